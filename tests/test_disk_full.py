"""A full disk under the ingest log (issue 29, item 5), against the real `drafter serve`
on a real full volume: its data directory is a small tmpfs, mounted in a private user
and mount namespace (``unshare --user --map-root-user --mount``, no root needed where
user namespaces are allowed), that the test fills with a ballast file it reaches through
``/proc/<pid>/root`` and deletes to free space. The kernel then answers the ingest log's
writes with ENOSPC or a short write, exactly as on a full production volume.

Ingest answers RESOURCE_EXHAUSTED naming the volume, with at most a few log lines for
hundreds of failing calls and no traceback; a two-sequence Ingest whose first sequence
was stored says so; once space is freed ingest works again and nothing was stored
twice."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from client_servers import VOCAB_SIZE, DrafterProcess, finish_durable

from sssd_drafter.v1 import drafter_pb2 as pb
from sssd_drafter.v1 import drafter_pb2_grpc as pb_grpc

pytestmark = pytest.mark.system

PAGE = 4096  # tmpfs allocates whole pages
_MOUNT = 'mount -t tmpfs -o size="$1" tmpfs "$2" && shift 2 && exec "$@"'


def _namespaces_work(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.mkdir()
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", _MOUNT, "sh", "64k",
         str(probe), "true"],
        capture_output=True, check=False,
    )  # fmt: skip
    return done.returncode == 0


class FullDiskDrafter(DrafterProcess):
    """`drafter serve` whose data directory is a ``size`` tmpfs only it sees."""

    def __init__(self, tmp_path: Path, size: str = "2m") -> None:
        self.size = size
        self.log_path = tmp_path / "data.log"
        (tmp_path / "data").mkdir()
        super().__init__(tmp_path / "data", "--snapshot-interval-s", "0")
        assert self.proc is not None
        # The tmpfs as this process sees it: through the server's own root.
        self.volume = Path(f"/proc/{self.proc.pid}/root") / str(self.data_dir).lstrip("/")
        self.ballast = self.volume / "ballast"
        self.channel = grpc.insecure_channel(self.target)
        self.stub = pb_grpc.DrafterServiceStub(self.channel)

    def fill(self, leave_pages: int = 0) -> None:
        """Writes the ballast until the volume is full, then frees ``leave_pages``."""
        fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        chunk = b"\0" * (64 * PAGE)
        try:
            while True:
                try:
                    if os.write(fd, chunk) < len(chunk):
                        continue  # the next write fails
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
        finally:
            os.close(fd)
        size = self.ballast.stat().st_size
        assert size % PAGE == 0
        os.truncate(self.ballast, size - leave_pages * PAGE)
        assert os.statvfs(self.volume).f_bfree == leave_pages

    def free(self) -> None:
        self.ballast.unlink()

    def log_lines(self) -> list[str]:
        return self.log_path.read_text().splitlines()

    def command(self) -> list[str]:
        return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", _MOUNT, "sh",
                self.size, str(self.data_dir), *super().command()]  # fmt: skip


@pytest.fixture
def drafter(tmp_path: Path) -> Iterator[FullDiskDrafter]:
    if not _namespaces_work(tmp_path):
        pytest.skip("no user+mount namespaces here (unshare -rm), so no private tmpfs")
    server = FullDiskDrafter(tmp_path)
    try:
        yield server
    finally:
        server.channel.close()
        server.stop()


def ingest(stub: pb_grpc.DrafterServiceStub, *sizes: int, seed: int = 0) -> pb.IngestResponse:
    sequences = [
        pb.TokenSequence(tokens=[(seed + 7 * i + j) % VOCAB_SIZE for j in range(n)])
        for i, n in enumerate(sizes)
    ]
    response: pb.IngestResponse = stub.Ingest(pb.IngestRequest(sequences=sequences), timeout=30)
    return response


def refused(stub: pb_grpc.DrafterServiceStub, *sizes: int, seed: int = 0) -> grpc.RpcError:
    try:
        ingest(stub, *sizes, seed=seed)
    except grpc.RpcError as exc:
        return exc
    raise AssertionError("Ingest succeeded on a full volume")


def test_a_full_volume_is_resource_exhausted_naming_it_with_few_log_lines(
    drafter: FullDiskDrafter,
) -> None:
    drafter.fill()  # before the first ingest: the log's first write needs a page
    before = len(drafter.log_lines())
    for i in range(200):
        err = refused(drafter.stub, 50, seed=i)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
        details = str(err.details())
        assert str(drafter.data_dir) in details and "is full" in details, details
        assert "after 0 of 1 sequences" in details, details
    for i in range(30):  # finished generations hit the same disk, in the background
        answer = finish_durable(drafter.stub, f"req-{i}")
        assert (answer.ingested, answer.durable) == (1, 0)
    flood = drafter.log_lines()[before:]
    assert "Traceback" not in "\n".join(flood)
    # 230 failing calls in well under the 10 s window: one line (two if it rolled over).
    assert 1 <= len(flood) <= 4, flood
    assert str(drafter.data_dir) in flood[0] and "full" in flood[0], flood
    drafter.free()
    assert ingest(drafter.stub, 50, seed=999).wal_position == 1  # none of the refused stored
    assert finish_durable(drafter.stub, "after").durable == 1


def test_a_partly_stored_ingest_says_which_sequences_were_stored(
    drafter: FullDiskDrafter,
) -> None:
    drafter.fill(leave_pages=1)
    # The first sequence (220 bytes) fits in the free page; the second (8 KB) does not:
    # the kernel writes what fits (a short write), the log takes it back and refuses.
    err = refused(drafter.stub, 50, 2000)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
    details = str(err.details())
    assert "after 1 of 2 sequences (those are stored)" in details, details
    assert str(drafter.data_dir) in details, details
    drafter.free()
    # Resending only the one not stored: the log holds each sequence once.
    assert ingest(drafter.stub, 2000, seed=7).wal_position == 2
    assert "Traceback" not in drafter.log_path.read_text()
