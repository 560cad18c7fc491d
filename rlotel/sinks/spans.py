"""Closed traces → OpenTelemetry spans with the recorded start and end times.

Runs on the publisher thread. Span and trace ids were drawn on the training thread when
each window opened (so they can be handed to workers and exemplars before the span
exists); a preset id generator makes the SDK use exactly those ids.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Status, StatusCode

from rlotel.drops import Drops
from rlotel.ledger import Phase, Step, Trace
from rlotel.profiling import Capture
from rlotel.samples import DURATION_FIELDS, PREEMPTED, SampleBatch
from rlotel.sinks import exporter_logs

# OTel GenAI conventions where one exists; rl.sample.* otherwise.
_SAMPLE_ATTRIBUTES = {
    "prompt_length": "gen_ai.usage.input_tokens",
    "response_length": "gen_ai.usage.output_tokens",
    **{name: f"rl.sample.{name}_s" for name in DURATION_FIELDS},
}
_INTEGER_FIELDS = frozenset({PREEMPTED, "prompt_length", "response_length"})


class PresetIdGenerator(RandomIdGenerator):
    """Hands out the next preset id once, then falls back to random ids."""

    def __init__(self) -> None:
        self.trace_id = 0
        self.span_id = 0

    def generate_trace_id(self) -> int:
        preset, self.trace_id = self.trace_id, 0
        return preset or super().generate_trace_id()

    def generate_span_id(self) -> int:
        preset, self.span_id = self.span_id, 0
        return preset or super().generate_span_id()


class CountingExporter(SpanExporter):
    """Counts spans an exporter failed to deliver in rlotel_telemetry_dropped_total."""

    def __init__(self, inner: SpanExporter, drops: Drops, name: str) -> None:
        self._inner = inner
        self._drops = drops
        self._name = name

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with exporter_logs.captured() as first_log:
            try:
                result = self._inner.export(spans)
            except Exception as exc:
                self._drops.add("spans", "export_failed", f"{self._name}: {exc!r}", len(spans))
                return SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            why = first_log() or "no reason given"
            self._drops.add("spans", "export_failed", f"{self._name}: {why}", len(spans))
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class SpanSink:
    """Owns rlotel's TracerProvider (never the global one) and turns traces into spans."""

    def __init__(
        self, resource: Resource, run: str, exporters: dict[str, SpanExporter], drops: Drops
    ) -> None:
        self._ids = PresetIdGenerator()
        # rlotel shuts the provider down itself, within its own time bound (atexit included).
        self.provider = TracerProvider(
            resource=resource, id_generator=self._ids, shutdown_on_exit=False
        )
        for name, exporter in exporters.items():
            self.provider.add_span_processor(
                BatchSpanProcessor(
                    CountingExporter(exporter, drops, name), schedule_delay_millis=1000
                )
            )
        self._tracer = self.provider.get_tracer("rlotel")
        self._run = run

    def export_step(self, step: Step) -> None:
        self._export(step.trace, _step_attributes(step), step.captures)

    def export_capture(self, capture: Capture) -> None:
        """A profiler output as a span of its own trace; steps and phases link to it."""
        offset = time.time_ns() - time.perf_counter_ns()
        self._ids.trace_id = capture.trace_id
        self._ids.span_id = capture.span_id
        span = self._tracer.start_span(
            "profile.capture",
            context=None,
            attributes={"rl.run": self._run, **capture.attributes()},
            start_time=capture.start_ns + offset,
        )
        span.end(end_time=max(capture.end_ns, capture.start_ns) + offset)

    def export_remote_samples(self, batch: SampleBatch) -> None:
        """Sample spans whose parent phase lives in another process (propagated context)."""
        parent = _remote_parent(batch.trace_id, batch.parent_span_id)
        offset = time.time_ns() - time.perf_counter_ns()
        self._export_samples(batch, parent, offset, {"rl.run": self._run})

    def export_trace(self, trace: Trace) -> None:
        """A phase tree opened outside any step (verl's `testing`)."""
        self._export(trace, {"rl.phase": trace.root.name})

    def _export(self, trace: Trace, root_attributes: dict, captures: list[Capture] = ()) -> None:
        offset = time.time_ns() - time.perf_counter_ns()  # one offset: durations stay exact
        common: dict = {"rl.run": self._run}
        if trace.step is not None:
            common["rl.step"] = trace.step
        root = trace.root
        links = [_link(c) for c in captures]
        remote = (
            _remote_parent(trace.trace_id, trace.remote_parent) if trace.remote_parent else None
        )
        root_span = self._start(
            root, remote, offset, trace.trace_id, {**common, **root_attributes}, links
        )
        spans = {id(root): root_span}
        closed = [record for record in trace.records if record.end_ns]
        covered: dict[int, list[trace_api.Link]] = {}  # phase span id → its windows' links
        for capture in captures:
            if capture.phase_context and capture.phase_context[0] == trace.trace_id:
                covered.setdefault(capture.phase_context[1], []).append(_link(capture))
        for record in closed:
            parent = spans.get(id(record.parent or root), root_span)
            spans[id(record)] = self._start(
                record,
                parent,
                offset,
                0,
                {**common, "rl.phase": record.name},
                covered.get(record.span_id, ()) if record.span_id else (),
            )
        for batch in trace.samples:
            if not batch.exported_elsewhere:
                parent = spans.get(id(batch.parent), root_span)
                self._export_samples(batch, parent, offset, common)
        for record in reversed(closed):
            self._end(spans[id(record)], record, offset)
        self._end(root_span, root, offset)

    def _export_samples(self, batch: SampleBatch, parent, offset: int, common: dict) -> None:
        """The slowest samples as children of the phase they were recorded in.

        A sample is placed to end when `record_samples` was called, lasting the sum of its
        stage seconds (clamped to start no earlier than its parent).
        """
        parent_start = getattr(parent, "start_time", None) or 0
        end = batch.end_ns + offset
        for sample in batch.spans:
            seconds = sum(sample.values.get(f, 0.0) for f in DURATION_FIELDS)
            start = max(end - int(seconds * 1e9), parent_start)
            self._ids.span_id = sample.span_id
            attributes = {**common, "rl.sample.index": sample.index}
            for name, value in sample.values.items():
                key = _SAMPLE_ATTRIBUTES.get(name, f"rl.sample.{name}")
                attributes[key] = int(value) if name in _INTEGER_FIELDS else value
            span = self._tracer.start_span(
                "sample",
                context=trace_api.set_span_in_context(parent),
                attributes=attributes,
                start_time=start,
            )
            span.end(end_time=end)

    def _start(
        self,
        record: Phase,
        parent,
        offset: int,
        trace_id: int,
        attributes: dict,
        links: Sequence[trace_api.Link] = (),
    ):
        self._ids.trace_id = trace_id
        self._ids.span_id = record.span_id
        context = trace_api.set_span_in_context(parent) if parent is not None else None
        return self._tracer.start_span(
            record.name,
            context=context,
            attributes=attributes,
            links=links,
            start_time=record.start_ns + offset,
            record_exception=False,
            set_status_on_exception=False,
        )

    @staticmethod
    def _end(span, record: Phase, offset: int) -> None:
        if record.error is not None:
            error = record.error
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            span.record_exception(error, timestamp=record.end_ns + offset, escaped=True)
        span.end(end_time=record.end_ns + offset)

    def shutdown(self) -> None:
        self.provider.shutdown()


def _remote_parent(trace_id: int, span_id: int) -> trace_api.NonRecordingSpan:
    context = trace_api.SpanContext(
        trace_id,
        span_id,
        is_remote=True,
        trace_flags=trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED),
    )
    return trace_api.NonRecordingSpan(context)


def _link(capture: Capture) -> trace_api.Link:
    context = trace_api.SpanContext(
        capture.trace_id,
        capture.span_id,
        is_remote=False,
        trace_flags=trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED),
    )
    return trace_api.Link(context, capture.attributes())


def _step_attributes(step: Step) -> dict:
    result: dict = {"rl.unaccounted_s": step.unaccounted_seconds}
    if step.record.error is not None:
        result["rl.incomplete"] = True  # the step ended by an exception or at exit
    if step.prompt_tokens is not None:
        result["rl.tokens.prompt"] = step.prompt_tokens
        result["rl.tokens.response"] = step.response_tokens
        result["rl.tokens.total"] = step.total_tokens
    for key in ("perf/throughput", "perf/time_per_step"):
        if key in step.metrics:
            result["rl." + key.split("/", 1)[1]] = step.metrics[key]
    for role, value in step.mfu.items():
        result[f"rl.mfu.{role}"] = value
    if step.sequences is not None:
        result["rl.sequences"] = step.sequences
    verdict = step.verdict
    if verdict is not None:
        result.update(verdict.attributes())
    return result
