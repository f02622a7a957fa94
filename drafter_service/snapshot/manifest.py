"""The snapshot manifest: tokenizer identity, sub-index entries and their strict JSON form
(docs/snapshot-format.md); ``drafter_service.snapshot.store`` re-exports it."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from drafter_service.datastore.sub_indices import MAX_SUB_INDEX_TOKENS

FORMAT_VERSION: int = 1
"""Version of the on-disk layout written by this module; loaders refuse any other."""

MANIFEST_NAME = "manifest.json"
CHECKSUM_KEY = "manifest_sha256"
"""Key of the sha256 of the rest (:func:`manifest_checksum`); older manifests lack it."""
MAX_MANIFEST_BYTES = 64 << 20
MAX_WAL_POSITION = 2**63 - 1  # an ingest-log sequence number (int64)
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_ENTRY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class SnapshotError(ValueError):
    """A snapshot (or tokenizer identity) was refused; the message names the file and why."""


def _check_int(value: object, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SnapshotError(f"{what} must be an int, got {value!r}")
    if not lo <= value <= hi:
        raise SnapshotError(f"{what} {value} is outside [{lo}, {hi}]")
    return value


def _check_str(value: object, what: str, pattern: re.Pattern[str] | None = None) -> str:
    if not isinstance(value, str):
        raise SnapshotError(f"{what} must be a string, got {value!r}")
    if pattern is not None and not pattern.fullmatch(value):
        raise SnapshotError(f"{what} {value!r} does not match {pattern.pattern}")
    return value


def _field(d: dict[str, Any], key: str, what: str) -> Any:
    if key not in d:
        raise SnapshotError(f"{what} is missing key {key!r}")
    return d[key]


def _check_dict(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SnapshotError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


@dataclass(frozen=True, slots=True)
class TokenizerIdentity:
    """Which tokenizer a datastore's token ids belong to: ``name`` is a label,
    ``fingerprint`` the sha256 hex of the tokenizer.json bytes (``""``: unknown)."""

    name: str
    vocab_size: int
    fingerprint: str = ""

    def __post_init__(self) -> None:
        _check_str(self.name, "tokenizer name")
        _check_int(self.vocab_size, "tokenizer vocab_size", 1, 2**30)
        pattern = _SHA256_HEX if self.fingerprint else None  # "": unknown
        _check_str(self.fingerprint, "tokenizer fingerprint", pattern)

    @classmethod
    def from_file(
        cls, path: str | Path, name: str | None = None, vocab_size: int | None = None
    ) -> TokenizerIdentity:
        """Identity of a HuggingFace ``tokenizer.json``: its sha256 and vocabulary size
        (added tokens included; read with ``tokenizers`` unless given). ``name`` defaults
        to the parent directory for a file named tokenizer.json, else the stem."""
        path = Path(path)
        try:
            with open(path, "rb") as f:
                digest = hashlib.file_digest(f, "sha256")
        except OSError as exc:
            raise SnapshotError(f"cannot read tokenizer file {path}: {exc}") from exc
        if vocab_size is None:
            import tokenizers  # deferred: only this constructor needs it

            try:
                tok = tokenizers.Tokenizer.from_file(str(path))
            except Exception as exc:
                raise SnapshotError(f"{path} is not a tokenizers file: {exc}") from exc
            vocab_size = int(tok.get_vocab_size(with_added_tokens=True))
        if name is None:
            parent = path.resolve().parent.name
            name = parent if path.name == "tokenizer.json" and parent else path.stem
        return cls(name=name, vocab_size=vocab_size, fingerprint=digest.hexdigest())

    def matches(self, other: TokenizerIdentity) -> bool:
        """Same vocabulary size, and the same fingerprint when both are known."""
        if self.vocab_size != other.vocab_size:
            return False
        return not (self.fingerprint and other.fingerprint) or self.fingerprint == other.fingerprint

    def describe(self) -> str:
        """One line for error messages: name, vocabulary size, fingerprint."""
        return (
            f"{self.name!r} (vocab_size {self.vocab_size}, "
            f"fingerprint {self.fingerprint or 'unknown'})"
        )

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: object) -> TokenizerIdentity:
        """Parses ``to_json`` output (checked by ``__post_init__``): SnapshotError naming
        the bad field."""
        obj = _check_dict(d, "tokenizer")
        return cls(**{f.name: _field(obj, f.name, "tokenizer") for f in fields(cls)})


@dataclass(frozen=True, slots=True)
class SubIndexEntry:
    """One sub-index as recorded in the manifest; its files are
    ``{name}.tokens.i32`` and ``{name}.sa.i32`` (raw little-endian int32)."""

    name: str
    num_tokens: int
    num_documents: int
    tokens_sha256: str
    sa_sha256: str

    @property
    def tokens_file(self) -> str:
        return f"{self.name}.tokens.i32"

    @property
    def sa_file(self) -> str:
        return f"{self.name}.sa.i32"

    @classmethod
    def from_json(cls, d: object, what: str) -> SubIndexEntry:
        obj = _check_dict(d, what)
        name = _check_str(_field(obj, "name", what), f"{what} name", _ENTRY_NAME)
        what = f"{what} ({name})"
        values = {f.name: _field(obj, f.name, what) for f in fields(cls) if f.name != "name"}
        n = _check_int(values["num_tokens"], f"{what} num_tokens", 0, MAX_SUB_INDEX_TOKENS)
        docs = _check_int(values["num_documents"], f"{what} num_documents", 0, n + 1)
        if (n == 0) != (docs == 0):
            raise SnapshotError(f"{what} has {n} tokens but {docs} documents")
        for key in ("tokens_sha256", "sa_sha256"):
            _check_str(values[key], f"{what} {key}", _SHA256_HEX)
        return cls(name=name, **values)


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """A snapshot's manifest: what it holds and which tokenizer and ingest position it covers."""

    path: Path
    format_version: int
    tokenizer: TokenizerIdentity
    sub_indices: tuple[SubIndexEntry, ...]  # oldest first
    wal_position: int  # ingest-log sequence number this snapshot covers (0 = none)
    created_unix: float
    metadata: dict[str, object]

    @property
    def num_tokens(self) -> int:
        return sum(e.num_tokens for e in self.sub_indices)

    def to_json(self) -> dict[str, object]:
        doc = asdict(self)
        del doc["path"]  # where the snapshot lies, not part of it
        return doc


def manifest_checksum(doc: dict[str, Any]) -> str:
    """sha256 hex of a manifest without its :data:`CHECKSUM_KEY`, as compact sorted JSON:
    any change of a value, key or nesting changes it, the file's layout does not."""
    body = {key: value for key, value in doc.items() if key != CHECKSUM_KEY}
    try:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()
    except (TypeError, ValueError) as exc:
        raise SnapshotError(f"manifest is not plain JSON: {exc}") from exc


def manifest_bytes(info: SnapshotInfo) -> bytes:
    """The manifest file's bytes (sorted keys, one-space indent, trailing newline), sealed
    with its checksum (:data:`CHECKSUM_KEY`)."""
    doc = info.to_json()
    try:
        doc[CHECKSUM_KEY] = manifest_checksum(doc)
    except SnapshotError as exc:
        raise SnapshotError(f"snapshot metadata is not plain JSON: {exc}") from None
    return (json.dumps(doc, sort_keys=True, indent=1, allow_nan=False) + "\n").encode("utf-8")


def _check_sealed(obj: dict[str, Any]) -> None:
    """Refuses a manifest whose content its checksum does not seal (none: accepted)."""
    if CHECKSUM_KEY not in obj:
        return
    stored = _check_str(obj[CHECKSUM_KEY], CHECKSUM_KEY, _SHA256_HEX)
    actual = manifest_checksum(obj)
    if stored != actual:
        raise SnapshotError(
            f"manifest fails its checksum (damaged): its content hashes to sha256 {actual}, "
            f"its {CHECKSUM_KEY} says {stored}"
        )


def parse_manifest(data: bytes, path: Path) -> SnapshotInfo:
    """Validates a manifest's bytes; ``path`` is the snapshot directory (for SnapshotInfo)."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SnapshotError(f"manifest is not valid JSON: {exc}") from exc
    obj = _check_dict(doc, "manifest")
    _check_sealed(obj)
    version = _check_int(_field(obj, "format_version", "manifest"), "format_version", 0, 2**31)
    if version != FORMAT_VERSION:
        raise SnapshotError(
            f"format_version {version} is not supported (this reader knows {FORMAT_VERSION})"
        )
    raw_entries = _field(obj, "sub_indices", "manifest")
    if not isinstance(raw_entries, list):
        raise SnapshotError(f"sub_indices must be a JSON array, got {type(raw_entries).__name__}")
    entries = tuple(
        SubIndexEntry.from_json(e, f"sub_indices[{i}]") for i, e in enumerate(raw_entries)
    )
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise SnapshotError(f"sub-index names repeat: {names}")
    created = _field(obj, "created_unix", "manifest")
    if type(created) not in (int, float) or not math.isfinite(created):  # a bool is not
        raise SnapshotError(f"created_unix must be a finite number, got {created!r}")
    return SnapshotInfo(
        path=path,
        format_version=version,
        tokenizer=TokenizerIdentity.from_json(_field(obj, "tokenizer", "manifest")),
        sub_indices=entries,
        wal_position=_check_int(
            _field(obj, "wal_position", "manifest"), "wal_position", 0, MAX_WAL_POSITION
        ),
        created_unix=float(created),
        metadata=_check_dict(_field(obj, "metadata", "manifest"), "metadata"),
    )
