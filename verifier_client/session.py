"""The pure half of a drafter client, shared by the sync and asyncio ones: everything a step
does but the call. A step is ``begin`` (records the commits, asks the breaker, picks the
budgets, builds the message) → the client's call → ``complete`` (applies the answer) or
``fail`` (marks the step's requests for a whole resend, counts the fallback).

RESYNCed requests are resent whole within the same step when at least a quarter of its
deadline is left (``resync_retry``), so they draft this very step: after a drafter restart
every request resyncs at once. Otherwise, or if that resend fails, they go with the next.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import cast

from sssd_drafter.v1 import drafter_pb2 as pb
from verifier_client.breaker import CircuitBreaker
from verifier_client.budget import BudgetRule
from verifier_client.deltas import (
    DeltaTracker,
    ProtocolError,
    RequestState,
    as_token_list,
    checked_commits,
    finish_tail,
)
from verifier_client.pending_work import IngestWork, Work, plan_abort, plan_finish
from verifier_client.results import ClientStats, Outcome, StepResult

__all__ = ["DraftSession", "StepPlan"]

_RETRY_MIN_FRACTION = 0.25  # resend resynced requests at once only with this much deadline left


@dataclass(slots=True)
class StepPlan:
    """One DraftRequest ready to go, and what to do with its answer."""

    step: int  # the decode step (StepResult.step)
    message: pb.DraftRequest  # its ``step`` field is the message sequence number
    sent: list[RequestState]
    request_ids: tuple[str, ...]
    deadline_s: float  # absolute, on the clock given to begin()
    budget_of: Mapping[str, int] | None
    default_budget: int
    refused: list[str]  # ids left out: they hold what the drafter would refuse
    base: StepResult | None = None  # set on a resync resend: the step's result so far


@dataclass(kw_only=True, eq=False)
class DraftSession:
    """Delta tracking, budgets, breaker and counters of one client."""

    deadline_s: float
    budget: BudgetRule
    breaker: CircuitBreaker
    tokenizer_fingerprint: str = ""
    resync_retry: bool = True
    # True: begin() gets checked_commits' lists (a replica set checks its steps' input).
    checked_by_caller: bool = False

    def __post_init__(self) -> None:
        if not self.deadline_s > 0:
            raise ValueError(f"deadline must be > 0, got {self.deadline_s * 1e3} ms")
        self.stats = ClientStats()
        self.tracker = DeltaTracker(self.stats)
        self.max_budget: int | None = None  # the drafter's limit, once known
        self.max_per_call = 1024  # requests per Finish / sequences per Ingest call
        self._read_only: frozenset[str] = frozenset()  # datastores that store nothing
        self._sequence = 0  # DraftRequest.step of the last message built

    def adopt_service_info(self, info: pb.GetServiceInfoResponse) -> None:
        """Checks the tokenizer and takes the drafter's limits and read-only datastores."""
        theirs, ours = info.tokenizer.fingerprint, self.tokenizer_fingerprint
        if theirs and ours and theirs != ours:
            raise ValueError(f"tokenizer mismatch: client {ours}, drafter {theirs}")
        self.max_budget = info.limits.max_budget or None
        self.max_per_call = info.limits.max_requests_per_call or self.max_per_call
        self.tracker.adopt_limits(info)
        read_only = {d.name for d in info.datastores if not d.live}
        read_only |= {"" for d in info.datastores if d.is_default and not d.live}
        self._read_only = frozenset(read_only)

    # --- lifecycle (planning only; the clients send the work in the background)

    def finish(
        self,
        request_id: str,
        tail: Iterable[int],
        store: bool,
        durable: bool = False,
        output: Iterable[int] | None = None,
    ) -> list[Work]:
        """Stops tracking a finished request; the work that ends it (``tail``, ``output``: see
        finish_tail; on its ValueError the request is still tracked)."""
        tail = finish_tail(self.tracker.get(request_id), tail, output)
        state = self.tracker.finish(request_id)
        stored = store and state.store and state.datastore not in self._read_only
        return plan_finish(state, tail, stored, durable)

    def abort(self, request_id: str) -> list[Work]:
        """Stops tracking a cancelled request; returns the work that frees it."""
        return plan_abort(self.tracker.finish(request_id))

    @staticmethod
    def ingest(sequences: Iterable[Iterable[int]], datastore: str) -> list[Work]:
        """The work that adds ``sequences`` to ``datastore``."""
        tokens = [as_token_list(s, "ingested sequence") for s in sequences]
        return [IngestWork(datastore, [s for s in tokens if s])]

    # --- one step

    def begin(
        self, commits: Mapping[str, Iterable[int]], budgets: Mapping[str, int] | None, now_s: float
    ) -> StepPlan | StepResult:
        """Records the commits (checked first unless ``checked_by_caller``); returns the plan
        to send, or the result if there is none (circuit open, or nothing to draft)."""
        if not self.checked_by_caller:
            commits = checked_commits(self.tracker.states, commits, budgets)
        self.tracker.commit_many(cast("Mapping[str, list[int]]", commits))  # lists once checked
        stats = self.stats
        stats.steps += 1
        request_ids = tuple(commits)
        if not self.breaker.admit(now_s):  # when it turned HALF_OPEN the client sends a probe
            stats.fallbacks[Outcome.BREAKER_OPEN] += 1
            return StepResult.without_drafts(stats.steps, Outcome.BREAKER_OPEN, request_ids)
        default_budget, budget_of = self.budget.draft_budget(len(request_ids)), budgets
        if (cap := self.max_budget) is not None:  # the drafter's limit
            default_budget = min(default_budget, cap)
            if budgets and any(b > cap for b in budgets.values()):
                budget_of = {rid: min(b, cap) for rid, b in budgets.items()}
        if not default_budget and not (budget_of and any(budget_of.get(r, 0) for r in request_ids)):
            # No request may draft (a tree would not pay): sending would only add a round
            # trip. The next step that drafts (deltas hold all since the last answer) or the
            # finish carries the tokens.
            stats.unsent_steps += 1
            return StepResult(stats.steps, Outcome.OK, request_ids, {}, {})
        message, sent, refused = self._build(request_ids, budget_of, default_budget)
        if sent:
            return StepPlan(stats.steps, message, sent, request_ids, now_s + self.deadline_s,
                            budget_of, default_budget, refused)  # fmt: skip
        # Nothing to send: empty contexts (no draft yet) and refused requests.
        return StepResult(stats.steps, Outcome.OK, request_ids, {}, _outcomes((), refused))

    def complete(
        self, plan: StepPlan, response: pb.DraftResponse, now_s: float
    ) -> tuple[StepResult, StepPlan | None]:
        """Applies an answer; returns the result and, maybe, a resync resend to make now."""
        try:
            trees, resynced = self.tracker.apply(response, plan.sent)
        except ProtocolError:
            return self.fail(plan, Outcome.ERROR, now_s), None
        stats = self.stats
        stats.resyncs += len(resynced)
        base = plan.base
        if base is not None:  # a resync resend: merge into the step's result
            refused = [r for r, o in base.request_outcomes.items() if o is Outcome.ERROR]
            outcomes = _outcomes(resynced, [*refused, *plan.refused])
            drafts = {**base.drafts, **trees}
            return StepResult(plan.step, Outcome.OK, plan.request_ids, drafts, outcomes), None
        self.breaker.record_success()
        stats.drafted_steps += 1
        outcomes = _outcomes(resynced, plan.refused)
        result = StepResult(plan.step, Outcome.OK, plan.request_ids, trees, outcomes)
        left_s = plan.deadline_s - now_s
        if resynced and self.resync_retry and left_s >= _RETRY_MIN_FRACTION * self.deadline_s:
            stats.resync_retries += len(resynced)
            message, sent, refused = self._build(resynced, plan.budget_of, plan.default_budget)
            return result, replace(plan, message=message, sent=sent, refused=refused, base=result)
        return result, None

    def fail(self, plan: StepPlan, outcome: Outcome, now_s: float) -> StepResult:
        """The answer did not come: the step's requests go whole next time (as built)."""
        if plan.base is not None:  # a failed resync resend: the step itself succeeded
            return plan.base
        self.breaker.record_failure(now_s)
        self.stats.fallbacks[outcome] += 1
        return StepResult.without_drafts(plan.step, outcome, plan.request_ids)

    def _build(
        self, send_ids: Iterable[str], budget_of: Mapping[str, int] | None, default_budget: int
    ) -> tuple[pb.DraftRequest, list[RequestState], list[str]]:
        """DeltaTracker.build's deltas in a message with the next sequence number."""
        self._sequence += 1
        packed, sent, refused = self.tracker.build(send_ids, budget_of, default_budget)
        message = pb.DraftRequest(step=self._sequence, packed=packed,
                                  tokenizer_fingerprint=self.tokenizer_fingerprint)  # fmt: skip
        return message, sent, refused


def _outcomes(resynced: Iterable[str], refused: Iterable[str]) -> dict[str, Outcome]:
    """Per-request outcomes of an answered step (only the requests that are not OK)."""
    outcomes = dict.fromkeys(refused, Outcome.ERROR)
    outcomes.update(dict.fromkeys(resynced, Outcome.RESYNC))
    return outcomes

