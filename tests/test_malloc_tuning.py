"""drafter serve fixes glibc's mmap threshold, so large buffers freed after a call go back
to the system instead of staying resident (the request-state bound counts what requests
hold; retained transients of large calls once made resident memory 1.8x of it)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from drafter_service.malloc_tuning import ENV, fix_mmap_threshold

# In a fresh interpreter: one 8 MiB buffer freed (glibc then raises its threshold to
# 8 MiB), then 64 buffers of 1 MiB, each followed by a small one that stays alive, so the
# heap cannot shrink past them; prints how many MiB stay resident once the 1 MiB ones
# are freed.
PROBE = """
import sys
from drafter_service.malloc_tuning import fix_mmap_threshold
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
if sys.argv[1] == "fixed":
    assert fix_mmap_threshold({}) is not None
big = bytearray(8 << 20)
del big
# Fill the holes the interpreter's start left in the heap first, so each pin below lands
# after its block (in a hole, it would let the heap trim the freed blocks: 0 retained
# whatever the threshold, as with one editable-install loader's start-up allocations).
holes = [bytearray(4096) for _ in range(4096)]
before = rss()
blocks, pins = [], []
for _ in range(64):
    blocks.append(bytearray(1 << 20))
    pins.append(bytearray(4096))
del blocks
print((rss() - before) >> 20)
"""

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")


def retained_mib(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    done = subprocess.run([sys.executable, "-c", PROBE, mode], env=env, capture_output=True,
                          text=True, timeout=300, check=True)  # fmt: skip
    return int(done.stdout)


@glibc
def test_freed_large_buffers_leave_the_resident_set_once_the_threshold_is_fixed() -> None:
    assert retained_mib("dynamic") >= 48  # the control: glibc's own behaviour keeps them
    assert retained_mib("fixed") <= 8


@glibc
def test_an_operators_malloc_setting_wins() -> None:
    assert fix_mmap_threshold({ENV: "1048576"}) is None

