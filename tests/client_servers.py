"""Servers for the verifier_client tests: the real `drafter serve` as a subprocess, a
tiny in-process gRPC DrafterService whose answers can be made slow, and a scripted one
that pre-drafts (the client's pre-drafting is under test, not this server)."""

from __future__ import annotations

import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from packed import pack_drafts, pack_predrafts, prefetched_flags, unpack_deltas

from sssd.drafter.v1 import drafter_pb2 as pb
from sssd.drafter.v1 import drafter_pb2_grpc as pb_grpc
from verifier_client.replica_targets import rendezvous_owner

VOCAB_SIZE = 1000
_START_TIMEOUT_S = 30.0


def drafter_command() -> list[str]:
    """`drafter serve`, or skip when the service is not installed."""
    exe = shutil.which("drafter", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("the `drafter` command is not installed (pip install -e .)")
    return [exe, "serve"]


def owned_ids(prefix: str, owners: Sequence[str], per_owner: int) -> list[str]:
    """Request ids ``prefix0``, ``prefix1``, ... picked so that each of ``owners`` (replica
    addresses) owns exactly ``per_owner`` of them under rendezvous ownership. A test that
    kills or hangs a replica must not find, by the luck of its random port, that it owned
    none (12 random ids leave one of three replicas empty about 2% of the time)."""
    share = dict.fromkeys(owners, per_owner)
    chosen: list[str] = []
    i = 0
    while len(chosen) < per_owner * len(share):
        rid = f"{prefix}{i}"
        owner = rendezvous_owner(rid, owners)
        if owner is not None and share[owner] > 0:
            share[owner] -= 1
            chosen.append(rid)
        i += 1
    return chosen


class DrafterProcess:
    """`drafter serve` on loopback with its own data directory; restartable on its port."""

    def __init__(self, data_dir: Path, *extra: str) -> None:
        self.data_dir = data_dir
        self.extra = extra
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None
        self.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        assert self.proc is None, "already running"
        cmd = [*drafter_command(), "--host", "127.0.0.1", "--port", str(self.port),
               "--data-dir", str(self.data_dir), "--vocab-size", str(VOCAB_SIZE),
               "--grace-period-s", "0.5", "--metrics-port", "0", "--admin-port", "0",
               *self.extra]  # fmt: skip
        log = (self.data_dir.parent / f"{self.data_dir.name}.log").open("a")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: lines.put(self.proc.stdout.readline()),  # type: ignore[union-attr]
                         daemon=True).start()  # fmt: skip
        try:
            line = lines.get(timeout=_START_TIMEOUT_S)
        except queue.Empty:
            self.stop()
            raise RuntimeError(f"drafter did not start in {_START_TIMEOUT_S} s") from None
        prefix = "drafter listening on "
        if not line.startswith(prefix):
            self.stop()
            raise RuntimeError(f"unexpected first line from drafter: {line!r}")
        self.port = int(line.removeprefix(prefix).strip().rsplit(":", 1)[1])

    def stop(self) -> None:
        """SIGTERM, as in production; the port is kept for a restart."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        for _ in range(50):  # the old listener may need a moment to let go of the port
            try:
                self.start()
                return
            except RuntimeError:
                time.sleep(0.1)
        raise RuntimeError(f"drafter did not restart on port {self.port}")

    def info(self) -> pb.GetServiceInfoResponse:
        with grpc.insecure_channel(self.target) as channel:
            stub = pb_grpc.DrafterServiceStub(channel)
            info: pb.GetServiceInfoResponse = stub.GetServiceInfo(
                pb.GetServiceInfoRequest(), timeout=5, wait_for_ready=True
            )
            return info


class SlowDrafter(pb_grpc.DrafterServiceServicer):  # type: ignore[misc]
    """Answers every request OK with a one-node tree after ``delay_s``; records what it got."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.received: list[pb.DraftRequest] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_DrafterServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def answer(self, request: pb.DraftRequest) -> pb.DraftResponse:
        deltas = unpack_deltas(request)  # recorded per request (the client sends packed)
        self.received.append(pb.DraftRequest(requests=deltas, step=request.step))
        time.sleep(self.delay_s)
        drafts = [
            pb.RequestDraft(
                status=pb.DRAFT_STATUS_OK,
                length=delta.known_length + len(delta.new_tokens),
                tokens=[1],
                parents=[-1],
                scores=[0.5],
            )
            for delta in deltas
        ]
        return pack_drafts(drafts, request.step)

    def Draft(self, request: pb.DraftRequest, context: Any) -> pb.DraftResponse:
        return self.answer(request)

    def DraftStream(self, requests: Iterator[pb.DraftRequest], context: Any
                    ) -> Iterator[pb.DraftResponse]:  # fmt: skip
        for request in requests:
            yield self.answer(request)

    def GetServiceInfo(self, request: Any, context: Any) -> pb.GetServiceInfoResponse:
        return pb.GetServiceInfoResponse(version="slow")

    def Ingest(self, request: pb.IngestRequest, context: Any) -> pb.IngestResponse:
        time.sleep(self.delay_s)
        return pb.IngestResponse(accepted=len(request.sequences))

    def stop(self) -> None:
        self.server.stop(grace=0)


Chain = tuple[list[int], list[int], list[float]]  # a tree: tokens, parents, scores
TreeRule = Callable[[str, Sequence[int]], Chain]  # (request id, context) -> the tree after it
# (request id, context, its tree) -> the outcomes to pre-draft, best first
OutcomeRule = Callable[[str, Sequence[int], Chain], list[tuple[int, int]]]


def chain_tree(request_id: str, context: Sequence[int]) -> Chain:
    """The scripted drafter's default tree after ``context`` ending in x: the chain x+1,
    x+2, x+3 and a sibling x+50 of x+1 (breadth-first, mod VOCAB_SIZE)."""
    x = context[-1]
    tokens = [(x + k) % VOCAB_SIZE for k in (1, 50, 2, 3)]
    return tokens, [-1, -1, 0, 2], [0.9, 0.1, 0.8, 0.7]


def bonus_after(token: int) -> int:
    """The default outcomes' bonus after a node holding ``token`` (never one of its
    children under chain_tree)."""
    return (token + 100) % VOCAB_SIZE


def chain_outcomes(request_id: str, context: Sequence[int], tree: Chain) -> list[tuple[int, int]]:
    """The default outcomes, best first: at the root, then at every node in order, the
    bonus ``bonus_after`` its token."""
    at_nodes = [(node, bonus_after(token)) for node, token in enumerate(tree[0])]
    return [(-1, bonus_after(context[-1])), *at_nodes]


def path_to(tree: Chain, node: int) -> list[int]:
    """The tokens from the root to ``node`` (none for the root, -1)."""
    tokens, parents = tree[0], tree[1]
    path: list[int] = []
    while node >= 0:
        path.append(tokens[node])
        node = parents[node]
    return path[::-1]


def outcome_made(tree: Chain, new_tokens: Sequence[int]) -> tuple[int, int] | None:
    """By brute force over the nodes: the (node, bonus) whose path plus bonus are exactly
    ``new_tokens``, the bonus being none of the node's children; None if there is none."""
    if not new_tokens:
        return None
    bonus = new_tokens[-1]
    tokens, parents = tree[0], tree[1]
    for node in range(-1, len(tokens)):
        children = {tokens[c] for c in range(len(tokens)) if parents[c] == node}
        if bonus not in children and [*path_to(tree, node), bonus] == list(new_tokens):
            return node, bonus
    return None


def _cut(tree: Chain, budget: int) -> Chain:
    return tree[0][:budget], tree[1][:budget], tree[2][:budget]


class PredraftingDrafter(SlowDrafter):
    """A scripted DrafterService that pre-drafts as the protocol says, for the client's tests.

    Each request's context is kept from its deltas (a delta that does not fit, or one
    listed in ``resync_next``, is answered RESYNC and the state dropped); the answer is
    OK with ``tree_for(request_id, context)`` cut to the budget. A request sent
    ``prefetched`` gets an empty tree instead, and the pre-draft for the outcome its new
    tokens make of its last tree becomes its tree (a claim with no such pre-draft is
    recorded in ``wrong_claims``). After answering a DraftStream message with
    ``prefetch_fan_out``, it sends a prefetch response: for every request it holds, the
    trees after its first ``prefetch_fan_out`` ``outcomes_for`` outcomes.

    Knobs: ``delays`` (seconds before each answer, one per message, then ``delay_s``),
    ``prefetch_delay_s``, ``stale_by`` (prefetch responses name step - stale_by),
    ``corrupt`` (applied to the next prefetch response only).
    """

    def __init__(self, tree_for: TreeRule = chain_tree,
                 outcomes_for: OutcomeRule = chain_outcomes) -> None:  # fmt: skip
        self.tree_for = tree_for
        self.outcomes_for = outcomes_for
        self.delays: deque[float] = deque()
        self.prefetch_delay_s = 0.0
        self.stale_by = 0
        self.corrupt: Callable[[pb.PrefetchedDrafts], None] | None = None
        self.resync_next: set[str] = set()
        self.contexts: dict[str, list[int]] = {}
        self.trees: dict[str, Chain] = {}  # the tree each request drafts from now
        self.budgets: dict[str, int] = {}
        self.predrafts: dict[str, dict[tuple[int, int], Chain]] = {}
        self.wrong_claims: list[str] = []
        self.prefetches_sent = 0
        self.finished: list[str] = []
        super().__init__()

    def answer(self, request: pb.DraftRequest) -> pb.DraftResponse:
        deltas = unpack_deltas(request)
        for delta, flag in zip(deltas, prefetched_flags(request), strict=True):
            delta.prefetched = flag
        fan_out = request.prefetch_fan_out
        self.received.append(pb.DraftRequest(requests=deltas, step=request.step,
                                             prefetch_fan_out=fan_out))  # fmt: skip
        time.sleep(self.delays.popleft() if self.delays else self.delay_s)
        return pack_drafts([self._draft(delta) for delta in deltas], request.step)

    def _draft(self, delta: pb.RequestDelta) -> pb.RequestDraft:
        rid, known = delta.request_id, delta.known_length
        context = self.contexts.get(rid)
        if rid in self.resync_next or (known and (context is None or len(context) != known)):
            self.resync_next.discard(rid)
            self.contexts.pop(rid, None)
            self.trees.pop(rid, None)
            self.predrafts.pop(rid, None)
            return pb.RequestDraft(status=pb.DRAFT_STATUS_RESYNC)
        new = list(delta.new_tokens)
        context = [*context, *new] if known and context is not None else new
        self.contexts[rid] = context
        self.budgets[rid] = delta.budget
        if delta.prefetched:
            self.trees[rid] = self._claimed(rid, new)
            return pb.RequestDraft(status=pb.DRAFT_STATUS_OK, length=len(context))
        tree = self.trees[rid] = _cut(self.tree_for(rid, context), delta.budget)
        return pb.RequestDraft(status=pb.DRAFT_STATUS_OK, length=len(context),
                               tokens=tree[0], parents=tree[1], scores=tree[2])  # fmt: skip

    def _claimed(self, rid: str, new: list[int]) -> Chain:
        """The pre-draft a request sent ``prefetched`` drafts from."""
        outcome = outcome_made(self.trees[rid], new) if rid in self.trees else None
        tree = None if outcome is None else self.predrafts.get(rid, {}).get(outcome)
        if tree is None:
            self.wrong_claims.append(rid)
            return _cut(self.tree_for(rid, self.contexts[rid]), self.budgets[rid])
        return tree

    def predraft(self, request: pb.DraftRequest) -> pb.DraftResponse:
        """The prefetch response that follows the answer to ``request``."""
        by_request = {}
        for rid in request.packed.request_ids:
            if rid not in self.trees:
                continue  # answered RESYNC
            context, tree = self.contexts[rid], self.trees[rid]
            trees = {}
            for node, bonus in self.outcomes_for(rid, context, tree)[: request.prefetch_fan_out]:
                after = [*context, *path_to(tree, node), bonus]
                trees[node, bonus] = _cut(self.tree_for(rid, after), self.budgets[rid])
            self.predrafts[rid] = trees
            by_request[rid] = [(node, bonus, *t) for (node, bonus), t in trees.items()]
        response = pack_predrafts(request.step - self.stale_by, by_request)
        if self.corrupt is not None:
            self.corrupt(response.prefetch)
            self.corrupt = None
        self.prefetches_sent += 1
        return response

    def DraftStream(self, requests: Iterator[pb.DraftRequest], context: Any
                    ) -> Iterator[pb.DraftResponse]:  # fmt: skip
        for request in requests:
            yield self.answer(request)
            if request.prefetch_fan_out:
                time.sleep(self.prefetch_delay_s)
                yield self.predraft(request)

    def Finish(self, request: pb.FinishRequest, context: Any) -> pb.FinishResponse:
        for finished in request.requests:
            self.finished.append(finished.request_id)
            self.contexts.pop(finished.request_id, None)
        return pb.FinishResponse()
