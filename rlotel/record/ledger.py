"""The step ledger: the training thread's only contact with rlotel.

Entering or leaving a phase reads the clock, pushes or pops an NVTX range and appends one
record; spans, metrics and files are made later, off the training thread, from the closed
step. Times are `perf_counter_ns` (monotonic, exact differences); the publisher maps them
to Unix time when the step closes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, MutableMapping
from contextvars import ContextVar, Token
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from rlotel.base import ids
from rlotel.base.drops import Drops, as_finite_float, clean_counts, describe, encodable
from rlotel.record import nvtx, ranks, samples
from rlotel.record.samples import SampleBatch
from rlotel.schema import vocabulary
from rlotel.schema.data_moves import DataMoves

if TYPE_CHECKING:
    from rlotel.record.capture import Capture

log = logging.getLogger("rlotel")


class StepHooks(Protocol):
    """What a component that reacts to steps implements (the profiler, verl capture
    discovery): called on the training thread, so each call must be cheap on unflagged
    steps. The ledger only records; it never publishes on a hook's behalf or asks whether
    to. A hook may also set `Ledger.phase_range` (e.g. torch's `record_function`)."""

    def on_step_start(self, number: int) -> None: ...

    def on_step_end(self, step: Step) -> None:
        """May set `step.held`: the pipeline then waits for the hook to release it."""

    def flush(self) -> None:
        """End of run: finish what is open and release every step still held."""


class HookServices(NamedTuple):
    """What a hook factory of `Config.step_hooks` gets at `init`: how an integration plugs
    a `StepHooks` into the ledger without the core knowing the integration."""

    profile: Any  # the run's validated `rlotel.ProfileConfig`; None when profiling is off
    publish_capture: Callable[[Capture], None]  # hand a found capture to the pipeline
    release: Callable[[list[Step]], None]  # steps a hook held (`step.held`) may publish now
    drops: Drops


# `Config.step_hooks` entries: a hook for this run, or None to stay out of it.
StepHookFactory = Callable[[HookServices], "StepHooks | None"]


class Phase:
    """One timed window: the context manager the user holds is also the ledger's record.

    `parent` is the enclosing phase in the caller's own context (None at the top of a
    trace): nesting follows a context variable, so phases opened from other threads or
    asyncio tasks nest under what *they* have open, never under another thread's phase.
    `span_id` is 0 until someone needs it before export (context propagation); the span
    builder draws it otherwise. `ledger` None: timed, not recorded; `sink` also sums its
    seconds into a dict (verl's `timing_raw`).
    """

    __slots__ = (
        "_ledger",
        "_range",
        "_records",
        "_sink",
        "_token",
        "color",
        "end_ns",
        "error",
        "marks_nvtx",
        "name",
        "parent",
        "progress_ns",
        "span_id",
        "start_ns",
    )

    _ledger: Ledger | None
    _range: Any  # torch.profiler.record_function while a capture runs
    _records: list[Phase] | None
    _sink: MutableMapping[str, float] | None
    _token: Token[Phase | None] | None  # restores the context's innermost phase on exit
    color: str | None
    end_ns: int
    error: BaseException | None
    marks_nvtx: bool  # False: the caller marks this range itself (verl's NVTX timer)
    name: str
    parent: Phase | None
    progress_ns: int  # when its work last showed progress (samples, replies); 0: not yet
    span_id: int
    start_ns: int

    def __init__(
        self,
        ledger: Ledger | None,
        name: str,
        color: str | None = None,
        sink: MutableMapping[str, float] | None = None,
    ) -> None:
        self._ledger = ledger
        self._sink = sink
        self._range = None
        self._records = None
        self._token = None
        self.name = name
        self.color = color
        self.parent = None
        self.progress_ns = 0
        self.span_id = 0
        self.start_ns = 0
        self.end_ns = 0
        self.error = None
        self.marks_nvtx = True

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def __enter__(self) -> Phase:
        ledger = self._ledger
        if ledger is not None:
            records = ledger.records
            parent = _innermost.get()
            while parent is not None and parent.end_ns:  # closed (see `_innermost`)
                parent = parent.parent
            # The common case inline: the open trace's phase in the context that has its
            # parent open (a closed phase's `_records` is None; another trace's differs);
            # a remote call's phase always makes a trace of its own (`_attach`).
            if (
                records is not None
                and (parent is None or parent._records is records)
                and type(self) is Phase
            ):
                self.parent = parent
                records.append(self)
                self._records = records
            else:
                self._attach(ledger, parent)
            self._token = _innermost.set(self)
            if ledger.phase_range is not None:
                self._enter_range(ledger.phase_range)
        backend = nvtx._backend
        if backend is not None and self.marks_nvtx:
            backend.push(self.name, self.color)
        self.start_ns = perf_counter_ns()
        return self

    def _attach(self, ledger: Ledger, parent: Phase | None) -> None:
        """Join a trace: the open step's; outside a step, the trace of the phase this
        context has open (`parent`; a remote call's: calls served concurrently stay apart),
        else the process's loose trace, opened with this phase as its root."""
        records = ledger.records
        if (
            parent is not None
            and ledger._step is None
            and parent._ledger is ledger
            and not parent.end_ns
            and parent._records is not None
        ):
            records = parent._records
        elif parent is not None and (parent.end_ns or parent._records is not records):
            parent = _open_ancestor(parent, records)
        self.parent = parent
        if records is None:
            records = ledger.open_loose(self)
        else:
            records.append(self)
        self._records = records

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.end_ns = end = perf_counter_ns()
        backend = nvtx._backend
        if backend is not None and self.marks_nvtx:
            backend.pop()
        if exc is not None:
            self.error = exc
        if self._range is not None:
            self._range.__exit__(exc_type, exc, tb)
            self._range = None
        sink = self._sink
        if sink is not None:
            try:
                sink[self.name] = sink.get(self.name, 0) + (end - self.start_ns) / 1e9
            except Exception as sink_error:
                _drop(self._ledger, "timing_raw", "bad_dict", sink_error)
        if self._token is not None:
            with contextlib.suppress(ValueError):  # left in another context: nothing to restore
                _innermost.reset(self._token)
            self._token = None
        ledger = self._ledger
        if ledger is not None:
            self._records = None  # no cycle (the trace's list holds this phase) once closed
            if ledger.loose_root is self:
                ledger.close_loose()
        return False

    def _enter_range(self, phase_range: Callable[[str], Any]) -> None:
        try:
            self._range = phase_range(self.name)
            if self._range is not None:
                self._range.__enter__()
        except Exception as error:
            self._range = None
            _drop(self._ledger, "profile", "profiler_error", error)


# The innermost phase the running context (thread, asyncio task, copied context) entered;
# leaving a phase resets it. A phase left in another context than it entered (a
# generator's, a callback's) cannot reset it there, so readers still walk up from a
# closed phase to its nearest open ancestor (`parent`).
_innermost: ContextVar[Phase | None] = ContextVar("rlotel_innermost_phase", default=None)


def _open_ancestor(phase: Phase | None, records: list[Phase] | None) -> Phase | None:
    """The nearest enclosing phase still open in `records`' trace (a closed phase can be
    left in a context whose reset ran elsewhere; a phase of an earlier trace is no parent)."""
    while phase is not None and (phase.end_ns or phase._records is not records):
        phase = phase.parent
    return phase


def innermost_open(records: list[Phase] | None) -> Phase | None:
    """The caller's innermost open phase in the trace of `records`, if any."""
    return _open_ancestor(_innermost.get(), records)


class IncompleteStep(Exception):
    """Recorded on spans still open when the process exited."""


class RemotePhase(Phase):
    """A phase whose parent span lives in another process (W3C traceparent): the root of
    a trace of its own, so that calls a worker serves at once (asyncio tasks, threads)
    each keep their own parent; what opens inside it in the same context nests in it."""

    __slots__ = ("remote", "trace")
    remote: tuple[int, int]
    trace: Trace | None

    def __init__(
        self, ledger: Ledger, name: str, color: str | None, remote: tuple[int, int]
    ) -> None:
        super().__init__(ledger, name, color)
        self.remote = remote
        self.trace = None

    def _attach(self, ledger: Ledger, parent: Phase | None = None) -> None:
        trace = self.trace = Trace(self, ledger.last_step_number)
        trace.trace_id, trace.remote_parent = self.remote
        self._records = trace.records  # its children's list: a root is not among them
        ledger.open_remote[id(self)] = trace  # watched for stalls while it is open

    def __exit__(self, exc_type, exc, tb) -> bool:
        super().__exit__(exc_type, exc, tb)
        ledger = self._ledger
        if ledger is not None:
            ledger.open_remote.pop(id(self), None)
            if self.trace is not None:
                ledger._publish_trace(self.trace)
        return False


def _remote_trace(phase: Phase | None, ledger: Ledger) -> Trace | None:
    """The trace of the remote call the caller's innermost open phase belongs to, if any."""
    while phase is not None and phase.end_ns:
        phase = phase.parent
    while phase is not None:
        if isinstance(phase, RemotePhase):
            return phase.trace if phase._ledger is ledger else None
        phase = phase.parent
    return None


def _drop(ledger: Ledger | None, signal: str, reason: str, error: BaseException) -> None:
    if ledger is not None:
        ledger.drops.add(signal, reason, repr(error))
    else:
        log.warning("rlotel: %s input dropped (%s): %r", signal, reason, error)


class Trace:
    """A tree of phases with one root: a step, or a phase opened outside any step."""

    __slots__ = (
        "captures",
        "events",
        "rank_time",
        "records",
        "remote_parent",
        "role",
        "root",
        "samples",
        "step",
        "trace_id",
    )

    def __init__(self, root: Phase, step: int | None) -> None:
        self.trace_id = ids.trace_id()
        self.root = root
        self.records: list[Phase] = []
        self.samples: list[SampleBatch] = []
        self.step = step
        self.remote_parent = 0  # span id in another process (propagated context), if any
        self.rank_time: ranks.RankTime | None = None  # a worker call's compute vs collectives
        self.role: str | None = None  # a worker call's own role (its process may host several)
        self.captures: tuple[Capture, ...] = ()  # a worker call's: profiler outputs it wrote
        self.events: tuple[tuple[str, int, dict[str, Any]], ...] = ()  # its root's (Unix ns)


class Summary(Protocol):
    """What the ledger holds of a closed step's numbers: `rlotel.derive.summary.StepSummary`,
    built above this layer (and wired in as `Ledger.summarize`), so not imported here."""

    timing_raw: dict[str, float]
    metrics: dict[str, float]
    unaccounted_seconds: float
    verdict: Any  # rlotel.derive.diagnose.Verdict, added by the pipeline


class NotClosed(NamedTuple):
    """A step still open has no numbers yet."""

    timing_raw: dict[str, float]
    metrics: dict[str, float]
    unaccounted_seconds: float
    verdict: Any


class Step:
    """Handle of one training step: feed it tokens and MFU; read verl's numbers after close."""

    def __init__(self, ledger: Ledger, number: int) -> None:
        self._ledger = ledger
        self.number = number
        self.trace = Trace(Phase(None, vocabulary.STEP), number)
        self.prompt_tokens: int | float | None = None
        self.response_tokens: int | float | None = None
        self.mfu: dict[str, float] = {}
        self.sequences: int | None = None
        self.captures: list[Capture] = []  # profiler outputs this step links to
        self.rank_seconds: dict[int, ranks.RankSeconds] = {}  # phase span id → its ranks' seconds
        self.rank_compute: dict[int, ranks.RankCompute] = {}  # phase span id → ranks' compute
        self.data_moves: dict[int, DataMoves] = {}  # phase span id → its calls' data movement
        self.closed = False
        self.held = False  # a hook holds it until its captures are written
        self.logged: Mapping[str, Any] | None = None  # the step's `tel.log` dict (verl's)
        self.published = False  # the pipeline published it (its summary is final)
        self._published = threading.Event()  # readers of the verdict wait on it
        self._summary_lock = threading.Lock()
        self._summary: Summary | None = None

    @property
    def record(self) -> Phase:
        return self.trace.root

    @property
    def total_tokens(self) -> int | float | None:
        if self.prompt_tokens is None or self.response_tokens is None:
            return None
        return self.prompt_tokens + self.response_tokens

    def set_tokens(self, prompt: Any = None, response: Any = None) -> None:
        """Per-sequence prompt and response token counts (lists, arrays or tensors)."""
        try:
            drops = self._ledger.drops
            sums = []
            for kind, values in (("prompt", prompt), ("response", response)):
                counts, n_bad, reason = clean_counts(values)
                if n_bad:
                    drops.add("tokens", reason, f"{n_bad} invalid {kind} token count(s)", n_bad)
                total = counts.sum()
                sums.append(int(total) if float(total).is_integer() else float(total))
            if prompt is not None and response is not None and _length(prompt) != _length(response):
                drops.add(
                    "tokens",
                    "length_mismatch",
                    f"{_length(prompt)} prompt counts vs {_length(response)} response counts "
                    "(sums kept)",
                )
            self.prompt_tokens, self.response_tokens = sums
            self.sequences = _length(response) if response is not None else None
            self._recorded()
        except Exception as exc:  # telemetry must never raise into training
            self._ledger.drops.add("tokens", "internal_error", repr(exc))

    def set_mfu(self, **roles: Any) -> None:
        """MFU ratios by role, e.g. `actor=0.41, actor_infer=0.33` (verl's perf/mfu/*)."""
        for role, value in roles.items():
            number, reason = as_finite_float(value)
            if not encodable(role):
                number, reason = None, "bad_label"
            if number is None or number < 0:
                self._ledger.drops.add("mfu", reason or "negative", f"mfu {role}={describe(value)}")
                continue
            self.mfu[role] = number
            self._recorded()

    def _recorded(self) -> None:
        """New evidence after close (verl's log dict, late tokens): an early reader's summary
        is rebuilt from it, unless the step is already published."""
        if not self.published:
            self._summary = None

    def adopt_log(self, data: Mapping[str, Any]) -> None:
        """The dict verl logged for this step after its timers closed: its MFU (verl's own
        `perf/mfu/*`, unless set) and response lengths become the verdict's evidence."""
        self.logged = data
        if not self.mfu:
            self.set_mfu(
                **{
                    key.removeprefix(vocabulary.MFU): value
                    for key, value in data.items()
                    if key.startswith(vocabulary.MFU)
                }
            )

    def __enter__(self) -> Step:
        self._ledger.open_step(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._ledger.close_step(self, exc)
        return False

    @property
    def summary(self) -> Summary:
        """What the closed step's numbers are (`rlotel.derive.summary`), built once: by the
        pipeline before fan-out, or by a reader that comes first. Once published it carries
        the verdict."""
        summary = self._summary
        if summary is not None:
            return summary
        if not self.closed:
            return NotClosed({}, {}, 0.0, None)
        with self._summary_lock:
            if self._summary is None:
                self._summary = self._ledger.summarize(self)
            return self._summary

    @property
    def timing_raw(self) -> dict[str, float]:
        """verl's `timing_raw`: seconds per phase name (repeats summed) plus `step`."""
        return self.summary.timing_raw

    @property
    def metrics(self) -> dict[str, float]:
        """verl's `timing_s/*`, `timing_per_token_ms/*` and `perf/*` for this step."""
        return self.summary.metrics

    @property
    def unaccounted_seconds(self) -> float:
        """Step time covered by no top-level phase."""
        return self.summary.unaccounted_seconds

    @property
    def verdict(self) -> Any:
        """Bottleneck verdict (rlotel.derive.diagnose), with trends over the run's previous steps.

        The pipeline computes it once, in step order, before any sink sees the step; read
        right after the step closes, this waits (bounded) for the publisher to get there.
        """
        if not self.closed:
            return None
        if not self.published:
            self._ledger.wake()  # the publisher polls: this reader waits, so now
        self._published.wait(self._ledger.verdict_wait_s)
        return self.summary.verdict

    def publish(self, summary: Summary) -> None:
        """The pipeline finished this step (its summary, verdict included) and fans it out."""
        self._summary = summary
        if not self.published:  # once: only the pipeline calls this
            self.published = True
            self._published.set()


def _length(values: Any) -> int:
    try:
        return len(values)
    except TypeError:
        return 1


class Ledger:
    """Open step, the open trace's records and the hand-off of closed traces.

    `records` is the open trace's list (None when no trace is open), so entering a phase
    is one append and one context-variable set, with no method call.
    """

    def __init__(
        self,
        publish_step: Callable[[Step], None],
        publish_trace: Callable[[Trace], None],
        drops: Drops,
        summarize: Callable[[Step], Summary],
        verdict_wait_s: float = 5.0,
    ) -> None:
        self._publish_step = publish_step
        self._publish_trace = publish_trace
        self.drops = drops
        self.hooks: tuple[StepHooks, ...] = ()
        self.phase_range: Callable[[str], Any] | None = None  # a context manager per phase
        self.summarize = summarize  # a closed step's numbers (`rlotel.derive.summary`), wired in
        # The publisher's, to handle what is queued now (none yet: nothing to wake).
        self.wake: Callable[[], None] = lambda: None
        self.verdict_wait_s = verdict_wait_s
        self.records: list[Phase] | None = None
        self.loose_root: Phase | None = None
        self._loose: Trace | None = None
        self.open_remote: dict[int, Trace] = {}  # the remote calls being served now
        self._step: Step | None = None
        self.last_step_number: int | None = None

    @property
    def current_step(self) -> Step | None:
        return self._step

    @property
    def current_trace(self) -> Trace | None:
        """The trace phases are recorded into now: the open step's, or a loose one."""
        if self._step is not None:
            return self._step.trace
        return _remote_trace(_innermost.get(), self) or self._loose

    def in_open_phase(self) -> bool:
        """The caller's own context has a phase open (nesting follows contexts)."""
        phase = _innermost.get()
        while phase is not None and phase.end_ns:
            phase = phase.parent
        return phase is not None and phase._ledger is self

    def current_context(self) -> tuple[int, int] | None:
        """(trace_id, span_id) of the innermost open phase, drawing its span id now."""
        trace = self.current_trace
        if trace is None:
            return None
        phase = innermost_open(trace.records) or trace.root
        if not phase.span_id:
            phase.span_id = ids.span_id()
        return trace.trace_id, phase.span_id

    def attach_samples(
        self, batch: SampleBatch, max_spans: int, remote: tuple[int, int] | None = None
    ) -> bool:
        """Give samples their parent, ids and span budget: the remote phase `remote` names
        (from another process's carrier), else the open trace's innermost phase. True when
        the batch joined the open trace (it is published with it); False when the caller
        publishes it on its own (remote, or no trace open: no spans then)."""
        batch.end_ns = perf_counter_ns()
        trace = self.current_trace
        parent = (innermost_open(trace.records) or trace.root) if trace is not None else None
        if parent is not None:
            parent.progress_ns = batch.end_ns  # samples done: the open phase's work moves
        if remote is not None:
            batch.trace_id, batch.parent_span_id = remote
            samples.pick_sample_spans(batch, max_spans)
            return False
        if trace is None:
            return False
        batch.trace_id = trace.trace_id
        batch.parent = parent
        taken = sum(len(earlier.spans) for earlier in trace.samples)
        samples.pick_sample_spans(batch, max_spans - taken)
        trace.samples.append(batch)
        return True

    def open_step(self, step: Step) -> None:
        if self._step is not None:
            self.drops.add(
                "spans",
                "nested_step",
                f"step {step.number} opened inside step {self._step.number}; its phases "
                "are recorded in the outer step",
            )
            return
        if self._loose is not None:  # a step inside a loose phase: publish what came before
            self.close_loose()
        self._step = step
        self.records = step.trace.records
        for hook in self.hooks:
            try:  # before the clock: a capture's start-up is not the step's time
                hook.on_step_start(step.number)
            except Exception as error:
                self.drops.add("profile", "profiler_error", repr(error))
        backend = nvtx._backend
        if backend is not None:
            backend.push("step", None)
        step.trace.root.start_ns = perf_counter_ns()

    def close_step(self, step: Step, exc: BaseException | None) -> None:
        end = perf_counter_ns()
        if self._step is not step:
            return
        backend = nvtx._backend
        if backend is not None:
            backend.pop()
        root = step.trace.root
        root.end_ns = end
        root.error = exc
        self._step = None
        self.records = None
        self.last_step_number = step.number
        step.closed = True
        for hook in self.hooks:
            try:
                hook.on_step_end(step)
            except Exception as error:
                self.drops.add("profile", "profiler_error", repr(error))
        self._publish_step(step)

    def set_publisher(
        self, publish_step: Callable[[Step], None], publish_trace: Callable[[Trace], None]
    ) -> None:
        self._publish_step = publish_step
        self._publish_trace = publish_trace

    def abandon_open_step(self) -> None:
        """The process is exiting with a step still open: close it now, marked incomplete,
        with the phases that were still running, so the spans closed so far are exported."""
        step = self._step
        if step is None:
            return
        now = perf_counter_ns()
        for phase in step.trace.records:
            if not phase.end_ns:
                phase.end_ns = now
                phase.error = IncompleteStep(f"phase {phase.name!r} still open at exit")
        self.close_step(step, IncompleteStep(f"step {step.number} did not complete"))

    def open_loose(self, root: Phase) -> list[Phase]:
        """A phase with no trace open becomes the root of a trace of its own: its records."""
        self._loose = Trace(root, self.last_step_number)
        self.loose_root = root
        self.records = self._loose.records
        return self.records

    def close_loose(self) -> None:
        loose = self._loose
        self._loose = None
        self.loose_root = None
        self.records = None
        if loose is not None:
            self._publish_trace(loose)
