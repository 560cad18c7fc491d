"""Phases that ran on several ranks: seconds per rank, the slowest rank and the spread.

A driver phase that calls a worker group (verl's `update_actor` on 8 actor ranks) lasts as
long as its slowest rank. The spread — slowest ÷ median — says whether one rank held the
others up (a straggler: a slow node, a bad GPU, an unbalanced batch) or all were slow.

Under collectives (FSDP, Megatron) every rank replies together, so the reply spread is ≈ 1
whatever one rank does; each rank's compute — the call's time outside torch.distributed's
collectives (`rlotel.integrations.collectives`), sent back with its reply — tells the slow
one apart: the compute spread is slowest compute ÷ median compute.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import NamedTuple, Protocol

from rlotel.schema import attributes as attr


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
    found = ((span_id, seconds.spread()) for span_id, seconds in rank_seconds.items())
    return {span_id: spread for span_id, spread in found if spread is not None}


# --- compute and collective time per rank ------------------------------------------------


class RankTime(NamedTuple):
    """One rank's traced worker call: seconds outside and inside torch.distributed's
    collectives (compute + collective = the call's wall time)."""

    phase: str
    role: str
    rank: int
    compute_s: float
    collective_s: float
    calls: int

    def attributes(self) -> dict[str, int | float]:
        """The worker span's attributes."""
        return {
            attr.COMPUTE_S: self.compute_s,
            attr.COLLECTIVE_S: self.collective_s,
            attr.COLLECTIVE_CALLS: self.calls,
        }


class Replied(Protocol):
    """A rank's account of one call (`rlotel.integrations.data_moves.RankReply`)."""

    compute_s: float
    collective_s: float


class ComputeSpread(NamedTuple):
    """One phase's per-rank compute seconds: the slowest rank against the median."""

    phase: str
    ranks: int
    slowest_rank: int
    slowest_s: float
    median_s: float
    collective_max_s: float

    @property
    def spread(self) -> float:
        """Slowest compute ÷ median compute (1.0 = every rank computed as long)."""
        return self.slowest_s / self.median_s if self.median_s > 0 else 1.0

    def attributes(self) -> dict[str, int | float]:
        return {
            attr.RANK_COMPUTE_SLOWEST: self.slowest_rank,
            attr.RANK_COMPUTE_SLOWEST_S: self.slowest_s,
            attr.RANK_COMPUTE_MEDIAN_S: self.median_s,
            attr.RANK_COMPUTE_SPREAD: self.spread,
            attr.RANK_COLLECTIVE_MAX_S: self.collective_max_s,
        }


class RankCompute:
    """Compute and collective seconds per rank of one phase, summed over its calls."""

    __slots__ = ("collective", "compute", "phase")

    def __init__(self, phase: str) -> None:
        self.phase = phase
        self.compute: dict[int, float] = {}
        self.collective: dict[int, float] = {}

    def add(self, replies: Mapping[int, Replied]) -> None:
        compute, collective = self.compute, self.collective
        for rank, reply in replies.items():
            compute[rank] = compute.get(rank, 0.0) + reply.compute_s
            collective[rank] = collective.get(rank, 0.0) + reply.collective_s

    def spread(self) -> ComputeSpread | None:
        """None for fewer than two ranks (nothing to compare)."""
        if len(self.compute) < 2:
            return None
        slowest = max(self.compute, key=self.compute.__getitem__)
        return ComputeSpread(
            self.phase,
            len(self.compute),
            slowest,
            self.compute[slowest],
            statistics.median(self.compute.values()),
            max(self.collective.values()),
        )


def compute_spreads(rank_compute: Mapping[int, RankCompute]) -> dict[int, ComputeSpread]:
    """Span id → compute spread of every phase whose ranks reported compute (≥ 2 ranks)."""
    found = ((span_id, compute.spread()) for span_id, compute in rank_compute.items())
    return {span_id: spread for span_id, spread in found if spread is not None}
