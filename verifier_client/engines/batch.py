"""What every engine plug-in does: settings, and one client kept in step with a batch.

:class:`EngineDrafter` turns an engine's rows of request ids and token buffers into the
client's ``add_request`` / ``step`` / ``finish``, and never raises into the decode loop:
a failure is a step without drafts, logged once per kind and counted. Request ids are
namespaced per engine instance (``<host>-<pid>-<random>/<id>``): engines number their
requests ``0, 1, ...``, and two engines sharing one drafter must not touch each other's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from time import perf_counter
from typing import TYPE_CHECKING, Any, Literal

import grpc

from verifier_client.budget import BudgetRule
from verifier_client.client import DrafterClient
from verifier_client.replica_ownership import Route, check_route
from verifier_client.replica_set import ClientOptions, ReplicaSetClient
from verifier_client.replica_targets import fixed_targets
from verifier_client.results import ClientStats, StepResult, Tree

if TYPE_CHECKING:  # prometheus_client only where metrics are served
    from wsgiref.simple_server import WSGIServer

    from verifier_client.acceptance_metrics import WorkerMetrics

__all__ = [
    "CONFIG_ENV", "STORE_KEY", "DrafterSettings", "EngineDrafter", "may_store",
    "tokenizer_fingerprint",
]  # fmt: skip

log = logging.getLogger(__name__)

CONFIG_ENV = "SSSD_DRAFTER_CONFIG"
"""Environment variable holding the settings as a JSON object (the engine's own
configuration, where it has a place for them, overrides it key by key)."""
STORE_KEY = "sssd_store"
"""A request's opt-out of storage: False under this key of its vLLM ``extra_args`` or
SGLang ``custom_params`` keeps its generation out of the datastore."""


@dataclass(frozen=True, slots=True)
class DrafterSettings:
    """How an engine plug-in reaches and uses the drafting service."""

    address: str = "127.0.0.1:50051"  # host:port of `drafter serve`, or several comma-separated
    # (one replica set: each request drafts on one of them, see verifier_client.replica_set)
    resolve_all: bool = False  # the one address names a headless Service: a replica per IP
    route: Route = "request"  # replicas: place requests by id, or by prompt (siblings together)
    deadline_ms: float = 5.0  # per decode step; past it the step has no drafts
    budget: str = "16"  # draft nodes per request: BudgetRule.parse ("16", "h100", "FLOPS/BW")
    # Engines that verify chains (vLLM): "" = chains of up to the engine's own length at
    # every batch size; a BudgetRule spec ("h100", "h200", "FLOPS/BW") = at most the
    # positions that rule lets the batch verify for free (none past the ridge point).
    chain_rule: str = ""
    chain_min_score: float = 0.0  # a chain ends before a node scored below this (0 = never)
    mode: Literal["stream", "unary"] = "stream"
    datastore: str = ""  # datastore to draft from and store into ("" = the drafter's default)
    store: bool = True  # ingest finished generations (a request can still opt out)
    metrics_port: int | None = None  # serve sssd:spec_decode_* on this port (None = off)
    connect_timeout_s: float = 10.0  # startup wait for the drafter; the engine starts anyway
    token_file: str | None = None  # this engine's bearer token (the drafter's --grpc-tokens-file)
    tls_ca_file: str | None = None  # CA of the drafter's certificate: TLS instead of plaintext
    tls_cert_file: str | None = None  # client certificate (mutual TLS), with tls_key_file
    tls_key_file: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.address, str) or not self.address:
            raise ValueError(f"address must be a non-empty 'host:port', got {self.address!r}")
        if not isinstance(self.resolve_all, bool):
            raise ValueError(f"resolve_all must be true or false, got {self.resolve_all!r}")
        check_route(self.route)
        self.targets()  # ValueError naming a bad address
        _check_positive("deadline_ms", self.deadline_ms)
        _check_positive("connect_timeout_s", self.connect_timeout_s, zero_ok=True)
        BudgetRule.parse(str(self.budget))  # ValueError naming the spec
        if not isinstance(self.chain_rule, str):
            raise ValueError(f"chain_rule must be a string, got {self.chain_rule!r}")
        self.chain_budget_rule()  # ValueError naming the spec
        score = self.chain_min_score
        if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
            raise ValueError(f"chain_min_score must be a number in [0, 1], got {score!r}")
        if self.mode not in ("stream", "unary"):
            raise ValueError(f"mode must be 'stream' or 'unary', got {self.mode!r}")
        if not isinstance(self.datastore, str):
            raise ValueError(f"datastore must be a string, got {self.datastore!r}")
        if not isinstance(self.store, bool):
            raise ValueError(f"store must be true or false, got {self.store!r}")
        for name in ("token_file", "tls_ca_file", "tls_cert_file", "tls_key_file"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a file path or null, got {value!r}")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if self.tls_cert_file is not None and self.tls_ca_file is None:
            raise ValueError("tls_cert_file (mutual TLS) needs tls_ca_file")
        port = self.metrics_port
        if port is not None and (
            not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535
        ):
            raise ValueError(f"metrics_port must be an int in [0, 65535] or null, got {port!r}")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], *, where: str) -> DrafterSettings:
        """Settings from a JSON-like mapping; ``where`` names its source in errors."""
        if not isinstance(mapping, Mapping):
            raise ValueError(f"{where}: expected a JSON object, got {mapping!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(mapping) - known)
        if unknown:
            raise ValueError(f"{where}: unknown setting(s) {unknown} (known: {sorted(known)})")
        values = dict(mapping)
        if "budget" in values:
            values["budget"] = str(values["budget"])  # 16 and "16" alike
        try:
            return cls(**values)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: {err}") from None

    @classmethod
    def resolve(cls, overrides: Mapping[str, Any] | None, *, where: str) -> DrafterSettings:
        """Defaults, then ``$SSSD_DRAFTER_CONFIG`` (a JSON object), then ``overrides``."""
        merged: dict[str, Any] = {}
        text = os.environ.get(CONFIG_ENV, "").strip()
        if text:
            try:
                merged.update(json.loads(text))
            except (json.JSONDecodeError, TypeError, ValueError) as err:
                raise ValueError(f"${CONFIG_ENV} is not a JSON object: {err}") from None
        if overrides:
            merged.update(overrides)
        source = f"{where} and ${CONFIG_ENV}" if text else where
        return cls.from_mapping(merged, where=source)

    def credentials(self) -> tuple[grpc.ChannelCredentials | None, str | None]:
        """TLS credentials and bearer token from the settings' files (ValueError names one
        that cannot be read)."""

        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as exc:
                raise ValueError(f"cannot read {path}: {exc}") from None

        token = read(self.token_file)
        ca = read(self.tls_ca_file)
        tls = None
        if ca is not None:
            key, cert = read(self.tls_key_file), read(self.tls_cert_file)
            tls = grpc.ssl_channel_credentials(ca, key, cert)
        return tls, token.decode().strip() if token is not None else None

    def targets(self) -> str | list[str] | None:
        """What the address names beyond one drafter: a list of ``host:port`` (several,
        comma-separated), the one name to resolve (``resolve_all``), or None (one drafter,
        the address as gRPC takes it)."""
        parts = [part.strip() for part in self.address.split(",")]
        if len(parts) == 1 and not self.resolve_all:
            return None
        if self.resolve_all and len(parts) > 1:
            raise ValueError(f"resolve_all takes one address (a headless Service), got "
                             f"{self.address!r}")  # fmt: skip
        try:
            targets = fixed_targets(parts)  # each a host:port, none twice
        except ValueError as err:
            raise ValueError(f"address {self.address!r}: {err}") from None
        return targets[0] if self.resolve_all else list(targets)

    def budget_rule(self) -> BudgetRule:
        """The budget rule the setting names."""
        return BudgetRule.parse(str(self.budget))

    def chain_budget_rule(self) -> BudgetRule | None:
        """The rule ``chain_rule`` names (None: chains as long as the engine allows)."""
        return BudgetRule.parse(self.chain_rule) if self.chain_rule else None


def _check_positive(name: str, value: object, *, zero_ok: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not (value >= 0 if zero_ok else value > 0):  # type: ignore[operator]
        bound = ">= 0" if zero_ok else "> 0"
        raise ValueError(f"{name} must be a number {bound}, got {value!r}")


TokenSlice = Callable[[int, int, int], Sequence[int]]
"""``tokens(row, start, stop)``: tokens ``start:stop`` of a row's committed context."""


class EngineDrafter:
    """A :class:`DrafterClient` (:class:`ReplicaSetClient` for several drafters or
    ``resolve_all``) kept in step with an engine's batch by request id.

    One thread (the decode loop) calls :meth:`draft` each step, :meth:`release` when the
    engine drops a request and :meth:`close` at shutdown. A drafter whose tokenizer is not
    ``tokenizer_fingerprint`` (sha256 of tokenizer.json) is refused at startup (ValueError).
    ``budget`` replaces the settings' rule (an engine whose verify width caps it). With a
    ``metrics_port`` in the settings, :attr:`metrics` (served there) records every drafter
    call; the engine may record its acceptance there too.
    """

    def __init__(
        self,
        settings: DrafterSettings,
        *,
        tokenizer_fingerprint: str = "",
        budget: BudgetRule | None = None,
    ) -> None:
        self.settings = settings
        self._budget = budget or settings.budget_rule()
        tls, token = settings.credentials()
        options = ClientOptions(
            deadline_ms=settings.deadline_ms, mode=settings.mode, budget=self._budget,
            tokenizer_fingerprint=tokenizer_fingerprint, credentials=tls, token=token,
        )  # fmt: skip
        targets = settings.targets()
        self.client: DrafterClient | ReplicaSetClient = (
            DrafterClient(settings.address, **options)
            if targets is None
            else ReplicaSetClient(targets, route=settings.route, **options)
        )
        self.namespace = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}/"
        self._lengths: dict[str, int] = {}  # live request (namespaced) -> tokens the client holds
        self.errors = 0  # steps whose drafting raised (no drafts; logged once)
        self.round_trips_ms: deque[float] = deque(maxlen=65536)  # recent steps' drafter calls
        self.last_result: StepResult | None = None  # the last draft()'s, None if it failed
        self._error_logged = False
        self.metrics: WorkerMetrics | None = None
        server = None
        if settings.metrics_port is not None:
            self.metrics, server = _served_metrics(settings.metrics_port)
        if settings.connect_timeout_s > 0:
            try:
                self._connect(settings.connect_timeout_s)
            except ValueError:  # refused: give back the client and the port
                self.client.close(0)
                if server is not None:
                    server.shutdown()
                    server.server_close()
                raise

    @property
    def stats(self) -> ClientStats:
        """The client's counters (steps, fallbacks by reason, resyncs, ...)."""
        return self.client.stats

    @property
    def live_requests(self) -> int:
        """Requests the drafter is tracking for this engine."""
        return len(self._lengths)

    def draft(
        self,
        request_ids: Sequence[str],
        num_tokens: Sequence[int],
        prompt_lengths: Sequence[int],
        tokens: TokenSlice,
        budget: int | None = None,
        stores: Sequence[bool] | None = None,
    ) -> list[Tree | None]:
        """One drafter call for the rows; a tree per row (None: no drafts this step).

        Row ``i`` is request ``request_ids[i]``, ``num_tokens[i]`` committed tokens of which
        the first ``prompt_lengths[i]`` are its prompt. ``budget``: draft nodes per row
        instead of the settings' rule (0: nothing sent or awaited; the tokens go with the
        next step that drafts). ``stores``: per row, False for a request that opted out of
        storage (said when first sent, so the drafter never shares it).
        """
        self.last_result = None  # set again only if this call's answer arrives
        commits: dict[str, Sequence[int]] = {}  # each row's tokens past what the client holds
        lengths, client = self._lengths, self.client
        failed = False
        try:
            for row, request_id in enumerate(request_ids):
                key = self.namespace + request_id
                length = int(num_tokens[row])
                known = lengths.get(key)
                try:
                    if known is not None and length >= known:
                        commits[key] = tokens(row, known, length) if length > known else ()
                    else:
                        context = tokens(row, 0, length)
                        if known is not None:
                            # The engine's context shrank (the id was reused for a new
                            # request, or its tokens were rolled back): start over rather
                            # than draft from a context the engine no longer has.
                            del lengths[key]
                            client.abort(key)
                        client.add_request(key, context, datastore=self.settings.datastore,
                                           prompt_length=min(int(prompt_lengths[row]), length),
                                           store=stores is None or stores[row])  # fmt: skip
                        commits[key] = ()
                except Exception:  # left out, unrecorded: the next step finds it as it was
                    if not failed:  # once a step: logged (once ever) and counted
                        self._failed("reading a row's tokens")
                    failed = True
                    continue
                lengths[key] = length
            if not commits:
                return [None] * len(request_ids)
            start = perf_counter()
            budgets = None if budget is None else dict.fromkeys(commits, budget)
            result = client.step(commits, budgets)
            round_trip_s = perf_counter() - start
            self.round_trips_ms.append(round_trip_s * 1e3)
            self.last_result = result
            if self.metrics is not None:  # the budget asked of the drafter, as the client chose it
                asked = budget if budget is not None else self._budget.draft_budget(len(commits))
                self.metrics.record_drafter_call(result, round_trip_s, asked)
            return [result.drafts.get(self.namespace + r) for r in request_ids]
        except Exception:  # never into the decode loop: this step has no drafts
            self._failed("drafting")
            return [None] * len(request_ids)

    def release(
        self, request_id: str, store: bool = True, context: Sequence[int] | None = None
    ) -> None:
        """The engine dropped ``request_id``: finish it, stored unless ``store`` or the
        settings say no. ``context`` (its final prompt + output) adds what it committed
        after its last drafted step."""
        key = self.namespace + request_id
        length = self._lengths.pop(key, None)
        if length is None:
            return  # never drafted (prefill only, or refused before its first step)
        try:
            tail = list(context[length:]) if context is not None else []
            self.client.finish(key, tail=tail, store=store and self.settings.store)
        except Exception:
            self._failed("finishing a request")

    def close(self, timeout_s: float = 5.0) -> None:
        """Sends queued finishes (up to ``timeout_s``) and closes the client."""
        self.client.close(timeout_s)

    def _connect(self, timeout_s: float) -> None:
        try:
            info = self.client.wait_ready(timeout_s)
        except grpc.RpcError as err:
            log.warning(
                "drafter %s not reachable within %.1f s (%s): decoding goes on without "
                "drafts until it is", self.settings.address, timeout_s, err.code(),
            )  # fmt: skip
            return
        except ValueError as err:  # e.g. a tokenizer mismatch: the drafts would be useless
            log.error("drafter %s refused: %s", self.settings.address, err)
            raise
        log.info(
            "drafting from %s (vocabulary %d, deadline %.1f ms, budget %s)",
            self.settings.address, info.tokenizer.vocab_size, self.settings.deadline_ms,
            self.settings.budget,
        )  # fmt: skip

    def _failed(self, what: str) -> None:
        self.errors += 1
        if not self._error_logged:  # once: a broken drafter must not flood the engine's log
            self._error_logged = True
            log.exception("sssd drafter: %s failed; continuing without drafts", what)


def _served_metrics(port: int) -> tuple[WorkerMetrics | None, WSGIServer | None]:
    """The worker's metrics and their server on ``port``; None (logged) when it cannot bind,
    e.g. for a second data-parallel engine on this host: the engine runs on without them."""
    from verifier_client.acceptance_metrics import WorkerMetrics

    metrics = WorkerMetrics()
    try:
        return metrics, metrics.serve(port)
    except OSError as err:
        log.warning("sssd metrics not served on port %d: %s", port, err)
        return None, None


def tokenizer_fingerprint(model_dir: str | os.PathLike[str] | None) -> str:
    """sha256 of ``model_dir``/tokenizer.json; "" when it is not a local file (a hub name)."""
    if model_dir is None:
        return ""
    path = os.path.join(os.fspath(model_dir), "tokenizer.json")
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return ""


def may_store(params: object) -> bool:
    """Whether a request may be stored, given its ``extra_args`` / ``custom_params``."""
    return not (isinstance(params, Mapping) and params.get(STORE_KEY) is False)
