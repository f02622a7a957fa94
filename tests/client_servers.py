"""Servers for the verifier_client tests: the real `drafter serve` as a subprocess, and a
tiny in-process gRPC DrafterService whose answers can be made slow or held."""

from __future__ import annotations

import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from packed import pack_drafts, unpack_deltas

from sssd_drafter.v1 import drafter_pb2 as pb
from sssd_drafter.v1 import drafter_pb2_grpc as pb_grpc
from verifier_client.replica_targets import rendezvous_owner

VOCAB_SIZE = 1000
_START_TIMEOUT_S = 120.0  # a bound on failure only: a loaded machine may take a minute to import


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

    def command(self) -> list[str]:
        return [*drafter_command(), "--host", "127.0.0.1", "--port", str(self.port),
                "--data-dir", str(self.data_dir), "--vocab-size", str(VOCAB_SIZE),
                "--grace-period-s", "0.5", "--metrics-port", "0", "--admin-port", "0",
                *self.extra]  # fmt: skip

    def start(self) -> None:
        assert self.proc is None, "already running"
        log = (self.data_dir.parent / f"{self.data_dir.name}.log").open("a")
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=log,
                                     text=True)  # fmt: skip
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


def finish_durable(stub: pb_grpc.DrafterServiceStub, request_id: str) -> pb.FinishResponse:
    """Starts ``request_id`` with a prompt, then finishes it with output, waiting for the
    generation to be stored (or refused)."""
    prompt = [(3 * j + len(request_id)) % VOCAB_SIZE for j in range(40)]
    delta = pb.RequestDelta(request_id=request_id, new_tokens=prompt, budget=4)
    stub.Draft(pb.DraftRequest(requests=[delta]), timeout=30)
    done = pb.FinishedRequest(
        request_id=request_id, reason=pb.FINISH_REASON_FINISHED, final_tokens=list(range(1, 30))
    )
    response: pb.FinishResponse = stub.Finish(
        pb.FinishRequest(requests=[done], wait_durable=True), timeout=60
    )
    return response


class SlowDrafter(pb_grpc.DrafterServiceServicer):  # type: ignore[misc]
    """Answers every request OK with a one-node tree; records what it got. ``hold()``
    keeps every Draft and Ingest answer back until ``release()``: a step that returns while
    it is held did not wait for its answer, whatever the machine's speed (slowness is an
    event here, never a sleep)."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()
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
        self._open.wait(timeout=120)  # a bound on failure only
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
        self._open.wait(timeout=120)  # a bound on failure only
        return pb.IngestResponse(accepted=len(request.sequences))

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    @property
    def held(self) -> bool:
        return not self._open.is_set()

    def stop(self) -> None:
        self.release()
        self.server.stop(grace=0)
