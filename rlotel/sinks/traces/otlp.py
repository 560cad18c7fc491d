"""Span data → `ReadableSpan`s, for the OpenTelemetry SDK span exporters (OTLP and yours).

Every exporter rlotel drives is an SDK `SpanExporter` used through its public API: the
OTLP exporter of the configured protocol is made the usual way, so it reads every
`OTEL_EXPORTER_OTLP_*` variable (endpoint, headers, timeout, compression, certificates,
insecure) and keeps its own retries; `span_exporters=` are called alike. Span data becomes
`ReadableSpan`s here, on the exporter's own thread, without a tracer (no sampler, no span
processor, no per-span lock).
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from rlotel.schema import attributes as attr
from rlotel.sinks.traces.span_data import (
    EXCEPTION_EVENT,
    SCOPE_NAME,
    SampleBlock,
    SpanData,
    SpanItem,
    exception_attributes,
    status_message,
)

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SCOPE = InstrumentationScope(SCOPE_NAME, schema_url=attr.GENAI_SCHEMA_URL)
_UNSET = Status(StatusCode.UNSET)


def otlp_span_exporter(protocol: str) -> SpanExporter:
    """The OTLP exporter package's span exporter for `protocol` (`grpc` or
    `http/protobuf`), configured from the environment."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()


def readable_span(span: SpanData, resource: Resource) -> ReadableSpan:
    parent = (
        SpanContext(span.trace_id, span.parent_span_id, span.remote_parent, _SAMPLED)
        if span.parent_span_id
        else None
    )
    status = _UNSET
    events = [Event(event.name, event.attributes, event.time_ns) for event in span.events]
    if span.error is not None:
        status = Status(StatusCode.ERROR, status_message(span.error))
        events.append(Event(EXCEPTION_EVENT, exception_attributes(span.error), span.end_ns))
    return ReadableSpan(
        name=span.name,
        context=SpanContext(span.trace_id, span.span_id, False, _SAMPLED),
        parent=parent,
        resource=resource,
        attributes=span.attributes,
        events=events,
        links=[
            Link(SpanContext(link.trace_id, link.span_id, False, _SAMPLED), link.attributes)
            for link in span.links
        ],
        kind=SpanKind.INTERNAL,
        instrumentation_scope=_SCOPE,
        status=status,
        start_time=span.start_ns,
        end_time=span.end_ns,
    )


def sample_readable_spans(block: SampleBlock, resource: Resource) -> list[ReadableSpan]:
    """A sample block's spans, straight from its columns (one parent context for all)."""
    parent = SpanContext(block.trace_id, block.parent_span_id, block.remote_parent, _SAMPLED)
    return [
        ReadableSpan(
            name=attr.SAMPLE_SPAN,
            context=SpanContext(block.trace_id, span_id, False, _SAMPLED),
            parent=parent,
            resource=resource,
            attributes=attributes,
            kind=SpanKind.INTERNAL,
            instrumentation_scope=_SCOPE,
            status=_UNSET,
            start_time=start,
            end_time=block.end_ns,
        )
        for span_id, start, attributes in block.rows_as_attributes()
    ]


def readable_spans(items: Sequence[SpanItem], resource: Resource) -> list[ReadableSpan]:
    """A batch of span data, sample blocks expanded, as `ReadableSpan`s of `resource`."""
    readable: list[ReadableSpan] = []
    for item in items:
        if type(item) is SampleBlock:
            readable.extend(sample_readable_spans(item, resource))
        else:
            readable.append(readable_span(item, resource))
    return readable


class HashedResource(Resource):
    """A `Resource` that hashes once. The SDK's encoder groups every span by its resource,
    and `Resource.__hash__` serialises the attributes to JSON on each call: 17 µs of a
    sample span's ~85 µs export (benchmarks/span_export.py). A resource is immutable."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash
