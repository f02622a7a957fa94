"""Rate-limited logging: the one way a failure that can repeat per call is logged.

A failure every call can hit (a full disk, the shared log down, garbage on the wire) must
not turn a flood of calls into a flood of log (a full disk once wrote ~26 traceback lines
per Ingest): at most one line per interval, saying how many were left out, and a
traceback at most once per exception type.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

DEFAULT_INTERVAL_S = 10.0
_MAX_TRACED_TYPES = 64  # exception types whose first occurrence got a traceback


class RateLimitedLog:
    """Logs through ``logger`` at most one line per ``interval_s`` seconds of ``clock``;
    one instance per failure site. Thread-safe."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = DEFAULT_INTERVAL_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._next_s: float | None = None  # None: the next line is logged
        self._suppressed = 0
        self._traced: set[type[BaseException]] = set()

    def log(
        self,
        msg: str,
        *args: object,
        level: int = logging.WARNING,
        error: BaseException | None = None,
    ) -> bool:
        """Logs ``msg % args`` unless a line was logged less than the interval ago (then it
        is only counted); ``error``'s traceback is added the first time its type is seen.
        Returns whether it logged."""
        with self._lock:
            now = self._clock()
            if self._next_s is not None and now < self._next_s:
                self._suppressed += 1
                return False
            suppressed, self._suppressed = self._suppressed, 0
            self._next_s = now + self._interval_s
            trace = (
                error is not None
                and type(error) not in self._traced
                and len(self._traced) < _MAX_TRACED_TYPES
            )
            if error is not None and trace:
                self._traced.add(type(error))
        if suppressed:
            msg = f"{msg} ({suppressed} more since the last line)"
        self._logger.log(level, msg, *args, exc_info=error if trace else None)
        return True

    def warning(self, msg: str, *args: object, error: BaseException | None = None) -> bool:
        return self.log(msg, *args, error=error)

    def error(self, msg: str, *args: object, error: BaseException | None = None) -> bool:
        return self.log(msg, *args, level=logging.ERROR, error=error)
