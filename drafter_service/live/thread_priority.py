"""Background threads give way to drafting.

Drafting is on the decode loop's critical path; storing finished generations, rebuilding
and snapshotting the live datastore and following a shared log are not. Where they share
a core with drafting, the kernel's scheduler would give them equal turns, and a step that
arrives while one of them runs waits for its turn. With ``drafter serve --background-nice
N`` each of those threads raises its own nice value to N first thing: at 19 the scheduler
runs a waking drafting thread at once and gives the background threads what drafting
leaves. Nice values weigh threads against every other thread of the same scheduling group
(a container's cgroup; on a plain machine the login session, or with autogroup off the
whole machine), not only against drafting, so the default is 0 (equal turns) and the Helm
chart, whose pod is a group of its own, sets 19. On a core kept busy the background
threads progress slowly, which is what the ingest queue's bound and the live datastore's
limits are for.

Only Linux can renice one thread: there ``setpriority(PRIO_PROCESS, tid)`` applies to the
thread ``tid``, where POSIX systems elsewhere would renice the whole process (drafting
included), so elsewhere nothing is done.
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
    """Raises the calling thread's nice value to ``nice`` (never lowers it: a thread
    already nicer, e.g. a process started with ``nice``, keeps its value). 0, or a
    platform other than Linux: nothing. A refusal is logged, not raised: the thread
    then runs at its normal priority, as it would have without this."""
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
