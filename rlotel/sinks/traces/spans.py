"""Closed traces → span data, built in one pass per trace, then exported in batches.

No tracer and no SDK span objects on the way: each phase record becomes one plain
`SpanData` (ids drawn on the training thread when a window needed them early, else here)
with its recorded start and end times. Each exporter gets the batch on its own thread and
makes `ReadableSpan`s of it there (`otlp`). Driving a tracer span by span cost ~60 µs a
span here, on the publisher.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlotel.base import clock, ids
from rlotel.base.drops import Drops
from rlotel.derive import sources
from rlotel.derive.goodput import PhaseBuckets
from rlotel.publish.sink import Sink
from rlotel.record import ranks
from rlotel.record.capture import Capture
from rlotel.record.ledger import Phase, Step, Trace
from rlotel.record.samples import (
    DURATION_FIELDS,
    INTEGER_FIELDS,
    PREEMPTED,
    SampleBatch,
    SpanExtras,
)
from rlotel.schema import attributes as attr
from rlotel.schema import vocabulary
from rlotel.sinks.traces.export_queue import ExportQueue
from rlotel.sinks.traces.span_data import (
    EventData,
    LinkData,
    SampleBlock,
    SpanData,
    SpanItem,
    span_count,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import SpanExporter

    from rlotel.derive.stall import OpenPhase, ThreadStack

# Per-sample column → (span attribute, written as an integer).
_SAMPLE_KEYS = {
    name: (attr.sample_attribute(name, name in DURATION_FIELDS), name in INTEGER_FIELDS)
    for name in (*DURATION_FIELDS, PREEMPTED, vocabulary.PROMPT_LENGTH, vocabulary.RESPONSE_LENGTH)
}


def _span_id(record: Phase) -> int:
    if not record.span_id:
        record.span_id = ids.span_id()
    return record.span_id


def _capture_link(capture: Capture) -> LinkData:
    return LinkData(capture.trace_id, capture.span_id, capture.attributes())


class SpanBuilder:
    """Span data of closed traces, samples and captures, with the run's common attributes."""

    STEPS_KEPT = 256  # recent steps a sample span can link to (its generating step): far
    # beyond any off-policy window verl keeps, and bounded within the first few hundred steps

    def __init__(self, run: str, phase_buckets: Callable[[], PhaseBuckets] = PhaseBuckets) -> None:
        self.run = run
        self._phase_buckets = phase_buckets  # read per trace: an integration may set the mode
        self._step_spans: OrderedDict[int, tuple[int, int]] = OrderedDict()  # step → ids

    def trace(
        self,
        trace: Trace,
        root_attributes: dict[str, Any],
        captures: Sequence[Capture] = (),
        offset_ns: int | None = None,
        events: Sequence[tuple[str, int, dict[str, Any]]] = (),
    ) -> list[SpanItem]:
        """`offset_ns` maps the records' clock to Unix time: perf_counter's now (one
        offset per trace, so durations stay exact), or 0 for records already in Unix ns."""
        offset = clock.unix_ns() - time.perf_counter_ns() if offset_ns is None else offset_ns
        common: dict[str, Any] = {attr.RUN: self.run}
        if trace.step is not None:
            common[attr.STEP] = trace.step
        trace_id = trace.trace_id
        root = trace.root
        root_id = _span_id(root)
        if trace.step is not None:
            self._remember_step(trace.step, trace_id, root_id)
        links_by_phase: dict[int, list[LinkData]] = {}  # span id → its windows' captures
        for capture in captures:
            if capture.phase_context and capture.phase_context[0] == trace_id:
                links_by_phase.setdefault(capture.phase_context[1], []).append(
                    _capture_link(capture)
                )
        measured = clock.offset()
        if measured is not None:
            root_attributes = {
                **root_attributes,
                attr.CLOCK_OFFSET_NS: measured[0],
                attr.CLOCK_UNCERTAINTY_NS: measured[1],
            }
        spans = [
            SpanData(
                trace_id,
                root_id,
                trace.remote_parent,
                root.name,
                root.start_ns + offset,
                root.end_ns + offset,
                {**common, **root_attributes},
                [_capture_link(c) for c in captures],
                root.error,
                bool(trace.remote_parent),
                [EventData(*event) for event in events],
            )
        ]
        append = spans.append
        phase_key, bucket_key, bucket_of = attr.PHASE, attr.BUCKET, self._phase_buckets().bucket
        named: dict[str, dict[str, Any]] = {}  # name → its attributes: a step repeats names
        new_id, no_links = ids.span_id, ()
        for record in trace.records:
            end = record.end_ns
            if not end:
                continue
            name, parent = record.name, record.parent
            span_id = record.span_id
            if not span_id:
                span_id = record.span_id = new_id()
            attributes = named.get(name)
            if attributes is None:
                attributes = named[name] = {**common, phase_key: name, bucket_key: bucket_of(name)}
            append(
                SpanData(
                    trace_id,
                    span_id,
                    parent.span_id if parent is not None else root_id,
                    name,
                    record.start_ns + offset,
                    end + offset,
                    attributes,  # shared by the phases of a name
                    links_by_phase.get(span_id, no_links) if links_by_phase else no_links,
                    record.error,
                    False,
                    no_links,
                )
            )
        for batch in trace.samples:
            if not batch.exported_elsewhere:
                parent = batch.parent
                parent_id = parent.span_id if parent is not None and parent.span_id else root_id
                parent_start = (parent or root).start_ns + offset
                spans.extend(
                    self._samples(batch, trace_id, parent_id, parent_start, offset, common)
                )
        return spans

    def _remember_step(self, number: int, trace_id: int, span_id: int) -> None:
        self._step_spans[number] = (trace_id, span_id)
        self._step_spans.move_to_end(number)
        if len(self._step_spans) > self.STEPS_KEPT:
            self._step_spans.popitem(last=False)

    def _enriched(self, block: SampleBlock, batch: SampleBatch, step: int | None) -> list[SpanData]:
        """Sample spans with identity, real times, a link to the step that generated them
        (V1: consumed steps after), the reward as an event and turns and tool calls as
        child spans: one `SpanData` each (a step has a few)."""
        result: list[SpanData] = []
        for span, index in zip(block.spans(), (s.index for s in batch.spans), strict=True):
            extras = batch.span_extras.get(index)
            if extras is None:
                result.append(span)
                continue
            attributes = {**span.attributes, **extras.attributes}
            newest = extras.attributes.get(attr.SAMPLE_VERSION_MAX)
            if step is not None and newest is not None:
                attributes[attr.SAMPLE_STALENESS] = (step - 1) - newest
            links: list[LinkData] = []
            generated = extras.generated_step
            if generated is not None:
                attributes[attr.SAMPLE_GENERATED_STEP] = generated
                ids = self._step_spans.get(generated) if generated != step else None
                if ids is not None:
                    links.append(
                        LinkData(*ids, {attr.LINK_RELATION: "generated_in", attr.STEP: generated})
                    )
            if extras.trajectory is not None:  # the worker-side span it ran as
                links.append(LinkData(*extras.trajectory, {attr.LINK_RELATION: "trajectory"}))
            start, end = span.start_ns, span.end_ns
            if extras.end_ns:  # its real times
                start, end = extras.start_ns, extras.end_ns
            children = _trajectory_parts(span, extras, block.common)
            if children and not extras.end_ns:  # placed by its stage seconds: enclose them
                start = min(start, *(child.start_ns for child in children))
                end = max(end, *(child.end_ns for child in children))
            events = () if extras.reward is None else (_reward_event(extras.reward, end),)
            result.append(
                span._replace(
                    start_ns=start, end_ns=end, attributes=attributes, links=links, events=events
                )
            )
            result.extend(children)
        return result

    def step(self, step: Step) -> list[SpanItem]:
        spans = self.trace(step.trace, step_attributes(step), step.captures)
        for spread_of in (
            ranks.spreads(step.rank_seconds) if step.rank_seconds else None,  # replies
            ranks.compute_spreads(step.rank_compute) if step.rank_compute else None,
        ):
            if spread_of:  # a phase that waited on several ranks names the slowest
                for index, span in enumerate(spans):
                    spread = spread_of.get(span.span_id) if type(span) is SpanData else None
                    if spread is not None:  # its own attributes: phases of a name share theirs
                        attributes = {**span.attributes, **spread.attributes()}
                        spans[index] = span._replace(attributes=attributes)
        for index, span in enumerate(spans if step.data_moves else ()):
            moves = step.data_moves.get(span.span_id) if type(span) is SpanData else None
            if moves is not None:  # its worker-group calls' stages and bytes
                data = {attr.DATA_PREFIX + key: value for key, value in moves.facts().items()}
                spans[index] = span._replace(attributes={**span.attributes, **data})
        return spans

    def loose(self, trace: Trace) -> list[SpanItem]:
        root_attributes: dict[str, Any] = {attr.PHASE: trace.root.name}
        if trace.rank_time is not None:  # a worker call: its compute and collective seconds
            root_attributes.update(trace.rank_time.attributes())
        if trace.role is not None:  # a worker call's own role, where its process hosts several
            root_attributes[attr.ROLE] = trace.role
        return self.trace(trace, root_attributes, trace.captures, events=trace.events)

    def remote_samples(self, batch: SampleBatch) -> list[SpanItem]:
        """Sample spans whose parent phase lives in another process (propagated context)."""
        offset = clock.unix_ns() - time.perf_counter_ns()
        return self._samples(
            batch, batch.trace_id, batch.parent_span_id, 0, offset, {attr.RUN: self.run}, True
        )

    def capture(self, capture: Capture) -> SpanData:
        """A profiler output as a span of its own trace; steps and phases link to it."""
        offset = clock.unix_ns() - time.perf_counter_ns()
        return SpanData(
            capture.trace_id,
            capture.span_id,
            0,
            attr.CAPTURE_SPAN,
            capture.start_ns + offset,
            max(capture.end_ns, capture.start_ns) + offset,
            {attr.RUN: self.run, **capture.attributes()},
        )

    def _samples(
        self,
        batch: SampleBatch,
        trace_id: int,
        parent_id: int,
        parent_start: int,
        offset: int,
        common: dict[str, Any],
        remote: bool = False,
    ) -> list[SpanItem]:
        """The slowest samples as children of the phase they were recorded in, by column.

        A sample is placed at its recorded real times, else to end when `record_samples`
        was called, lasting the sum of its stage seconds (clamped to start no earlier than
        its parent)."""
        spans = batch.spans
        if not spans:
            return []
        end = batch.end_ns + offset
        indices = np.fromiter((span.index for span in spans), dtype=np.int64, count=len(spans))
        seconds = np.zeros(len(spans))
        keys, integral, columns = [attr.SAMPLE_INDEX], [True], [indices.tolist()]
        for field, column in batch.columns.items():
            values = _at(column, indices)
            if field in DURATION_FIELDS:  # verl's order: (generate + tools) + score
                seconds = seconds + np.where(np.isnan(values), 0.0, values)
            key, whole = _SAMPLE_KEYS.get(field) or _sample_key(field)
            keys.append(key)
            integral.append(whole)
            columns.append(values.tolist())
        starts = np.maximum(end - (seconds * 1e9).astype(np.int64), parent_start)
        block = SampleBlock(
            trace_id,
            parent_id,
            remote,
            end,
            starts.tolist(),
            [span.span_id for span in spans],
            {**common, attr.OPERATION: attr.OPERATION_INVOKE_AGENT},  # a trajectory
            tuple(keys),
            tuple(integral),
            list(zip(*columns, strict=True)),
        )
        if batch.span_extras:
            return self._enriched(block, batch, common.get(attr.STEP))
        return [block]


def _reward_event(reward: float, time_ns: int) -> EventData:
    """A sample's reward as the GenAI evaluation event, at the end of its span."""
    score = {attr.EVALUATION_NAME: attr.REWARD_EVALUATION, attr.EVALUATION_SCORE: reward}
    return EventData(attr.EVALUATION_EVENT, time_ns, score)


def _trajectory_parts(
    sample: SpanData, extras: SpanExtras, common: dict[str, Any]
) -> list[SpanData]:
    """A trajectory's model turns as `chat` spans and its tool calls as `execute_tool
    {tool}` spans, children of its sample span, at their real times."""
    if not extras.turns and not extras.tools:
        return []
    base = {**common, attr.OPERATION: attr.OPERATION_CHAT}
    conversation = extras.attributes.get(attr.CONVERSATION_ID)
    if conversation is not None:
        base[attr.CONVERSATION_ID] = conversation
    trace_id, parent = sample.trace_id, sample.span_id
    children = [
        SpanData(trace_id, ids.span_id(), parent, attr.CHAT_SPAN, start, end, base)
        for start, end in extras.turns
    ]
    tool_base = {**base, attr.OPERATION: attr.OPERATION_EXECUTE_TOOL}
    for tool, start, end in extras.tools:
        children.append(
            SpanData(
                trace_id,
                ids.span_id(),
                parent,
                attr.TOOL_SPAN_PREFIX + tool,
                start,
                end,
                {**tool_base, attr.TOOL_NAME: tool},
            )
        )
    return children


def _at(column: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """column[indices], NaN where a ragged column is shorter than the sample index."""
    if indices.size and int(indices.max()) < column.size:
        return column[indices]
    return np.array([column[i] if i < column.size else np.nan for i in indices.tolist()])


def _sample_key(field: str) -> tuple[str, bool]:
    """A per-sample column without a catalogued attribute: `rl.sample.<field>`."""
    return f"{attr.SAMPLE_PREFIX}{field}", field in INTEGER_FIELDS


def _partial(builder: SpanBuilder, phase: OpenPhase) -> list[SpanItem]:
    """The open spans of a stalled phase's trace, as they stand now: each ends now and says
    `rl.incomplete` and how long it has been open (`rl.open_s`); the stalled one also
    `rl.stalled`. The same span ids come again, complete, if the trace ever closes (readers
    keep that one). Ids are drawn here for spans that have none yet, as the training thread
    draws them (a lost race would give one span two ids: a window of a few bytecodes)."""
    trace, now = phase.trace, time.perf_counter_ns()
    offset = clock.unix_ns() - now
    common: dict[str, Any] = {attr.RUN: builder.run}
    if trace.step is not None:
        common[attr.STEP] = trace.step
    root, root_id = trace.root, _span_id(trace.root)
    spans: list[SpanItem] = []
    for record in (root, *list(trace.records)):
        if record.end_ns or not record.start_ns:
            continue
        attributes = {**common, attr.INCOMPLETE: True, attr.OPEN_S: (now - record.start_ns) / 1e9}
        if record is root:
            parent_id = trace.remote_parent
        else:
            parent_id = _span_id(record.parent) if record.parent is not None else root_id
            attributes[attr.PHASE] = record.name
        events: tuple[EventData, ...] = ()
        if record is phase.record:
            attributes[attr.STALLED] = True
            events = tuple(_stack_event(stack, now + offset) for stack in phase.stacks)
        spans.append(
            SpanData(
                trace.trace_id,
                _span_id(record),
                parent_id,
                record.name,
                record.start_ns + offset,
                now + offset,
                attributes,
                (),
                None,
                record is root and bool(trace.remote_parent),
                events,
            )
        )
    return spans


def _stack_event(stack: ThreadStack, time_ns: int) -> EventData:
    """One thread's stack at the stall's onset, on the stalled span (so it reaches the
    Collector and Tempo): innermost frame first, each marked user/library/rlotel/stdlib."""
    frames = "\n".join(f"{frame.where} [{frame.kind}]" for frame in stack.frames)
    attributes = {"thread.name": stack.thread, "code.stacktrace": frames}  # OTel semconv
    return EventData(attr.STALL_STACK, time_ns, attributes)


def step_attributes(step: Step) -> dict[str, Any]:
    """What the `step` span says about the step (tokens, throughput, MFU, verdict)."""
    result: dict[str, Any] = {attr.UNACCOUNTED_S: step.unaccounted_seconds}
    if step.record.error is not None:
        result[attr.INCOMPLETE] = True
    if step.prompt_tokens is not None:
        result[attr.TOKENS_PROMPT] = step.prompt_tokens
        result[attr.TOKENS_RESPONSE] = step.response_tokens
        result[attr.TOKENS_TOTAL] = step.total_tokens
    metrics = step.metrics
    for key, name in (
        (vocabulary.THROUGHPUT, attr.THROUGHPUT),
        (vocabulary.TIME_PER_STEP, attr.TIME_PER_STEP),
    ):
        if key in metrics:
            result[name] = metrics[key]
    for role, value in step.mfu.items():
        result[attr.MFU_PREFIX + role] = value
    result.update(sources.attributes(step.summary.sources))  # the step's samples by source
    if step.sequences is not None:
        result[attr.SEQUENCES] = step.sequences
    verdict = step.summary.verdict
    if verdict is not None:
        result.update(verdict.attributes())
    return result


class SpanSink(Sink):
    """Builds span data once per trace and hands the batch to every span exporter's queue."""

    def __init__(
        self,
        run: str,
        exporters: dict[str, SpanExporter],
        resource: Resource,
        drops: Drops,
        phase_buckets: Callable[[], PhaseBuckets] = PhaseBuckets,
        delay_s: float = 1.0,
    ) -> None:
        self._build = SpanBuilder(run, phase_buckets)
        self._queues = [
            ExportQueue(name, exporter, resource, drops, delay_s)
            for name, exporter in exporters.items()
        ]

    def _put(self, spans: list[SpanItem]) -> None:
        count = span_count(spans)
        for queue in self._queues:
            queue.put(spans, count)

    def on_step(self, step: Step) -> None:
        self._put(self._build.step(step))

    def on_trace(self, trace: Trace) -> None:
        self._put(self._build.loose(trace))

    def on_samples(self, batch: SampleBatch) -> None:
        if batch.parent_span_id and batch.spans and not batch.exported_elsewhere:
            self._put(self._build.remote_samples(batch))

    def on_capture(self, capture: Capture) -> None:
        self._put([self._build.capture(capture)])

    def on_open_phases(self, phases: Sequence[OpenPhase]) -> None:
        for phase in phases:
            if phase.onset:  # once per stall: where the trace hangs, before it closes
                self._put(_partial(self._build, phase))

    def force_flush(self, deadline: float) -> bool:
        return all([queue.flush(deadline) for queue in self._queues])  # a list: flush each

    def shutdown(self, deadline: float) -> None:
        for queue in self._queues:
            queue.shutdown(deadline)
