"""The circuit breaker of verifier_client, on a fake clock (no sleeps)."""

from __future__ import annotations

import pytest

from verifier_client.breaker import BreakerConfig, BreakerState, CircuitBreaker

CONFIG = BreakerConfig(failure_threshold=3, cooldown_s=1.0, max_cooldown_s=4.0, jitter=0.5)


def opened(rng: float = 0.0) -> CircuitBreaker:
    breaker = CircuitBreaker(CONFIG, rng=lambda: rng)
    for _ in range(3):
        breaker.record_failure(0.0)
    return breaker


def test_closed_until_n_consecutive_failures() -> None:
    breaker = CircuitBreaker(CONFIG, rng=lambda: 0.0)
    breaker.record_failure(0.0)
    breaker.record_failure(0.0)
    breaker.record_success()  # not consecutive any more
    breaker.record_failure(0.0)
    breaker.record_failure(0.0)
    assert breaker.state is BreakerState.CLOSED
    assert breaker.admit(0.0) is True
    breaker.record_failure(0.0)
    assert breaker.state is BreakerState.OPEN
    assert breaker.admit(0.5) is False and breaker.state is BreakerState.OPEN


def test_one_probe_after_the_cooldown_then_close_on_success() -> None:
    breaker = opened()
    assert breaker.admit(0.999) is False and breaker.state is BreakerState.OPEN
    assert breaker.admit(1.0) is False  # the caller probes instead
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.admit(1.0) is False  # one probe at a time
    assert breaker.admit(100.0) is False and breaker.state is BreakerState.HALF_OPEN
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.admit(100.0) is True


def test_failed_probes_double_the_cooldown_up_to_the_cap() -> None:
    breaker = opened()
    now, periods = 0.0, []
    for _ in range(5):
        until = breaker.open_until_s
        periods.append(until - now)
        now = until
        assert breaker.admit(now) is False and breaker.state is BreakerState.HALF_OPEN
        breaker.record_failure(now)  # the probe failed
    assert periods == pytest.approx([1.0, 2.0, 4.0, 4.0, 4.0])


def test_success_resets_the_backoff() -> None:
    breaker = opened()
    breaker.admit(1.0)
    breaker.record_failure(1.0)  # now 2 s
    breaker.admit(3.0)
    breaker.record_success()
    for _ in range(3):
        breaker.record_failure(10.0)
    assert breaker.open_until_s == pytest.approx(11.0)


@pytest.mark.parametrize(("rng", "period"), [(0.0, 1.0), (1.0, 0.5), (0.5, 0.75)])
def test_jitter_shortens_the_period(rng: float, period: float) -> None:
    assert opened(rng).open_until_s == pytest.approx(period)


def test_reports_while_open_are_ignored() -> None:
    breaker = opened()
    until = breaker.open_until_s
    breaker.record_failure(0.5)  # a late failure of a call made before the circuit opened
    assert breaker.state is BreakerState.OPEN and breaker.open_until_s == until


@pytest.mark.parametrize(
    "kwargs",
    [{"failure_threshold": 0}, {"cooldown_s": 0.0}, {"cooldown_s": 2, "max_cooldown_s": 1},
     {"jitter": 1.0}],
)  # fmt: skip
def test_bad_config(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BreakerConfig(**kwargs)  # type: ignore[arg-type]
