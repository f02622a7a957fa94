"""Corpus files on the server's storage: a client-given path resolved safely inside
``corpora_dir``, and the file built into sub-indices with the datastore builder (the
kinds: ``schemas.CorpusAdd``)."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path, PurePosixPath

import numpy as np

from drafter_service.admin.http_errors import bad_request, conflict, not_found
from drafter_service.admin.schemas import CorpusAdd
from drafter_service.corpus.build_errors import BuildError
from drafter_service.corpus.pipeline import BuildConfig, build
from drafter_service.corpus.records import RecordSpec
from drafter_service.datastore.sub_indices import SEPARATOR, SubIndex
from drafter_service.live.live_datastore import Corpus, LiveDatastore
from drafter_service.service.settings import ServeConfig
from drafter_service.snapshot.store import SnapshotError, load_snapshot

_PATH_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}")


def resolve_corpus_path(corpora_dir: Path | None, relative: str) -> Path:
    """``relative`` (a POSIX path) inside ``corpora_dir``, symlinks resolved. Refuses
    absolute paths, ``..``, hidden or odd components, and anything resolving outside."""
    if corpora_dir is None:
        raise conflict(
            "no corpora directory is configured: start the service with --corpora-dir "
            "(DRAFTER_CORPORA_DIR) and put corpus files there"
        )
    parts = PurePosixPath(relative).parts  # a leading "/" is a part; _PATH_PART refuses it
    if not parts or not all(_PATH_PART.fullmatch(p) for p in parts):
        raise bad_request(
            f"path {relative!r} must be relative to the corpora directory, with components "
            "of letters, digits and _.+- (not starting with a dot)"
        )
    root = corpora_dir.resolve()
    try:
        path = root.joinpath(*parts).resolve(strict=True)
    except (FileNotFoundError, NotADirectoryError):
        raise not_found(f"no corpus file {relative!r} in the corpora directory") from None
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        raise bad_request(f"path {relative!r} cannot be resolved: {exc}") from None
    if not path.is_relative_to(root):
        raise bad_request(f"path {relative!r} leads outside the corpora directory")
    if not path.is_file():
        raise bad_request(f"path {relative!r} is not a regular file")
    return path


def build_corpus(body: CorpusAdd, path: Path, live: LiveDatastore, config: ServeConfig) -> Corpus:
    """Builds ``path`` into a :class:`Corpus` for ``live`` (blocking); AdminError 400 for a
    bad file. Text kinds need ``config.tokenizer`` (the route checks it)."""
    name, kind, tokenizer = body.name, body.kind, live.tokenizer
    source = {"path": str(path), "kind": kind, "bytes": path.stat().st_size}
    if kind == "npy":
        return Corpus(name, (_npy_sub_index(path, tokenizer.vocab_size),), source)
    spec = RecordSpec(
        kind,
        body.store,
        text_field=body.text_field,
        prompt_field=body.prompt_field,
        output_field=body.output_field,
    )
    scratch_dir = config.data_dir / "corpus-builds"  # the data's filesystem
    scratch_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".build-{name}-", dir=scratch_dir))
    try:
        report = build(
            BuildConfig(
                inputs=[path],
                output=work / name,
                spec=spec,
                text_split=body.text_split,
                tokenizer=None if kind == "token-ids" else config.tokenizer,
                vocab_size=tokenizer.vocab_size,
                max_sub_index_tokens=live.policy.max_sub_index_tokens,
                quiet=True,
            )
        )
        # Mapped read-only: the mapping outlives the files, removed below.
        datastore, _ = load_snapshot(report.info.path, expect_tokenizer=tokenizer)
    except (BuildError, SnapshotError) as exc:
        raise bad_request(f"corpus {name!r}: {exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta = {**source, "documents": report.documents, "tokens": report.tokens}
    return Corpus(name, datastore.sub_indices, meta)


def _npy_sub_index(path: Path, vocab_size: int) -> SubIndex:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise bad_request(f"{path.name}: not a readable .npy array: {exc}") from None
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer) or len(array) == 0:
        raise bad_request(
            f"{path.name}: expected a non-empty 1-D integer array, got {array.ndim}-D "
            f"{array.dtype} of {array.size} values"
        )
    low, high = int(array.min()), int(array.max())
    if low < SEPARATOR or high >= vocab_size:
        raise bad_request(
            f"{path.name}: values must be token ids in [0, {vocab_size}) or {SEPARATOR} "
            f"between documents; found [{low}, {high}]"
        )
    text = np.ascontiguousarray(array, dtype=np.int32)
    try:
        return SubIndex.from_text(text, vocab_size)
    except ValueError as exc:
        raise bad_request(f"{path.name}: {exc}") from None
