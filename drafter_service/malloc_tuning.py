"""glibc's malloc, told to give large freed buffers back to the operating system.

glibc maps allocations of at least ``M_MMAP_THRESHOLD`` (128 KiB at first) on their own,
but raises the threshold to each such mapping freed, up to 32 MiB; after one large call
(a million-token prompt) buffers up to that size come from the heap and stay resident
once freed: 1.8x the request state held for two 1M-token contexts, 1.1-1.3x with the
threshold fixed (``drafter_bench/state_memory.py``). A fixed threshold trades against
CPU (each buffer above it costs an ``mmap`` and fresh pages): heavy calls a second on
one core 5.9 at 256 KiB, 9.7 at 1 MiB, 9.2 at 32 MiB (``drafter_bench/overload.py
--pin``), with held state 0.90-1.41x accounted at 1 MiB (within issue 29's 1.5x)."""

from __future__ import annotations

import ctypes
import platform
from collections.abc import Mapping

MMAP_THRESHOLD_BYTES = 1 << 20
_M_MMAP_THRESHOLD = -3  # malloc.h
ENV = "MALLOC_MMAP_THRESHOLD_"  # glibc's own tunable: an operator's setting wins


def fix_mmap_threshold(environ: Mapping[str, str]) -> int | None:
    """Fixes glibc's mmap threshold at :data:`MMAP_THRESHOLD_BYTES`; returns it, or None
    where nothing was changed (not glibc, or ``MALLOC_MMAP_THRESHOLD_`` already set)."""
    if ENV in environ or platform.libc_ver()[0] != "glibc":
        return None
    libc = ctypes.CDLL(None)
    if libc.mallopt(ctypes.c_int(_M_MMAP_THRESHOLD), ctypes.c_int(MMAP_THRESHOLD_BYTES)) != 1:
        return None
    return MMAP_THRESHOLD_BYTES
