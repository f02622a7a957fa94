"""ReplicaSetClient (issue 14, item 3) against three real `drafter serve` processes holding
the same datastore: rendezvous ownership, drafts identical to one drafter's, a replica
killed (-9) or hung (SIGSTOP) under a stepping batch, a resolved name over TLS, and bad
targets."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from client_servers import VOCAB_SIZE, DrafterProcess, owned_ids

from drafter_service import Datastore
from drafter_service.snapshot.store import TokenizerIdentity, write_snapshot
from verifier_client import (
    BreakerConfig,
    BreakerState,
    BudgetRule,
    DrafterClient,
    Outcome,
    ReplicaSetClient,
    StepResult,
)
from verifier_client.engines import DrafterSettings, EngineDrafter
from verifier_client.replica_set import parse_target, rendezvous_owner

# Documents over 40 token ids: contexts match the datastore in many places, so trees fill
# their budgets (which then show whose batch size set them).
_RNG = random.Random(7)
DOCS = [[_RNG.randrange(40) for _ in range(150)] for _ in range(16)]
PROMPT = 40
RULE = BudgetRule(48.0)  # batch 12: 3 nodes; a replica sizing for its share (~4): 11
FAST_BREAKER = BreakerConfig(failure_threshold=2, cooldown_s=0.05, max_cooldown_s=0.2)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[DrafterProcess]]:
    """Three drafters seeded with the same snapshot (nothing here stores into them)."""
    root = tmp_path_factory.mktemp("replicas")
    identity = TokenizerIdentity("test", VOCAB_SIZE, "")
    write_snapshot(root / "snap", Datastore.from_documents(DOCS, VOCAB_SIZE), identity)
    servers: list[DrafterProcess] = []
    try:
        for i in range(3):
            # No recent tier: a request's drafts do not depend on which others share its
            # replica, so the set's drafts are one drafter's (tests/test_recent_tier.py
            # covers the tier with replicas).
            servers.append(DrafterProcess(root / f"data{i}", "--snapshot", str(root / "snap"),
                                          "--draft-config", "recent_samples=0"))  # fmt: skip
        yield servers
    finally:
        for server in servers:
            server.stop()


def batch(prefix: str, n: int = 12, owners: list[str] | None = None) -> dict[str, list[int]]:
    """``n`` request ids and their prompts; with ``owners``, each of those replicas owns
    ``n / len(owners)`` of the ids (:func:`owned_ids`)."""
    if owners is None:
        ids = [f"{prefix}{i}" for i in range(n)]
    else:
        ids = owned_ids(prefix, owners, n // len(owners))
    return {rid: DOCS[i % len(DOCS)][:PROMPT] for i, rid in enumerate(ids)}


def commits_at(prompts: dict[str, list[int]], step: int) -> dict[str, list[int]]:
    """Each request's committed token at ``step``: its document goes on."""
    return {rid: [DOCS[i % len(DOCS)][PROMPT + step]] for i, rid in enumerate(prompts)}


class Reference:
    """The same requests on one drafter through a plain DrafterClient ("ref-" ids): the
    trees any replica holding the whole context must give."""

    def __init__(self, server: DrafterProcess, prompts: dict[str, list[int]]) -> None:
        self.client = DrafterClient(server.target, deadline_ms=5000, budget=RULE)
        self.client.wait_ready()
        self.ids = ["ref-" + rid for rid in prompts]
        for rid, prompt in prompts.items():
            self.client.add_request("ref-" + rid, prompt)

    def check(self, result: StepResult, commits: dict[str, list[int]]) -> None:
        """Every tree in ``result`` is the reference's for the same commits."""
        ref = self.client.step({"ref-" + rid: tokens for rid, tokens in commits.items()})
        for rid in commits:
            assert result[rid] is None or result[rid] == ref["ref-" + rid], rid

    def close(self) -> None:
        for rid in self.ids:
            self.client.abort(rid)
        self.client.close()


def step_until(
    client: ReplicaSetClient,
    prompts: dict[str, list[int]],
    first: int,
    done: Callable[[StepResult], bool],
    timeout_s: float = 60.0,
) -> int:
    """Steps on from document position ``first`` until ``done``; the next position
    (``timeout_s`` bounds failure only)."""
    end_s = time.monotonic() + timeout_s
    step = first
    while not done(client.step(commits_at(prompts, step))):
        step += 1
        assert time.monotonic() < end_s, f"gave up at step {step}: {client.stats}"
        time.sleep(0.01)
    return step + 1


@pytest.mark.system
def test_ownership_is_rendezvous_stable_across_orders_clients_and_processes(
    replicas: list[DrafterProcess],
) -> None:
    addresses = [f"10.0.0.{i}:50051" for i in range(1, 5)]
    ids = [f"req-{i}" for i in range(400)]
    owners = {rid: rendezvous_owner(rid, addresses) for rid in ids}
    assert owners == {rid: rendezvous_owner(rid, addresses[::-1]) for rid in ids}
    assert all(60 < list(owners.values()).count(a) < 140 for a in addresses)  # ~100 each
    # Removing one replica moves its requests only, spread over the others.
    left = addresses[:2] + addresses[3:]
    after = {rid: rendezvous_owner(rid, left) for rid in ids}
    assert all(after[rid] == owners[rid] for rid in ids if owners[rid] != addresses[2])
    assert {after[rid] for rid in ids if owners[rid] == addresses[2]} == set(left)
    # Another process (another str hash seed) assigns the same way.
    script = ("import sys, json; from verifier_client.replica_set import rendezvous_owner; "
              "a = json.loads(sys.argv[1]); ids = (f'req-{i}' for i in range(400)); "
              "print(json.dumps([rendezvous_owner(rid, a) for rid in ids]))")  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", script, json.dumps(addresses)], env=env,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert json.loads(out) == [owners[rid] for rid in ids]
    # Two live clients, given the replicas in different orders, agree with each other.
    targets = [server.target for server in replicas]
    with ReplicaSetClient(targets) as one, ReplicaSetClient(targets[::-1]) as two:
        for rid, prompt in batch("own-", 30).items():
            one.add_request(rid, prompt)
            two.add_request(rid, prompt)
            assert one.replica_of(rid) == two.replica_of(rid) == rendezvous_owner(rid, targets)
        assert one.moves == two.moves == 0


def test_drafts_match_one_drafter_and_budgets_come_from_the_whole_batch(
    replicas: list[DrafterProcess],
) -> None:
    targets = [server.target for server in replicas]
    prompts = batch("same-", owners=targets)
    with (
        ReplicaSetClient(targets, deadline_ms=5000, budget=RULE) as spread,
        DrafterClient(replicas[0].target, deadline_ms=5000, budget=RULE) as single,
    ):
        spread.wait_ready()
        single.wait_ready()
        for rid, prompt in prompts.items():
            spread.add_request(rid, prompt)
            single.add_request("one-" + rid, prompt)
        assert len({spread.replica_of(rid) for rid in prompts}) >= 2
        for step in range(6):
            commits = commits_at(prompts, step)
            ours = spread.step(commits)
            theirs = single.step({"one-" + rid: tokens for rid, tokens in commits.items()})
            assert ours.ok and theirs.ok
            for rid in prompts:
                tree = ours[rid]
                assert tree is not None and tree == theirs["one-" + rid], (step, rid)
                assert len(tree) == RULE.draft_budget(len(prompts)) == 3  # the batch's budget
        assert spread.stats.steps == spread.stats.drafted_steps == 6
        assert spread.stats.fallback_steps == 0
        for rid in prompts:
            spread.abort(rid)
            single.abort("one-" + rid)


def test_a_replica_killed_loses_only_its_requests_drafts_and_gets_them_back(
    replicas: list[DrafterProcess],
) -> None:
    deadline_s = 5.0  # the live replicas answer within it even on a loaded machine
    targets = [server.target for server in replicas]
    prompts = batch("kill-", owners=targets)
    client = ReplicaSetClient(targets, deadline_ms=deadline_s * 1e3, budget=RULE,
                              breaker=FAST_BREAKER, probe_timeout_s=5.0)  # fmt: skip
    victim = replicas[1]
    ref = Reference(replicas[0], prompts)
    try:
        client.wait_ready()
        for rid, prompt in prompts.items():
            client.add_request(rid, prompt)
        first = client.step(commits_at(prompts, 0))
        assert all(first.values())
        ref.check(first, commits_at(prompts, 0))
        before = {rid: client.replica_of(rid) for rid in prompts}
        theirs = {rid for rid, a in before.items() if a == victim.target}
        assert theirs and len(theirs) < len(prompts)
        assert victim.proc is not None
        victim.proc.kill()
        victim.proc.wait()
        back_at: dict[str, int] = {}
        for step in range(1, 13):  # each returns, without the victim's drafts
            result = client.step(commits_at(prompts, step))
            ref.check(result, commits_at(prompts, step))  # moved requests: whole contexts
            for rid in prompts.keys() - theirs:  # the others never miss a draft
                assert result[rid] is not None, (step, rid, result.why(rid))
            for rid in theirs:
                if result[rid] is not None:
                    back_at.setdefault(rid, step)
                elif rid not in back_at:
                    assert result.why(rid) in (Outcome.UNAVAILABLE, Outcome.DEADLINE)
        assert back_at.keys() == theirs and max(back_at.values()) <= 4, back_at
        assert client.breaker_state[victim.target] is not BreakerState.CLOSED
        after = {rid: client.replica_of(rid) for rid in prompts}
        assert all(after[rid] == before[rid] for rid in prompts.keys() - theirs)
        assert {after[rid] for rid in theirs} <= set(targets) - {victim.target}
        assert client.moves == len(theirs)
        # Restarted on its port: the probe closes its breaker, and its requests move back.
        victim.restart()
        step_until(client, prompts, 13, lambda r: client.replica_of(next(iter(theirs))) ==
                   victim.target and all(r.values()))  # fmt: skip
        assert {rid: client.replica_of(rid) for rid in prompts} == before
        assert client.moves == 2 * len(theirs)
    finally:
        client.close(timeout_s=1.0)
        ref.close()
        if victim.proc is None or victim.proc.poll() is not None:
            victim.proc = None
            victim.restart()


def stopped(server: DrafterProcess) -> bool:
    """Whether ``server``'s process is stopped (SIGSTOP): it answers nothing meanwhile."""
    assert server.proc is not None
    stat = Path(f"/proc/{server.proc.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def test_hung_replicas_cost_a_step_one_deadline_and_lose_only_their_drafts(
    replicas: list[DrafterProcess],
) -> None:
    """Two replicas stop answering at once (SIGSTOP: connected, silent): a step waits for
    them in parallel, by one deadline, and the third replica's requests keep drafting.

    Shown by events, not by the clock: the first step's three replica calls are all out
    before any goes on (a barrier: calls made one after another would never meet there),
    each returns while the two are still stopped (it did not wait for their answers), and
    theirs end by the deadline (DEADLINE, not an error at once). The deadline is long
    enough that the live replica always answers within it."""
    deadline_s = 4.0
    targets = [server.target for server in replicas]
    prompts = batch("hung-", owners=targets)
    client = ReplicaSetClient(targets, deadline_ms=deadline_s * 1e3, budget=RULE,
                              breaker=FAST_BREAKER, probe_timeout_s=5.0)  # fmt: skip
    hung = replicas[1:]
    try:
        client.wait_ready()
        for rid, prompt in prompts.items():
            client.add_request(rid, prompt)
        # Warm: every request drafted once (a loaded machine may miss the first deadline).
        start = step_until(client, prompts, 0, lambda r: all(r.values()))
        before = {rid: client.replica_of(rid) for rid in prompts}
        theirs = {rid for rid, a in before.items() if a != replicas[0].target}
        assert len({before[rid] for rid in theirs}) == 2 and len(theirs) < len(prompts)
        for server in hung:
            assert server.proc is not None
            server.proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 60  # a signal takes effect soon; a bound on failure only
        while not all(stopped(server) for server in hung):
            assert time.monotonic() < deadline, "SIGSTOP never stopped the replicas"
            time.sleep(0.01)
        met = threading.Barrier(len(targets), timeout=60)  # a bound on failure only
        spied = list(client._replicas.values())

        def meeting(step_by: Callable[..., StepResult]) -> Callable[..., StepResult]:
            def call(*args: Any) -> StepResult:
                met.wait()  # every replica's call of this step is out before any goes on
                return step_by(*args)

            return call

        for replica_client in spied:
            replica_client.step_by = meeting(replica_client.step_by)  # type: ignore[method-assign]
        try:
            first = client.step(commits_at(prompts, start))
        finally:
            for replica_client in spied:
                del replica_client.step_by  # the class's again
        assert not met.broken and all(stopped(server) for server in hung)
        assert all(first.why(rid) is Outcome.DEADLINE for rid in theirs), first.request_outcomes
        assert first.ok and all(first[rid] is not None for rid in prompts.keys() - theirs)
        for step in range(start + 1, start + 8):
            result = client.step(commits_at(prompts, step))
            assert all(stopped(server) for server in hung), step  # returned while they were
            assert all(result[rid] is not None for rid in prompts.keys() - theirs), step
            assert result.ok  # the third replica answered every step
        assert all(result[rid] is not None for rid in theirs)  # moved, with their contexts
        assert {client.replica_of(rid) for rid in prompts} == {replicas[0].target}
        for server in hung:
            assert server.proc is not None
            server.proc.send_signal(signal.SIGCONT)
        home = lambda r: all(client.replica_of(rid) == before[rid] for rid in prompts)  # noqa: E731
        step_until(client, prompts, start + 8, lambda r: home(r) and all(r.values()))
        assert client.stats.fallback_steps == 0
    finally:
        for server in hung:
            if server.proc is not None:
                server.proc.send_signal(signal.SIGCONT)
        client.close(timeout_s=1.0)


def _certificates(root: Path) -> dict[str, Path]:
    """A CA and a server certificate for the name ``localhost`` only (no IP)."""
    files = {name: root / name for name in ("ca.key", "ca.pem", "server.key", "server.pem")}

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=ca",
            "-keyout", str(files["ca.key"]), "-out", str(files["ca.pem"]))  # fmt: skip
    (root / "server.ext").write_text("subjectAltName=DNS:localhost\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=drafter",
            "-keyout", str(files["server.key"]), "-out", str(root / "server.csr"))  # fmt: skip
    openssl("x509", "-req", "-in", str(root / "server.csr"), "-CA", str(files["ca.pem"]),
            "-CAkey", str(files["ca.key"]), "-CAcreateserial", "-days", "2",
            "-extfile", str(root / "server.ext"), "-out", str(files["server.pem"]))  # fmt: skip
    return files


@pytest.mark.system
def test_a_resolved_name_connects_to_its_addresses_with_the_names_certificate(
    tmp_path: Path,
) -> None:
    certs = _certificates(tmp_path)
    server = DrafterProcess(tmp_path / "data", "--tls-cert-file", str(certs["server.pem"]),
                            "--tls-key-file", str(certs["server.key"]))  # fmt: skip
    tls = grpc.ssl_channel_credentials(certs["ca.pem"].read_bytes())
    try:
        # The address alone does not verify: the certificate names localhost only.
        with DrafterClient(server.target, credentials=tls) as by_address:
            with pytest.raises(grpc.RpcError):
                by_address.wait_ready(timeout_s=1)
        name = f"localhost:{server.port}"
        with ReplicaSetClient(name, credentials=tls, deadline_ms=5000,
                              resolve_interval_s=0.05) as client:  # fmt: skip
            assert client.replicas == (server.target,)  # localhost's address
            assert client.wait_ready(timeout_s=5).tokenizer.vocab_size == VOCAB_SIZE
            client.add_request("tls-0", DOCS[0][:PROMPT])
            assert client.step({"tls-0": [DOCS[0][PROMPT]]})["tls-0"] is not None
            assert client.finish("tls-0", tail=[DOCS[0][PROMPT + 1]]) and client.ingest([[1, 2, 3]])
            assert client.flush(5) and client.stats.background_sent >= 2
    finally:
        server.stop()


def test_with_no_replica_requests_wait_and_steps_are_unavailable() -> None:
    with ReplicaSetClient("no-such-drafter.invalid:50051", resolve_interval_s=60) as client:
        assert client.replicas == ()
        with pytest.raises(grpc.RpcError) as refused:
            client.wait_ready(timeout_s=0.5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        client.add_request("o1", [1, 2, 3])
        assert client.replica_of("o1") is None
        result = client.step({"o1": [4]})
        assert result.outcome is Outcome.UNAVAILABLE and result["o1"] is None
        assert client.finish("o1", tail=[5]) is False and client.ingest([[1, 2]]) is False
        stats = client.stats
        assert stats.fallbacks[Outcome.UNAVAILABLE] == 1 and stats.ingest_drops == 2
        with pytest.raises(KeyError, match="'o1'"):
            client.step({"o1": [6]})


@pytest.mark.parametrize("route", ["request", "prompt"])
@pytest.mark.parametrize("bad", [-1, 2**31, 2**63])
def test_a_bad_prompt_is_refused_by_name_and_leaves_nothing(route: str, bad: int) -> None:
    with ReplicaSetClient("no-such-drafter.invalid:50051", route=route,
                          resolve_interval_s=60) as client:  # fmt: skip
        with pytest.raises(ValueError, match=re.escape(f"prompt of 'b1': token id {bad}")):
            client.add_request("b1", [1, bad])
        assert "b1" not in client._keys
        with pytest.raises(KeyError, match="'b1'"):
            client.replica_of("b1")  # not live
        client.add_request("b1", [1, 2])  # the id is free: nothing of the refused one is kept
        assert client.finish("b1", tail=[3]) is False


def test_the_engine_plugin_drafts_over_a_comma_separated_address(
    replicas: list[DrafterProcess],
) -> None:
    address = ", ".join(server.target for server in replicas)
    engine = EngineDrafter(DrafterSettings(address=address, deadline_ms=5000, budget="4"))
    try:
        assert isinstance(engine.client, ReplicaSetClient)
        assert engine.client.replicas == tuple(server.target for server in replicas)
        contexts = [DOCS[i][:PROMPT] for i in range(6)]
        trees = engine.draft([f"e{i}" for i in range(6)], [PROMPT] * 6, [PROMPT] * 6,
                             lambda row, a, b: contexts[row][a:b])  # fmt: skip
        assert all(tree is not None and len(tree) == 4 for tree in trees)
        for i in range(6):
            engine.release(f"e{i}", store=False)
    finally:
        engine.close()
    one = DrafterSettings(address=replicas[0].target)
    assert one.targets() is None  # one address: a plain DrafterClient, as before
    assert DrafterSettings(address="drafter:50051", resolve_all=True).targets() == "drafter:50051"


@pytest.mark.parametrize(
    "bad",
    ["", "drafter", "drafter:", "drafter:0", "drafter:65536", "drafter:http", ":50051",
     "::1:50051", "[nonsense]:50051", "two words:1", "a:1,b:2", "-bad-:1", "dns://x/y:1"],
)  # fmt: skip
def test_bad_targets_are_refused_by_name(bad: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        parse_target(bad)
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        ReplicaSetClient(bad)
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        ReplicaSetClient(["127.0.0.1:1", bad])
    if bad and "," not in bad:
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            DrafterSettings(address=f"127.0.0.1:1,{bad}")
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            DrafterSettings(address=bad, resolve_all=True)


def test_bad_target_lists_and_settings_are_refused_by_name() -> None:
    assert parse_target("[::1]:50051") == ("::1", 50051)
    assert parse_target("dns:///drafter-headless.ns.svc.cluster.local:50051") == (
        "drafter-headless.ns.svc.cluster.local", 50051)  # fmt: skip
    with pytest.raises(ValueError, match=re.escape("[]")):
        ReplicaSetClient([])
    with pytest.raises(ValueError, match=re.escape("['127.0.0.1:1']")):
        ReplicaSetClient(["127.0.0.1:1", "127.0.0.1:1"])
    with pytest.raises(ValueError, match="deadline_ms must be a number > 0, got 0"):
        ReplicaSetClient(["127.0.0.1:1"], deadline_ms=0)
    with pytest.raises(ValueError, match="resolve_interval_s must be > 0, got -1"):
        ReplicaSetClient("127.0.0.1:1", resolve_interval_s=-1)
    with pytest.raises(TypeError, match="deadline"):
        ReplicaSetClient(["127.0.0.1:1"], deadline=3)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=re.escape("'a:1,,b:2'")):
        DrafterSettings(address="a:1,,b:2")
    with pytest.raises(ValueError, match=re.escape("'a:1,a:1'")):
        DrafterSettings(address="a:1,a:1")
    with pytest.raises(ValueError, match=re.escape("'a:1,b:2'")):
        DrafterSettings(address="a:1,b:2", resolve_all=True)
    with pytest.raises(ValueError, match="resolve_all must be true or false, got 'yes'"):
        DrafterSettings.from_mapping({"resolve_all": "yes"}, where="test")
