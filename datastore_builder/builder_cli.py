"""``datastore-builder``: builds a datastore snapshot from text or token corpora.

Example (the shared Llama-3 corpus, outputs only)::

    datastore-builder build --input corpus.text.jsonl.gz \\
        --prompt-field prompt_text --output-field output_text \\
        --tokenizer llama3/tokenizer.json --output /srv/datastore/snap-001

Errors (a missing file or field, bad JSON, an empty corpus, ...) print one line on
stderr naming the file, line and field, and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, cast

from datastore_builder.score_cli import add_train_score_parser, run_train_score
from drafter_service.corpus.build_errors import BuildError
from drafter_service.corpus.pipeline import (
    DEFAULT_BATCH_DOCS,
    DEFAULT_MAX_SUB_INDEX_TOKENS,
    BuildConfig,
    build,
)
from drafter_service.corpus.readers import FORMATS, TEXT_SPLITS
from drafter_service.corpus.records import RECORD_KINDS, STORES, RecordKind, RecordSpec, Store
from drafter_service.snapshot.manifest import SnapshotError

PROG = "datastore-builder"


def positive(text: str) -> int:
    """The argparse type of a count: an integer >= 1 (``1_000_000`` accepted)."""
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_build_parser(subparsers: Any) -> None:
    """Registers ``build``."""
    p = subparsers.add_parser(
        "build",
        help="tokenize a corpus and write a datastore snapshot",
        description="Streams the inputs, tokenizes them (no special tokens added), packs the "
        "documents into suffix-array sub-indices and writes one snapshot directory.",
    )
    io = p.add_argument_group("inputs and output")
    io.add_argument(
        "--input",
        action="append",
        dest="inputs",
        required=True,
        type=Path,
        metavar="PATH",
        help="input file (.jsonl[.gz], .parquet, .txt[.gz]); repeatable",
    )
    io.add_argument(
        "--format",
        choices=FORMATS,
        help="format of every input (default: from each file's extension)",
    )
    io.add_argument(
        "--output",
        required=True,
        type=Path,
        metavar="DIR",
        help="snapshot directory to create (must not exist)",
    )
    rec = p.add_argument_group("records (JSONL / Parquet)")
    rec.add_argument(
        "--records",
        choices=RECORD_KINDS,
        help="what a record holds (default: chat with --messages-field, "
        "prompt-output with --prompt-field/--output-field, else text)",
    )
    for field, what in (
        ("text", "text field (default 'text')"),
        ("prompt", "prompt field (default 'prompt', or 'prompt_ids' for token-ids)"),
        ("output", "output field (default 'output', or 'output_ids' for token-ids)"),
        ("messages", "chat messages field, a list of {role, content} (default 'messages')"),
    ):
        rec.add_argument(f"--{field}-field", metavar="NAME", help=what)
    rec.add_argument(
        "--store",
        choices=STORES,
        default="output",
        help="which parts of prompt/output records become datastore text (default: output)",
    )
    rec.add_argument(
        "--text-split",
        choices=TEXT_SPLITS,
        default="document",
        help="plain-text inputs: one document per file (default), per paragraph "
        "(blank-line) or per line",
    )
    tok = p.add_argument_group("tokenizer")
    for flag, what in (
        ("--tokenizer", "a local Hugging Face tokenizer.json (never downloaded)"),
        (
            "--tokenizer-config",
            "tokenizer_config.json with the chat template and special tokens "
            "(default: beside --tokenizer)",
        ),
        ("--chat-template", "a Jinja chat template file (overrides the config's)"),
    ):
        tok.add_argument(flag, type=Path, metavar="PATH", help=what)
    tok.add_argument(
        "--tokenizer-name",
        metavar="NAME",
        help="label recorded in the snapshot (default: the tokenizer's directory)",
    )
    tok.add_argument(
        "--vocab-size",
        type=positive,
        metavar="N",
        help="vocabulary size (default: the tokenizer's, added tokens included; "
        "required for token-ids records without --tokenizer)",
    )
    run = p.add_argument_group("build")
    for flag, default, what in (
        (
            "--max-sub-index-tokens",
            DEFAULT_MAX_SUB_INDEX_TOKENS,
            "most text positions per sub-index",
        ),
        ("--batch-docs", DEFAULT_BATCH_DOCS, "documents per tokenizer batch"),
    ):
        what += " (default %(default)s)"
        run.add_argument(flag, type=positive, metavar="N", default=default, help=what)
    run.add_argument("--quiet", action="store_true", help="no progress bar")


def _record_spec(args: argparse.Namespace) -> RecordSpec:
    kind: RecordKind | None = args.records
    if kind is None:
        if args.messages_field is not None:
            kind = "chat"
        elif args.prompt_field is not None or args.output_field is not None:
            kind = "prompt-output"
        else:
            kind = "text"
    # --prompt-field with --store output is accepted (and unused): the same command line
    # then works for both --store values.
    pairs = ("prompt-output", "token-ids")
    kinds = {"text": ("text",), "messages": ("chat",), "prompt": pairs, "output": pairs}
    fields = {f"{name}_field": getattr(args, f"{name}_field") for name in kinds}
    for name, applies in kinds.items():
        if fields[f"{name}_field"] is not None and kind not in applies:
            raise BuildError(f"--{name}-field does not apply to {kind} records")
    return RecordSpec(kind, cast(Store, args.store), **fields)


def _config(args: argparse.Namespace) -> BuildConfig:
    """The build the command line asks for: every option is the BuildConfig field of its
    name (``--input`` stores into ``inputs``)."""
    names = [f.name for f in fields(BuildConfig) if f.name != "spec"]
    return BuildConfig(spec=_record_spec(args), **{name: getattr(args, name) for name in names})


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``datastore-builder``; returns the exit status (2 on any error)."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Builds datastore snapshots from text or token corpora."
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_build_parser(subparsers)
    add_train_score_parser(subparsers, positive)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors (status 2) and --help (status 0)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.command == "train-score":
            return run_train_score(args)
        report = build(_config(args))
    except (BuildError, SnapshotError) as exc:  # SnapshotError: a snapshot or tokenizer file
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; nothing was written", file=sys.stderr)
        return 130
    info = report.info
    print(
        f"wrote {info.path}: {report.tokens:,} tokens in {report.documents:,} documents "
        f"({report.records:,} records, {report.empty_documents:,} empty skipped), "
        f"{len(info.sub_indices)} sub-index(es), {report.seconds:.2f} s, "
        f"{report.tokens / max(report.seconds, 1e-9) / 1e6:.2f}M tokens/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
