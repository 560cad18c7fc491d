"""Open phases, watched while they are open: a stuck step never closes, so nothing that
reads closed steps (verdicts, histograms, traces) ever says where a run hangs.

Stalled means no progress, not long: every tick of the publisher thread (never the
training thread) reads the ledger's open spans — the open step's, a loose trace's, the
remote calls this process serves — and gives each open phase the time of its last
progress: the latest evidence under it of work moving (a child phase opening or closing,
samples recorded, worker-group replies: `Phase.progress_ns`, written where those events
already happen). A phase is stalled once that evidence has been quiet for `stall_after_s`
(`RLOTEL_STALL_AFTER_S`), however long or short it ran before; a slow phase that keeps
progressing never is. Its age and the median of its recent closed durations stay as
evidence. A phase name is judged by the freshest evidence of any of its spans in this
process: calls a worker serves one at a time (a reward worker's queue) progress while
one completes, however long the last in line waits.

Across processes: work another process runs for a phase here (V1's trajectories under
the trainer's step, a worker group's calls) is progress of that phase and of every phase
it holds open (the driver's `gen` waits on the trajectories its step dispatched). Each
process reports, per remote parent span, the latest progress under it (`reported`, a
few dozen entries at most); the Ray integration carries that to the driver with each
process's target heartbeat and hands back the spans that moved (`heard`, bounded, drops
counted). Only changes are compared, never two processes' clocks.

On the tick a phase becomes stalled, rlotel records every thread's Python stack
of this process (from the publisher thread, so a blocked training thread is no obstacle),
logs one line and keeps a live verdict naming the phase, the process and where to look;
the sinks get every tick's open phases (gauges, a partial span tree).
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import sysconfig
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from rlotel.base import ids, waits
from rlotel.derive.diagnose import Verdict
from rlotel.record.ledger import Ledger, Phase, Trace
from rlotel.schema import attributes as attr
from rlotel.schema import vocabulary as voc

log = logging.getLogger("rlotel")

HISTORY = 32  # recent closed durations kept per phase name
MAX_HEARD = 1024  # spans with remote progress waiting for the next tick; more are dropped
MAX_REPORTED = 32  # remote parent spans this process reports progress under (the latest)
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
    """One phase name with open spans: the quietest one's age, its last progress and
    whether it is stalled."""

    name: str
    age_s: float
    quiet_s: float  # since its last progress (its own start when none yet)
    median_s: float | None  # of its recent closed durations; None before any closed
    threshold_s: float  # stall_after_s: quiet this long is stalled
    stalled: bool
    onset: bool  # became the innermost stalled phase on this tick (a verdict, a log line)
    record: Phase = field(repr=False)  # the quietest open span of that name
    trace: Trace = field(repr=False)  # the trace it belongs to
    stacks: tuple[ThreadStack, ...] = field(default=(), repr=False)  # taken at onset


@dataclass
class RankWait:
    """A blocking call on several ranks, from the caller's side: which have not replied
    (the caller discards ranks as they reply; each reply is progress of `record`)."""

    record: Phase
    started_ns: int
    pending: set[int]
    refs: Sequence[Any] = ()  # each rank's reply (a Ray ref: whose process it waits on)

    @property
    def phase(self) -> str:
        return self.record.name

    def replied(self, ranks: Iterable[int]) -> None:
        """These ranks replied just now: progress of the phase, stamped when it happened
        (not on the next tick, so a stall is named `stall_after_s` after the last reply)."""
        self.pending.difference_update(ranks)
        self.record.progress_ns = max(self.record.progress_ns, time.perf_counter_ns())


class StallWatch:
    """The publisher's view of open phases; `check()` runs on its thread only."""

    def __init__(
        self,
        stall_after_s: float,
        identity: Mapping[str, Any],
        clock: Callable[[], int] = time.perf_counter_ns,
        stacks_file: Path | None = None,
    ) -> None:
        self.ledger: Ledger | None = None  # set once the ledger exists (it is built after)
        self._after_s = stall_after_s
        self._identity = dict(identity)
        self._clock = clock
        self._stacks_file = stacks_file  # each stall's stacks, one JSON line (traces dir)
        self._history: dict[str, deque[float]] = {}
        self._stalled: set[str] = set()
        self._lock = threading.Lock()
        self._verdicts: dict[str, Verdict] = {}
        self._actors: dict[str, list[str]] = {}  # stalled phase → Ray actors not started
        self._processes: dict[str, list[str]] = {}  # stalled phase → its pending ranks' processes
        self._stacks: dict[str, tuple[ThreadStack, ...]] = {}  # stalled phase → its stacks
        self.rank_waits: dict[int, RankWait] = {}  # id → a blocking call's pending ranks
        self._last_closed: dict[str, int] = {}  # phase name → when a span of it last closed
        self._heard: dict[int, int] = {}  # span id → when progress under it was heard
        self.heard_dropped = 0  # spans whose remote progress found the buffer full
        self._reported: dict[int, int] = {}  # remote parent span id → latest progress under it
        # The same, as the other process reads it (hex span id → ns on this process's clock):
        # a new dict each tick it changes, so a reader on any thread holds a complete one.
        self.reported: dict[str, int] = {}

    # --- fed from any thread ----------------------------------------------------------

    def heard(self, span_ids: Iterable[int]) -> int:
        """Another process reported progress of work that phases of this one (the spans
        `span_ids` name) are waiting on; applied on the next tick. Never blocks longer than
        a dict update; returns how many were dropped (more than MAX_HEARD pending)."""
        now = self._clock()
        dropped = 0
        with self._lock:
            heard = self._heard
            for span_id in span_ids:
                if span_id in heard or len(heard) < MAX_HEARD:
                    heard[span_id] = now
                else:
                    dropped += 1
            self.heard_dropped += dropped
        return dropped

    # --- fed on the publisher thread --------------------------------------------------

    def closed(self, trace: Trace) -> None:
        """A trace closed: its phases' durations are the median given as evidence, its end
        the latest progress of its name (and of the remote span it ran under)."""
        history = self._history
        if trace.remote_parent and trace.root.end_ns:
            self._report(trace.remote_parent, trace.root.end_ns)
        last_closed = self._last_closed
        for record in (trace.root, *trace.records):
            if not record.end_ns:
                continue
            if record.name in last_closed or len(last_closed) < MAX_NAMES:
                last_closed[record.name] = max(last_closed.get(record.name, 0), record.end_ns)
            durations = history.get(record.name)
            if durations is None:
                if len(history) >= MAX_NAMES:
                    continue
                durations = history[record.name] = deque(maxlen=HISTORY)
            durations.append((record.end_ns - record.start_ns) / 1e9)

    def check(self) -> list[OpenPhase]:
        """The open phases now; logs and keeps a verdict for each that just stalled."""
        now = self._clock()
        traces = self._open_traces()
        with self._lock:
            heard, self._heard = self._heard, {}
        if heard:
            _apply_heard(traces, heard)
        latest = _latest_progress(traces)
        quietest: dict[str, tuple[Phase, Trace]] = {}
        freshest: dict[str, int] = {}  # per name: the latest progress of any of its spans
        for trace in traces:
            for record in (trace.root, *list(trace.records)):
                if not record.start_ns or record.end_ns:
                    continue
                known = quietest.get(record.name)
                if known is None and len(quietest) >= MAX_NAMES:
                    continue
                if known is None or latest[record] < latest[known[0]]:
                    quietest[record.name] = (record, trace)
                freshest[record.name] = max(freshest.get(record.name, 0), latest[record])
            if trace.remote_parent:  # progress of the other process's span this work is under
                self._report(trace.remote_parent, latest[trace.root])
        self._publish_reported()
        judged = []
        for name, (record, trace) in quietest.items():
            age_s = max(0.0, (now - record.start_ns) / 1e9)
            last = max(freshest[name], self._last_closed.get(name, 0))
            quiet_s = max(0.0, (now - last) / 1e9)
            durations = self._history.get(name)
            median_s = statistics.median(durations) if durations else None
            judged.append((name, record, trace, age_s, quiet_s, median_s))
        after_s = self._after_s
        enclosing = _enclosing([(r, t) for _, r, t, _, quiet, _ in judged if quiet > after_s])
        phases, verdicts = [], {}
        for name, record, trace, age_s, quiet_s, median_s in judged:
            stalled = quiet_s > after_s
            named = stalled and record not in enclosing  # the innermost stalled phase
            onset = named and name not in self._stalled
            if onset:  # once per stall: Ray's actors not started, every thread's stack
                self._actors[name] = pending_actors()
                self._processes[name] = pending_processes(self._waits_of(name))
                self._stacks[name] = thread_stacks()
            stacks = self._stacks.get(name, ())
            phase = OpenPhase(
                name, age_s, quiet_s, median_s, after_s, stalled, onset, record, trace, stacks
            )
            phases.append(phase)
            if named:
                verdicts[name] = self._verdict(phase)
                if onset:
                    log.warning("rlotel: %s", self._line(phase, verdicts[name]))
                    self._write_stacks(phase, verdicts[name])
        with self._lock:
            self._verdicts = verdicts
        self._stalled = set(verdicts)
        self._actors = {name: self._actors[name] for name in verdicts if name in self._actors}
        self._processes = {n: self._processes[n] for n in verdicts if n in self._processes}
        self._stacks = {name: self._stacks[name] for name in verdicts if name in self._stacks}
        return phases

    def _report(self, parent: int, at_ns: int) -> None:
        """Progress at `at_ns` under the remote span `parent` (publisher thread only)."""
        reported = self._reported
        if at_ns <= reported.get(parent, 0):
            return
        reported[parent] = at_ns
        if len(reported) > MAX_REPORTED:  # the oldest is done with, most likely
            del reported[min(reported, key=reported.__getitem__)]

    def _publish_reported(self) -> None:
        reported = {f"{span:016x}": at for span, at in self._reported.items()}
        if reported != self.reported:
            self.reported = reported

    def _open_traces(self) -> list[Trace]:
        """Every open trace of this process: read from another thread, so each reference
        is read once and each dict copied first."""
        ledger = self.ledger
        if ledger is None:
            return []
        step = ledger._step
        traces = [step.trace if step is not None else None, ledger._loose]
        traces += list(ledger.open_remote.values())
        return [t for t in traces if t is not None and t.root.start_ns and not t.root.end_ns]

    def _write_stacks(self, phase: OpenPhase, verdict: Verdict) -> None:
        """The stall and its stacks, one JSON line in the traces directory (`rlotel hangs`)."""
        if self._stacks_file is None:
            return
        record = phase.record
        if not record.span_id:  # drawn as the span builder and the training thread do
            record.span_id = ids.span_id()
        line = {
            "phase": phase.name,
            "trace_id": f"{phase.trace.trace_id:032x}",  # its span, if it closes complete
            "span_id": f"{record.span_id:016x}",
            "open_s": round(phase.age_s, 3),
            "quiet_s": round(phase.quiet_s, 3),
            "since_unix_s": round(time.time() - phase.age_s, 3),
            "last_progress_unix_s": round(time.time() - phase.quiet_s, 3),
            "evidence": verdict.evidence,
            "threads": [stack.as_dict() for stack in phase.stacks],
        }
        try:
            with self._stacks_file.open("a", encoding="utf-8") as out:
                out.write(json.dumps(line) + "\n")
        except OSError as error:
            log.warning("rlotel: stall stacks not written to %s: %r", self._stacks_file, error)

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
            "quiet_s": round(phase.quiet_s, 3),
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
        stuck = next((stack.innermost_user() for stack in phase.stacks), None)
        if stuck:
            evidence["stuck_at"] = stuck
        actors = self._actors.get(phase.name)
        if actors:
            evidence["pending_actors"] = "; ".join(actors)
        processes = self._processes.get(phase.name)
        if processes:
            evidence["pending_processes"] = "; ".join(processes)
        look = WHERE_TO_LOOK.get(phase.name, "the process holding it: py-spy dump --pid")
        if processes:
            look = f"{evidence['pending_processes']} (py-spy dump --pid there); " + look
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

    def _waits_of(self, name: str) -> list[RankWait]:
        return [wait for wait in list(self.rank_waits.values()) if wait.phase == name]

    def _pending_ranks(self, phase: OpenPhase) -> set[int]:
        pending: set[int] = set()
        for wait in self._waits_of(phase.name):
            pending |= wait.pending
        return pending

    def _line(self, phase: OpenPhase, verdict: Verdict) -> str:
        who = " ".join(f"{k.removeprefix(attr.NAMESPACE)}={v}" for k, v in self._identity.items())
        median = (
            f", {phase.age_s / phase.median_s:.0f}x its median {phase.median_s:.3g} s"
            if phase.median_s
            else ""
        )
        stuck = verdict.evidence.get("stuck_at")
        at = f"; stuck at {stuck}" if stuck else ""
        return (
            f"phase {phase.name!r} stalled: no progress for {phase.quiet_s:.1f} s (over "
            f"{phase.threshold_s:.3g} s; open {phase.age_s:.1f} s{median}) [{who}]{at}; "
            f"look at {verdict.next_read}"
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


def pending_processes(waits: Iterable[RankWait], most: int = 8) -> list[str]:
    """The process each pending rank's reply waits on, as "rank 5: Class pid 123 on
    10.0.0.5": the actor its call runs on (the reply's task names it), from Ray's actor
    table. Read once, at the onset of a stall; [] outside Ray or for replies not of an
    actor's call."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return []
    found = []
    try:
        from ray._private import state  # the GCS actor table: no dashboard needed

        for wait in waits:
            for rank in sorted(wait.pending)[:most]:
                ref = wait.refs[rank] if rank < len(wait.refs) else None
                if not isinstance(ref, ray.ObjectRef):
                    continue
                actor = ref.task_id().actor_id()
                if actor.is_nil():
                    continue
                info = state.actors(actor_id=actor.hex())
                where = info.get("Address", {}).get("IPAddress") or "a node not known yet"
                found.append(
                    f"rank {rank}: {info.get('ActorClassName')} pid {info.get('Pid')} on {where}"
                )
                if len(found) >= most:
                    return found
    except Exception as error:
        log.debug("rlotel: pending ranks' processes not read: %r", error)
    return found


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


def _apply_heard(traces: list[Trace], heard: Mapping[int, int]) -> None:
    """Progress heard from other processes under a span: progress of that phase and of
    every open phase inside it (the driver's `gen` waits on what its step dispatched)."""
    for trace in traces:
        records = (trace.root, *list(trace.records))
        marked = {r: heard[r.span_id] for r in records if r.span_id and r.span_id in heard}
        if not marked:
            continue
        under_root = marked.get(trace.root, 0)
        for record in records:
            if record.end_ns:
                continue
            at, node = under_root, record
            while node is not None:
                at = max(at, marked.get(node, 0))
                node = node.parent
            if at > record.progress_ns:
                record.progress_ns = at


def _latest_progress(traces: list[Trace]) -> dict[Phase, int]:
    """Each record's last progress: the latest start, end or noted progress of it and of
    everything under it (a trace's records name their parents; top-level ones hang from
    its root). A walk up stops at an ancestor already as late: its own ancestors are."""
    latest: dict[Phase, int] = {}
    for trace in traces:
        root = trace.root
        for record in (root, *list(trace.records)):
            value = max(record.start_ns, record.end_ns, record.progress_ns)
            node: Phase | None = record
            while node is not None and latest.get(node, -1) < value:
                latest[node] = value
                node = None if node is root else (node.parent or root)
    return latest


class Frame(NamedTuple):
    """One frame of a thread's stack; `kind` says whose code it is: user, library (an
    installed package), rlotel or stdlib."""

    where: str  # "file:line in function"
    kind: str


class ThreadStack(NamedTuple):
    """One thread's Python stack at a stall, innermost frame first."""

    thread: str
    frames: tuple[Frame, ...]
    waiting: str | None = None  # what a wrapper says it is blocked in (a collective)

    def innermost_user(self) -> str | None:
        return next((f.where for f in self.frames if f.kind == "user"), None)

    def as_dict(self) -> dict[str, Any]:
        found = {"thread": self.thread, "frames": [f._asdict() for f in self.frames]}
        if self.waiting:
            found["waiting"] = self.waiting
        return found


MAX_FRAMES = 64  # innermost frames kept per thread: a stack's event stays bounded
RLOTEL_DIR = str(Path(__file__).resolve().parent.parent)
STDLIB_DIRS = tuple({sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib")})


def thread_stacks() -> tuple[ThreadStack, ...]:
    """Every other thread's Python stack, from the calling thread (rlotel's publisher):
    threads running the user's code first, rlotel's own threads last."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    own = threading.get_ident()
    stacks = []
    for ident, top in sys._current_frames().items():
        if ident == own:
            continue
        frames = tuple(
            Frame(f"{f.filename}:{f.lineno} in {f.name}", _kind(f.filename))
            for f in reversed(traceback.extract_stack(top, limit=MAX_FRAMES))
        )
        stacks.append(ThreadStack(names.get(ident, f"thread-{ident}"), frames, waits.of(ident)))
    return tuple(sorted(stacks, key=lambda s: s.innermost_user() is None))


def _kind(filename: str) -> str:
    if filename.startswith(RLOTEL_DIR):
        return "rlotel"
    if "site-packages" in filename or "dist-packages" in filename:
        return "library"
    if filename.startswith(STDLIB_DIRS) or filename.startswith("<frozen"):
        return "stdlib"
    return "user"
