"""Request and response bodies of the admin API (they define its OpenAPI schema)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
"""Snapshot and corpus names: no dots, slashes or leading dash, so never a path."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok", "loading", "stopping"]


class DatastoreSummary(BaseModel):
    name: str
    live: bool
    num_tokens: int = Field(description="text positions, document separators included")
    sub_indices: int
    resident_bytes: int


class SharedLogDetail(BaseModel):
    stream: str
    consumed_offset: str | None
    covered_offset: str | None
    skipped_entries: int = Field(description="entries no replica can store (logged)")
    errors: int = Field(description="failed reads of the log server or local log writes")
    lost: int = Field(description="times entries were found trimmed before they were taken")


class LiveDetail(BaseModel):
    pending_tokens: int
    rebuilds: int
    rebuild_seconds_total: float
    last_rebuild_seconds: float
    wal_position: int
    covered_position: int
    wal_bytes: int
    last_snapshot_unix: float | None
    last_error: str | None
    corpora: int
    shared_log: SharedLogDetail | None = Field(description="null: this replica learns alone")


class DatastoreDetail(DatastoreSummary):
    active_requests: int
    live_state: LiveDetail | None


class DatastoreList(BaseModel):
    datastores: list[DatastoreSummary]


class SnapshotSummary(BaseModel):
    name: str
    created_unix: float
    wal_position: int
    log_offset: str | None = Field(
        description="shared ingest stream entry id of the newest document it holds "
        "(null: none from a shared log)"
    )
    num_tokens: int
    sub_indices: int
    pinned: bool
    corpora: list[str]
    newest: bool = Field(description="the snapshot a restart begins from (cannot be deleted)")


class SnapshotDetail(SnapshotSummary):
    tokenizer: dict[str, Any]
    metadata: dict[str, Any]


class SnapshotList(BaseModel):
    snapshots: list[SnapshotSummary]


class SnapshotFile(BaseModel):
    name: str
    bytes: int


class SnapshotFiles(BaseModel):
    files: list[SnapshotFile] = Field(
        description="every file of the snapshot directory; manifest.json lists the "
        "checksums of the others"
    )


class ContentDigest(BaseModel):
    content_sha256: str = Field(
        description="SHA-256 over the learned sub-indices' tokens: equal on replicas that "
        "took the same shared-log entries and folded them all (covered_offset equal to "
        "consumed_offset)"
    )
    num_tokens: int
    pending_tokens: int
    consumed_offset: str | None = Field(description="newest shared-log entry in the ingest log")
    covered_offset: str | None = Field(description="newest shared-log entry in the sub-indices")


class SnapshotCreate(Strict):
    name: str | None = Field(
        default=None,
        pattern=NAME_PATTERN,
        description="snapshot name (default: generated); a named snapshot is pinned",
    )
    rebuild_first: bool = Field(
        default=True,
        description="fold every acknowledged ingest into the sub-indices before writing",
    )


class CorpusAdd(Strict):
    name: str = Field(pattern=NAME_PATTERN, description="corpus name, unique per datastore")
    path: str = Field(
        min_length=1,
        max_length=4096,
        description="file path relative to the server's corpora directory",
    )
    kind: Literal["token-ids", "text", "prompt-output", "npy"] = Field(
        description="token-ids: JSONL/Parquet records with token-id lists (prompt_ids, "
        "output_ids); text / prompt-output: text records or .txt files, tokenized with the "
        "service's tokenizer; npy: 1-D int array, -1 between documents"
    )
    store: Literal["output", "prompt+output"] = "output"
    text_field: str = Field(default="text", min_length=1, max_length=256)
    prompt_field: str | None = Field(default=None, min_length=1, max_length=256)
    output_field: str | None = Field(default=None, min_length=1, max_length=256)
    text_split: Literal["document", "blank-line", "line"] = "document"


class CorpusInfo(BaseModel):
    name: str
    num_tokens: int
    sub_indices: int
    resident_bytes: int
    metadata: dict[str, Any]


class CorpusList(BaseModel):
    corpora: list[CorpusInfo]


class Settings(BaseModel):
    """The live settings: they change when maintenance runs, never what is stored."""

    rebuild_min_tokens: int
    rebuild_interval_s: float
    rebuild_max_share: float
    snapshot_interval_s: float
    keep_snapshots: int


class SettingsPatch(Strict):
    rebuild_min_tokens: int | None = Field(default=None, ge=1, le=2**62)
    rebuild_interval_s: float | None = Field(default=None, gt=0, le=10**9)
    rebuild_max_share: float | None = Field(
        default=None, ge=0, lt=1, description="0 = only rebuild_min_tokens and rebuild_interval_s"
    )
    snapshot_interval_s: float | None = Field(
        default=None, ge=0, le=10**9, description="0 = only on request"
    )
    keep_snapshots: int | None = Field(default=None, ge=1, le=10**6)


class JobInfo(BaseModel):
    id: str
    kind: str
    datastore: str
    state: Literal["queued", "running", "succeeded", "failed"]
    created_unix: float
    started_unix: float | None
    finished_unix: float | None
    result: dict[str, Any] | None
    error: str | None


class JobList(BaseModel):
    jobs: list[JobInfo]
