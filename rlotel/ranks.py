"""Phases that ran on several ranks: seconds per rank, the slowest rank and the spread.

A driver phase that calls a worker group (verl's `update_actor` on 8 actor ranks) lasts as
long as its slowest rank. The spread — slowest ÷ median — says whether one rank held the
others up (a straggler: a slow node, a bad GPU, an unbalanced batch) or all were slow.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import NamedTuple

from rlotel import attributes as attr


class RankSpread(NamedTuple):
    """One phase's per-rank seconds, summed over the calls made inside it."""

    phase: str
    ranks: int
    slowest_rank: int
    slowest_s: float
    median_s: float

    @property
    def spread(self) -> float:
        """Slowest ÷ median (1.0 = every rank took as long)."""
        return self.slowest_s / self.median_s if self.median_s > 0 else 1.0

    def attributes(self) -> dict[str, int | float]:
        return {
            attr.RANKS: self.ranks,
            attr.SLOWEST_RANK: self.slowest_rank,
            attr.SLOWEST_RANK_S: self.slowest_s,
            attr.RANK_SPREAD: self.spread,
        }


class RankSeconds:
    """Seconds per rank of one phase, accumulated call by call on the training thread."""

    __slots__ = ("phase", "seconds")

    def __init__(self, phase: str) -> None:
        self.phase = phase
        self.seconds: dict[int, float] = {}

    def add(self, seconds_by_rank: Mapping[int, float]) -> None:
        seconds = self.seconds
        for rank, value in seconds_by_rank.items():
            seconds[rank] = seconds.get(rank, 0.0) + value

    def spread(self) -> RankSpread | None:
        """None for fewer than two ranks (nothing to compare)."""
        if len(self.seconds) < 2:
            return None
        slowest = max(self.seconds, key=self.seconds.__getitem__)
        return RankSpread(
            self.phase,
            len(self.seconds),
            slowest,
            self.seconds[slowest],
            statistics.median(self.seconds.values()),
        )


def spreads(rank_seconds: Mapping[int, RankSeconds]) -> dict[int, RankSpread]:
    """Span id → spread of every phase that ran on at least two ranks."""
    result = {}
    for span_id, seconds in rank_seconds.items():
        spread = seconds.spread()
        if spread is not None:
            result[span_id] = spread
    return result
