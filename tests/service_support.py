"""Helpers for the service tests: an event loop in a thread that runs real servers,
sync gRPC clients over loopback, and `drafter serve` as a subprocess."""

from __future__ import annotations

import asyncio
import concurrent.futures
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from drafter_service.drafter_cli import build_parser
from drafter_service.drafting.drafter import Drafter
from drafter_service.engine.catalog import Catalog, DatastoreSlot
from drafter_service.service import DrafterServer, ServeConfig
from drafter_service.serving import start_server
from drafter_service.snapshot.store import TokenizerIdentity
from sssd_drafter.v1 import drafter_pb2 as pb
from sssd_drafter.v1 import drafter_pb2_grpc as pb_grpc

T = TypeVar("T")
VOCAB = 1000


class LoopThread:
    """An asyncio loop running forever in a daemon thread (the server side of a test)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return self.submit(coro).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@dataclass
class Running:
    """A started in-process server and a client connected to it."""

    server: DrafterServer
    channel: grpc.Channel
    stub: pb_grpc.DrafterServiceStub

    def draft(
        self, *deltas: pb.RequestDelta, step: int = 0, fingerprint: str = ""
    ) -> pb.DraftResponse:
        request = pb.DraftRequest(requests=deltas, step=step, tokenizer_fingerprint=fingerprint)
        # A bound on failure only: a loaded machine's call can take seconds.
        response: pb.DraftResponse = self.stub.Draft(request, timeout=60)
        return response


def config(data_dir: Path, **overrides: Any) -> ServeConfig:
    settings: dict[str, Any] = dict(
        port=0,
        data_dir=data_dir,
        vocab_size=VOCAB,
        draft_threads=1,
        grace_period_s=0.5,
        admin_port=0,  # a free port: tests never collide on the default 8400
        metrics_port=0,  # nor on the default 9400
    )
    settings.update(overrides)
    return ServeConfig(**settings)


def read_only_catalog(vocab_size: int, *names: str) -> Catalog:
    """Empty read-only datastores ``names`` (none of them started), what calls are checked
    against without a service."""
    slots = {
        name: DatastoreSlot(
            name, Drafter(vocab_size, num_threads=1), None, concurrent.futures.ThreadPoolExecutor(1)
        )
        for name in names
    }
    return Catalog(TokenizerIdentity("test", vocab_size, ""), slots)


def parsed_config(args: Sequence[str], environ: Mapping[str, str]) -> ServeConfig:
    """The settings of ``drafter serve ARGS`` with ``environ`` as its variables, read as
    the command reads them."""
    return ServeConfig.from_namespace(build_parser().parse_args(["serve", *args]), environ)


@dataclass(slots=True)
class FakeClock:
    """A monotonic clock that moves only when a test moves it."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@contextmanager
def serving(
    loop: LoopThread, cfg: ServeConfig, clock: Callable[[], float] = time.monotonic
) -> Iterator[Running]:
    """A started server (``clock``: what request idleness is measured by)."""
    server = loop.run(start_server(cfg, clock))
    channel = grpc.insecure_channel(server.address)
    try:
        yield Running(server, channel, pb_grpc.DrafterServiceStub(channel))
    finally:
        channel.close()
        loop.run(server.stop(0))


def delta(
    request_id: str, tokens: Sequence[int] = (), known_length: int = 0, budget: int = 8, **kw: Any
) -> pb.RequestDelta:
    return pb.RequestDelta(
        request_id=request_id,
        known_length=known_length,
        new_tokens=list(tokens),
        budget=budget,
        **kw,
    )


def rpc_error(call: Any, *args: Any, **kw: Any) -> grpc.RpcError:
    """The RpcError ``call(*args)`` raises (fails the test if it returns)."""
    try:
        call(*args, **kw)
    except grpc.RpcError as exc:
        return exc
    raise AssertionError(f"{call} succeeded; expected an error")


class Subprocess:
    """``drafter serve`` as a child process; ``address`` from its one stdout line."""

    def __init__(
        self,
        *args: str,
        timeout_s: float = 30,
        defaults: tuple[str, ...] = ("--admin-port", "0", "--metrics-port", "0"),
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        exe = Path(sys.executable).with_name("drafter")
        self.proc = subprocess.Popen(
            [str(exe), "serve", *defaults, *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout_s)
        if not line or not line[0].startswith("drafter listening on "):
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            raise AssertionError(f"no listening line ({line!r}); stderr:\n{err}")
        self.line = line[0]
        self.address = line[0].removeprefix("drafter listening on ").strip()

    def stop(self, sig: int, timeout_s: float = 20) -> tuple[int, str, str]:
        """Sends ``sig``; returns (exit code, rest of stdout, stderr)."""
        self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=timeout_s)
        return self.proc.returncode, out, err


@contextmanager
def datastore_held(s: Running) -> Iterator[None]:
    """The default datastore's worker thread is busy until the block ends: a call made
    meanwhile is queued behind it, so the service is still at work on it however long the
    client takes to give up (no race with the clock)."""
    assert s.server.engine is not None
    release = threading.Event()
    executor = s.server.engine.catalog.slots["default"].executor
    blocker = executor.submit(release.wait, 600)  # a bound on failure only
    try:
        yield
    finally:
        release.set()
        blocker.result()


def wait_until_taken(s: Running) -> None:
    """Until the service holds a call (admitted, its work queued)."""
    engine = s.server.engine
    assert engine is not None
    end = time.monotonic() + 60  # bounds failure only
    while engine.inflight_calls == 0:
        assert time.monotonic() < end, "the service never took the call"
        time.sleep(0.01)


@contextmanager
def draft_held(s: Running, *deltas: pb.RequestDelta) -> Iterator[grpc.Future]:
    """A Draft call of ``deltas`` that the service has taken, held on the default
    datastore's worker thread until the block ends: the call's future."""
    with datastore_held(s):
        call = s.stub.Draft.future(pb.DraftRequest(requests=deltas))
        wait_until_taken(s)
        yield call
