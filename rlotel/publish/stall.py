"""Open phases, watched while they are open: a stuck step never closes, so nothing that
reads closed steps (verdicts, histograms, traces) ever says where a run hangs.

Every tick of the publisher thread (never the training thread) reads the ledger's open
spans — the open step's, a loose trace's, the remote calls this process serves — and
gives each phase name with an open span the age of its oldest one. A phase is stalled
while that age exceeds `max(stall_factor × median of its recent closed durations,
stall_floor_s)` (the floor alone before any closed history). Ages come from the monotonic
clock, so a wall-clock jump never makes one negative. On the tick a phase becomes
stalled, rlotel logs one line and keeps a live verdict naming the phase, the process and
where to look; the sinks get every tick's open phases (gauges, a partial span tree).
"""

from __future__ import annotations

import logging
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlotel.derive.diagnose import Thresholds, Verdict
from rlotel.record.ledger import Ledger, Phase, Trace
from rlotel.schema import attributes as attr
from rlotel.schema import vocabulary as voc

log = logging.getLogger("rlotel")

HISTORY = 32  # recent closed durations kept per phase name
MAX_NAMES = 256  # phase names watched (verl uses a few dozen); more are not watched
STALLED = "stalled"  # the verdict kind

# Where to look first when a window of this name hangs.
WHERE_TO_LOOK = {
    voc.GEN: "the rollout: engine servers (their /metrics: running and waiting requests, "
    "KV-cache use), agent-loop and reward workers; a Ray actor pending creation",
    voc.GENERATE_SEQUENCES: "the rollout engine serving this worker",
    voc.UPDATE_ACTOR: "the actor worker group: the rank that has not replied (py-spy dump "
    "--pid), a hung collective (NCCL_DEBUG=INFO)",
    voc.OLD_LOG_PROB: "the actor worker group: the rank that has not replied (py-spy dump "
    "--pid), a hung collective",
    voc.REF: "the reference worker group: the rank that has not replied",
    voc.VALUES: "the critic worker group: the rank that has not replied",
    voc.UPDATE_CRITIC: "the critic worker group: the rank that has not replied",
    voc.UPDATE_WEIGHTS: "the weight sync between trainer and rollout (checkpoint engine, "
    "rollout servers resuming)",
    voc.REWARD: "the reward workers or reward model servers",
    voc.STEP: "the phase open inside it; if none is, the code between phases (data loading, "
    "a Ray call outside any timer)",
}


@dataclass(frozen=True)
class OpenPhase:
    """One phase name with open spans: the oldest one's age and whether it is stalled."""

    name: str
    age_s: float
    median_s: float | None  # of its recent closed durations; None before any closed
    threshold_s: float
    stalled: bool
    onset: bool  # became the innermost stalled phase on this tick (a verdict, a log line)
    record: Phase = field(repr=False)  # the oldest open span of that name
    trace: Trace = field(repr=False)  # the trace it belongs to


@dataclass
class RankWait:
    """A blocking call on several ranks, from the caller's side: which have not replied."""

    phase: str
    started_ns: int
    pending: set[int]


class StallWatch:
    """The publisher's view of open phases; `check()` runs on its thread only."""

    def __init__(
        self,
        thresholds: Thresholds,
        identity: Mapping[str, Any],
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.ledger: Ledger | None = None  # set once the ledger exists (it is built after)
        self._factor = thresholds.stall_factor
        self._floor_s = thresholds.stall_floor_s
        self._identity = dict(identity)
        self._clock = clock
        self._history: dict[str, deque[float]] = {}
        self._stalled: set[str] = set()
        self._lock = threading.Lock()
        self._verdicts: dict[str, Verdict] = {}
        self._actors: dict[str, list[str]] = {}  # stalled phase → Ray actors not started
        self.rank_waits: dict[int, RankWait] = {}  # id → a blocking call's pending ranks

    # --- fed on the publisher thread --------------------------------------------------

    def closed(self, trace: Trace) -> None:
        """A trace closed: its phases' durations are the history stalls are judged by."""
        history = self._history
        for record in (trace.root, *trace.records):
            if not record.end_ns:
                continue
            durations = history.get(record.name)
            if durations is None:
                if len(history) >= MAX_NAMES:
                    continue
                durations = history[record.name] = deque(maxlen=HISTORY)
            durations.append((record.end_ns - record.start_ns) / 1e9)

    def check(self) -> list[OpenPhase]:
        """The open phases now; logs and keeps a verdict for each that just stalled."""
        now = self._clock()
        oldest: dict[str, tuple[Phase, Trace]] = {}
        for record, trace in self._open_records():
            known = oldest.get(record.name)
            if known is None or record.start_ns < known[0].start_ns:
                if known is None and len(oldest) >= MAX_NAMES:
                    continue
                oldest[record.name] = (record, trace)
        judged = []
        for name, (record, trace) in oldest.items():
            age_s = max(0.0, (now - record.start_ns) / 1e9)
            durations = self._history.get(name)
            median_s = statistics.median(durations) if durations else None
            threshold_s = max(self._floor_s, self._factor * median_s if median_s else 0.0)
            judged.append((name, record, trace, age_s, median_s, threshold_s))
        enclosing = _enclosing([(r, t) for _, r, t, age, _, limit in judged if age > limit])
        phases, verdicts = [], {}
        for name, record, trace, age_s, median_s, threshold_s in judged:
            stalled = age_s > threshold_s
            named = stalled and record not in enclosing  # the innermost stalled phase
            onset = named and name not in self._stalled
            phase = OpenPhase(name, age_s, median_s, threshold_s, stalled, onset, record, trace)
            phases.append(phase)
            if named:
                if onset:  # asked once per stall: Ray's state of the actors not started
                    self._actors[name] = pending_actors()
                verdicts[name] = self._verdict(phase)
                if onset:
                    log.warning("rlotel: %s", self._line(phase, verdicts[name]))
        with self._lock:
            self._verdicts = verdicts
        self._stalled = set(verdicts)
        self._actors = {name: self._actors[name] for name in verdicts if name in self._actors}
        return phases

    def _open_records(self) -> Iterator[tuple[Phase, Trace]]:
        """Every open span of this process: read from another thread, so each list is
        copied first (CPython appends are atomic) and each reference read once."""
        ledger = self.ledger
        if ledger is None:
            return
        traces = [ledger._step.trace if ledger._step is not None else None, ledger._loose]
        traces += list(ledger.open_remote.values())
        for trace in traces:
            if trace is None:
                continue
            root = trace.root
            if root.start_ns and not root.end_ns:
                yield root, trace
            for record in list(trace.records):
                if record.start_ns and not record.end_ns:
                    yield record, trace

    # --- read from any thread ---------------------------------------------------------

    @property
    def verdicts(self) -> list[Verdict]:
        """The live stall verdicts, one per stalled phase name."""
        with self._lock:
            return list(self._verdicts.values())

    def _verdict(self, phase: OpenPhase) -> Verdict:
        evidence: dict[str, float | str] = {
            "phase": phase.name,
            "open_s": round(phase.age_s, 3),
            "threshold_s": round(phase.threshold_s, 3),
        }
        if phase.median_s is not None:
            evidence["median_s"] = round(phase.median_s, 6)
            evidence["times_median"] = round(phase.age_s / phase.median_s, 1)
        step = self._step_of(phase)
        if step is not None:
            evidence["step"] = step
        for key, value in self._identity.items():
            evidence[key.removeprefix(attr.NAMESPACE)] = value
        pending = self._pending_ranks(phase)
        if pending:
            evidence["pending_ranks"] = ",".join(map(str, sorted(pending)))
        actors = self._actors.get(phase.name)
        if actors:
            evidence["pending_actors"] = "; ".join(actors)
        look = WHERE_TO_LOOK.get(phase.name, "the process holding it: py-spy dump --pid")
        if pending:
            look = f"rank(s) {evidence['pending_ranks']} have not replied; " + look
        if actors:
            look = (
                f"Ray actor(s) never started: {evidence['pending_actors']} (resources or "
                "placement group not available: `ray status`); " + look
            )
        return Verdict(STALLED, phase.name, "high", 0.0, evidence, look)

    def _step_of(self, phase: OpenPhase) -> int | None:
        """The open step a stalled phase belongs to (a loose or remote trace has none)."""
        ledger = self.ledger
        step = ledger._step if ledger is not None else None
        if step is not None and phase.trace is step.trace:
            return step.number
        return None

    def _pending_ranks(self, phase: OpenPhase) -> set[int]:
        pending: set[int] = set()
        for wait in list(self.rank_waits.values()):
            if wait.phase == phase.name:
                pending |= wait.pending
        return pending

    def _line(self, phase: OpenPhase, verdict: Verdict) -> str:
        who = " ".join(f"{k.removeprefix(attr.NAMESPACE)}={v}" for k, v in self._identity.items())
        median = (
            f", {phase.age_s / phase.median_s:.0f}x its median {phase.median_s:.3g} s"
            if phase.median_s
            else " (no closed history yet)"
        )
        return (
            f"phase {phase.name!r} stalled: open {phase.age_s:.1f} s{median}, over "
            f"{phase.threshold_s:.3g} s [{who}]; look at {verdict.next_read}"
        )


NOT_STARTED = ("PENDING_CREATION", "DEPENDENCIES_UNREADY", "RESTARTING")


def pending_actors() -> list[str]:
    """Ray actors that have not started (their calls wait forever: verl#7381), as
    "Class(name) id STATE"; [] outside Ray. Ray's state API first (it needs the dashboard),
    then the GCS actor table every driver can read."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return []
    try:
        try:
            from ray.util.state import list_actors

            found = [
                (a.class_name, a.name, a.actor_id, a.state)
                for a in list_actors(filters=[("state", "!=", "ALIVE")], timeout=2)
            ]
        except Exception:  # no dashboard: the GCS table
            from ray._private import state

            found = [
                (a.get("ActorClassName"), a.get("Name"), a.get("ActorID"), a.get("State"))
                for a in state.actors().values()
            ]
    except Exception as error:
        log.debug("rlotel: Ray actor states not read: %r", error)
        return []
    return [
        f"{cls}({name}) {actor_id[:12]} {state}" if name else f"{cls} {actor_id[:12]} {state}"
        for cls, name, actor_id, state in found
        if state in NOT_STARTED
    ][:8]


def _enclosing(stalled: list[tuple[Phase, Trace]]) -> set[Phase]:
    """The records that hold a stalled phase open inside them (its parents and its trace's
    root): a step stalls because its phase does, and the innermost is the one to name."""
    ancestors: set[Phase] = set()
    for record, trace in stalled:
        if record is not trace.root:
            ancestors.add(trace.root)
        parent = record.parent
        while parent is not None:
            ancestors.add(parent)
            parent = parent.parent
    return ancestors
