"""Rollout occupancy measured from what held each replica's engine, and when.

In flight on a replica: each model turn of a trajectory (a request its engine served),
where the integration measured every sample's turns (verl's agent loop does); otherwise each
trajectory from its start to its end (tool calls, reward and queueing included). Per
replica, over the time it has at least one in flight: occupancy = mean in flight ÷ peak in
flight (1: everything ran side by side to the end), and the tail seconds, while fewer than
half the peak are in flight (the rollout mostly waits for its last long samples).
Computed when the step closes, off the training thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from rlotel.record.samples import SampleBatch
from rlotel.schema import vocabulary as voc

DEFAULT_REPLICA = "0"


class Occupancy(NamedTuple):
    ratio: float  # mean in flight ÷ peak in flight, in (0, 1]
    tail_seconds: float  # in flight < half the peak
    busy_seconds: float  # at least one in flight
    peak: int


def occupancy(starts: np.ndarray, ends: np.ndarray) -> Occupancy | None:
    """From int64 Unix-ns times (pairs with end <= start are ignored); None when no
    trajectory lasted any time."""
    lasting = ends > starts
    if not lasting.any():
        return None
    starts, ends = starts[lasting], ends[lasting]
    times, where = np.unique(np.concatenate([starts, ends]), return_inverse=True)
    change = np.bincount(where, weights=np.repeat([1.0, -1.0], starts.size), minlength=times.size)
    level = np.cumsum(change)[:-1]  # in flight over [times[i], times[i + 1])
    seconds = np.diff(times) / 1e9
    busy = level > 0
    busy_seconds = float(seconds[busy].sum())
    peak = float(level.max())
    mean = float(np.dot(level[busy], seconds[busy])) / busy_seconds
    tail = float(seconds[busy & (level < peak / 2)].sum())
    return Occupancy(mean / peak, tail, busy_seconds, int(peak))


def in_flight(batch: SampleBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start ns, end ns, sample index) of what held the engine: every model turn when each
    sample has well-formed turns, else each sample's trajectory."""
    start, end = batch.times  # type: ignore[misc]  # by_replica reads timed batches only
    whole = start, end, np.arange(start.size)
    if batch.turns is None or len(batch.turns) != start.size:
        return whole
    try:
        rows = [(s, e, i) for i, turns in enumerate(batch.turns) for s, e in turns]
        table = np.array(rows, dtype=np.int64).reshape(-1, 3)
    except (TypeError, ValueError, OverflowError):  # malformed: the trajectories instead
        return whole
    if np.unique(table[:, 2]).size != start.size:  # a sample without turns
        return whole
    return table[:, 0], table[:, 1], table[:, 2]


def by_replica(batches: Iterable[SampleBatch]) -> dict[str, Occupancy]:
    """Each replica's occupancy over what these batches' timed samples held it with."""
    starts: dict[str, list[np.ndarray]] = {}
    ends: dict[str, list[np.ndarray]] = {}
    for batch in batches:
        if batch.times is None:
            continue
        start, end, sample = in_flight(batch)
        replica = batch.replica if batch.replica is not None else DEFAULT_REPLICA
        if isinstance(replica, str):
            starts.setdefault(replica, []).append(start)
            ends.setdefault(replica, []).append(end)
            continue
        names, which = np.unique(replica, return_inverse=True)
        which = which[sample]
        for index, name in enumerate(names.tolist()):
            rows = which == index
            starts.setdefault(name, []).append(start[rows])
            ends.setdefault(name, []).append(end[rows])
    result = {}
    for replica, parts in starts.items():
        measured = occupancy(np.concatenate(parts), np.concatenate(ends[replica]))
        if measured is not None:
            result[replica] = measured
    return result


def step_metrics(replicas: Mapping[str, Occupancy]) -> dict[str, float]:
    """`rlotel/rollout_occupancy` and `rlotel/rollout_tail_seconds`: the mean over
    replicas (each is an equal part of the rollout pool)."""
    if not replicas:
        return {}
    values: Sequence[Occupancy] = list(replicas.values())
    return {
        voc.ROLLOUT_OCCUPANCY: sum(o.ratio for o in values) / len(values),
        voc.ROLLOUT_TAIL_SECONDS: sum(o.tail_seconds for o in values) / len(values),
    }
