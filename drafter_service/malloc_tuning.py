"""glibc's malloc, told to give large freed buffers back to the operating system.

glibc serves an allocation of at least ``M_MMAP_THRESHOLD`` bytes (128 KiB at first) with
a mapping of its own, returned to the system when freed, but each time such a mapping is
freed it raises the threshold to that size, up to 32 MiB. After one large call (a
million-token prompt arrives as a ~3 MB message, becomes a 4 MB token array, grows a
request's buffers by doubling) buffers up to that size come from the heap instead, and
stay resident once freed: measured with ``drafter_bench/state_memory.py``, 1.8x the request
state actually held for two 1M-token contexts of repetitive text, 1.1-1.3x with the
threshold fixed. Setting the threshold explicitly turns the adjustment off.

Where it is fixed is a trade against CPU: a buffer at or above it costs one ``mmap`` and
fresh, zeroed pages, and a heavy call (64 requests of 2,000 tokens: a 368 KB message,
~1 MB token arrays, the tries' growing buffers) makes many. At 256 KiB the service
answered 5.9 such calls a second on one core, at 1 MiB 9.7, at 32 MiB 9.2
(``drafter_bench/overload.py --pin``), with held state at 0.90-1.41x accounted at 1 MiB
(``drafter_bench/state_memory.py``, five runs; within issue 29's 1.5x)."""

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
