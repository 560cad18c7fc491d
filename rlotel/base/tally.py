"""Whole-number observations reduced to counts per distinct value.

Weight versions, staleness and spans take a handful of distinct values over 100k samples:
a tally keeps verl's mean/max/min exact and feeds histograms, with no per-sample arrays
left to allocate (at that size, fresh arrays cost more than the arithmetic).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

DENSE_RANGE = 1 << 16  # wider spreads of values are tallied by sorting, not bincount
CHUNK = 1 << 15  # elements per temporary: small enough for the allocator to reuse


class Tally(NamedTuple):
    """(distinct values ascending, how many of each)."""

    values: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, observations: np.ndarray, non_negative: bool = False) -> Tally:
        """The tally of an integer array (`non_negative`: the caller checked, one pass less)."""
        if not observations.size:
            return cls(np.empty(0, np.int64), np.empty(0, np.int64))
        high = int(observations.max())
        low = 0 if non_negative else int(observations.min())
        if high - low >= DENSE_RANGE:
            values, counts = np.unique(observations, return_counts=True)
            return cls(values.astype(np.int64), counts.astype(np.int64))
        offset = low if low < 0 or high >= DENSE_RANGE else 0  # no shifted copy if not needed
        return cls.of_counts(np.bincount(observations - offset if offset else observations), offset)

    @classmethod
    def of_counts(cls, counts: np.ndarray, offset: int = 0) -> Tally:
        """From `counts[i]` = how many equal `offset + i`."""
        present = np.flatnonzero(counts)
        return cls(present + offset, counts[present].astype(np.int64))

    @classmethod
    def of_difference(cls, larger: np.ndarray, smaller: np.ndarray) -> Tally:
        """The tally of `larger - smaller` (each >= 0), a chunk at a time: no temporary of
        the arrays' size."""
        total = np.zeros(0, np.int64)
        for start in range(0, larger.size, CHUNK):
            difference = larger[start : start + CHUNK] - smaller[start : start + CHUNK]
            if int(difference.max()) >= DENSE_RANGE:  # far-apart values: sort them instead
                return cls.of(larger - smaller)
            counts = np.bincount(difference)
            if counts.size > total.size:
                counts[: total.size] += total
                total = counts
            else:
                total[: counts.size] += counts
        return cls.of_counts(total)

    @classmethod
    def merge(cls, tallies: list[Tally]) -> Tally:
        tallies = [tally for tally in tallies if tally.values.size]
        if len(tallies) == 1:
            return tallies[0]
        if not tallies:
            return cls.of(np.empty(0, np.int64))
        values, where = np.unique(np.concatenate([t.values for t in tallies]), return_inverse=True)
        counts = np.bincount(where, weights=np.concatenate([t.counts for t in tallies]))
        return cls(values, counts.astype(np.int64))

    def shifted(self, offset: int, sign: int = 1) -> Tally:
        """The tally of `offset + sign * value` (ascending again)."""
        values = offset + sign * self.values
        if sign < 0:
            return Tally(values[::-1], self.counts[::-1])
        return Tally(values, self.counts)

    @property
    def size(self) -> int:
        return int(self.counts.sum())

    def mean(self) -> float:
        # Exact integer sum, one correctly rounded division: numpy's mean of the same
        # integers (what verl computes) gives this float.
        return int(np.dot(self.values, self.counts)) / self.size

    def min(self) -> int:
        return int(self.values[0])

    def max(self) -> int:
        return int(self.values[-1])


def ordered_pairs(low: np.ndarray, high: np.ndarray) -> tuple[Tally, Tally, Tally] | None:
    """Tallies of `low`, `high` and `high - low` for pairs with 0 <= low <= high, or None
    when some pair is not: one bincount of each pair's cell in the (high, low) grid, made
    a chunk at a time in one reused buffer (cheaper than a tally per array)."""
    if not low.size:
        return None
    low_min = int(low.min())
    if low_min < 0 or np.less(high, low).any():
        return None
    low_max, high_min, high_max = int(low.max()), int(high.min()), int(high.max())
    width, rows = low_max - low_min + 1, high_max - high_min + 1
    if width * rows > DENSE_RANGE:  # far-apart versions: one tally at a time
        return Tally.of(low, True), Tally.of(high, True), Tally.of_difference(high, low)
    grid = np.zeros(width * rows, np.int64)
    buffer = np.empty(min(CHUNK, low.size), np.int64)
    for start in range(0, low.size, CHUNK):
        lows, highs = low[start : start + CHUNK], high[start : start + CHUNK]
        cell = buffer[: lows.size]
        np.subtract(highs, high_min, out=cell)
        np.multiply(cell, width, out=cell)
        np.add(cell, lows, out=cell)
        np.subtract(cell, low_min, out=cell)
        grid += np.bincount(cell, minlength=grid.size)
    grid = grid.reshape(rows, width)  # grid[r, c]: pairs (high_min + r, low_min + c)
    row, column = np.indices(grid.shape)
    difference = (high_min + row) - (low_min + column)  # negative cells are empty
    inside = grid > 0
    spans = np.bincount(difference[inside], weights=grid[inside]).astype(np.int64)
    return (
        Tally.of_counts(grid.sum(axis=0), low_min),
        Tally.of_counts(grid.sum(axis=1), high_min),
        Tally.of_counts(spans),
    )
