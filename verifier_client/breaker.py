"""Circuit breaker: an unreachable drafter must cost nothing per decode step.

States::

    CLOSED ──N consecutive failures──▶ OPEN ──cooldown elapsed──▶ HALF_OPEN
       ▲                                 ▲                            │
       └────────── probe succeeds ───────┼────── probe fails ─────────┘

While OPEN, ``admit`` answers False after one comparison (no message, no socket). After
the cooldown it moves to HALF_OPEN (still False: the caller sends one probe off the hot
path) and waits for that probe's result. Each
reopening in a row doubles the cooldown up to a cap; jitter spreads many workers' probes
so a restarted drafter is not hit by all at once. Pure: time is an argument (any monotonic
clock, seconds) and the jitter's random source is injectable, so tests need no sleeps.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["BreakerConfig", "BreakerState", "CircuitBreaker"]


class BreakerState(StrEnum):
    """Where the breaker stands."""

    CLOSED = "closed"  # calls go through
    OPEN = "open"  # calls are refused until the cooldown ends
    HALF_OPEN = "half_open"  # one probe is out; everything else is refused


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """Thresholds and timings of a :class:`CircuitBreaker`."""

    failure_threshold: int = 3  # consecutive failed calls that open the circuit
    cooldown_s: float = 0.1  # first open period
    max_cooldown_s: float = 5.0  # cap of the doubling
    jitter: float = 0.2  # each period is drawn from [(1 - jitter) * c, c]

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {self.failure_threshold}")
        if not 0 < self.cooldown_s <= self.max_cooldown_s:
            raise ValueError(
                f"need 0 < cooldown_s <= max_cooldown_s, got {self.cooldown_s} and "
                f"{self.max_cooldown_s}"
            )
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")


@dataclass(slots=True)
class CircuitBreaker:
    """Counts consecutive failures and decides whether a call may go out; read ``state``
    (and, while OPEN, ``open_until_s``), change it only through the methods."""

    config: BreakerConfig = field(default_factory=BreakerConfig)
    rng: Callable[[], float] = field(default=random.random, kw_only=True)  # the jitter's
    state: BreakerState = field(default=BreakerState.CLOSED, init=False)
    failures: int = field(default=0, init=False)  # consecutive failed calls while CLOSED
    # consecutive openings without a success: the backoff exponent
    opens: int = field(default=0, init=False)
    # end of the current OPEN period (clock of the caller)
    open_until_s: float = field(default=0.0, init=False)

    def admit(self, now_s: float) -> bool:
        """Whether a call may go out now (only while CLOSED); an OPEN breaker whose cooldown
        has elapsed moves to HALF_OPEN: the caller sends one probe and reports its result."""
        if self.state is BreakerState.OPEN and now_s >= self.open_until_s:
            self.state = BreakerState.HALF_OPEN
        return self.state is BreakerState.CLOSED

    def record_success(self) -> None:
        """A call (or the probe) succeeded: close and forget the backoff."""
        self.state = BreakerState.CLOSED
        self.failures = 0
        self.opens = 0

    def record_failure(self, now_s: float) -> None:
        """A call failed (timeout, unavailable, error), or the probe did."""
        if self.state is BreakerState.OPEN:
            return  # a late report from before the circuit opened: already counted
        if self.state is BreakerState.CLOSED:
            self.failures += 1
            if self.failures < self.config.failure_threshold:
                return
        cfg = self.config
        # Exponential backoff: cooldown * 2^(openings in a row), capped, then jittered down.
        period_s = min(cfg.max_cooldown_s, cfg.cooldown_s * 2.0 ** min(self.opens, 62))
        period_s *= 1.0 - cfg.jitter * self.rng()
        self.state = BreakerState.OPEN
        self.open_until_s = now_s + period_s
        self.opens += 1
        self.failures = 0
