"""Sticky routing over several drafter replicas: one DrafterClient per replica, each request
owned by one of them (issue 14, item 3).

Targets are a list of ``host:port`` (a fixed set), or one ``host:port`` whose name
resolves to a replica per address (a Kubernetes headless Service), resolved again in
a background thread every ``resolve_interval_s``; a new address joins once it answers
GetServiceInfo, a vanished one leaves, and a failed lookup keeps the last set. With
``credentials``, the name is the TLS target name of every address
(``grpc.ssl_target_name_override``), so certificates issued for the Service verify.

Ownership is rendezvous (highest-random-weight) hashing: a request belongs to the
usable replica (present, breaker closed) whose keyed blake2b of the request id weighs
most (:func:`rendezvous_owner`), the same in every process. A replica leaving moves
only its own requests; when it comes back they move back. A request's context lives
once, in its owner's DrafterClient (which keeps it for RESYNC anyway); a move hands it
to the new owner's client whole (sent with its next step, known length 0) and aborts
it on the old one. With no replica usable, requests stay where they are (their
breakers answer at once); with no replica at all, they wait here for one.

A step splits the commits by owner and runs every replica's step at once, one worker
thread per replica (the largest share runs on the caller's thread: with one replica
there is no thread hop), all under one absolute deadline: the client's ``deadline_ms``
from the step's entry. It returns by that deadline plus a millisecond; a replica that
is slow, down or refused loses the drafts of its own requests only. The merged
:class:`StepResult`: ``outcome`` is OK when some replica answered or nothing had to be
sent, and each request that got no draft has its reason in ``request_outcomes``
(DEADLINE, UNAVAILABLE, BREAKER_OPEN or ERROR from its replica; RESYNC as ever); when
no replica answered it is the step's outcome, the first of DEADLINE, UNAVAILABLE,
ERROR, BREAKER_OPEN that some request had. Budgets come from the whole batch's size.

Not thread-safe, like DrafterClient: the decode loop's thread calls everything but
``ingest`` and the counters. A replica's client is touched by one thread at a time:
its worker during a step, else the caller, after that step ended (it always does, by
its deadline).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from itertools import count
from time import perf_counter
from typing import Any, Literal, TypedDict, Unpack

import grpc

from sssd_drafter.v1 import drafter_pb2 as pb
from verifier_client.breaker import BreakerConfig, BreakerState
from verifier_client.budget import BudgetRule
from verifier_client.channel import ChannelOptions
from verifier_client.client import DrafterClient
from verifier_client.deltas import DeltaTracker, RequestState, as_token_list, finish_tail
from verifier_client.replica_targets import (
    ReplicaResolver,
    parse_target,
    rendezvous_owner,
    replica_key,
    resolve_target,
    weight,
)
from verifier_client.results import ClientStats, Outcome, StepResult, Tree

__all__ = ["ClientOptions", "ReplicaSetClient", "parse_target", "rendezvous_owner",
           "resolve_target"]  # fmt: skip

log = logging.getLogger(__name__)

_MARGIN_S = 0.001  # past the deadline, for the replicas' own deadline checks to return
_INT32_MAX = 2**31 - 1
# When nothing answered, the step's outcome: the first of these some request had.
_PRECEDENCE = (Outcome.DEADLINE, Outcome.UNAVAILABLE, Outcome.ERROR, Outcome.BREAKER_OPEN)


class ClientOptions(TypedDict, total=False):
    """DrafterClient's keyword arguments (documented there), given to every replica's."""

    deadline_ms: float
    mode: Literal["stream", "unary"]
    budget: BudgetRule | None
    tokenizer_fingerprint: str
    channel_options: ChannelOptions
    credentials: grpc.ChannelCredentials | None
    token: str | None
    ingest_queue_size: int
    breaker: BreakerConfig | None
    resync_retry: bool
    background_timeout_s: float
    probe_timeout_s: float


class _ReplicaClient(DrafterClient):
    """A DrafterClient whose steps also end by a deadline shared with the other
    replicas', and that hands a request's context over when it moves."""

    def step_by(
        self, commits: Mapping[str, list[int]], budgets: Mapping[str, int], deadline_s: float
    ) -> StepResult:
        """``step``, with every wait ending by ``deadline_s`` (perf_counter) at the latest."""
        io = self._begin_step(commits, budgets)
        while not isinstance(io, StepResult):
            io.deadline_s = min(io.deadline_s, deadline_s)
            io = self._advance(io, self._io(io))
        return io

    def hand_over(self, request_id: str) -> RequestState:
        """Stops tracking ``request_id`` (aborted on this replica); its last state."""
        state = self._session.tracker.get(request_id)
        self.abort(request_id)
        return state

    def record(self, commits: Mapping[str, list[int]]) -> None:
        """Records commits without drafting (ones held while a step ran late)."""
        self._session.tracker.commit_many(commits)


@dataclass(eq=False, slots=True)
class _Replica:
    address: str
    key: bytes  # replica_key(address)
    client: _ReplicaClient
    worker: ThreadPoolExecutor  # one thread: this replica's steps, in order
    busy: Future[Any] | None = None  # its last work on the worker, until seen done
    held: dict[str, list[int]] = field(default_factory=dict)  # commits of a step it missed


class _NoReplica(grpc.RpcError):  # type: ignore[misc]
    """wait_ready's error when there is no replica to ask."""

    def __init__(self, details: str) -> None:
        super().__init__(details)
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details


class ReplicaSetClient:
    """DrafterClient's surface over several replicas (see the module docstring).

    Args:
        targets: ``["host:port", ...]``, a fixed set; or one ``"host:port"`` whose name
            resolves to the replicas (a headless Service), looked up again in the
            background every ``resolve_interval_s``.
        options: DrafterClient's keyword arguments, for every replica's client.
    """

    def __init__(
        self,
        targets: str | Sequence[str],
        *,
        resolve_interval_s: float = 5.0,
        **options: Unpack[ClientOptions],
    ) -> None:
        unknown = sorted(set(options) - set(ClientOptions.__annotations__))
        if unknown:
            raise TypeError(f"ReplicaSetClient got unexpected keyword argument(s) {unknown}")
        deadline_ms = options.get("deadline_ms", 3.0)
        if not (isinstance(deadline_ms, int | float) and deadline_ms > 0):
            raise ValueError(f"deadline_ms must be a number > 0, got {deadline_ms!r}")
        if not (isinstance(resolve_interval_s, int | float) and resolve_interval_s > 0):
            raise ValueError(f"resolve_interval_s must be > 0, got {resolve_interval_s!r}")
        self._options = options
        self._deadline_s = deadline_ms / 1e3
        self._budget = options.get("budget") or BudgetRule.for_gpu("h100-sxm")
        self._replicas: dict[str, _Replica] = {}  # by address
        self._usable: tuple[str, ...] = ()  # addresses usable at the last _sync
        self._spread: tuple[_Replica, ...] = ()  # where ingest goes (read from any thread)
        self._owner: dict[str, _Replica | None] = {}  # live request -> its replica, or none
        self._orphans = DeltaTracker()  # requests while no replica exists
        self._own = ClientStats()  # this client's steps, and work dropped with no replica
        self._retired = ClientStats()  # the counters of replicas gone
        self._ingest_turn = count()
        self.moves = 0  # requests handed from one replica (or none) to another
        self._closed = False
        self._resolver = ReplicaResolver(targets, self._new_client, resolve_interval_s,
                                         options.get("probe_timeout_s", 1.0))  # fmt: skip
        for address in self._resolver.addresses:
            self._add_replica(address, self._new_client(address))
        self._sync()
        self._resolver.start()

    # --- what the decode loop sees

    @property
    def replicas(self) -> tuple[str, ...]:
        """The replicas' addresses, as of the last step."""
        return tuple(self._replicas)

    @property
    def breaker_state(self) -> dict[str, BreakerState]:
        """Each replica's circuit breaker state, by address."""
        return {a: r.client.breaker_state for a, r in self._replicas.items()}

    def replica_of(self, request_id: str) -> str | None:
        """The address of the replica that holds ``request_id`` (None: no replica yet)."""
        owner = self._owner_of(request_id)
        return None if owner is None else owner.address

    def replica_stats(self) -> dict[str, ClientStats]:
        """Each present replica's own DrafterClient counters, by address."""
        return {a: r.client.stats for a, r in self._replicas.items()}

    @property
    def stats(self) -> ClientStats:
        """The replicas' counters summed (those gone too, as of their removal), except
        ``steps``, ``drafted_steps`` and ``fallbacks``, which count this client's steps
        (a step is drafted when some replica answered). A fresh object on each read."""
        total = ClientStats()
        for stats in (self._retired, *(r.client.stats for r in tuple(self._replicas.values()))):
            _add_stats(total, stats)
        total.steps, total.drafted_steps = self._own.steps, self._own.drafted_steps
        total.fallbacks = dict(self._own.fallbacks)
        total.ingest_drops += self._own.ingest_drops
        return total

    def wait_ready(self, timeout_s: float = 10.0) -> pb.GetServiceInfoResponse:
        """Connects to every replica at once (up to ``timeout_s``; a name is resolved
        first if it had no address yet); returns the first one's service info. Raises
        ValueError when a replica refuses the tokenizer, grpc.RpcError when none answers."""
        end_s = perf_counter() + timeout_s
        if not self._replicas and self._resolver.name is not None:
            self._resolver.refresh(timeout_s)
        self._sync()
        calls = []
        for replica in self._replicas.values():
            self._idle(replica)
            left_s = max(0.0, end_s - perf_counter())
            replica.busy = replica.worker.submit(replica.client.wait_ready, left_s)
            calls.append(replica.busy)
        if not calls:
            host, port = self._resolver.name or ("", 0)
            raise _NoReplica(f"no drafter replica: {host}:{port} resolves to no address")
        wait(calls)  # each waits for at most timeout_s
        for replica in self._replicas.values():
            replica.busy = None  # its answer is read here, not by _idle
        errors = [e for c in calls if (e := c.exception()) is not None]
        if refused := [e for e in errors if isinstance(e, ValueError)]:
            raise refused[0]
        infos: list[pb.GetServiceInfoResponse] = [c.result() for c in calls if not c.exception()]
        if not infos:
            raise errors[0]
        return infos[0]

    def add_request(
        self,
        request_id: str,
        prompt_ids: Iterable[int],
        *,
        datastore: str = "",
        prompt_length: int | None = None,
    ) -> None:
        """Starts tracking a request on its owner (see DrafterClient.add_request)."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        if request_id in self._owner:
            raise ValueError(f"request_id {request_id!r} is already live")
        self._sync()
        owner = self._rendezvous(request_id, self._usable or tuple(self._replicas))
        if owner is None:
            self._orphans.add(request_id, prompt_ids, datastore, prompt_length)
        else:
            self._idle(owner)
            owner.client.add_request(request_id, prompt_ids, datastore=datastore,
                                     prompt_length=prompt_length)  # fmt: skip
        self._owner[request_id] = owner

    def step(
        self, commits: Mapping[str, Iterable[int]], budgets: Mapping[str, int] | None = None
    ) -> StepResult:
        """Drafts for the requests in ``commits`` (see DrafterClient.step) from their
        replicas at once, all by one deadline from now."""
        if self._closed:
            raise RuntimeError("step() on a closed ReplicaSetClient")
        started_s = perf_counter()
        deadline_s = started_s + self._deadline_s
        checked = self._checked(commits)
        budget_of = self._budgets(checked, budgets)
        self._sync()
        self._own.steps += 1
        work: dict[_Replica, dict[str, list[int]]] = {}
        outcomes: dict[str, Outcome] = {}
        for rid, tokens in checked.items():
            owner = self._owner[rid]
            if owner is None:
                self._orphans.commit(rid, tokens)
                outcomes[rid] = Outcome.UNAVAILABLE
            else:
                work.setdefault(owner, {})[rid] = tokens
        calls: list[tuple[_Replica, dict[str, list[int]]]] = []
        for replica, sub in work.items():
            if self._idle(replica, deadline_s):
                calls.append((replica, sub))
            else:  # its last step is still out (past its deadline): these go with the next
                for rid, tokens in sub.items():
                    replica.held[rid] = [*replica.held.get(rid, ()), *tokens]
                outcomes.update(dict.fromkeys(sub, Outcome.DEADLINE))
        self._let_breakers_probe(work)
        results = self._run(calls, budget_of, deadline_s, outcomes)
        return self._merged(tuple(checked), results, outcomes, started_s)

    def finish(
        self,
        request_id: str,
        *,
        tail: Iterable[int] = (),
        output: Iterable[int] | None = None,
        store: bool = True,
        durable: bool = False,
    ) -> bool:
        """Ends a finished request on its owner (see DrafterClient.finish); False too when
        it had no replica to store it (counted in ``stats.ingest_drops``)."""
        owner = self._owner_of(request_id)
        if owner is None:
            finish_tail(self._orphans.get(request_id), tail, output)
            self._orphans.finish(request_id)
            del self._owner[request_id]
            self._own.ingest_drops += store
            return not store
        self._idle(owner)
        sent = owner.client.finish(
            request_id, tail=tail, output=output, store=store, durable=durable
        )
        del self._owner[request_id]
        return sent

    def abort(self, request_id: str) -> bool:
        """Ends a cancelled request on its owner; nothing is stored."""
        owner = self._owner_of(request_id)
        sent = True
        if owner is None:
            self._orphans.finish(request_id)
        else:
            self._idle(owner)
            sent = owner.client.abort(request_id)
        del self._owner[request_id]
        return sent

    def ingest(self, sequences: Iterable[Iterable[int]], datastore: str = "") -> bool:
        """Adds token sequences through one replica, in turn (a shared log teaches the
        others); any thread may call it. False when there is none (counted)."""
        spread = self._spread
        if not spread:
            for sequence in sequences:
                as_token_list(sequence, "ingested sequence")  # bad input still raises
            self._own.ingest_drops += 1
            return False
        return spread[next(self._ingest_turn) % len(spread)].client.ingest(sequences, datastore)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Waits until every replica sent its queued background work; False on timeout or
        when a call failed since the previous flush (see DrafterClient.flush)."""
        end_s = perf_counter() + timeout_s
        replicas = tuple(self._replicas.values())
        return all([r.client.flush(max(0.0, end_s - perf_counter())) for r in replicas])

    def close(self, timeout_s: float = 5.0) -> None:
        """Stops resolving, sends every replica's queued work (up to ``timeout_s``, all at
        once), then closes them."""
        if self._closed:
            return
        self._closed = True
        self._resolver.close()
        closing = [r.worker.submit(r.client.close, timeout_s) for r in self._replicas.values()]
        wait(closing)
        for replica in self._replicas.values():
            replica.worker.shutdown()

    def __enter__(self) -> ReplicaSetClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- a step's parts

    def _checked(self, commits: Mapping[str, Iterable[int]]) -> dict[str, list[int]]:
        """The commits as lists; KeyError or ValueError (naming the request) before any
        replica records anything."""
        owner = self._owner
        if not owner.keys() >= commits.keys():
            missing = [rid for rid in commits if rid not in owner]
            raise KeyError(f"unknown request_id(s) {missing[:5]!r}: add them first")
        checked: dict[str, list[int]] = {}
        for rid, tokens in commits.items():
            if type(tokens) is not list or (
                tokens and (min(tokens) < 0 or max(tokens) > _INT32_MAX)
            ):
                tokens = as_token_list(tokens, f"commit of {rid!r}")
            checked[rid] = tokens
        return checked

    def _budgets(
        self, checked: Mapping[str, list[int]], budgets: Mapping[str, int] | None
    ) -> dict[str, int]:
        """Every request's budget: the rule's for the whole batch (each replica sees only
        its share), unless ``budgets`` names one."""
        default = self._budget.draft_budget(len(checked))
        if budgets is None:
            return dict.fromkeys(checked, default)
        for rid, budget in budgets.items():
            if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
                raise ValueError(f"budget of {rid!r} must be an int >= 0, got {budget!r}")
        return {rid: budgets.get(rid, default) for rid in checked}

    def _let_breakers_probe(self, work: Mapping[_Replica, object]) -> None:
        """An open breaker probes only from a step: a replica left without requests gets
        an empty one (no I/O but the probe it may start)."""
        for replica in self._replicas.values():
            if (replica not in work and replica.client.breaker_state is not BreakerState.CLOSED
                    and self._idle(replica, 0.0)):  # fmt: skip
                replica.client.step({})

    def _run(
        self,
        calls: list[tuple[_Replica, dict[str, list[int]]]],
        budget_of: Mapping[str, int],
        deadline_s: float,
        outcomes: dict[str, Outcome],
    ) -> list[StepResult]:
        """The replicas' steps, the largest on this thread; the requests of those that
        are not back by the deadline get DEADLINE."""
        if not calls:
            return []
        calls.sort(key=lambda call: len(call[1]))
        args = [(sub, {rid: budget_of[rid] for rid in sub}, deadline_s) for _, sub in calls]
        for (replica, _), (sub, budgets, _) in zip(calls[:-1], args[:-1], strict=True):
            replica.busy = replica.worker.submit(replica.client.step_by, sub, budgets, deadline_s)
        results = [calls[-1][0].client.step_by(*args[-1])]
        futures = [replica.busy for replica, _ in calls[:-1] if replica.busy is not None]
        if futures:
            wait(futures, timeout=max(0.0, deadline_s + _MARGIN_S - perf_counter()))
        for replica, sub in calls[:-1]:
            future = replica.busy
            if future is not None and future.done():
                replica.busy = None
                results.append(future.result())  # a bug's exception is raised here
            else:  # still out: its client is not touched until it is back (_idle)
                outcomes.update(dict.fromkeys(sub, Outcome.DEADLINE))
        return results

    def _merged(
        self,
        request_ids: tuple[str, ...],
        results: list[StepResult],
        outcomes: dict[str, Outcome],
        started_s: float,
    ) -> StepResult:
        """One StepResult of the replicas' (see the module docstring)."""
        drafts: dict[str, Tree] = {}
        answered = False
        for result in results:
            if result.ok:
                drafts.update(result.drafts)
                outcomes.update(result.request_outcomes)
                answered = answered or bool(result.drafts or result.request_outcomes)
            else:
                outcomes.update(dict.fromkeys(result.request_ids, result.outcome))
        own, step = self._own, self._own.steps
        wait_s = perf_counter() - started_s
        failed = {o for o in outcomes.values() if o in _PRECEDENCE}
        if not failed or any(r.ok for r in results):
            own.drafted_steps += answered
            return StepResult(step, Outcome.OK, request_ids, drafts, outcomes, wait_s)
        outcome = next(o for o in _PRECEDENCE if o in failed)
        own.fallbacks[outcome] += 1
        result = StepResult.without_drafts(step, outcome, request_ids)
        return dataclasses.replace(result, wait_s=wait_s)

    # --- replicas and their requests

    def _owner_of(self, request_id: str) -> _Replica | None:
        try:
            return self._owner[request_id]
        except KeyError:
            raise KeyError(f"unknown request_id {request_id!r}: add it first") from None

    def _idle(self, replica: _Replica, until_s: float | None = None) -> bool:
        """Waits (up to ``until_s``, perf_counter; None: as long as it takes, which is
        never past its step's deadline) until the replica's worker is done with it, then
        records the commits held for it; False if it is still busy. A late step's result
        is dropped (its counters and delta state are kept)."""
        busy = replica.busy
        if busy is not None:
            timeout = None if until_s is None else max(0.0, until_s - perf_counter())
            if not wait([busy], timeout).done:
                return False
            replica.busy = None
            if (error := busy.exception()) is not None:
                log.error("drafter replica %s: a late step failed: %r", replica.address, error)
        if replica.held:
            held, replica.held = replica.held, {}
            replica.client.record(held)
        return True

    def _rendezvous(self, request_id: str, addresses: Iterable[str]) -> _Replica | None:
        """The owner of ``request_id`` among ``addresses`` (see rendezvous_owner)."""
        rid, replicas = request_id.encode(), self._replicas
        best = max(((weight(rid, replicas[a].key), a) for a in addresses), default=None)
        return None if best is None else replicas[best[1]]

    def _sync(self) -> None:
        """Takes the resolver's news and the breakers' states; moves the requests whose
        owner changed, and retires the replicas gone."""
        gone: list[_Replica] = []
        if (news := self._resolver.news()) is not None:
            addresses, offered = news
            for address, client in offered.items():
                if address in addresses and address not in self._replicas:
                    self._add_replica(address, client)
                else:
                    client.close(0)
            gone = [r for a, r in self._replicas.items() if a not in addresses]
        closed = BreakerState.CLOSED
        usable = tuple(a for a, r in self._replicas.items()
                       if r not in gone and r.client.breaker_state is closed)  # fmt: skip
        if not gone and usable == self._usable:
            return
        added = not set(usable) <= set(self._usable)
        self._usable = usable
        present = tuple(a for a, r in self._replicas.items() if r not in gone)
        self._spread = tuple(self._replicas[a] for a in usable or present)
        for rid, owner in list(self._owner.items()):
            if owner is not None and owner not in gone and owner.address in usable and not added:
                continue  # its owner still wins: only the usable set's losers move
            if usable:
                target = self._rendezvous(rid, usable)
            elif owner is not None and owner not in gone:
                continue  # nowhere better to go: its breaker answers at once
            else:
                target = self._rendezvous(rid, present)
            if target is not owner:
                self._move(rid, owner, target)
        for replica in gone:
            self._remove_replica(replica)

    def _move(self, request_id: str, source: _Replica | None, target: _Replica | None) -> None:
        """Hands a request, its whole context, from one replica (or none) to another."""
        if source is None:
            state = self._orphans.finish(request_id)
        else:
            self._idle(source)
            state = source.client.hand_over(request_id)
        if target is None:
            self._orphans.add(request_id, state.tokens, state.datastore, state.prompt_length)
        else:
            self._idle(target)
            target.client.add_request(request_id, state.tokens, datastore=state.datastore,
                                      prompt_length=state.prompt_length)  # fmt: skip
        self._owner[request_id] = target
        self.moves += 1

    def _add_replica(self, address: str, client: _ReplicaClient) -> None:
        worker = ThreadPoolExecutor(1, thread_name_prefix=f"drafter-replica-{address}")
        self._replicas[address] = _Replica(address, replica_key(address), client, worker)

    def _remove_replica(self, replica: _Replica) -> None:
        """Drops a replica whose requests have moved; it closes on its own worker."""
        self._idle(replica)
        del self._replicas[replica.address]
        _add_stats(self._retired, replica.client.stats)
        timeout_s = self._options.get("background_timeout_s", 5.0)
        replica.worker.submit(replica.client.close, timeout_s)
        replica.worker.shutdown(wait=False)
        log.info("drafter replica %s left", replica.address)

    def _new_client(self, address: str) -> _ReplicaClient:
        options = self._options.copy()
        name = self._resolver.name
        if name is not None and options.get("credentials") is not None:
            # TLS to an address of a name: the certificate is the name's.
            channel_options = list(options.get("channel_options", ()))
            if not any(key == "grpc.ssl_target_name_override" for key, _ in channel_options):
                channel_options.append(("grpc.ssl_target_name_override", name[0]))
            options["channel_options"] = channel_options
        return _ReplicaClient(address, **options)


def _add_stats(total: ClientStats, stats: ClientStats) -> None:
    """Adds ``stats``' counters into ``total``."""
    for f in dataclasses.fields(ClientStats):
        if f.name == "fallbacks":
            for outcome, n in stats.fallbacks.items():
                total.fallbacks[outcome] += n
        else:
            setattr(total, f.name, getattr(total, f.name) + getattr(stats, f.name))
