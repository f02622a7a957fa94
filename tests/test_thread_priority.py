"""Background threads give way to drafting: the threads that store generations, rebuild
and snapshot the live datastore and follow the shared log run at `background_nice`
(a real service, a real Redis stream); drafting threads keep their priority."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from log_server import RedisServer
from service_support import LoopThread, config, delta, serving

from drafter_service.engine.ingest_queue import GenerationIngester
from drafter_service.live.live_datastore import LiveDatastore
from drafter_service.live.thread_priority import MAX_NICE, check_nice, lower_thread_priority
from drafter_service.replication.replicated_datastore import ReplicatedDatastore
from drafter_service.replication.shared_log import SharedLogConfig
from drafter_service.snapshot.store import TokenizerIdentity
from sssd_drafter.v1 import drafter_pb2 as pb

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="only Linux renices a single thread"
)

PROCESS_NICE = os.getpriority(os.PRIO_PROCESS, 0)
TOKENIZER = TokenizerIdentity("test", 1000, "0" * 64)


def nice_of(thread: threading.Thread) -> int:
    assert thread.native_id is not None
    return os.getpriority(os.PRIO_PROCESS, thread.native_id)


def in_thread(fn: Callable[[], None]) -> int:
    """Runs ``fn`` in a new thread; that thread's nice value after it."""
    seen: list[int] = []

    def run() -> None:
        fn()
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    return seen[0]


def settled_nice(
    before: set[threading.Thread], prefix: str, expected: int, timeout_s: float = 60.0
) -> dict[str, int]:
    """The nice values of the threads started since ``before`` whose name starts with
    ``prefix``, once every one has reached ``expected`` (a thread lowers itself first
    thing, but it may not have run yet), or as they are at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = {t.name: nice_of(t) for t in threading.enumerate()
                 if t not in before and t.name.startswith(prefix)}  # fmt: skip
        if (found and all(v == expected for v in found.values())) or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def test_a_thread_lowers_only_itself_and_never_raises_its_priority() -> None:
    expected = max(PROCESS_NICE, 7)
    assert in_thread(lambda: lower_thread_priority(7)) == expected
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == PROCESS_NICE

    def nicer_first() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), max(PROCESS_NICE, 15))
        lower_thread_priority(5)  # asks for more priority than it has: keeps its own

    assert in_thread(nicer_first) == max(PROCESS_NICE, 15)
    assert in_thread(lambda: lower_thread_priority(0)) == PROCESS_NICE


@pytest.mark.parametrize("bad", [-1, MAX_NICE + 1, 1.5, True, "3"])
def test_a_bad_nice_value_is_named(bad: object, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=repr(bad).replace(".", r"\.")):
        check_nice(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nice"):
        GenerationIngester(4, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nice"):
        LiveDatastore(tmp_path / "live", TOKENIZER, background_nice=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "live").exists()  # refused before anything was written


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()


def test_the_service_runs_its_background_threads_at_background_nice(
    loop: LoopThread, tmp_path: Path
) -> None:
    nice = max(PROCESS_NICE, 13)
    before = set(threading.enumerate())
    with serving(loop, config(tmp_path / "data", background_nice=13)) as running:
        running.draft(delta("a", [1, 2, 3, 4, 5, 6], budget=4))
        assert settled_nice(before, "generation-ingest", nice) == {"generation-ingest": nice}
        assert settled_nice(before, "live-datastore", nice) == {"live-datastore": nice}
        # Drafting keeps its priority: the event loop's thread, which calls the native
        # drafter (one drafting thread: the caller's), and the process.
        assert nice_of(loop.thread) == PROCESS_NICE
        assert os.getpriority(os.PRIO_PROCESS, 0) == PROCESS_NICE


def test_background_nice_zero_leaves_every_thread_as_it_was(
    loop: LoopThread, tmp_path: Path
) -> None:
    before = set(threading.enumerate())
    cfg = config(tmp_path / "data", background_nice=0, rebuild_min_tokens=1)
    with serving(loop, cfg) as running:
        running.draft(delta("a", [1, 2, 3], budget=4))
        # Proof that both threads are past lowering their priority (their first thing):
        # the ingest thread stored a generation (the call waits for that), then the
        # background thread rebuilt with it.
        finished = pb.FinishedRequest(request_id="a", reason=pb.FINISH_REASON_FINISHED,
                                      final_tokens=[4, 5])  # fmt: skip
        answer = running.stub.Finish(pb.FinishRequest(requests=[finished], wait_durable=True),
                                     timeout=60)  # fmt: skip
        assert answer.durable == 1
        assert running.server.engine is not None
        live = running.server.engine.catalog.slots["default"].live
        assert live is not None
        deadline = time.monotonic() + 60  # a bound on failure only
        while live.stats().rebuilds == 0:
            assert time.monotonic() < deadline, "the background thread never rebuilt"
            time.sleep(0.02)
        for name in ("generation-ingest", "live-datastore"):
            assert settled_nice(before, name, PROCESS_NICE, 0) == {name: PROCESS_NICE}


def test_the_shared_log_follower_runs_at_background_nice(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    try:
        shared = SharedLogConfig(server.url, prefix="nice")
        before = set(threading.enumerate())
        live = ReplicatedDatastore(
            tmp_path / "live", TOKENIZER, shared_log=shared.stream("default"), background_nice=11
        )
        try:
            nice = max(PROCESS_NICE, 11)
            assert settled_nice(before, "stream-follower-", nice) == {"stream-follower-live": nice}
            assert settled_nice(before, "live-datastore", nice) == {"live-datastore": nice}
        finally:
            live.close()
    finally:
        server.stop()
