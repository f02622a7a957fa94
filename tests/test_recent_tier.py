"""The recent tier (docs/algorithm.md, "The recent tier"): drafts from the other requests
a drafter holds, native core against the reference over random sequences of starts,
batched steps and stops, and what the tier promises by hand."""

from __future__ import annotations

import dataclasses
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import reference as ref
from client_servers import DrafterProcess, owned_ids
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from reference import assert_same_draft
from service_support import LoopThread, Running, read_only_catalog, serving
from service_support import config as service_config
from strategies import MAX_BUDGET, Corpus, corpora, draft_configs

from drafter_service import DraftConfig, Drafter
from drafter_service.drafting.drafter import SCORE_FEATURES
from drafter_service.engine.request_table import RECENT_BYTES_PER_TOKEN, StateCost
from verifier_client import BudgetRule, DrafterClient, Outcome, ReplicaSetClient


@st.composite
def recent_configs(draw: st.DrawFn) -> DraftConfig:
    k = draw(st.integers(1, 3))
    return dataclasses.replace(
        draw(draft_configs()),
        recent_samples=draw(st.integers(1, 6)),
        recent_min_match=k,
        recent_max_match=draw(st.integers(k, 6)),
        recent_candidates=draw(st.integers(1, 6)),
        recent_held_tokens=draw(st.integers(0, 24)),
    )


def reference_draft(tier: ref.RefRecentTier, request_id: str, context: list[int],
                    corpus: Corpus | None, config: DraftConfig, budget: int) -> ref.RefDraft:
    subs = corpus.reference() if corpus is not None else None
    base = corpus.base_count if corpus is not None else 0
    ds_tree, live_tree = ref.datastore_trees(subs, context, config, budget, base)
    return ref.fuse(
        ref.input_trie_counts(context, config.input_max_depth), context, ds_tree, config,
        budget, live_tree=live_tree,
        prefixes=ref.datastore_prefixes(subs, context, config, budget, base),
        recent=tier.retrieve(request_id, context, budget),
    )  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(st.data(), recent_configs(), st.one_of(st.none(), corpora(split=True)),
       st.integers(1, 3))
def test_drafts_with_the_recent_tier_equal_the_reference(
    data: st.DataObject, config: DraftConfig, corpus: Corpus | None, threads: int
) -> None:
    vocab = corpus.vocab_size if corpus is not None else data.draw(st.integers(2, 5))
    tokens = st.lists(st.integers(0, vocab - 1), max_size=8)
    drafter = Drafter(vocab, config, corpus.datastore() if corpus is not None else None,
                      num_threads=threads)  # fmt: skip
    tier = ref.RefRecentTier(config)
    held: dict[str, list[int]] = {}
    # Siblings: every request starts from a prompt drawn from a few shared ones.
    prompts = data.draw(st.lists(tokens, min_size=1, max_size=3))
    names = iter(f"r{i}" for i in range(100))
    position = 0
    for _ in range(data.draw(st.integers(1, 6))):
        # Stored generations, held until a rebuild folds them (out of order: two threads
        # may store at once; a release may come first).
        for _ in range(data.draw(st.integers(0, 2))):
            position += data.draw(st.integers(1, 2))
            at = position - data.draw(st.integers(0, 1))
            doc = [*data.draw(st.sampled_from(prompts)), *data.draw(tokens)]
            assert drafter.hold(at, doc) == tier.hold(at, doc)
        if data.draw(st.booleans()):
            through = data.draw(st.integers(0, position))
            drafter.release_through(through)
            tier.release_through(through)
        held_tokens = sum(len(tier.streams[s]) for s in tier.held.values())
        assert drafter.held == (len(tier.held), held_tokens)
        for _ in range(data.draw(st.integers(0 if held else 1, 3))):
            rid = next(names)
            prompt = [*data.draw(st.sampled_from(prompts)), *data.draw(tokens)]
            shared = data.draw(st.booleans()) or data.draw(st.booleans())  # mostly shared
            group = data.draw(st.integers(0, 2))  # 0: seen by all; 1, 2: two clients apart
            drafter.start(rid, prompt, shared=shared, group=group)
            tier.start(rid, prompt, shared, group)
            held[rid] = prompt
        for rid in data.draw(st.lists(st.sampled_from(sorted(held)), unique=True, max_size=1)):
            if len(held) > 1:
                drafter.stop(rid)
                tier.stop(rid)
                del held[rid]
        ids = sorted(held)
        new = [data.draw(tokens) for _ in ids]
        budgets = [data.draw(st.integers(0, MAX_BUDGET)) for _ in ids]
        got = drafter.speculate(ids, new, budgets)
        for rid, added in zip(ids, new, strict=True):  # appended in row order, then drafted
            tier.append(rid, added)
            held[rid] = [*held[rid], *added]
        for row, rid in enumerate(ids):
            tree = got.tree(row)
            want = reference_draft(tier, rid, held[rid], corpus, config, budgets[row])
            assert_same_draft((tree.tokens, tree.parents, tree.scores), want)


@settings(max_examples=30, deadline=None)
@given(st.data(), recent_configs(), st.integers(1, MAX_BUDGET))
def test_explain_with_the_recent_tier_equals_the_reference(
    data: st.DataObject, config: DraftConfig, budget: int
) -> None:
    tokens = st.lists(st.integers(0, 3), min_size=1, max_size=10)
    drafter, tier = Drafter(4, config), ref.RefRecentTier(config)
    held = {f"r{i}": data.draw(tokens) for i in range(data.draw(st.integers(1, 4)))}
    for rid, context in held.items():
        drafter.start(rid, context)
        tier.start(rid, context)
    for rid, context in held.items():
        got = drafter.explain(rid, budget)
        want = reference_draft(tier, rid, context, None, config, budget)
        assert_same_draft((got.tree.tokens, got.tree.parents, got.tree.scores), want)
        assert want.features is not None
        assert got.features.tolist() == want.features.tolist()


RECENT = DraftConfig(recent_samples=8, recent_min_match=2)


def test_a_sibling_ahead_is_drafted_from() -> None:
    """Two requests of one prompt: the one behind drafts what the other already wrote."""
    drafter = Drafter(100, RECENT)
    prompt = [1, 2, 3]
    drafter.start("ahead", [*prompt, 10, 11, 12, 13, 14])
    drafter.start("behind", prompt)
    tree = drafter.speculate(["behind"], [[10]], 8).tree(0)
    assert tree.tokens.tolist()[:4] == [11, 12, 13, 14]
    assert tree.parents.tolist()[:4] == [-1, 0, 1, 2]


def test_siblings_of_one_prompt_match_on_one_token_unrelated_requests_do_not() -> None:
    """With K = 2 a sibling (same prompt) is drafted from after a one-token match; a
    request of another prompt with the same tokens is not."""
    drafter = Drafter(100, RECENT)
    drafter.start("sibling", [1, 2, 3])
    drafter.start("stranger", [4, 2, 3])
    drafter.start("b", [1, 2, 3])
    drafter.speculate(["sibling", "stranger"], [[5, 9, 7, 8], [8, 9, 7, 8]], 0)
    # b's last two tokens (6, 9) occur nowhere; its last one, 9, in both others.
    tree = drafter.speculate(["b"], [[6, 9]], 4).tree(0)
    assert tree.tokens.tolist() == [7, 8]
    drafter.stop("sibling")
    assert len(drafter.speculate(["b"], [[]], 4).tree(0)) == 0


def test_a_request_never_matches_its_own_tokens_in_the_tier() -> None:
    """Its own repeats are the input trie's: alone, it drafts exactly as without the tier,
    and no node says the tier offered it."""
    context = [5, 6, 7, 8, 5, 6]
    alone, plain = Drafter(100, RECENT), Drafter(100)
    for d in (alone, plain):
        d.start("a", context)
    explained = alone.explain("a", 8)
    assert len(explained.tree) > 0
    assert explained.features[:, SCORE_FEATURES.index("recent_present")].tolist() == [0.0] * 4
    want = plain.speculate(["a"], [[]], 8).tree(0)
    assert explained.tree.tokens.tolist() == want.tokens.tolist()
    assert explained.tree.scores.tolist() == want.scores.tolist()


def test_a_stopped_request_is_drafted_from_no_more() -> None:
    drafter = Drafter(100, RECENT)
    drafter.start("gone", [1, 2, 3, 4, 5, 6])
    drafter.start("b", [9, 1, 2])
    assert drafter.speculate(["b"], [[3]], 4).tree(0).tokens.tolist() == [4, 5, 6]
    drafter.stop("gone")
    assert len(drafter.speculate(["b"], [[]], 4).tree(0)) == 0


def test_many_starts_and_stops_compact_the_tier_and_keep_drafting() -> None:
    """Stopped requests' entries are dropped once they outnumber the live ones; drafts
    stay those of the requests held."""
    drafter = Drafter(50, RECENT)
    rng = np.random.default_rng(0)
    drafter.start("keep", [1, 2, 3, 4, 5, 6, 7])
    for i in range(300):
        drafter.start(f"t{i}", rng.integers(10, 50, 64))
        drafter.stop(f"t{i}")
    drafter.start("b", [0, 1, 2])
    assert drafter.speculate(["b"], [[3]], 3).tree(0).tokens.tolist() == [4, 5, 6]


def test_the_tier_is_on_by_default_and_inert_for_a_request_alone() -> None:
    """On by default (``recent_samples`` 16); ``recent_samples=0`` turns it off, and then
    no request drafts from another. A request alone in its drafter drafts exactly what it
    would without the tier."""
    assert DraftConfig().recent_samples == 16
    on, off = Drafter(100), Drafter(100, DraftConfig(recent_samples=0))
    for drafter in (on, off):
        drafter.start("ahead", [1, 2, 3, 10, 11, 12])
        drafter.start("behind", [1, 2, 3])
    assert on.speculate(["behind"], [[10]], 8).tree(0).tokens.tolist()[:2] == [11, 12]
    assert len(off.speculate(["behind"], [[10]], 8).tree(0)) == 0
    for drafter in (on, off):
        drafter.stop("ahead")
        drafter.stop("behind")
        drafter.start("alone", [5, 6, 7, 5, 6, 8, 5, 6])
    trees = [d.speculate(["alone"], [[7]], 8).tree(0) for d in (on, off)]
    assert trees[0].tokens.tolist() == trees[1].tokens.tolist()
    assert trees[0].scores.tolist() == trees[1].scores.tolist()


def test_its_memory_is_counted_per_token_and_no_headroom_is_claimed() -> None:
    plain, recent = Drafter(100, DraftConfig(recent_samples=0)), Drafter(100, RECENT)
    for d in (plain, recent):
        d.start("a", list(range(50)))
    assert plain.speculate(["a"], [[1]], 0).state_headroom.tolist()[0] > 0
    assert recent.speculate(["a"], [[1]], 0).state_headroom.tolist() == [0]
    assert recent.request_bytes("a") - plain.request_bytes("a") == 51 * RECENT_BYTES_PER_TOKEN


@pytest.mark.parametrize("field,value", [("recent_samples", -1), ("recent_min_match", 0),
                                         ("recent_max_match", 2), ("recent_candidates", 0)])
def test_recent_settings_are_validated(field: str, value: int) -> None:
    settings = {"recent_samples": 4, "recent_min_match": 3, field: value}
    with pytest.raises(ValueError, match=field):
        DraftConfig(**settings)


def test_siblings_on_two_clients_draft_from_each_other(tmp_path: Path) -> None:
    """Through the real service (`drafter serve --draft-config recent_samples=8`): two
    decode workers, each with its own client, run one prompt; the one behind drafts the
    tokens the other has already committed, as a tree the service could not have drafted
    from the prompt or the (empty) datastore."""
    server = DrafterProcess(tmp_path / "data", "--draft-config", "recent_samples=8",
                            "--draft-config", "recent_min_match=2")  # fmt: skip
    try:
        ahead = DrafterClient(server.target, deadline_ms=60_000.0, budget=BudgetRule.fixed(8))
        behind = DrafterClient(server.target, deadline_ms=60_000.0, budget=BudgetRule.fixed(8))
        ahead.wait_ready()
        behind.wait_ready()
        prompt = [1, 2, 3, 4]
        written = [40, 41, 42, 43, 44, 45, 46, 47]
        ahead.add_request("a", prompt)
        behind.add_request("b", prompt)
        assert ahead.step({"a": written}).outcome == Outcome.OK
        result = behind.step({"b": written[:2]})
        tree = result["b"]
        assert result.outcome == Outcome.OK and tree is not None
        assert list(tree.tokens[:6]) == written[2:]
        alone = DrafterProcess(tmp_path / "alone", "--draft-config", "recent_samples=8")
        try:  # the same step with no sibling drafts nothing
            solo = DrafterClient(alone.target, deadline_ms=60_000.0,
                                 budget=BudgetRule.fixed(8))  # fmt: skip
            solo.wait_ready()
            solo.add_request("b", prompt)
            lone = solo.step({"b": written[:2]})["b"]
            assert lone is None or len(lone.tokens) == 0
            solo.close()
        finally:
            alone.stop()
        ahead.close()
        behind.close()
    finally:
        server.stop()


@pytest.mark.parametrize("scope", ["datastore", "client"])
def test_with_recent_scope_client_only_a_clients_own_requests_share_in_flight_tokens(
    loop_thread: LoopThread, tmp_path: Path, scope: str
) -> None:
    """Per-client authentication (a tokens file): with ``recent_scope`` "datastore" (the
    default) the clients of one datastore draft from each other's requests in flight;
    with "client" only two workers of one client do, while what a client stores is
    drafted from by every client (shared as the live datastore shares it)."""
    tokens = tmp_path / "tokens"
    tokens.write_text("alpha alpha-token-0123456789\nbeta beta-token-0123456789ab\n")
    cfg = service_config(
        tmp_path / "data", draft_config=[("recent_samples", "8")], grpc_tokens_file=tokens,
        recent_scope=scope, rebuild_min_tokens=10**9, rebuild_interval_s=10**6,
        rebuild_max_share=0.0,
    )  # fmt: skip
    written, prompt = [40, 41, 42, 43, 44, 45, 46, 47], [1, 2, 3, 4]
    with serving(loop_thread, cfg) as s:
        def client(token: str) -> DrafterClient:
            return DrafterClient(s.server.address, deadline_ms=60_000.0, token=token,
                                 budget=BudgetRule.fixed(8))  # fmt: skip

        ahead, mate = client("alpha-token-0123456789"), client("alpha-token-0123456789")
        other = client("beta-token-0123456789ab")
        ahead.add_request("a", prompt)
        assert ahead.step({"a": written}).outcome == Outcome.OK
        for name, worker in (("m", mate), ("o", other)):
            worker.add_request(name, prompt)
        mates = mate.step({"m": written[:2]})["m"]
        assert mates is not None and list(mates.tokens[:6]) == written[2:]
        others = other.step({"o": written[:2]})["o"]
        if scope == "datastore":
            assert others is not None and list(others.tokens[:6]) == written[2:]
        else:  # beta sees nothing of alpha's request in flight ...
            assert others is None or len(others.tokens) == 0
        ahead.finish("a", tail=[48], durable=True)
        assert ahead.flush(60)  # a bound on failure only
        other.add_request("after", [9, 40, 41])  # ... but what alpha stored, at once
        stored = other.step({"after": []})["after"]
        assert stored is not None and list(stored.tokens[:6]) == written[2:]
        for worker in (ahead, mate, other):
            worker.close()


def test_recent_scope_client_without_clients_told_apart_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="recent_scope 'client' needs clients told apart"):
        service_config(tmp_path / "data", recent_scope="client")


def test_the_service_reserves_the_tiers_bound_for_every_token() -> None:
    """What the native core counts a token for the tier, the service reserves before it
    is measured (its request-state budget bounds the tier too)."""
    plain, recent = StateCost(4, 640), StateCost(4, 640, RECENT_BYTES_PER_TOKEN)
    assert RECENT_BYTES_PER_TOKEN == 192
    assert recent.worst(100) - plain.worst(100) == 100 * RECENT_BYTES_PER_TOKEN


def test_a_request_that_shares_nothing_is_never_drafted_from_but_drafts() -> None:
    """An opted-out request (``shared=False``): its tokens never join the tier, however it
    grows, while it drafts from the requests that share theirs."""
    drafter = Drafter(100, RECENT)
    drafter.start("private", [1, 2, 3, 10, 11, 12, 13], shared=False)
    drafter.start("public", [7, 8, 30, 31, 32])
    drafter.start("b", [0, 1, 2, 3])
    drafter.speculate(["private"], [[14, 15]], 4)
    assert len(drafter.speculate(["b"], [[]], 4).tree(0)) == 0  # nothing of "private"
    drafter.start("c", [9, 7, 8])
    assert drafter.speculate(["c"], [[]], 3).tree(0).tokens.tolist() == [30, 31, 32]
    drafter.start("p2", [5, 7, 8], shared=False)
    assert drafter.speculate(["p2"], [[]], 3).tree(0).tokens.tolist() == [30, 31, 32]


def test_a_request_that_opted_out_of_storage_is_never_shared_through_the_service(
    tmp_path: Path,
) -> None:
    """``add_request(..., store=False)``: the client says so in the request's whole
    context (``do_not_store``), and its tokens never reach another request's draft, while
    it drafts from the others; its finish stores nothing."""
    server = DrafterProcess(tmp_path / "data", "--draft-config", "recent_samples=8")
    try:
        client = DrafterClient(server.target, deadline_ms=60_000.0, budget=BudgetRule.fixed(8))
        client.wait_ready()
        written = [40, 41, 42, 43, 44, 45]
        client.add_request("private", [1, 2, 3], store=False)
        client.add_request("public", [5, 6, 7])
        assert client.step({"private": written, "public": [50, 51, 52, 53]}).outcome == Outcome.OK
        client.add_request("behind", [1, 2, 3])
        client.add_request("other", [5, 6, 7])
        result = client.step({"behind": written[:2], "other": [50]})
        nothing = result["behind"]
        assert nothing is None or len(nothing.tokens) == 0  # the private one's tokens: never
        shared = result["other"]
        assert shared is not None and list(shared.tokens[:3]) == [51, 52, 53]
        client.add_request("late-private", [9, 5, 6, 7], store=False)
        drafted = client.step({"late-private": [50]})["late-private"]
        assert drafted is not None and list(drafted.tokens[:3]) == [51, 52, 53]
        client.close()
    finally:
        server.stop()


@pytest.mark.parametrize("column,error", [(b"\x01", "4 entries of 1 bytes expected"),
                                          (b"\x00\x02\x00\x00", r"do_not_store\[1\] is 2")])
def test_a_bad_do_not_store_column_is_refused_by_name(column: bytes, error: str) -> None:
    from drafter_service.edge.validation import parse_draft_request
    from drafter_service.engine.call_errors import InvalidArgument
    from drafter_service.engine.calls import CallLimits
    from sssd_drafter.v1 import drafter_pb2 as pb

    limits = CallLimits(read_only_catalog(100, "d"), 64, 1000, 64, "d")
    packed = pb.PackedDeltas(
        request_ids=["a", "b", "c", "e"], known_lengths=bytes(16),
        new_token_counts=(1).to_bytes(4, "little") * 4, new_tokens=bytes(16),
        budgets=bytes(16), do_not_store=column,
    )  # fmt: skip
    with pytest.raises(InvalidArgument, match=error):
        parse_draft_request(pb.DraftRequest(packed=packed), limits)
    one = {"request_ids": ["a"], "known_lengths": bytes(4), "budgets": bytes(4),
           "new_token_counts": (1).to_bytes(4, "little"), "new_tokens": bytes(4)}  # fmt: skip
    call = parse_draft_request(pb.DraftRequest(packed=pb.PackedDeltas(**one, do_not_store=b"\x01")),
                               limits)  # fmt: skip
    assert call.private == [True]
    assert parse_draft_request(pb.DraftRequest(packed=pb.PackedDeltas(**one)), limits).private == []
    delta = pb.RequestDelta(request_id="a", new_tokens=[1], do_not_store=True)
    assert parse_draft_request(pb.DraftRequest(requests=[delta]), limits).private == [True]


# -- stored generations: drafted from before their rebuild ----------------------------------


def _no_rebuild(tmp_path: Path, *draft_config: tuple[str, str]) -> Any:
    """A service whose live datastore rebuilds only when a test says so."""
    return service_config(
        tmp_path / "data", draft_config=[("recent_samples", "8"), *draft_config],
        rebuild_min_tokens=10**9, rebuild_interval_s=10**6, rebuild_max_share=0.0,
    )  # fmt: skip


def held_tokens_metric(s: Running) -> float:
    """``sssd_drafter_recent_held_tokens{datastore="default"}`` from a real scrape."""
    url = f"http://127.0.0.1:{s.server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=60) as page:  # a bound on failure only
        text = page.read().decode()
    return next(sample.value for f in text_string_to_metric_families(text) for sample in f.samples
                if sample.name == "sssd_drafter_recent_held_tokens"
                and sample.labels == {"datastore": "default"})  # fmt: skip


def test_a_stored_generation_is_drafted_from_at_the_next_step_before_any_rebuild(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    """A finished generation is drafted from by the first step after its Finish, with no
    rebuild (the live datastore's sub-indices are still empty); once a rebuild folds it
    in, the tier lets it go and the datastore drafts it instead."""
    written = [40, 41, 42, 43, 44, 45, 46, 47]
    with serving(loop_thread, _no_rebuild(tmp_path)) as s:
        client = DrafterClient(s.server.address, deadline_ms=60_000.0,
                               budget=BudgetRule.fixed(8))  # fmt: skip
        client.add_request("done", [1, 2, 3])
        assert client.step({"done": written}).outcome == Outcome.OK
        client.finish("done", tail=[48], durable=True)
        assert client.flush(60)  # a bound on failure only
        slot = s.server.engine.catalog.slots["default"]  # type: ignore[union-attr]
        assert slot.live is not None and slot.live.stats().rebuilds == 0
        generations, tokens = slot.drafter.held
        assert generations == 1 and tokens >= len(written) + 1
        assert held_tokens_metric(s) == tokens
        client.add_request("next", [7, 40, 41])
        tree = client.step({"next": []})["next"]
        assert tree is not None and list(tree.tokens[:6]) == [42, 43, 44, 45, 46, 47]
        assert slot.live.rebuild()
        assert slot.drafter.held == (0, 0)  # folded: the datastore holds it now
        assert held_tokens_metric(s) == 0
        client.add_request("later", [7, 40, 41])
        tree = client.step({"later": []})["later"]
        assert tree is not None and list(tree.tokens[:6]) == [42, 43, 44, 45, 46, 47]
        client.close()


def test_without_the_tier_a_stored_generation_waits_for_its_rebuild(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    """The control: the same steps with the tier off draft nothing before the rebuild."""
    cfg = service_config(tmp_path / "data", rebuild_min_tokens=10**9,
                         rebuild_interval_s=10**6, rebuild_max_share=0.0,
                         draft_config=[("recent_samples", "0")])  # fmt: skip
    with serving(loop_thread, cfg) as s:
        client = DrafterClient(s.server.address, deadline_ms=60_000.0,
                               budget=BudgetRule.fixed(8))  # fmt: skip
        client.add_request("done", [1, 2, 3])
        client.step({"done": [40, 41, 42, 43, 44, 45, 46, 47]})
        client.finish("done", tail=[48], durable=True)
        assert client.flush(60)  # a bound on failure only
        client.add_request("next", [7, 40, 41])
        tree = client.step({"next": []})["next"]
        assert tree is None or len(tree.tokens) == 0
        client.close()


def test_an_opted_out_generation_is_never_held(loop_thread: LoopThread, tmp_path: Path) -> None:
    """A request that opted out of storage is stored nowhere, so the tier holds nothing of
    it after its Finish either."""
    with serving(loop_thread, _no_rebuild(tmp_path)) as s:
        client = DrafterClient(s.server.address, deadline_ms=60_000.0,
                               budget=BudgetRule.fixed(8))  # fmt: skip
        client.add_request("private", [1, 2, 3], store=False)
        client.step({"private": [40, 41, 42, 43, 44, 45]})
        client.finish("private", tail=[46], durable=True)
        assert client.flush(60)  # a bound on failure only
        assert s.server.engine.catalog.slots["default"].drafter.held == (0, 0)  # type: ignore[union-attr]
        client.add_request("next", [7, 40, 41])
        tree = client.step({"next": []})["next"]
        assert tree is None or len(tree.tokens) == 0
        client.close()


def test_held_generations_stay_within_their_bound_oldest_released_first() -> None:
    """Past ``recent_held_tokens`` the oldest held generations are released (they are
    still stored, and drafted from once their rebuild folds them in)."""
    drafter = Drafter(100, dataclasses.replace(RECENT, recent_held_tokens=10))
    assert drafter.hold(1, [1, 2, 3, 4, 5, 6])
    assert drafter.hold(2, [7, 8, 9, 10])
    assert drafter.held == (2, 10)
    assert drafter.hold(3, [11, 12, 13])  # 13 > 10: the oldest goes
    assert drafter.held == (2, 7)
    drafter.start("r", [0, 1, 2])
    assert len(drafter.speculate(["r"], [[]], 4).tree(0)) == 0  # released
    drafter.start("s", [0, 7, 8])
    assert drafter.speculate(["s"], [[]], 2).tree(0).tokens.tolist() == [9, 10]
    assert not drafter.hold(4, list(range(11)))  # longer than the bound: never held
    drafter.release_through(3)
    assert drafter.held == (0, 0)
    assert not drafter.hold(3, [1, 2])  # folded already (a release that came first)
    off = Drafter(100, DraftConfig(recent_samples=0))
    assert off.hold(1, [1, 2, 3]) is False  # no tier: nothing held


@pytest.mark.parametrize("route", ["request", "prompt"])
def test_siblings_share_a_replica_when_routed_by_prompt(
    loop_thread: LoopThread, tmp_path: Path, route: str
) -> None:
    """Two replicas with the tier on; two siblings (one prompt) whose ids two different
    replicas own. Routed by request id (the default) they land apart and the one behind
    drafts nothing from the other; routed by prompt they share a replica and it does."""
    cfg = [service_config(tmp_path / f"data{i}", draft_config=[("recent_samples", "8")])
           for i in range(2)]  # fmt: skip
    with serving(loop_thread, cfg[0]) as a, serving(loop_thread, cfg[1]) as b:
        addresses = [a.server.address, b.server.address]
        ahead, behind = owned_ids("sib", addresses, 1)  # ids owned by different replicas
        with ReplicaSetClient(addresses, route=route, deadline_ms=60_000.0,
                              budget=BudgetRule.fixed(8)) as client:  # fmt: skip
            prompt = [1, 2, 3, 4]
            written = [40, 41, 42, 43, 44, 45, 46, 47]
            client.add_request(ahead, prompt)
            client.add_request(behind, prompt)
            assert client.step({ahead: written}).outcome == Outcome.OK
            tree = client.step({behind: written[:2]})[behind]
            drafted = [] if tree is None else list(tree.tokens[:6])
            assert drafted == (written[2:] if route == "prompt" else [])
