"""The embedded default of `drafter serve`: with no vocabulary, tokenizer, snapshot or data
directory given it runs an empty live datastore in ./drafter-data with the Llama-3
vocabulary; a data directory's recorded vocabulary wins over that default."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import grpc
import pytest
from service_support import VOCAB, Subprocess

from drafter_service.drafter_cli import main
from drafter_service.live.live_datastore import LiveDatastore
from drafter_service.service.open_catalog import TOKENIZER_RECORD, open_catalog, resolve_tokenizer
from drafter_service.service.setting_values import DEFAULT_VOCAB_SIZE
from drafter_service.service.settings import ServeConfig
from drafter_service.snapshot.store import TokenizerIdentity
from sssd_drafter.v1 import drafter_pb2 as pb
from sssd_drafter.v1 import drafter_pb2_grpc as pb_grpc

PORTS = ("--port", "0", "--metrics-port", "0", "--admin-port", "-1")


class BareServe(Subprocess):
    """The console command `drafter serve` with only port flags, run in ``cwd`` with no
    DRAFTER_* variable set."""

    def __init__(self, cwd: Path, timeout_s: float = 60) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTER_")}
        super().__init__(*PORTS, timeout_s=timeout_s, defaults=(), cwd=cwd, env=env)

    def info(self) -> pb.GetServiceInfoResponse:
        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.DrafterServiceStub(channel)
            info: pb.GetServiceInfoResponse = stub.GetServiceInfo(
                pb.GetServiceInfoRequest(), timeout=10
            )
            return info

    def ingest(self, tokens: list[int]) -> None:
        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.DrafterServiceStub(channel)
            stub.Ingest(pb.IngestRequest(sequences=[pb.TokenSequence(tokens=tokens)]), timeout=10)

    def terminate(self, timeout_s: float = 30) -> tuple[int, str, str]:
        """SIGTERM; returns (exit code, rest of stdout, stderr)."""
        return self.stop(signal.SIGTERM, timeout_s)


def test_bare_serve_runs_an_empty_live_datastore_with_the_llama3_vocabulary(
    tmp_path: Path,
) -> None:
    first = BareServe(tmp_path)
    try:
        info = first.info()
        assert info.tokenizer.vocab_size == DEFAULT_VOCAB_SIZE == 128256
        assert [(d.name, d.is_default, d.live, d.num_tokens) for d in info.datastores] == [
            ("default", True, True, 0)
        ]
        assert (tmp_path / "drafter-data" / "snapshots").is_dir()
        assert (tmp_path / "drafter-data" / "wal").is_dir()
        first.ingest([128255, 7, 8])  # the top id of the default vocabulary is accepted
    finally:
        code, rest, err = first.terminate()
    assert code == 0, err
    assert rest == ""  # exactly one line on stdout
    assert "using the default, 128256 token ids" in err
    assert "--vocab-size" in err and "--tokenizer" in err

    # a bare restart reopens the same directory (its log replayed) without the warning
    second = BareServe(tmp_path)
    try:
        info = second.info()
        assert info.tokenizer.vocab_size == 128256
        assert info.datastores[0].num_tokens == 3
    finally:
        code, _, err = second.terminate()
    assert code == 0, err
    assert "using the default" not in err


def test_serve_help_states_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--vocab-size VOCAB_SIZE vocabulary size (default:" in text
    assert "else 128256, the Llama-3 vocabulary) [env DRAFTER_VOCAB_SIZE]" in text


def _open_and_close(config: ServeConfig) -> None:
    open_catalog(config).close()


def test_a_data_directory_keeps_its_vocabulary(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _open_and_close(ServeConfig(data_dir=data, vocab_size=VOCAB, draft_threads=1))
    assert (data / TOKENIZER_RECORD).is_file()
    bare = ServeConfig(data_dir=data)
    assert resolve_tokenizer(bare).vocab_size == VOCAB  # not the default
    with pytest.raises(ValueError, match="vocab_size 2000 differs from the tokenizer recorded"):
        resolve_tokenizer(ServeConfig(data_dir=data, vocab_size=2000))
    # with a snapshot the snapshot's vocabulary is the one kept
    with LiveDatastore(data, TokenizerIdentity("unknown", VOCAB), background=False) as live:
        live.snapshot()
    (data / TOKENIZER_RECORD).unlink()
    assert resolve_tokenizer(bare).vocab_size == VOCAB
    with pytest.raises(ValueError, match="vocab_size 2000 differs from the snapshot tokenizer"):
        resolve_tokenizer(ServeConfig(data_dir=data, vocab_size=2000))


@pytest.mark.parametrize("record", [b"\xff\xfe", b"{", b'{"name": "t"}'])
def test_a_damaged_tokenizer_record_is_named(tmp_path: Path, record: bytes) -> None:
    (tmp_path / TOKENIZER_RECORD).write_bytes(record)  # not UTF-8, not JSON, a field missing
    with pytest.raises(ValueError, match=f"{TOKENIZER_RECORD} is not a tokenizer record"):
        resolve_tokenizer(ServeConfig(data_dir=tmp_path))


def test_a_recorded_directory_refuses_another_vocabulary_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    _open_and_close(ServeConfig(data_dir=data, vocab_size=VOCAB, draft_threads=1))
    assert main(["serve", *PORTS, "--data-dir", str(data), "--vocab-size", "4096"]) == 2
    err = capsys.readouterr().err
    assert "vocab_size 4096 differs from the tokenizer recorded in" in err
    assert f"'unknown' (vocab_size {VOCAB}" in err
    # The message names the directory and the flags that fix it.
    assert f"the datastore in --data-dir {data} keeps its vocabulary" in err
    assert "drop --vocab-size, or give another --data-dir" in err


def test_a_bad_admin_token_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The error alone, status 2: no "metrics on ..." and "stopped" lines before it, as
    if the service had run, and no data directory created."""
    caplog.set_level(logging.INFO)
    token = tmp_path / "token"
    token.write_text("short\n")
    data = tmp_path / "data"
    ports = ("--port", "0", "--metrics-port", "0", "--admin-port", "0")
    argv = ["serve", *ports, "--data-dir", str(data), "--admin-token-file", str(token)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"drafter serve: error: admin_token_file {token}: the admin token must be at least "
        "16 characters without whitespace\n"
    )
    assert not caplog.records and not data.exists()


def test_an_unrecorded_ingest_log_needs_a_vocabulary(tmp_path: Path) -> None:
    """A directory written before the record existed, holding only an ingest log: the
    default could silently be the wrong vocabulary, so a bare start is refused."""
    data = tmp_path / "data"
    with LiveDatastore(data, TokenizerIdentity("unknown", VOCAB), background=False) as live:
        live.ingest([1, 2, 3])
    assert not (data / TOKENIZER_RECORD).exists()
    with pytest.raises(ValueError, match="holds logged ingests but records no vocabulary"):
        resolve_tokenizer(ServeConfig(data_dir=data))
    assert resolve_tokenizer(ServeConfig(data_dir=data, vocab_size=VOCAB)).vocab_size == VOCAB


def test_an_empty_directory_takes_the_default(tmp_path: Path) -> None:
    resolved = resolve_tokenizer(ServeConfig(data_dir=tmp_path / "new"))
    assert resolved == TokenizerIdentity("unknown", DEFAULT_VOCAB_SIZE, "")
    named = resolve_tokenizer(ServeConfig(data_dir=tmp_path / "new", tokenizer_name="llama-3"))
    assert named == TokenizerIdentity("llama-3", DEFAULT_VOCAB_SIZE, "")
    assert not (tmp_path / "new").exists()  # resolving writes nothing
