"""Background threads give way to drafting.

Drafting is on the decode loop's critical path; storing generations, rebuilding,
snapshotting and following a shared log are not. With ``drafter serve --background-nice
N`` each such thread raises its own nice value to N, so at 19 a waking drafting thread
runs at once. Nice weighs threads against all others of the scheduling group (a
container's cgroup, a login session, or the machine), so the default is 0 and the Helm
chart, whose pod is its own group, sets 19 (on a busy core the threads then progress
slowly: the ingest queue's bound and the datastore's limits cover that). Only Linux
renices one thread (``setpriority(PRIO_PROCESS, tid)``; elsewhere it would renice the
whole process), so elsewhere nothing is done.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

MAX_NICE = 19
"""The lowest priority a nice value gives (Linux's range is -20..19)."""


def check_nice(nice: int) -> int:
    """``nice`` if it is a background nice value (0 = leave the priority as it is)."""
    if isinstance(nice, bool) or not isinstance(nice, int) or not 0 <= nice <= MAX_NICE:
        raise ValueError(f"background nice value {nice!r} must be an int in [0, {MAX_NICE}]")
    return nice


def lower_thread_priority(nice: int) -> None:
    """Raises the calling thread's nice value to ``nice``, never lowering it; 0 or not
    Linux: nothing. A refusal is logged, not raised (the thread keeps its priority)."""
    check_nice(nice)
    if nice == 0 or not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError as exc:
        log.warning(
            "thread %r keeps its priority: setting nice %d failed: %s",
            threading.current_thread().name, nice, exc,
        )
