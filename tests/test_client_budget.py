"""The hardware-aware draft budget rule (SSSD §3.2) of verifier_client."""

from __future__ import annotations

import pytest

from verifier_client.budget import PROFILES, BudgetRule, GpuProfile


def test_profiles_ridge_points() -> None:
    assert PROFILES["h100-sxm"].ridge_point == pytest.approx(989.4e12 / 3.35e12)  # ~295.3
    assert PROFILES["h200"].ridge_point == pytest.approx(989.4e12 / 4.8e12)  # ~206.1


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        (1, 32),  # 295 - 1 capped
        (8, 32),  # floor(36.9) - 1 = 35, capped
        (16, 17),  # floor(18.46) - 1
        (64, 3),  # floor(4.61) - 1
        (147, 1),  # floor(2.008) - 1
        (148, 0),  # 2 * 148 > 295: even one draft node passes the ridge point
        (4096, 0),
    ],
)
def test_h100_budget_is_ridge_over_batch_minus_root(batch: int, expected: int) -> None:
    assert BudgetRule.for_gpu("h100").draft_budget(batch) == expected


def test_h200_has_smaller_trees_than_h100() -> None:
    h100, h200 = BudgetRule.for_gpu("h100-sxm"), BudgetRule.for_gpu("H200")
    assert h200.draft_budget(16) == 11  # floor(206.1 / 16) - 1
    for batch in range(1, 300):
        assert h200.draft_budget(batch) <= h100.draft_budget(batch)


def test_budget_never_grows_with_the_batch() -> None:
    rule = BudgetRule.for_gpu("h100")
    budgets = [rule.draft_budget(b) for b in range(1, 1000)]
    assert budgets == sorted(budgets, reverse=True)


def test_floor_and_cap_are_settable() -> None:
    rule = BudgetRule.for_gpu("h100", cap_tokens=8, floor_tokens=1)
    assert rule.draft_budget(1) == 8
    assert rule.draft_budget(10_000) == 1


def test_explicit_hardware_matches_the_profile() -> None:
    custom = BudgetRule.from_hardware(989.4e12, 4.8e12)
    assert [custom.draft_budget(b) for b in (1, 16, 64)] == [
        BudgetRule.for_gpu("h200").draft_budget(b) for b in (1, 16, 64)
    ]


def test_fixed_budget_ignores_the_batch() -> None:
    rule = BudgetRule.fixed(16)
    assert {rule.draft_budget(b) for b in (1, 64, 10_000)} == {16}


@pytest.mark.parametrize(
    ("spec", "batch", "expected"),
    [("h200", 16, 11), ("16", 64, 16), ("fixed:4", 1, 4), ("989.4e12/3.35e12", 64, 3)],
)
def test_parse(spec: str, batch: int, expected: int) -> None:
    assert BudgetRule.parse(spec).draft_budget(batch) == expected


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: BudgetRule.for_gpu("a100"), "unknown GPU profile 'a100'"),
        (lambda: BudgetRule.fixed(-1), "fixed budget must be >= 0"),
        (lambda: BudgetRule.for_gpu("h100", cap_tokens=2, floor_tokens=3), "floor_tokens"),
        (lambda: BudgetRule.from_hardware(0, 1e12), "must be > 0"),
        (lambda: BudgetRule.parse("1e12/x"), "bad budget spec"),
        (lambda: GpuProfile("x", 1e12, -1), "'x'"),
    ],
)
def test_bad_rules_name_the_value(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]
