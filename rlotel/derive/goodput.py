"""Goodput buckets and who is idle: every window classified, per step, per role.

Each phase name maps to a bucket — `productive` (the work RL is for), `overhead` (work
that enables it), `idle` (waiting) or `wasted` (work thrown away) — and to a role
(`trainer`, or `rollout` for windows a concurrent rollout opens). The table is mode-aware:
in verl's async modes the V1 trainer's `gen` is the trainer *waiting* for the replay
buffer, so it is idle there and productive in sync mode.

Per step, each role's wall time (the step's) is split once into buckets by a sweep over
its top-level windows (where windows of one role overlap, the first of productive,
overhead, wasted, idle wins). Trainer time covered by no window is overhead (the time
between windows); rollout time covered by no rollout window is idle. So, per role,
busy + idle = wall, every ratio is in [0, 1], and Σ bucket seconds = roles × step seconds.
Computed when the step closes, off the training thread.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from time import perf_counter_ns

from rlotel.schema import vocabulary as voc

PRODUCTIVE, OVERHEAD, IDLE, WASTED = "productive", "overhead", "idle", "wasted"
BUCKETS: tuple[str, ...] = (PRODUCTIVE, OVERHEAD, IDLE, WASTED)
_PRIORITY = (PRODUCTIVE, OVERHEAD, WASTED, IDLE)  # who owns an instant two windows cover
TRAINER, ROLLOUT = "trainer", "rollout"
Window = tuple[str, int, int]  # (phase name, start_ns, end_ns) of a top-level window

SYNC = "sync"
ASYNC_MODES = frozenset({"colocate_async", "separate_async", "fully_async"})
MODES = frozenset({SYNC, *ASYNC_MODES})

DEFAULT_BUCKETS: dict[str, str] = {
    **dict.fromkeys((voc.GEN, voc.REWARD, voc.UPDATE_ACTOR, voc.UPDATE_CRITIC), PRODUCTIVE),
    **dict.fromkeys(
        (
            voc.OLD_LOG_PROB,
            voc.REF,
            voc.VALUES,
            voc.ADV,
            voc.UPDATE_WEIGHTS,
            voc.SAVE_CHECKPOINT,
            voc.DUMP_ROLLOUT_GENERATIONS,
            voc.TESTING,
            voc.START_PROFILE,
            voc.STOP_PROFILE,
            voc.SWITCH_TO_TRAINER,
            voc.SWITCH_TO_ROLLOUT,
            voc.PARAM_SYNC,
        ),
        OVERHEAD,
    ),
    **dict.fromkeys((voc.SWITCH_WAIT, voc.WAIT_FOR_ENOUGH_SAMPLES), IDLE),
    voc.ROLLOUT_GENERATE: PRODUCTIVE,
    voc.ROLLOUT_WAIT_BUFFER: IDLE,
    voc.ROLLOUT_WAIT_WEIGHTS: IDLE,
    voc.ROLLOUT_DISCARDED: WASTED,
}
# Names whose work differs by mode: V1's `gen` samples the replay buffer in async modes.
ASYNC_BUCKETS: dict[str, str] = {voc.GEN: IDLE}
UNKNOWN_BUCKET = OVERHEAD  # a name of yours not in the table: say what it is in phase_buckets

# Trainer windows during which an async rollout cannot generate, when the rollout's own
# windows are not in this process (verl's trainer): weights are being swapped in.
_ROLLOUT_BLOCKED_ASYNC = frozenset({voc.UPDATE_WEIGHTS, voc.PARAM_SYNC})


class Timeline:
    """Windows of a role that runs beside the trainer (a rollout thread), thread-safe.

    A rollout's windows outlive the trainer's steps (a generation started in one step ends
    in the next), so they are not phases of a step: the rollout opens `window(name)` here,
    and each closing step reads the part of every window (open ones too) inside it.
    """

    def __init__(self, keep: int = 4096) -> None:
        self._lock = threading.Lock()
        self._closed: deque[Window] = deque(maxlen=keep)
        self._open: dict[int, tuple[str, int]] = {}

    @contextmanager
    def window(self, name: str) -> Iterator[None]:
        key, start = threading.get_ident(), perf_counter_ns()
        with self._lock:
            self._open[key] = (name, start)
        try:
            yield
        finally:
            end = perf_counter_ns()
            with self._lock:
                self._open.pop(key, None)
                self._closed.append((name, start, end))

    def between(self, start_ns: int, end_ns: int) -> list[Window]:
        """Windows overlapping [start_ns, end_ns); an open one ends at end_ns."""
        with self._lock:
            closed = [w for w in self._closed if w[2] > start_ns and w[1] < end_ns]
            running = [(n, s, end_ns) for n, s in self._open.values() if s < end_ns]
        return closed + running


@dataclass(frozen=True)
class PhaseBuckets:
    """The bucket of every phase name for one training mode; overrides win over defaults.

    `timeline`: windows of a concurrent rollout in this process (None: it runs elsewhere).
    """

    mode: str = SYNC
    overrides: Mapping[str, str] = field(default_factory=dict)
    timeline: Timeline | None = field(default=None, compare=False)

    def bucket(self, name: str) -> str:
        if name in self.overrides:
            return self.overrides[name]
        if self.mode in ASYNC_MODES and name in ASYNC_BUCKETS:
            return ASYNC_BUCKETS[name]
        return DEFAULT_BUCKETS.get(name, UNKNOWN_BUCKET)

    def for_mode(self, mode: str) -> PhaseBuckets:
        """The same overrides under another mode (an integration that detects verl's)."""
        return replace(self, mode=mode if mode in MODES else SYNC)

    @property
    def is_async(self) -> bool:
        return self.mode in ASYNC_MODES


def role_of(name: str) -> str:
    return ROLLOUT if name in voc.ROLLOUT_WINDOWS else TRAINER


def step_metrics(
    windows: Iterable[Window],
    start_ns: int,
    end_ns: int,
    buckets: PhaseBuckets,
    rollout_tail_s: float = 0.0,
) -> dict[str, float]:
    """`rlotel/goodput`, `rlotel/bucket_seconds/<bucket>` and, in async modes or when a
    rollout recorded windows, `rlotel/idle_ratio/{trainer,rollout}` of one closed step.

    `rollout_tail_s`: measured rollout tail (rlotel.derive.occupancy: fewer than half the peak
    trajectories in flight): generation time that waited for the last samples, moved from
    productive to idle — in the rollout's own windows where it records them, else in sync
    `gen` (at most its seconds); where the rollout runs elsewhere in an async mode, added
    to its inferred idle."""
    wall = end_ns - start_ns
    if wall <= 0:
        return {}
    by_role: dict[str, list[tuple[str, int, int]]] = {TRAINER: []}
    names_by_role: dict[str, list[Window]] = {TRAINER: []}
    bucket_of: dict[str, tuple[str, str]] = {}  # name → (role, bucket): a step repeats names
    for name, start, end in windows:
        start, end = max(start, start_ns), min(end, end_ns)
        if end <= start:
            continue
        known = bucket_of.get(name)
        if known is None:
            known = bucket_of[name] = (role_of(name), buckets.bucket(name))
        role, bucket = known
        by_role.setdefault(role, []).append((bucket, start, end))
        names_by_role.setdefault(role, []).append((name, start, end))
    totals = dict.fromkeys(BUCKETS, 0)
    idle_ns: dict[str, int] = {}
    tail_ns = max(0, round(rollout_tail_s * 1e9))
    for role, intervals in by_role.items():
        uncovered = OVERHEAD if role == TRAINER else IDLE
        split = _sweep(intervals, start_ns, end_ns, uncovered)
        if tail_ns and (role == ROLLOUT or (ROLLOUT not in by_role and not buckets.is_async)):
            gen = (
                split[PRODUCTIVE]
                if role == ROLLOUT
                else _sweep(
                    [(PRODUCTIVE, s, e) for n, s, e in names_by_role[role] if n == voc.GEN],
                    start_ns,
                    end_ns,
                    IDLE,
                )[PRODUCTIVE]
            )
            moved = min(tail_ns, gen, split[PRODUCTIVE])
            split[PRODUCTIVE] -= moved
            split[IDLE] += moved
        for bucket, ns in split.items():
            totals[bucket] += ns
        idle_ns[role] = split[IDLE]
    roles = len(by_role)
    metrics = {f"{voc.BUCKET_SECONDS}{bucket}": ns / 1e9 for bucket, ns in totals.items()}
    metrics[voc.GOODPUT] = totals[PRODUCTIVE] / (roles * wall)
    if buckets.is_async or ROLLOUT in by_role:
        if ROLLOUT not in by_role:  # the rollout runs elsewhere: read it off the trainer's
            blocked = [(IDLE, s, e) for n, s, e in names_by_role[TRAINER] if _blocks(n, buckets)]
            idle_ns[ROLLOUT] = _sweep(blocked, start_ns, end_ns, PRODUCTIVE)[IDLE]
            idle_ns[ROLLOUT] = min(wall, idle_ns[ROLLOUT] + tail_ns)
        for role in (TRAINER, ROLLOUT):
            metrics[f"{voc.IDLE_RATIO}{role}"] = min(1.0, idle_ns[role] / wall)
    return metrics


def _blocks(name: str, buckets: PhaseBuckets) -> bool:
    """Does this trainer window stop an async rollout that runs in another process?
    colocate_async sleeps the replicas from the end of sampling until `update_weights`
    wakes them, so there every window but `gen` blocks; separate pools only pause for
    weights."""
    if buckets.mode == "colocate_async":
        return name != voc.GEN
    return name in _ROLLOUT_BLOCKED_ASYNC


def _sweep(
    intervals: list[tuple[str, int, int]], start_ns: int, end_ns: int, uncovered: str
) -> dict[str, int]:
    """Nanoseconds of [start_ns, end_ns) per bucket: each instant to the highest-priority
    bucket covering it, `uncovered` where none does. One sorted pass over the window
    edges with a count of open windows per bucket (a step has ~100 windows); windows that
    follow one another without overlap (a synchronous step's) are simply summed."""
    result = dict.fromkeys(BUCKETS, 0)
    reach = start_ns
    for _, start, end in intervals:
        if start < reach or end < start:
            break  # overlapping or out of order: the sweep
        reach = end
    else:
        covered = 0
        for bucket, start, end in intervals:
            start, end = max(start, start_ns), min(end, end_ns)
            if end > start:
                result[bucket] += end - start
                covered += end - start
        result[uncovered] += max(0, end_ns - start_ns) - covered
        return result
    edges = sorted(
        [(s, 1, bucket) for bucket, s, _ in intervals]
        + [(e, -1, bucket) for bucket, _, e in intervals]
    )
    open_count = dict.fromkeys(BUCKETS, 0)
    cursor = start_ns
    for at, change, bucket in edges:
        at = min(max(at, start_ns), end_ns)
        if at > cursor:
            owner = next((b for b in _PRIORITY if open_count[b]), uncovered)
            result[owner] += at - cursor
            cursor = at
        open_count[bucket] += change
    if end_ns > cursor:
        result[next((b for b in _PRIORITY if open_count[b]), uncovered)] += end_ns - cursor
    return result


def trace_metrics(
    top_level: Iterable[Window],
    start_ns: int,
    end_ns: int,
    buckets: PhaseBuckets,
    rollout_tail_s: float = 0.0,
) -> dict[str, float]:
    """`step_metrics` of a closed step: its top-level windows (plus a concurrent role's,
    from the buckets' timeline) against the step's own window."""
    windows = list(top_level)
    if buckets.timeline is not None:
        windows.extend(buckets.timeline.between(start_ns, end_ns))
    return step_metrics(windows, start_ns, end_ns, buckets, rollout_tail_s)
