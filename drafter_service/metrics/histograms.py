"""Histogram state that is cheap to update on the serving path, turned into Prometheus
buckets only when scraped. Neither class locks: the owner holds its lock around every call."""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt


class Buckets:
    """One histogram series: counts per bucket (``le`` bounds, then +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # last: +Inf
        self.total = 0.0

    def add(self, value: float, weight: int = 1) -> None:
        """``weight`` observations of ``value`` (buckets are inclusive: value <= le)."""
        self.counts[bisect_left(self.bounds, value)] += weight
        self.total += value * weight

    @property
    def count(self) -> int:
        return sum(self.counts)

    def sample(self) -> tuple[list[tuple[str, float]], float]:
        """Cumulative (le, count) pairs ending with +Inf, and the sum."""
        return _cumulative(self.bounds, list(itertools.accumulate(self.counts))), self.total


class SizeCounts:
    """A histogram of small non-negative integers (tree sizes), kept as a count per exact
    value and bucketed at scrape time: a batch costs one ``bincount`` and one array add.
    Grows to the largest value seen (at most the largest draft budget)."""

    __slots__ = ("bounds", "by_value", "total")

    def __init__(self, bounds: Sequence[int]) -> None:
        self.bounds = tuple(int(b) for b in bounds)
        self.by_value = np.zeros(self.bounds[-1] + 2, dtype=np.int64)
        self.total = 0

    def add_all(self, values: npt.NDArray[np.int64], total: int) -> int:
        """One observation per element of ``values`` (>= 0, summing to ``total``);
        returns how many were 0."""
        found = np.bincount(values)
        if len(found) > len(self.by_value):
            self.by_value = np.pad(self.by_value, (0, len(found) - len(self.by_value)))
        self.by_value[: len(found)] += found
        self.total += total
        return int(found[0])

    def sample(self) -> tuple[list[tuple[str, float]], float]:
        at_most = np.cumsum(self.by_value)  # at_most[k]: observations <= k
        last = len(at_most) - 1
        cumulative = [int(at_most[min(b, last)]) for b in self.bounds] + [int(at_most[-1])]
        return _cumulative(tuple(float(b) for b in self.bounds), cumulative), float(self.total)


def _cumulative(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    les = [repr(b) for b in bounds] + ["+Inf"]  # 0.0, 5e-05, 1.0: as Go prints them
    return list(zip(les, counts, strict=True))
