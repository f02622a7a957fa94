"""The pure step logic of verifier_client (DraftSession) and its background work plans."""

from __future__ import annotations

import pytest
from packed import pack_drafts, unpack_deltas

from sssd_drafter.v1 import drafter_pb2 as pb
from verifier_client.breaker import BreakerConfig, BreakerState, CircuitBreaker
from verifier_client.budget import BudgetRule
from verifier_client.deltas import RequestState
from verifier_client.pending_work import (
    MAX_INGEST_TOKENS_PER_CALL,
    FinishWork,
    IngestWork,
    batch_messages,
    reingest_unknown,
)
from verifier_client.results import Outcome, StepResult
from verifier_client.session import DraftSession, StepPlan

DEADLINE_S = 0.004


def session(**kwargs: object) -> DraftSession:
    breaker = CircuitBreaker(BreakerConfig(failure_threshold=2, cooldown_s=1.0), rng=lambda: 0.0)
    return DraftSession(deadline_s=DEADLINE_S, budget=BudgetRule.for_gpu("h100"),
                        breaker=breaker, **kwargs)  # type: ignore[arg-type]  # fmt: skip


def ok_answer(plan: StepPlan, *, resync: tuple[str, ...] = ()) -> pb.DraftResponse:
    drafts = []
    for delta in unpack_deltas(plan.message):
        if delta.request_id in resync:
            drafts.append(pb.RequestDraft(status=pb.DRAFT_STATUS_RESYNC))
        else:
            length = delta.known_length + len(delta.new_tokens)
            drafts.append(pb.RequestDraft(status=pb.DRAFT_STATUS_OK, length=length,
                                          tokens=[1], parents=[-1], scores=[1.0]))  # fmt: skip
    return pack_drafts(drafts, plan.message.step)


def begin(s: DraftSession, commits: dict[str, list[int]], now_s: float = 0.0,
          budgets: dict[str, int] | None = None) -> StepPlan:  # fmt: skip
    plan = s.begin(commits, budgets, now_s)
    assert isinstance(plan, StepPlan)
    return plan


def test_a_step_builds_drafts_and_results() -> None:
    s = session()
    s.tracker.add(RequestState.new("a", [1, 2, 3]))
    s.tracker.add(RequestState.new("b", [4, 5]))
    plan = begin(s, {"a": [9], "b": []})
    assert plan.deadline_s == DEADLINE_S and plan.message.step == 1
    assert [d.budget for d in unpack_deltas(plan.message)] == [32, 32]  # batch 2: capped
    result, retry = s.complete(plan, ok_answer(plan), 0.001)
    assert retry is None and result.ok and list(result) == ["a", "b"]
    assert result["a"] is not None and result.why("b") is Outcome.OK
    assert (s.stats.steps, s.stats.drafted_steps, s.stats.tokens_sent) == (1, 1, 6)


def test_budget_overrides_and_the_drafters_limit() -> None:
    s = session()
    s.adopt_service_info(pb.GetServiceInfoResponse(limits=pb.Limits(max_budget=8)))
    for rid in "abc":
        s.tracker.add(RequestState.new(rid, [1]))
    plan = begin(s, {"a": [], "b": [], "c": []}, budgets={"a": 0, "b": 100})
    assert [d.budget for d in unpack_deltas(plan.message)] == [0, 8, 8]
    with pytest.raises(ValueError, match="budget of 'a' must be an int >= 0"):
        s.begin({"a": []}, {"a": -1}, 0.0)
    with pytest.raises(ValueError, match="budget of 'a' must be an int >= 0, got True"):
        s.begin({"a": []}, {"a": True}, 0.0)  # as the replica set refuses it


def test_failures_mark_for_resend_and_open_the_breaker() -> None:
    s = session()
    s.tracker.add(RequestState.new("a", [1, 2]))
    plan = begin(s, {"a": []})
    s.complete(plan, ok_answer(plan), 0.0)
    plan = begin(s, {"a": [3]})
    result = s.fail(plan, Outcome.DEADLINE, 0.0)
    assert result.outcome is Outcome.DEADLINE and result["a"] is None
    assert result.why("a") is Outcome.DEADLINE
    plan = begin(s, {"a": [4]})
    assert unpack_deltas(plan.message)[0].known_length == 0  # the lost step's request goes whole
    s.fail(plan, Outcome.UNAVAILABLE, 0.0)
    assert s.breaker.state is BreakerState.OPEN
    # Open: commits are still recorded, nothing is built, one probe is asked for.
    sent_before = s.stats.tokens_sent
    for now_s in (0.5, 1.5, 1.6):
        result = s.begin({"a": [5]}, None, now_s)
        assert isinstance(result, StepResult) and result.outcome is Outcome.BREAKER_OPEN
    assert s.breaker.state is BreakerState.HALF_OPEN  # asked once (the client sends it)
    assert s.stats.tokens_sent == sent_before and s.tracker.get("a").tokens == [1, 2, 3, 4, 5, 5, 5]
    assert s.stats.fallbacks == {Outcome.DEADLINE: 1, Outcome.UNAVAILABLE: 1,
                                 Outcome.BREAKER_OPEN: 3, Outcome.ERROR: 0}  # fmt: skip
    s.breaker.record_success()  # the probe came back
    plan = begin(s, {"a": []}, now_s=2.0)
    assert list(unpack_deltas(plan.message)[0].new_tokens) == [1, 2, 3, 4, 5, 5, 5]
    assert s.stats.full_resends == 2


def test_resynced_requests_are_resent_within_the_step() -> None:
    s = session()
    for rid in "ab":
        s.tracker.add(RequestState.new(rid, [1, 2]))
    plan = begin(s, {"a": [], "b": []})
    s.complete(plan, ok_answer(plan), 0.0)
    plan = begin(s, {"a": [3], "b": [3]})
    result, retry = s.complete(plan, ok_answer(plan, resync=("b",)), 0.001)
    assert result.why("b") is Outcome.RESYNC and retry is not None
    resent = unpack_deltas(retry.message)
    assert [(d.request_id, d.known_length, len(d.new_tokens)) for d in resent] == [
        ("b", 0, 3)]  # fmt: skip
    merged, again = s.complete(retry, ok_answer(retry), 0.002)
    assert again is None and merged.ok and set(merged.drafts) == {"a", "b"}
    assert merged.step == plan.step and list(merged) == ["a", "b"]
    assert (s.stats.resyncs, s.stats.resync_retries, s.stats.drafted_steps) == (1, 1, 2)


def test_no_resend_within_the_step_when_the_deadline_is_near() -> None:
    s = session()
    s.tracker.add(RequestState.new("a", [1]))
    plan = begin(s, {"a": []})
    result, retry = s.complete(plan, ok_answer(plan, resync=("a",)), 0.0035)
    assert retry is None and result.why("a") is Outcome.RESYNC
    s2 = session(resync_retry=False)
    s2.tracker.add(RequestState.new("a", [1]))
    plan = begin(s2, {"a": []})
    assert s2.complete(plan, ok_answer(plan, resync=("a",)), 0.0)[1] is None


def test_a_failed_resend_keeps_the_steps_drafts() -> None:
    s = session()
    for rid in "ab":
        s.tracker.add(RequestState.new(rid, [1]))
    plan = begin(s, {"a": [], "b": []})
    result, retry = s.complete(plan, ok_answer(plan, resync=("b",)), 0.0)
    assert retry is not None
    after = s.fail(retry, Outcome.DEADLINE, 0.003)
    assert after is result and after["a"] is not None
    assert s.breaker.failures == 0 and s.stats.fallback_steps == 0


def test_tokenizer_mismatch_is_refused() -> None:
    s = session(tokenizer_fingerprint="abc")
    info = pb.GetServiceInfoResponse(tokenizer=pb.TokenizerInfo(fingerprint="def"))
    with pytest.raises(ValueError, match="tokenizer mismatch: client abc, drafter def"):
        s.adopt_service_info(info)


def synced(s: DraftSession, rid: str, tokens: list[int]) -> None:
    s.tracker.add(RequestState.new(rid, tokens))
    plan = begin(s, {rid: []})
    s.complete(plan, ok_answer(plan), 0.0)


def test_finish_of_a_synced_request_sends_only_the_tail() -> None:
    s = session()
    synced(s, "a", [1, 2, 3, 4, 5, 6])
    s.tracker.commit_many({"a": [7]})
    (work,) = s.finish("a", [8], store=True)
    assert isinstance(work, FinishWork) and not work.aborted and not work.do_not_store
    assert list(work.final_tokens) == [7, 8]
    # Should the drafter have lost it: output plus the last 3 prompt tokens.
    assert list(work.generation or ()) == [4, 5, 6, 7, 8]
    synced(s, "b", [1])
    (work,) = s.finish("b", [2], store=False)
    assert isinstance(work, FinishWork) and work.do_not_store and work.generation is None


def test_finish_with_the_whole_output_stores_each_token_once() -> None:
    """Issue 33, item 5: the whole output after stepping stores no token twice."""
    s = session()
    synced(s, "a", [1, 2, 3, 4, 5, 6])
    plan = begin(s, {"a": [7, 8]})  # output so far: 7, 8 (sent)
    s.complete(plan, ok_answer(plan), 0.0)
    s.tracker.commit_many({"a": [9]})  # committed, not sent
    (work,) = s.finish("a", [], store=True, output=[7, 8, 9, 10])
    assert isinstance(work, FinishWork) and list(work.final_tokens) == [9, 10]
    assert list(work.generation or ()) == [4, 5, 6, 7, 8, 9, 10]
    synced(s, "b", [1, 2])  # nothing stepped: the whole output is new
    (work,) = s.finish("b", [], store=True, output=[3])
    assert isinstance(work, FinishWork) and list(work.final_tokens) == [3]


def test_an_output_that_disagrees_is_refused_and_the_request_stays_open() -> None:
    s = session()
    synced(s, "a", [1, 2])
    plan = begin(s, {"a": [3, 4]})
    s.complete(plan, ok_answer(plan), 0.0)
    with pytest.raises(ValueError, match=r"first difference at 1"):
        s.finish("a", [], store=True, output=[3, 5, 6])
    with pytest.raises(ValueError, match=r"does not start with the 2 tokens"):
        s.finish("a", [], store=True, output=[3])
    with pytest.raises(ValueError, match="not both"):
        s.finish("a", [5], store=True, output=[3, 4, 5])
    (work,) = s.finish("a", [5], store=True)  # still tracked: ends normally
    assert isinstance(work, FinishWork) and list(work.final_tokens) == [5]


def test_the_clients_take_tail_and_output_only_by_name() -> None:
    from verifier_client import DrafterClient

    with DrafterClient("127.0.0.1:1") as client:
        client.add_request("r", [1, 2])
        with pytest.raises(TypeError):
            client.finish("r", [3])  # type: ignore[misc]
        assert client.finish("r", output=[3])


def test_an_open_circuit_has_one_probe_out_at_a_time() -> None:
    from verifier_client import DrafterClient

    fast = BreakerConfig(failure_threshold=1, cooldown_s=1e-3, max_cooldown_s=1e-3, jitter=0.0)
    # Nothing listens there: steps fail, and the probe (wait_for_ready) stays out.
    with DrafterClient("127.0.0.1:1", breaker=fast, probe_timeout_s=60.0) as client:
        client.add_request("a", [1, 2])
        for _ in range(100_000):
            if client.step({"a": []}).outcome is Outcome.BREAKER_OPEN and client.stats.probes:
                break
        assert client.breaker_state is BreakerState.HALF_OPEN and client.stats.probes == 1
        for _ in range(5):
            assert client.step({"a": []}).outcome is Outcome.BREAKER_OPEN
        assert client.stats.probes == 1  # the one out is waited for, not sent again


def test_finish_of_an_unsure_request_aborts_and_ingests_the_generation() -> None:
    s = session()
    s.tracker.add(RequestState.new("a", [1, 2], "code"))
    plan = begin(s, {"a": [3]})
    s.fail(plan, Outcome.DEADLINE, 0.0)  # the drafter may hold a partial context
    abort, ingest = s.finish("a", [4], store=True)
    assert isinstance(abort, FinishWork) and abort.aborted
    assert ingest == IngestWork("code", [[1, 2, 3, 4]])
    s.tracker.add(RequestState.new("c", [1, 2]))
    plan = begin(s, {"c": []})
    s.complete(plan, ok_answer(plan), 0.0)  # synced
    begin(s, {"c": [3]})  # its answer is still out (an asyncio client's finish may come now)
    abort, ingest = s.finish("c", [], store=True)
    assert isinstance(abort, FinishWork) and abort.aborted
    assert ingest == IngestWork("", [[1, 2, 3]])
    s.tracker.add(RequestState.new("b", [7]))  # never sent: nothing to free
    assert s.finish("b", [8], store=True) == [IngestWork("", [[7, 8]])]
    s.tracker.add(RequestState.new("e", [1, 2]))  # no output: nothing to store
    assert s.finish("e", [], store=True) == []
    s.tracker.add(RequestState.new("d", [1]))
    assert s.abort("d") == []


def test_nothing_is_ingested_into_a_read_only_datastore() -> None:
    s = session()
    info = pb.GetServiceInfoResponse(datastores=[pb.DatastoreInfo(name="wiki", live=False)])
    s.adopt_service_info(info)
    s.tracker.add(RequestState.new("a", [1, 2], "wiki"))
    assert s.finish("a", [], store=True) == []


def test_batching_respects_limits_and_never_repeats_an_id() -> None:
    work = [FinishWork(f"r{i % 3}", False, False, [i]) for i in range(5)]
    work += [IngestWork("", [[1] * 10] * 3), IngestWork("x", [[2]])]
    finishes, ingests = batch_messages(work, max_per_call=2)
    assert [[r.request_id for r in m.requests] for m, _ in finishes] == [
        ["r0", "r1"], ["r2", "r0"], ["r1"]]  # fmt: skip
    assert [(m.datastore, len(m.sequences)) for m in ingests] == [("", 2), ("", 1), ("x", 1)]
    big = [IngestWork("", [[3] * (MAX_INGEST_TOKENS_PER_CALL // 2 + 1)] * 2)]
    assert len(batch_messages(big)[1]) == 2


def test_generations_the_drafter_lost_are_ingested_by_the_client() -> None:
    sent = [FinishWork("a", False, False, [3], "", [1, 2, 3]), FinishWork("b", True, True, [])]
    response = pb.FinishResponse(unknown_request_ids=["a", "b"])
    assert reingest_unknown(response, sent) == [IngestWork("", [[1, 2, 3]])]


def test_refused_requests_get_no_draft_and_are_never_stored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = session()
    info = pb.GetServiceInfoResponse(tokenizer=pb.TokenizerInfo(vocab_size=100),
                                     limits=pb.Limits(max_tokens_per_request=1000))  # fmt: skip
    s.adopt_service_info(info)
    s.tracker.add(RequestState.new("good", [1, 2]))
    s.tracker.add(RequestState.new("bad", [1, 2]))
    plan = begin(s, {"good": [3], "bad": [3]})
    s.complete(plan, ok_answer(plan), 0.0)
    plan = begin(s, {"good": [4], "bad": [120]})  # 120 is past the drafter's vocabulary
    assert [d.request_id for d in unpack_deltas(plan.message)] == ["good"]
    result, _ = s.complete(plan, ok_answer(plan), 0.0)
    assert result.why("good") is Outcome.OK and result.why("bad") is Outcome.ERROR
    assert result["bad"] is None and s.stats.refused == 1
    assert "'bad' gets no drafts: a committed token id is past" in caplog.text
    (work,) = s.finish("bad", [], store=True)  # frees what the drafter holds, stores nothing
    assert isinstance(work, FinishWork) and work.aborted
    s.tracker.add(RequestState.new("lonely", [500]))  # refused from the start; alone in its step
    result = s.begin({"lonely": []}, None, 0.0)
    assert isinstance(result, StepResult) and result.why("lonely") is Outcome.ERROR


def test_ids_and_datastores_the_drafter_would_refuse_cost_only_their_own_drafts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = session()
    # added before the drafter's limits are known
    s.tracker.add(RequestState.new("e-typo", [1, 2], "typo"))
    info = pb.GetServiceInfoResponse(
        datastores=[pb.DatastoreInfo(name="default", is_default=True, live=True),
                    pb.DatastoreInfo(name="code")],
        limits=pb.Limits(max_request_id_chars=8),
    )  # fmt: skip
    s.adopt_service_info(info)  # rechecks the requests already added
    s.tracker.add(RequestState.new("good", [1, 2]))
    s.tracker.add(RequestState.new("coder", [1, 2], "code"))
    s.tracker.add(RequestState.new("x" * 9, [1, 2]))  # longer than the drafter accepts
    s.tracker.add(RequestState.new("typo", [1, 2], "nope"))  # a datastore the drafter does not have
    step = ["e-typo", "good", "coder", "x" * 9, "typo"]
    plan = begin(s, {rid: [3] for rid in step})
    assert [d.request_id for d in unpack_deltas(plan.message)] == ["good", "coder"]
    result, _ = s.complete(plan, ok_answer(plan), 0.0)
    assert [rid for rid in step if result[rid] is not None] == ["good", "coder"]
    assert {rid: result.why(rid) for rid in step if result.why(rid) is not Outcome.OK} == {
        "e-typo": Outcome.ERROR, "x" * 9: Outcome.ERROR, "typo": Outcome.ERROR,
    }  # fmt: skip
    assert s.stats.refused == 3 and result.outcome is Outcome.OK
    logged = caplog.text
    assert "no datastore 'typo'" in logged and "no datastore 'nope'" in logged
    assert "9 characters, over the drafter's 8" in logged
