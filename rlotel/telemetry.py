"""`Telemetry`: one run's telemetry, the user API — the ledger and the pipeline over the
sinks `rlotel.wiring` builds from one validated `Config` — and its lifecycle (flush,
shutdown, atexit, SIGTERM, fork).
"""

from __future__ import annotations

import atexit
import functools
import logging
import math
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import replace
from typing import Any

from rlotel import active, wiring
from rlotel.base.drops import Drops, describe, encodable
from rlotel.config import MAX_SHUTDOWN_TIMEOUT_S, Config
from rlotel.derive import sources
from rlotel.derive.diagnose import Diagnoser, Verdict
from rlotel.derive.goodput import PhaseBuckets, Timeline
from rlotel.derive.stall import RankWait, StallWatch
from rlotel.derive.summary import StepSummary, summarize
from rlotel.publish.pipeline import LogRecord, Pipeline
from rlotel.publish.publisher import Publisher
from rlotel.publish.sink import CompositeSink
from rlotel.record.ledger import (
    IncompleteStep,
    Ledger,
    Phase,
    RemotePhase,
    Step,
    Trace,
    innermost_open,
)
from rlotel.record.propagation import parse, traceparent
from rlotel.record.ranks import RankCompute, RankSeconds, Replied
from rlotel.record.samples import build_batch, use_remote_spans
from rlotel.schema import attributes as attr
from rlotel.schema.data_moves import DataMoves

log = logging.getLogger("rlotel")

NO_PARENT = (0, 0)  # samples whose carrier was unusable: no trace, no parent, no spans

MAX_CACHED_NAMES = 4096  # validated phase names remembered (verl uses a few dozen)


class Telemetry:
    """One run's telemetry. Create with `rlotel.init`; nothing here raises after that."""

    def __init__(self, config: Config) -> None:
        """`config` must be `Config.validated()`: everything that can fail on
        configuration fails while the sinks are built, before training starts."""
        self.config = config
        self.drops = Drops()
        self._usable_names: set[str] = set()  # phase names already validated
        self._closers: list[Callable[[], None]] = []  # run first at shutdown (quick, bounded)
        # Goodput buckets and the training mode (`set_mode`), read per step and per trace.
        self.phase_buckets = PhaseBuckets(overrides=config.phase_buckets or {})
        exports = wiring.build_exports(config, self.drops, self._phase_buckets)
        self._endpoint, self.metrics_url = exports.endpoint, exports.metrics_url
        self._traced = exports.traced
        self._source_labels = exports.source_labels
        self._sink = CompositeSink(exports.sinks, self.drops)
        top_ops = config.profile.top_n if config.profile is not None else 10
        identity = {**config.resource_attributes, attr.PROCESS_PID: os.getpid()}
        stacks = wiring.process_file(config, ".stacks")  # read by `rlotel hangs`
        self.stalls = StallWatch(config.stall_after_s, identity, stacks_file=stacks)
        self._pipeline = Pipeline(
            self._sink,
            Diagnoser(config.bottleneck_thresholds),
            self.drops,
            top_ops,
            closed=self.stalls.closed,
        )
        self._publisher = Publisher(self.drops, config.queue_size, tick=self._watch_open)
        submit = self._publisher.submit
        self.ledger = Ledger(
            functools.partial(submit, self._pipeline.step),
            functools.partial(submit, self._pipeline.trace),
            self.drops,
            self._summarize,
            verdict_wait_s=config.shutdown_timeout_s,
        )
        self.ledger.wake = self._publisher.wake
        self.stalls.ledger = self.ledger
        self._profiler, self._hooks = wiring.build_step_hooks(
            config, self.drops, self._publisher.submit, self._pipeline, self.ledger
        )
        self.ledger.hooks = tuple(self._hooks)
        self._beside: Beside | None = None  # made by the first verl timer (`timed_into`)
        self._closed = False
        atexit.register(self.shutdown)  # flush what training closed, within the time bound
        _flush_on_sigterm(self)
        os.register_at_fork(after_in_child=_after_fork_hook(weakref.ref(self)))

    def _phase_buckets(self) -> PhaseBuckets:
        return self.phase_buckets  # read per trace: verl's integration sets the mode

    def _summarize(self, step: Step) -> StepSummary:
        return summarize(step, self.config.n_gpus, self.phase_buckets)

    def set_mode(self, mode: str, timeline: Timeline | None = None) -> None:
        """The training mode from here on (verl's `sync`, `fully_async`, ...; the demo's),
        and optionally the rollout timeline its idle-per-role is measured against."""
        buckets = self.phase_buckets.for_mode(str(mode))
        if timeline is not None:
            buckets = replace(buckets, timeline=timeline)
        self.phase_buckets = buckets

    # --- training-thread API ---------------------------------------------------------------

    def step(self, global_step: int) -> Step:
        """Context manager of one training step (root span `step`, NVTX range `step`)."""
        return Step(self.ledger, global_step)

    def phase(
        self, name: str, color: str | None = None, context: Mapping[str, str] | None = None
    ) -> Phase:
        """Context manager of one phase: a child span of the open step (or a root span).

        `context` (a carrier from `current_context()` in another process, e.g. a Ray
        driver) makes a phase opened outside any local step a child of that remote phase.
        """
        if context is None and type(name) is str and name in self._usable_names:  # known name
            return Phase(self.ledger, name, color)
        if not isinstance(name, str) or not name or not encodable(name) or name == "step":
            self.drops.add(
                "spans",
                "bad_name",
                f"phase name {describe(name)} is not a usable name (non-empty UTF-8 string, "
                "not the reserved 'step'); the body runs untimed",
            )
            return Phase(None, "unnamed", color)
        ledger = self.ledger
        if context is not None and ledger.current_step is None and not ledger.in_open_phase():
            ids = parse(context)
            if ids is not None:
                return RemotePhase(self.ledger, name, color, ids)
            self.drops.add("spans", "bad_context", f"no valid traceparent in {context!r}")
        if len(self._usable_names) < MAX_CACHED_NAMES:
            self._usable_names.add(name)
        return Phase(self.ledger, name, color)

    @property
    def current_step(self) -> Step | None:
        return self.ledger.current_step

    def timed_into(self, window: Phase | Step, timing_raw: MutableMapping[str, float]) -> None:
        """A verl timer's: `window` (a phase, or a step before it opens) sums its seconds into
        `timing_raw`. A phase timed into another dict than its step's is the step's whose dict
        verl merges its seconds into (`Beside`)."""
        try:
            beside = self._beside
            if beside is None:  # first among the hooks: they see the windows verl credits
                beside = self._beside = Beside(
                    lambda trace: self._publisher.submit(self._pipeline.trace, trace)
                )
                self._hooks.insert(0, beside)
                self.ledger.hooks = (beside, *self.ledger.hooks)
            beside.timed_into(window, timing_raw, self.ledger.current_step)
        except Exception as error:
            self.drops.add("spans", "internal_error", f"timed_into: {error!r}")

    def record_samples(
        self,
        records: Any = None,
        /,
        *,
        context: Mapping[str, str] | None = None,
        exemplar_spans: Mapping[int, Any] | None = None,
        discarded: str | None = None,
        replica: Any = None,
        data_source: Any = None,
        reward_extra_info: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> dict[int, str]:
        """Per-sample agent-loop timings and lengths, one entry per sample.

        Keyword arrays (lists, numpy, torch): generate_sequences, tool_calls, compute_score
        (seconds), num_preempted (-1 = unknown), prompt_length, response_length; any
        subset. Or verl's shapes as `records`: a list of per-sample metric dicts, or the
        list[list[dict]] of worker chunks `AgentLoopManager._performance_metrics` receives.
        `min_weight_version` / `max_weight_version`: the weights each trajectory was
        generated with (verl's `min_global_steps` / `max_global_steps`): staleness.

        Read only for the samples that get a span (never copied; the spans say them):
        `uid`, `session`, `output`, `turns` (a trajectory's identity), `start_time_ns` /
        `end_time_ns` (its real Unix times: else the span ends now and lasts its stage
        seconds), `generated_step` (the step whose prompts it answers: the span links it),
        `trajectory_context` (a carrier of the span the trajectory ran as in another
        process, e.g. an agent-loop worker's: the span links it).

        A sample span is a GenAI `invoke_agent` operation (OpenTelemetry GenAI semantic
        conventions, pinned in `rlotel.schema.attributes`); its `gen_ai.conversation.id` is the
        trajectory key `{uid}_{session}_{output}` (as many parts as given). Also read only
        for the samples with spans: `reward` (a number per sample: a
        `gen_ai.evaluation.result` event on the span, `gen_ai.evaluation.name` "reward"),
        `turn_times_ns` (per sample a list of `(start_ns, end_ns)` Unix times, one per model
        turn: child `chat` spans) and `tool_times_ns` (per sample a list of
        `(tool_name, start_ns, end_ns)`, one per tool call: child `execute_tool {tool_name}`
        spans with `gen_ai.tool.name`); None for a sample means not measured. Malformed
        entries (not a pair/triple, negative or non-whole times, end before start, an
        empty tool name, beyond 256 a sample) are dropped and counted, the span stays.
        A span placed by its stage seconds widens to enclose its turns and tool calls.
        Prompts and responses are never exported.

        `context`: a carrier from `current_context()` in another process; the slowest
        samples' spans become children of that remote phase. `exemplar_spans`: sample index
        → span id of spans another process already made (returned by its own call); they
        become this process's exemplars and no spans are made here.
        `reward`: per-sample reward (any sign). `discarded`: these samples were generated
        and never trained, and why (`stale`, `evicted`, `filtered`): recorded in the step
        that dropped them, they are its async-bias reference (no spans, no histograms, not
        in verl's keys). `replica`: the rollout replica they ran on (one label, or one per
        sample) for occupancy, which `start_time_ns`/`end_time_ns` of every sample measure.
        `data_source`: verl's per-sample `data_source` (one string a sample): the samples' series
        by source, the step span's figures by source, `rl.sample.data_source` on their
        spans (the first 10 sources keep their names, later ones are labelled `other`).
        `reward_extra_info`: component → one number a sample (verl's custom-reward dict;
        any sign; at most 8): sums by component and source, `rl.sample.reward.<name>`.
        Returns sample index → span id (hex) of the samples that got a span here.
        """
        try:
            fields.update(sources.reward_components(reward_extra_info, self.drops))
            data_source = sources.per_sample(data_source)
            if data_source is not None:
                fields["data_source"] = data_source  # its spans' attribute, as given
            batch = build_batch(records, fields, self.drops, discarded, replica)
            if batch is None:
                return {}
            self._source_labels.label(batch, data_source)
            span_budget = self.config.max_sample_spans if self._traced else 0
            if exemplar_spans is not None or batch.discarded is not None:
                span_budget = 0
            remote = None
            if context is not None:
                remote = parse(context)
                if remote is None:
                    self.drops.add("samples", "bad_context", f"no valid traceparent in {context!r}")
                    remote, span_budget = NO_PARENT, 0
            attached = self.ledger.attach_samples(batch, span_budget, remote)
            batch.settle()  # once: the caller may reuse its arrays from here on
            if not attached:  # published settled: the spans' identity, turns and reward
                self._publisher.submit(self._pipeline.samples, batch)  # (or histograms only)
            if exemplar_spans is not None:
                bad = use_remote_spans(batch, exemplar_spans)
                if bad:
                    self.drops.add("samples", "bad_exemplar", f"{bad} unusable exemplar span(s)")
            if batch.exported_elsewhere:
                return {}
            return {span.index: f"{span.span_id:016x}" for span in batch.spans}
        except Exception as error:  # telemetry must never raise into training
            self.drops.add("samples", "internal_error", repr(error))
            return {}

    def current_context(self) -> dict[str, str]:
        """W3C `traceparent` of the innermost open phase, for work in other processes.

        Empty when no phase or step is open (or on error): a worker then records without
        a parent."""
        try:
            ids = self.ledger.current_context()
        except Exception as error:
            self.drops.add("spans", "internal_error", repr(error))
            return {}
        return traceparent(*ids) if ids else {}

    def record_rank_seconds(self, seconds_by_rank: Mapping[int, float]) -> None:
        """Seconds per rank of work the innermost open phase waited for (a worker-group
        call on N ranks; calls in one phase add up): its span then names the slowest rank,
        its seconds and the spread (slowest ÷ median)."""
        self._add_to_phase("rank_seconds", RankSeconds, seconds_by_rank)

    def record_rank_compute(self, replies: Mapping[int, Replied]) -> None:
        """Each rank's compute and collective seconds of work the innermost open phase
        waited for (their replies to a worker-group call; calls in one phase add up): its
        span then names the rank that computed longest and the compute spread."""
        self._add_to_phase("rank_compute", RankCompute, replies)

    def record_data_moves(self, call: Mapping[str, float]) -> None:
        """One worker-group call's seconds by stage and bytes by direction
        (`rlotel.schema.data_moves`), added to the innermost open phase: its span, series
        and the step's verdict then say how much of it was moving data."""
        self._add_to_phase("data_moves", DataMoves, call)

    def _add_to_phase(self, table: str, make: Callable[[str], Any], values: Mapping) -> None:
        """Add `values` to the record the open step keeps for its innermost open phase in
        `step.<table>` (by span id; made with `make(phase name)` on first use)."""
        try:
            step = self.ledger.current_step
            phase = innermost_open(step.trace.records) if step is not None else None
            if phase is None:
                return  # outside a step's phase there is no span to carry it
            if not phase.span_id:
                self.ledger.current_context()  # draws the span id
            records = getattr(step, table)
            record = records.get(phase.span_id)
            if record is None:
                record = records[phase.span_id] = make(phase.name)
            record.add(values)
            phase.progress_ns = time.perf_counter_ns()  # ranks replied: its work moves
        except Exception as error:
            self.drops.add("spans", "internal_error", f"{table}: {error!r}")

    def waiting_on_ranks(self, pending: set[int], refs: Sequence[Any] = ()) -> RankWait | None:
        """A blocking call on several ranks starts inside the innermost open phase: until
        `pending` empties (the caller discards ranks as they reply), a stall of that phase
        names the ranks still pending, and the processes of their replies (`refs`, by
        rank). Remove it with `done_waiting`."""
        step = self.ledger.current_step
        phase = innermost_open(step.trace.records) if step is not None else None
        if phase is None:
            return None
        wait = RankWait(phase, time.perf_counter_ns(), pending, refs=refs)
        self.stalls.rank_waits[id(wait)] = wait
        return wait

    def done_waiting(self, wait: RankWait | None) -> None:
        if wait is not None:
            self.stalls.rank_waits.pop(id(wait), None)

    @property
    def stalled(self) -> list[Verdict]:
        """Live verdicts of the phases stalled now (no progress for `stall_after_s`), one each."""
        return self.stalls.verdicts

    def _watch_open(self) -> None:
        """The publisher's tick: open phases to the sinks (gauges, partial spans)."""
        if getattr(self, "ledger", None) is not None:  # the first tick may come early
            self._sink.on_open_phases(self.stalls.check())

    def profile_step(self) -> None:
        """One update mini-batch done: advances a profiler schedule on flagged steps."""
        if self._profiler is not None:
            self._profiler.profile_step()

    def expect_logs(self) -> None:
        """Every step will be `log`ged after it closes (verl's Tracking does): its verdict
        waits for that dict's MFU and token evidence (until the next step, at most)."""
        self._publisher.submit(self._pipeline.expect_logs, None)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """verl `Tracking.log`-compatible: known keys to the catalogue, other scalars generic."""
        try:
            snapshot = dict(data)
        except Exception as exc:
            self.drops.add("metrics", "bad_dict", f"tel.log data is not a mapping: {exc!r}")
            return
        self._publisher.submit(self._pipeline.log, LogRecord(snapshot, step))

    # --- lifecycle -------------------------------------------------------------------------

    def serve_path(self, path: str, handler: Callable[[], tuple[str, bytes]]) -> str | None:
        """Serve `path` on this process's `/metrics` listener (its address, TLS and
        credentials); `handler` answers (content type, body). The URL, or None without an
        endpoint."""
        if self._endpoint is None or self.metrics_url is None:
            return None
        self._endpoint.add_route(path, handler)
        return self.metrics_url.rsplit("/metrics", 1)[0] + path

    def on_shutdown(self, closer: Callable[[], None]) -> None:
        """`closer` runs first when this telemetry shuts down (it must return quickly)."""
        self._closers.append(closer)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Publish everything closed so far and push it to every exporter; bounded wait."""
        timeout = bounded(timeout_s, self.config.shutdown_timeout_s)
        deadline = time.monotonic() + timeout
        done = self._publisher.flush(deadline)
        return self._sink.force_flush(deadline) and done

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Flush and stop everything, returning within about `timeout_s` seconds.

        Called on one of rlotel's own threads (a finaliser the garbage collector ran there:
        verl's `Tracking.__del__`), it runs on a thread of its own: no thread waits on itself.
        """
        if self._closed:
            return
        if threading.current_thread().name.startswith(OWN_THREADS):
            threading.Thread(target=self.shutdown, args=(timeout_s,), name=SHUTDOWN_THREAD).start()
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        timeout = bounded(timeout_s, self.config.shutdown_timeout_s)
        for closer in self._closers:
            try:
                closer()
            except Exception as error:
                self.drops.add("metrics", "internal_error", f"shutdown: {error!r}")
        self.ledger.abandon_open_step()  # exiting mid-step: export what closed, incomplete
        for hook in self._hooks:
            try:
                hook.flush()  # a capture still open, steps held for discovery
            except Exception as error:
                self.drops.add("profile", "profiler_error", repr(error))
        if self._profiler is not None:
            self._profiler.wait_for_hook(timeout / 4)
        self._publisher.submit(self._pipeline.release_all, None)
        self._publisher.flush(time.monotonic() + timeout / 2)
        self._publisher.stop(time.monotonic() + 0.5)
        self._sink.shutdown(time.monotonic() + timeout / 2)
        if active.current is self:
            active.current = None

    def _forked(self) -> None:
        """In a forked child (dataloader workers, multiprocessing): go quiet.

        The parent's threads did not survive the fork and their locks may be held forever,
        and exporting here would duplicate the parent's data: the child keeps timing into
        its ledger (so `timing_raw` still works) but publishes and exports nothing.
        """
        self._closed = True
        self.drops = Drops()  # a fresh lock: the parent's may have been held at fork time
        self.ledger.drops = self.drops
        self._publisher.submit = _discard
        self.ledger.set_publisher(_discard_step, _discard)
        if self._endpoint is not None:
            self._endpoint.release_in_child()
        self.metrics_url = None
        self._endpoint = None
        self._sink = CompositeSink([], self.drops)

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


class Beside:
    """verl's timers sum each window's seconds into a dict (`timing_raw`), and verl credits a
    step with what is in its dict when it logs it. A window timed into another dict is
    credited where verl merges that dict: one-step-off times the next batch's `generate_async`
    in the task that generates it, beside the step, and merges its dict into the dict of the
    step that consumes the batch. So such a window (with what nests in it and the samples
    under it) leaves the step it opened in when that step closes without its seconds, and
    joins the first step that closes with them — the very number its dict holds — in its
    own dict. Closed before a step opened that then closes without them, or still waiting at
    the end: no step's, a trace of its own (`rl.step` the step it opened in)."""

    def __init__(self, publish: Callable[[Trace], None]) -> None:
        self._publish = publish
        self._step: tuple[Step, MutableMapping[str, float]] | None = None  # the next or open
        self._opened: list[tuple[Phase, MutableMapping[str, float]]] = []  # in it, elsewhere
        self._waiting: list[tuple[Trace, MutableMapping[str, float]]] = []  # in no step yet

    def timed_into(
        self, window: Phase | Step, into: MutableMapping[str, float], open_step: Step | None
    ) -> None:
        if isinstance(window, Step):
            self._step = (window, into)
        elif self._step is not None and self._step[0] is open_step and into is not self._step[1]:
            self._opened.append((window, into))

    def on_step_start(self, number: int) -> None:
        """Nothing to do: a window is judged when its step closes."""

    def on_step_end(self, step: Step) -> None:
        own = self._step[1] if self._step is not None and self._step[0] is step else None
        opened, self._opened, self._step = self._opened, [], None
        trace, waiting, self._waiting = step.trace, self._waiting, []
        for held, into in waiting:
            window = held.root
            if _credited(window, into, own):
                window.parent = None  # a window of this step's own
                trace.records += (window, *held.records)
                for batch in held.samples:
                    batch.trace_id = trace.trace_id
                trace.samples += held.samples
            elif 0 < window.end_ns < trace.root.start_ns:
                self._publish(held)  # this step was verl's to merge it into: none will
            else:
                self._waiting.append((held, into))
        for window, into in opened:
            if not _credited(window, into, own) and window in trace.records:
                self._waiting.append((_take_out(trace, window), into))

    def flush(self) -> None:
        """The end of the run: each window still waiting is a trace of its own."""
        waiting, self._waiting = self._waiting, []
        now = time.perf_counter_ns()
        for held, _ in waiting:
            for record in (held.root, *held.records):
                if not record.end_ns:
                    record.end_ns, record.error = now, IncompleteStep("still open at exit")
            self._publish(held)


def _credited(window: Phase, into: Mapping[str, float], own: Mapping[str, float] | None) -> bool:
    """verl merged the closed `window`'s dict into `own` (a step's): the number is the same."""
    name = window.name
    return bool(window.end_ns) and own is not None and name in into and own.get(name) is into[name]


def _take_out(trace: Trace, window: Phase) -> Trace:
    """`window`, what nests in it and the samples under it, out of `trace`: a trace of their
    own (records list parents before children)."""
    held = Trace(window, trace.step)
    inside, kept = {id(window)}, []
    for record in trace.records:
        if record is window:
            continue
        if record.parent is not None and id(record.parent) in inside:
            inside.add(id(record))
            held.records.append(record)
        else:
            kept.append(record)
    trace.records[:] = kept
    held.samples = [b for b in trace.samples if b.parent is not None and id(b.parent) in inside]
    trace.samples[:] = [b for b in trace.samples if b not in held.samples]
    for batch in held.samples:
        batch.trace_id = held.trace_id
    return held


OWN_THREADS = "rlotel-"  # how every thread rlotel starts is named
SHUTDOWN_THREAD = "shutdown of rlotel"  # not one of them: it may wait on each


def bounded(timeout_s: Any, default: float) -> float:
    """A wait every layer accepts (threading, the OTel SDK's ns deadlines): finite, ≥ 0,
    at most MAX_SHUTDOWN_TIMEOUT_S."""
    if timeout_s is None or isinstance(timeout_s, bool):
        return default
    try:
        value = float(timeout_s)
    except OverflowError:  # an int beyond float range: as long as allowed
        return MAX_SHUTDOWN_TIMEOUT_S
    except (TypeError, ValueError):
        return default
    if math.isnan(value):
        return default
    return min(max(value, 0.0), MAX_SHUTDOWN_TIMEOUT_S)


_live: weakref.WeakSet[Telemetry] = weakref.WeakSet()


def _on_sigterm(signum: int, frame: Any) -> None:
    for tel in list(_live):
        tel.shutdown()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _flush_on_sigterm(tel: Telemetry) -> None:
    """SIGTERM (a scheduler's stop, `kill`) skips atexit: flush first, then die as before.

    Installed only when nobody handles SIGTERM yet, and only from the main thread (where
    Python allows it); the default action is restored and the signal re-raised, so the
    process ends exactly as it would have — with its telemetry flushed within the bound.
    """
    _live.add(tel)
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def _discard_step(step: Step) -> None:
    """The publisher of a forked child: nothing leaves the child (and no verdict waits)."""
    step.publish(step.summary)


def _discard(*_: Any) -> None:
    """The publisher of a forked child: nothing leaves the child."""


def _after_fork_hook(reference: weakref.ref) -> Callable[[], None]:
    def after_fork() -> None:
        tel = reference()
        if tel is not None:
            tel._forked()

    return after_fork


def build(*args: Any, **kwargs: Any) -> Telemetry:
    """`rlotel.init`'s work: validate the options, then start everything."""
    return Telemetry(Config(*args, **kwargs).validated())
