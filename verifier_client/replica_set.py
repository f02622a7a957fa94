"""Sticky routing over several drafter replicas (issue 14, item 3): one DrafterClient per
replica; which replica owns each request is ReplicaOwnership's (replica_ownership.py).

A step splits the commits by owner and runs the replicas' steps at once, one worker thread
each (the largest share on the caller's thread: with one replica, no thread hop), all by
one absolute deadline, ``deadline_ms`` from the step's entry; it returns by that deadline
plus a millisecond. A slow, down or refusing replica loses its own requests' drafts only,
each with its reason in ``request_outcomes``. The step is OK when some replica answered or
nothing had to be sent; else its outcome is the first of DEADLINE, UNAVAILABLE, ERROR,
BREAKER_OPEN that some request had. Budgets come from the whole batch's size.

Not thread-safe, like DrafterClient (``ingest`` and the counters excepted). A replica's
client is touched by one thread at a time: its worker during a step, else the caller,
after that step ended (always by its deadline).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import wait
from itertools import count
from time import perf_counter
from typing import Unpack

from sssd_drafter.v1 import drafter_pb2 as pb
from verifier_client.breaker import BreakerState
from verifier_client.budget import BudgetRule
from verifier_client.channel import Unavailable
from verifier_client.deltas import as_token_list, checked_commits
from verifier_client.replica_ownership import ClientOptions, ReplicaClient, ReplicaOwnership, Route
from verifier_client.replica_targets import parse_target, rendezvous_owner
from verifier_client.results import ClientStats, Outcome, StepResult, Tree

__all__ = ["ClientOptions", "ReplicaSetClient", "parse_target", "rendezvous_owner"]

_MARGIN_S = 0.001  # past the deadline, for the replicas' own deadline checks to return
# When nothing answered, the step's outcome: the first of these some request had.
_PRECEDENCE = (Outcome.DEADLINE, Outcome.UNAVAILABLE, Outcome.ERROR, Outcome.BREAKER_OPEN)


class ReplicaSetClient(ReplicaOwnership):
    """DrafterClient's surface over several replicas (see the module docstring).

    Args:
        targets: ``["host:port", ...]``, a fixed set; or one ``"host:port"`` whose name
            resolves to the replicas (a headless Service), looked up again in the
            background every ``resolve_interval_s``.
        route: ``"request"`` (by id, the default) or ``"prompt"``: requests with one prompt
            (parallel samples, RL rollouts) share a replica, so with the drafter's recent
            tier on they draft from each other in flight (docs/scale-out.md).
        options: DrafterClient's keyword arguments, for every replica's client.
    """

    def __init__(
        self,
        targets: str | Sequence[str],
        *,
        resolve_interval_s: float = 5.0,
        route: Route = "request",
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
        self._deadline_s = deadline_ms / 1e3
        self._budget = options.get("budget") or BudgetRule.for_gpu("h100-sxm")
        self._ingest_turn = count()
        super().__init__(targets, options, resolve_interval_s, route)

    @property
    def replicas(self) -> tuple[str, ...]:
        """The replicas' addresses, as of the last step."""
        return tuple(self._replicas)

    @property
    def breaker_state(self) -> dict[str, BreakerState]:
        """Each replica's circuit breaker state, by address."""
        return {a: r.breaker_state for a, r in self._replicas.items()}

    @property
    def stats(self) -> ClientStats:
        """The replicas' counters summed (those gone too, as of their removal), except
        ``steps``, ``drafted_steps`` and ``fallbacks``, which count this client's steps
        (a step is drafted when some replica answered). A fresh object on each read."""
        total = ClientStats()
        for stats in (self._retired, *(r.stats for r in tuple(self._replicas.values()))):
            total.add(stats)
        total.steps, total.drafted_steps = self._own.steps, self._own.drafted_steps
        total.fallbacks = dict(self._own.fallbacks)
        total.ingest_drops += self._own.ingest_drops
        return total

    def wait_ready(self, timeout_s: float = 10.0) -> pb.GetServiceInfoResponse:
        """Connects to every replica at once (up to ``timeout_s``); the first one's service
        info. ValueError when a replica refuses the tokenizer, grpc.RpcError when none answers."""
        end_s = perf_counter() + timeout_s
        name = self._resolver.name
        if not self._replicas and name is not None:
            self._resolver.refresh(timeout_s)  # no replica yet: wait for a first one
        self._sync()
        calls = []
        for replica in self._replicas.values():
            replica.idle()
            left_s = max(0.0, end_s - perf_counter())
            calls.append(replica.worker.submit(replica.wait_ready, left_s))
        if not calls:
            host, port = name or ("", 0)
            raise Unavailable(f"no drafter replica: {host}:{port} resolves to no address")
        wait(calls)  # each waits for at most timeout_s
        errors = [e for c in calls if (e := c.exception()) is not None]
        if refused := [e for e in errors if isinstance(e, ValueError)]:
            raise refused[0]
        infos: list[pb.GetServiceInfoResponse] = [c.result() for c in calls if not c.exception()]
        if not infos:
            raise errors[0]
        return infos[0]

    def step(
        self, commits: Mapping[str, Iterable[int]], budgets: Mapping[str, int] | None = None
    ) -> StepResult:
        """Drafts for the requests in ``commits`` (see DrafterClient.step) from their
        replicas at once, all by one deadline from now."""
        if self._closed:
            raise RuntimeError("step() on a closed ReplicaSetClient")
        started_s = perf_counter()
        deadline_s = started_s + self._deadline_s
        checked = checked_commits(self._owner, commits, budgets)  # before any replica records
        # Every request's budget: the rule's for the whole batch (each replica sees only its
        # share), unless ``budgets`` names one.
        default, given = self._budget.draft_budget(len(checked)), budgets or {}
        budget_of = {rid: given.get(rid, default) for rid in checked}
        self._sync()
        self._own.steps += 1
        work, orphaned = self._by_owner(checked)
        outcomes = dict.fromkeys(orphaned, Outcome.UNAVAILABLE)
        calls: list[tuple[ReplicaClient, dict[str, list[int]]]] = []
        for replica, sub in work.items():
            if replica.idle(deadline_s):
                calls.append((replica, sub))
            else:  # its last step is still out (past its deadline): these go with the next
                for rid, tokens in sub.items():
                    replica.held[rid] = [*replica.held.get(rid, ()), *tokens]
                outcomes.update(dict.fromkeys(sub, Outcome.DEADLINE))
        self._let_breakers_probe(work)
        results = self._run(calls, budget_of, deadline_s, outcomes)
        return self._merged(tuple(checked), results, outcomes, started_s)

    def ingest(self, sequences: Iterable[Iterable[int]], datastore: str = "") -> bool:
        """Adds token sequences through one replica, in turn (a shared log teaches the
        others); any thread may call it. False when there is none (counted)."""
        spread = self._spread
        if not spread:
            for sequence in sequences:
                as_token_list(sequence, "ingested sequence")  # bad input still raises
            self._own.ingest_drops += 1
            return False
        return spread[next(self._ingest_turn) % len(spread)].ingest(sequences, datastore)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Waits until every replica sent its queued background work; False on timeout or
        when a call failed since the previous flush (see DrafterClient.flush)."""
        end_s = perf_counter() + timeout_s
        replicas = tuple(self._replicas.values())
        return all([r.flush(max(0.0, end_s - perf_counter())) for r in replicas])

    def __enter__(self) -> ReplicaSetClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- a step's parts

    def _let_breakers_probe(self, work: Mapping[ReplicaClient, object]) -> None:
        """An open breaker probes only from a step: a replica left without requests gets
        an empty one (no I/O but the probe it may start)."""
        for replica in self._replicas.values():
            if (replica not in work and replica.breaker_state is not BreakerState.CLOSED
                    and replica.idle(0.0)):  # fmt: skip
                replica.step({})

    def _run(
        self,
        calls: list[tuple[ReplicaClient, dict[str, list[int]]]],
        budget_of: Mapping[str, int],
        deadline_s: float,
        outcomes: dict[str, Outcome],
    ) -> list[StepResult]:
        """The replicas' steps, the largest on this thread; the requests of those that
        are not back by the deadline get DEADLINE."""
        if not calls:
            return []
        *others, (largest, its_commits) = sorted(calls, key=lambda call: len(call[1]))
        futures = [r.worker.submit(r.step_by, sub, budget_of, deadline_s) for r, sub in others]
        results = [largest.step_by(its_commits, budget_of, deadline_s)]
        wait(futures, timeout=max(0.0, deadline_s + _MARGIN_S - perf_counter()))
        for (replica, sub), future in zip(others, futures, strict=True):
            if future.done():
                results.append(future.result())  # a bug's exception is raised here
            else:  # still out: its client is not touched until it is back (idle)
                replica.busy = future
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
        for result in results:
            if result.ok:
                drafts.update(result.drafts)
                outcomes.update(result.request_outcomes)
            else:
                outcomes.update(dict.fromkeys(result.request_ids, result.outcome))
        own, step = self._own, self._own.steps
        wait_s = perf_counter() - started_s
        failed = {o for o in outcomes.values() if o in _PRECEDENCE}
        if not failed or any(r.ok for r in results):
            own.drafted_steps += any(r.ok and (r.drafts or r.request_outcomes) for r in results)
            return StepResult(step, Outcome.OK, request_ids, drafts, outcomes, wait_s)
        outcome = next(o for o in _PRECEDENCE if o in failed)
        own.fallbacks[outcome] += 1
        return StepResult.without_drafts(step, outcome, request_ids, wait_s)
