"""Settings of ``drafter serve``: one frozen pydantic model whose every field is a flag, a
``DRAFTER_*`` variable and a key of an optional TOML file (``--config-file``). A flag wins
over the variable, the variable over the file, each as a whole value.

Nothing is read at import, nor when a ``ServeConfig`` is built directly (only its
arguments count). ``setting_values.read_settings`` reads the three layers (the parsed
flags, each field's variable, the file by ``tomllib``), not pydantic-settings' sources: a
bad value must name the flag, variable or file that gave it, so the layers stay apart
until validation.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from drafter_service.drafting.draft_config import DraftConfig, config_field_value
from drafter_service.drafting.node_score import NODE_SCORE_CHOICES, read_node_score
from drafter_service.live.live_datastore import LivePolicy
from drafter_service.live.thread_priority import MAX_NICE
from drafter_service.replication.shared_log import SharedLogConfig
from drafter_service.service.setting_values import (
    CONFIG_FILE_ENV,
    DEFAULT_VOCAB_SIZE,
    REPEATED_FLAGS,
    AtLeastOne,
    Bool,
    Host,
    OptionalPort,
    Pairs,
    Port,
    PositiveSeconds,
    Seconds,
    bounds,
    check_live_store,
    check_log_level,
    cpu_count,
    env_name,
    flag_name,
    none_text,
    pairs,
    read_settings,
    unique_datastore_names,
    urls,
)


class ServeConfig(BaseModel):
    """Everything ``drafter serve`` needs; the defaults run an empty live datastore in
    ./drafter-data with the Llama-3 vocabulary (``DEFAULT_VOCAB_SIZE``). Frozen."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    host: Host = Field("127.0.0.1", description="address to listen on")
    port: Port = Field(50051, description="port to listen on (0 = pick a free port)")
    data_dir: Path = Field(Path("drafter-data"), description="live datastore directory")
    snapshot: Path | None = Field(
        None, description="snapshot that seeds the live datastore when data_dir has none yet"
    )
    tokenizer: Path | None = Field(None, description="tokenizer.json giving the tokenizer identity")
    tokenizer_name: str | None = Field(None, description="tokenizer label (default: from the file)")
    vocab_size: Annotated[int, bounds(1, 2**30)] | None = Field(
        None,
        description="vocabulary size (default: from --tokenizer, the seed snapshot or the data "
        f"directory, else {DEFAULT_VOCAB_SIZE}, the Llama-3 vocabulary)",
    )
    datastores: Annotated[
        tuple[tuple[str, Path], ...],
        pairs("NAME=DIR"),
        AfterValidator(unique_datastore_names),
    ] = Field((), description="extra read-only datastore NAME=DIR (a snapshot); repeatable")
    draft_config: Annotated[Pairs, pairs("KEY=VALUE")] = Field(
        (),
        description="drafting knob KEY=VALUE, a DraftConfig field (docs/algorithm.md), e.g. "
        "datastore_smoothing=1; repeatable",
    )
    node_score: str = Field(
        "default",
        description="how draft nodes are scored: default = the learned node score of the "
        "--snapshot (datastore-builder train-score), else the one shipped with the package; "
        "hand = the hand-set SSSD fusion; or a node score JSON file",
    )
    draft_threads: Annotated[int, bounds(1, 1024)] = Field(
        default_factory=cpu_count,
        description="native drafting threads per datastore (default: CPUs)",
    )
    max_requests_per_call: Annotated[int, bounds(1, 2**32 - 1)] = Field(
        1024, description="requests per Draft/Finish/Ingest call"
    )
    max_tokens_per_request: Annotated[int, bounds(1, 2**32 - 1)] = Field(
        1_048_576, description="tokens one request may hold"
    )
    max_budget: Annotated[int, bounds(1, 2**31 - 1)] = Field(
        256, description="largest draft budget (tree nodes)"
    )
    max_message_bytes: Annotated[int, bounds(1024, 2**31 - 1)] = Field(
        64 << 20, description="largest gRPC message, in bytes"
    )
    inline_max_work: Annotated[int, bounds(0)] = Field(
        256,
        description="a call's native work runs on the event loop thread (no thread hand-offs) "
        "when nothing else is queued and it weighs at most this many requests (1 each, +1 per "
        "64 budget nodes, 8 tokens added or 8 requests stopped; ~12 µs each on 2 cores; 0 = "
        "always hand off)",
    )
    max_inflight_calls: AtLeastOne = Field(
        64, description="calls and stream steps queued or running; beyond: RESOURCE_EXHAUSTED"
    )
    max_concurrent_rpcs: Annotated[int, bounds(0)] = Field(
        0,
        description="RPCs open at once, open streams included; beyond, calls wait in gRPC's "
        "core (max_pending_rpcs) and are refused there, the cheapest refusal. 0 = no limit. "
        "Under floods of unary Draft calls: a few calls plus the streams expected (a stream "
        "past it waits). With 4 at 10x overload, light calls kept 0.62 of capacity (0.55 "
        "without), heavy ones 0.80 (0.84, noise; docs/benchmarks.md, Goodput under overload)",
    )
    max_pending_rpcs: Annotated[int, bounds(0)] = Field(
        128,
        description="calls gRPC has received but the service not yet taken up (streams "
        "excluded); beyond, gRPC's core refuses them before Python (CANCELLED or "
        "RESOURCE_EXHAUSTED), from half of it on at random (random early detection). "
        "gRPC's own bound, 3,000 calls, lets them wait past their deadlines (0.15 of "
        "capacity left at 10x overload; docs/benchmarks.md). 0 = gRPC's (1,000 / 3,000)",
    )
    max_queue_ms: PositiveSeconds = Field(
        250.0,
        description="drafting work queued ahead of a Draft call, at most (its weight at the "
        "measured speed); beyond: RESOURCE_EXHAUSTED, before the message is parsed. A call "
        "that cannot be answered within its deadline is refused DEADLINE_EXCEEDED, one past "
        "it before its turn skipped. It bounds the recovery after a flood (0.24 s at 250, "
        "0.78 s at 1000, at 10x overload)",
    )
    request_ttl_s: PositiveSeconds = Field(
        600.0, description="request state idle this long is dropped"
    )
    max_request_states: AtLeastOne = Field(
        100_000, description="request states kept (least recent dropped)"
    )
    max_request_state_bytes: Annotated[int, bounds(1 << 20)] = Field(
        4 << 30,
        description="memory request states may hold, as measured (12-640 bytes a context "
        "token by how much it repeats, +96 with the recent tier; least recent dropped); a "
        "call that alone may need more (up to 1,480 bytes a new token, 1,288 without the "
        "tier): RESOURCE_EXHAUSTED",
    )
    grace_period_s: Seconds = Field(5.0, description="shutdown grace for in-flight calls")
    ingest_queue_size: AtLeastOne = Field(
        1024, description="finished generations waiting to be stored"
    )
    background_nice: Annotated[int, bounds(0, MAX_NICE)] = Field(
        0,
        description="nice value of the threads that store, rebuild, snapshot and follow the "
        "shared log (Linux): 19 lets drafting run first on cores of its own; on a machine "
        "shared with busy processes it starves them (0 = as drafting)",
    )
    keepalive_time_s: PositiveSeconds = Field(
        30.0, description="interval of server keepalive pings"
    )
    keepalive_timeout_s: PositiveSeconds = Field(10.0, description="wait for a keepalive ack")
    keepalive_min_ping_interval_s: Seconds = Field(5.0, description="shortest client ping interval")
    keepalive_permit_without_calls: Bool = Field(True, description="pings allowed with no call")
    # The live datastore's policy: LivePolicy's fields, checked by it (live_policy).
    rebuild_min_tokens: int = Field(1_000_000, description="live: rebuild once this many wait")
    rebuild_interval_s: float = Field(60.0, description="live: or this often with any waiting")
    rebuild_max_share: float = Field(
        0.01,
        description="live: or sooner while a rebuild takes at most this share of the time "
        "since the last (at least 1 s apart; 0 = only the two rules above)",
    )
    snapshot_interval_s: float = Field(900.0, description="live: snapshot period (0 = never)")
    keep_snapshots: int = Field(2, description="live: complete snapshots kept")
    max_sub_indices: int = Field(8, description="live: sub-indices kept (oldest dropped)")
    max_sub_index_tokens: int = Field(512_000_000, description="live: positions per sub-index")
    max_resident_bytes: Annotated[int | None, BeforeValidator(none_text)] = Field(
        None, description="live: datastore memory bound in bytes"
    )
    store: Annotated[Literal["output", "prompt+output"], BeforeValidator(check_live_store)] = Field(
        "output", description="live: what a finished generation stores (output|prompt+output)"
    )
    prompt_context_tokens: int = Field(3, description="live: prompt tokens kept before an output")
    finish_durable: Bool = Field(
        False,
        description="every Finish answers once its generations are in the ingest log "
        "(fsynced; FinishResponse.durable counts them), as wait_durable asks per call; "
        "without either, a Finish acknowledges queued generations",
    )
    salvage: Bool = Field(
        False,
        description="start despite damaged data (a corrupt ingest log record, an unreadable "
        "newest snapshot), moving the damaged files into DATA_DIR/damaged; without it such "
        "damage refuses to start, naming what would be lost",
    )
    log_level: Annotated[str, AfterValidator(check_log_level)] = Field(
        "INFO", description="logging level"
    )
    metrics_port: OptionalPort = Field(
        9400, description="Prometheus /metrics port (0 = pick a free port, -1 = disabled)"
    )
    metrics_host: Annotated[Host | None, BeforeValidator(none_text)] = Field(
        None, description="Prometheus /metrics address (default: --host)"
    )
    admin_port: OptionalPort = Field(
        8400, description="REST admin API port (0 = pick a free port, -1 = disabled)"
    )
    admin_host: Host = Field("127.0.0.1", description="REST admin API address")
    admin_token_file: Path | None = Field(
        None,
        description="file holding the admin bearer token (else env DRAFTER_ADMIN_TOKEN; "
        "without one, admin calls that change anything are refused)",
    )
    grpc_tokens_file: Path | None = Field(
        None,
        description="gRPC bearer tokens, one client per line 'NAME TOKEN': every "
        "DrafterService call must carry one (UNAUTHENTICATED otherwise) and each client's "
        "request ids are its own (docs/guarantees.md)",
    )
    tls_cert_file: Path | None = Field(
        None, description="gRPC server certificate (PEM); with --tls-key-file"
    )
    tls_key_file: Path | None = Field(None, description="gRPC server private key (PEM)")
    tls_client_ca_file: Path | None = Field(
        None,
        description="CA (PEM) whose client certificates are required (mutual TLS); without "
        "--grpc-tokens-file the certificate's common name names the client",
    )
    recent_scope: Literal["datastore", "client"] = Field(
        "datastore",
        description="whose requests in flight the recent tier drafts from: its datastore's "
        "(datastore) or its own client's (client; needs --grpc-tokens-file or "
        "--tls-client-ca-file). Stored generations are shared either way",
    )
    corpora_dir: Path | None = Field(
        None, description="directory whose corpus files the admin API may add (unset: none)"
    )
    # Scale-out (docs/scale-out.md): replicas that learn as one.
    shared_log: Annotated[str | None, BeforeValidator(none_text)] = Field(
        None,
        description="redis:// or rediss:// URL of the shared ingest stream every replica "
        "appends to and takes from (unset: this replica learns alone)",
    )
    shared_log_password_file: Path | None = Field(
        None, description="file holding the shared log server's password"
    )
    shared_log_prefix: str = Field(
        "sssd-drafter", description="shared log key prefix (datastore NAME's stream: PREFIX:NAME)"
    )
    shared_log_retention: Annotated[int, bounds(0)] = Field(
        1_000_000, description="shared log entries kept per stream, about (0 = all)"
    )
    bootstrap_peers: Annotated[tuple[str, ...], BeforeValidator(urls)] = Field(
        (),
        description="admin API URLs of peers (http[s]://host:port, comma-separated; a host of "
        "several addresses counts as each): with no snapshot of its own, the live datastore "
        "starts from the newest peer snapshot, then the shared log after it",
    )

    @model_validator(mode="after")
    def _check_together(self) -> ServeConfig:
        self.live_policy()  # raises ValueError naming a bad live knob
        self.draft_settings()  # raises ValueError naming a bad drafting knob
        if self.node_score not in NODE_SCORE_CHOICES:
            read_node_score(self.node_score)  # raises NodeScoreError naming the file
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("ServeConfig.tls_cert_file and tls_key_file go together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("ServeConfig.tls_client_ca_file needs tls_cert_file/tls_key_file")
        if (self.recent_scope == "client" and self.grpc_tokens_file is None
                and self.tls_client_ca_file is None):  # fmt: skip
            raise ValueError(
                "ServeConfig.recent_scope 'client' needs clients told apart: grpc_tokens_file "
                "or tls_client_ca_file"
            )
        self.shared_log_config()  # raises ValueError naming a bad URL or prefix
        return self

    def shared_log_config(self) -> SharedLogConfig | None:
        """Where the shared ingest stream lives (None: no shared log)."""
        if self.shared_log is None:
            return None
        return SharedLogConfig(
            self.shared_log,
            prefix=self.shared_log_prefix,
            retention=self.shared_log_retention,
            password_file=self.shared_log_password_file,
        )

    def draft_settings(self) -> DraftConfig:
        """The drafting parameters: DraftConfig defaults, max_budget, then --draft-config
        (the node score is each datastore's: :func:`resolve_node_score`)."""
        values: dict[str, Any] = {"max_budget": self.max_budget}
        for key, text in self.draft_config:
            if key == "max_budget":
                raise ValueError("ServeConfig.draft_config: set max_budget with --max-budget")
            try:
                values[key] = config_field_value(key, text)
            except ValueError as exc:
                raise ValueError(f"ServeConfig.draft_config: {exc}") from None
        return DraftConfig(**values)

    def live_policy(self) -> LivePolicy:
        """The live datastore's policy: the settings of its fields' names."""
        return LivePolicy(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LivePolicy)})

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per field (``--max-budget``), and ``--config-file``; unset flags stay None."""
        for name, info in cls.model_fields.items():
            parser.add_argument(
                flag_name(name),
                dest=name,
                action="append" if name in REPEATED_FLAGS else "store",
                metavar=REPEATED_FLAGS[name][1] if name in REPEATED_FLAGS else None,
                help=f"{info.description} [env {env_name(name)}]",
            )
        parser.add_argument(
            "--config-file",
            metavar="PATH",
            help="TOML file of settings, a key per flag above in its field form "
            '(max_budget = 64, datastores = {code = "/srv/code"}); variables and flags '
            f"override it [env {CONFIG_FILE_ENV}]",
        )

    @classmethod
    def from_namespace(
        cls, namespace: argparse.Namespace, environ: Mapping[str, str] | None = None
    ) -> ServeConfig:
        """Flags over ``DRAFTER_*`` variables (default ``os.environ``) over the settings file
        over defaults; ValueError names the flag, variable or file entry and its value."""
        environ = os.environ if environ is None else environ
        return read_settings(cls.model_validate, cls.model_fields, namespace, environ)
