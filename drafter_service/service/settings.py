"""Settings of ``drafter serve``: one frozen value, every field a flag and an environment variable.

A field ``max_budget`` is ``--max-budget`` and ``DRAFTER_MAX_BUDGET``; a flag wins over
the variable, the variable over the default. Nothing is read at import.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from drafter_service.drafting.draft_config import DraftConfig
from drafter_service.live.live_datastore import LivePolicy

ENV_PREFIX = "DRAFTER_"
DATASTORE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
DEFAULT_DATASTORE = "default"
DEFAULT_VOCAB_SIZE = 128256
"""The embedded default vocabulary: Llama 3's 128256 token ids. ``drafter serve`` uses it
when no --vocab-size, --tokenizer, --snapshot or existing data directory gives one."""


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not a boolean (true/false)")


def _optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    return lambda text: None if text.strip().lower() in ("", "none") else parse(text)


def _datastores(text: str) -> tuple[tuple[str, Path], ...]:
    """``NAME=DIR[,NAME=DIR...]`` (the environment form; the flag repeats instead)."""
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, directory = item.partition("=")
        if not sep or not directory:
            raise ValueError(f"{item!r} is not NAME=DIR")
        pairs.append((name, Path(directory)))
    return tuple(pairs)


def _key_values(text: str) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE[,KEY=VALUE...]`` (the environment form; the flag repeats instead)."""
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"{item!r} is not KEY=VALUE")
        pairs.append((key.strip(), value.strip()))
    return tuple(pairs)


def _meta(help: str, parse: Callable[[str], Any]) -> dict[str, Any]:
    """Field metadata: the flag's help text and how to parse a flag or variable value."""
    return {"help": help, "parse": parse}


def _cpu_count() -> int:
    return os.cpu_count() or 1


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Everything ``drafter serve`` needs; the defaults run an empty live datastore in
    ./drafter-data with the Llama-3 vocabulary (``DEFAULT_VOCAB_SIZE``)."""

    host: str = field(default="127.0.0.1", metadata=_meta("address to listen on", str))
    port: int = field(
        default=50051, metadata=_meta("port to listen on (0 = pick a free port)", int)
    )
    data_dir: Path = field(
        default=Path("drafter-data"), metadata=_meta("live datastore directory", Path)
    )
    snapshot: Path | None = field(
        default=None,
        metadata=_meta("snapshot that seeds the live datastore when data_dir has none yet", Path),
    )
    tokenizer: Path | None = field(
        default=None, metadata=_meta("tokenizer.json giving the tokenizer identity", Path)
    )
    tokenizer_name: str | None = field(
        default=None, metadata=_meta("tokenizer label (default: from the file)", str)
    )
    vocab_size: int | None = field(
        default=None,
        metadata=_meta(
            "vocabulary size (default: from --tokenizer, the seed snapshot or the data "
            f"directory, else {DEFAULT_VOCAB_SIZE}, the Llama-3 vocabulary)",
            int,
        ),
    )
    """None: resolved when the datastores open (``resolve_tokenizer``), falling back to
    ``DEFAULT_VOCAB_SIZE``."""
    datastores: tuple[tuple[str, Path], ...] = field(
        default=(),
        metadata=_meta("extra read-only datastore NAME=DIR (a snapshot); repeatable", _datastores),
    )
    draft_config: tuple[tuple[str, str], ...] = field(
        default=(),
        metadata=_meta(
            "drafting knob KEY=VALUE, a DraftConfig field (docs/algorithm.md), e.g. "
            "datastore_smoothing=1; repeatable",
            _key_values,
        ),
    )
    draft_threads: int = field(
        default_factory=_cpu_count,
        metadata=_meta("native drafting threads per datastore (default: CPUs)", int),
    )
    max_requests_per_call: int = field(
        default=1024, metadata=_meta("requests per Draft/Finish/Ingest call", int)
    )
    max_tokens_per_request: int = field(
        default=1_048_576, metadata=_meta("tokens one request may hold", int)
    )
    max_budget: int = field(default=256, metadata=_meta("largest draft budget (tree nodes)", int))
    max_message_bytes: int = field(
        default=64 << 20, metadata=_meta("largest gRPC message, in bytes", int)
    )
    inline_max_work: int = field(
        default=256,
        metadata=_meta(
            "a call's native work runs on the event loop thread, skipping two thread "
            "hand-offs, when nothing else is queued and it weighs at most this many "
            "drafted requests (each request 1, plus 1 per 64 nodes of budget, per 8 "
            "tokens added and per 8 requests stopped; ~12 µs each on 2 cores; "
            "0 = always hand off)",
            int,
        ),
    )
    max_inflight_calls: int = field(
        default=64,
        metadata=_meta("calls and stream steps queued or running; beyond: RESOURCE_EXHAUSTED", int),
    )
    request_ttl_s: float = field(
        default=600.0, metadata=_meta("request state idle this long is dropped", float)
    )
    max_request_states: int = field(
        default=100_000, metadata=_meta("request states kept (least recent dropped)", int)
    )
    max_request_state_bytes: int = field(
        default=4 << 30,
        metadata=_meta(
            "memory request states may hold, 8 bytes per context token (least recently "
            "used dropped; a call needing more alone: RESOURCE_EXHAUSTED)",
            int,
        ),
    )
    grace_period_s: float = field(
        default=5.0, metadata=_meta("shutdown grace for in-flight calls", float)
    )
    ingest_queue_size: int = field(
        default=1024, metadata=_meta("finished generations waiting to be stored", int)
    )
    keepalive_time_s: float = field(
        default=30.0, metadata=_meta("interval of server keepalive pings", float)
    )
    keepalive_timeout_s: float = field(
        default=10.0, metadata=_meta("wait for a keepalive ack", float)
    )
    keepalive_min_ping_interval_s: float = field(
        default=5.0, metadata=_meta("shortest client ping interval", float)
    )
    keepalive_permit_without_calls: bool = field(
        default=True, metadata=_meta("pings allowed with no call", _bool)
    )
    rebuild_min_tokens: int = field(
        default=1_000_000, metadata=_meta("live: rebuild once this many wait", int)
    )
    rebuild_interval_s: float = field(
        default=60.0, metadata=_meta("live: or this often with any waiting", float)
    )
    snapshot_interval_s: float = field(
        default=900.0, metadata=_meta("live: snapshot period (0 = never)", float)
    )
    keep_snapshots: int = field(default=2, metadata=_meta("live: complete snapshots kept", int))
    max_sub_indices: int = field(
        default=8, metadata=_meta("live: sub-indices kept (oldest dropped)", int)
    )
    max_sub_index_tokens: int = field(
        default=512_000_000, metadata=_meta("live: positions per sub-index", int)
    )
    max_resident_bytes: int | None = field(
        default=None, metadata=_meta("live: datastore memory bound in bytes", _optional(int))
    )
    store: Literal["output", "prompt+output"] = field(
        default="output",
        metadata=_meta("live: what a finished generation stores (output|prompt+output)", str),
    )
    prompt_context_tokens: int = field(
        default=3, metadata=_meta("live: prompt tokens kept before an output", int)
    )
    finish_durable: bool = field(
        default=False,
        metadata=_meta(
            "every Finish answers only once the generations it stores are in the ingest log "
            "(fsynced; FinishResponse.durable counts them), as a client can ask per call "
            "with wait_durable; without either, a Finish acknowledges queued generations",
            _bool,
        ),
    )
    salvage: bool = field(
        default=False,
        metadata=_meta(
            "start despite damaged data (a corrupt ingest log record, an unreadable newest "
            "snapshot): keep what is readable, move the damaged files into DATA_DIR/damaged "
            "(never deleted); without it such damage refuses to start, naming what would be "
            "lost",
            _bool,
        ),
    )
    log_level: str = field(default="INFO", metadata=_meta("logging level", str))
    metrics_port: int = field(
        default=9400,
        metadata=_meta("Prometheus /metrics port (0 = pick a free port, -1 = disabled)", int),
    )
    metrics_host: str | None = field(
        default=None,
        metadata=_meta("Prometheus /metrics address (default: --host)", _optional(str)),
    )
    admin_port: int = field(
        default=8400,
        metadata=_meta("REST admin API port (0 = pick a free port, -1 = disabled)", int),
    )
    admin_host: str = field(default="127.0.0.1", metadata=_meta("REST admin API address", str))
    admin_token_file: Path | None = field(
        default=None,
        metadata=_meta(
            "file holding the admin bearer token (else env DRAFTER_ADMIN_TOKEN; without "
            "one, admin calls that change anything are refused)",
            Path,
        ),
    )
    grpc_tokens_file: Path | None = field(
        default=None,
        metadata=_meta(
            "gRPC bearer tokens, one client per line 'NAME TOKEN': every DrafterService call "
            "must carry one (UNAUTHENTICATED otherwise) and each client's request ids are its "
            "own (docs/guarantees.md)",
            Path,
        ),
    )
    tls_cert_file: Path | None = field(
        default=None, metadata=_meta("gRPC server certificate (PEM); with --tls-key-file", Path)
    )
    tls_key_file: Path | None = field(
        default=None, metadata=_meta("gRPC server private key (PEM)", Path)
    )
    tls_client_ca_file: Path | None = field(
        default=None,
        metadata=_meta(
            "CA (PEM) whose client certificates are required (mutual TLS); without "
            "--grpc-tokens-file the certificate's common name names the client",
            Path,
        ),
    )
    corpora_dir: Path | None = field(
        default=None,
        metadata=_meta("directory whose corpus files the admin API may add (unset: none)", Path),
    )

    def __post_init__(self) -> None:
        checks = {
            "port": 0 <= self.port <= 65535,
            "vocab_size": self.vocab_size is None or 1 <= self.vocab_size <= 2**30,
            "draft_threads": 1 <= self.draft_threads <= 1024,
            "max_requests_per_call": 1 <= self.max_requests_per_call < 2**32,
            "max_tokens_per_request": 1 <= self.max_tokens_per_request < 2**32,
            "max_budget": 1 <= self.max_budget < 2**31,
            "max_message_bytes": 1024 <= self.max_message_bytes < 2**31,
            "max_inflight_calls": self.max_inflight_calls >= 1,
            "inline_max_work": self.inline_max_work >= 0,
            "request_ttl_s": self.request_ttl_s > 0,
            "max_request_states": self.max_request_states >= 1,
            "max_request_state_bytes": self.max_request_state_bytes >= 1 << 20,
            "grace_period_s": self.grace_period_s >= 0,
            "ingest_queue_size": self.ingest_queue_size >= 1,
            "keepalive_time_s": self.keepalive_time_s > 0,
            "keepalive_timeout_s": self.keepalive_timeout_s > 0,
            "keepalive_min_ping_interval_s": self.keepalive_min_ping_interval_s >= 0,
            "host": bool(self.host),
            "metrics_port": -1 <= self.metrics_port <= 65535,
            "metrics_host": self.metrics_host is None or bool(self.metrics_host),
            "admin_port": -1 <= self.admin_port <= 65535,
            "admin_host": bool(self.admin_host),
            "log_level": self.log_level.upper() in ("DEBUG", "INFO", "WARNING", "ERROR"),
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"ServeConfig.{name} = {getattr(self, name)!r} is out of range")
        seen = {DEFAULT_DATASTORE}
        for name, _ in self.datastores:
            if not DATASTORE_NAME.fullmatch(name) or name in seen:
                raise ValueError(
                    f"ServeConfig.datastores: name {name!r} is invalid, reserved or repeated "
                    f"(expected {DATASTORE_NAME.pattern}, not {DEFAULT_DATASTORE!r})"
                )
            seen.add(name)
        self.live_policy()  # raises ValueError naming a bad live knob
        self.draft_settings()  # raises ValueError naming a bad drafting knob
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("ServeConfig.tls_cert_file and tls_key_file go together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("ServeConfig.tls_client_ca_file needs tls_cert_file/tls_key_file")

    def draft_settings(self) -> DraftConfig:
        """The drafting parameters: DraftConfig defaults, max_budget, then --draft-config."""
        kinds = {f.name: f.type for f in fields(DraftConfig)}
        values: dict[str, Any] = {"max_budget": self.max_budget}
        for key, text in self.draft_config:
            if key == "max_budget":
                raise ValueError("ServeConfig.draft_config: set max_budget with --max-budget")
            if key not in kinds:
                raise ValueError(
                    f"ServeConfig.draft_config: {key!r} is not a DraftConfig field "
                    f"({', '.join(sorted(kinds))})"
                )
            kind = int if kinds[key] in ("int", int) else float
            try:
                values[key] = kind(text)
            except ValueError:
                raise ValueError(
                    f"ServeConfig.draft_config: {key} = {text!r} is not a {kind.__name__}"
                ) from None
        return DraftConfig(**values)

    def live_policy(self) -> LivePolicy:
        return LivePolicy(
            max_sub_indices=self.max_sub_indices,
            max_sub_index_tokens=self.max_sub_index_tokens,
            rebuild_min_tokens=self.rebuild_min_tokens,
            rebuild_interval_s=self.rebuild_interval_s,
            snapshot_interval_s=self.snapshot_interval_s,
            keep_snapshots=self.keep_snapshots,
            max_resident_bytes=self.max_resident_bytes,
            store=self.store,
            prompt_context_tokens=self.prompt_context_tokens,
        )

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """One flag per field (``--max-budget``); unset flags stay None."""
        for f in fields(ServeConfig):
            flag = "--" + ("datastore" if f.name == "datastores" else f.name.replace("_", "-"))
            repeats = f.name in ("datastores", "draft_config")
            env = ENV_PREFIX + f.name.upper()
            help_text = f"{f.metadata['help']} [env {env}]"
            if repeats:
                metavar = "NAME=DIR" if f.name == "datastores" else "KEY=VALUE"
                parser.add_argument(
                    flag, dest=f.name, action="append", metavar=metavar, help=help_text
                )
            else:
                parser.add_argument(flag, dest=f.name, help=help_text)

    @classmethod
    def from_namespace(
        cls, namespace: argparse.Namespace, environ: Mapping[str, str] | None = None
    ) -> ServeConfig:
        """Flags from ``add_arguments`` over ``DRAFTER_*`` variables over defaults.
        Raises ValueError naming the flag or variable and its bad value."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            flag_value = getattr(namespace, f.name, None)
            env = ENV_PREFIX + f.name.upper()
            parse = f.metadata["parse"]
            if f.name in ("datastores", "draft_config") and flag_value is not None:
                text = ",".join(flag_value)
                source = "--datastore" if f.name == "datastores" else "--draft-config"
            elif flag_value is not None:
                text, source = flag_value, "--" + f.name.replace("_", "-")
            elif environ.get(env, "") != "":
                text, source = environ[env], env
            else:
                continue
            try:
                values[f.name] = parse(text)
            except ValueError as exc:
                raise ValueError(f"{source}: bad value {text!r}: {exc}") from None
        return cls(**values)

    @classmethod
    def from_env_and_args(
        cls, args: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
    ) -> ServeConfig:
        """Parses ``drafter serve`` flags (``args``; default ``sys.argv[1:]``) and the
        environment (default ``os.environ``); a flag wins over its variable."""
        parser = argparse.ArgumentParser(prog="drafter serve")
        cls.add_arguments(parser)
        return cls.from_namespace(parser.parse_args(args), environ)
