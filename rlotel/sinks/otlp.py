"""OpenTelemetry SDK span exporters (OTLP from `OTEL_EXPORTER_OTLP_*`, or your own).

They take `ReadableSpan`s: span data becomes them here, on the exporter's own thread,
without a tracer (no sampler, no span processor, no per-span lock). Endpoint, headers,
timeout, compression and certificates are read by the OTLP exporters themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from rlotel import attributes as attr
from rlotel.sinks.span_data import (
    SampleBlock,
    SpanData,
    SpanItem,
    exception_attributes,
    status_message,
)

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SCOPE = InstrumentationScope("rlotel", schema_url=attr.GENAI_SCHEMA_URL)
_UNSET = Status(StatusCode.UNSET)


def otlp_span_exporter(protocol: str) -> SpanExporter:
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
        events.append(Event("exception", exception_attributes(span.error), span.end_ns))
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


class SdkSpanExporter:
    """Adapts an OTel `SpanExporter` to rlotel's batches of span data."""

    def __init__(self, exporter: SpanExporter, resource: Mapping[str, Any]) -> None:
        self._exporter = exporter
        self._resource = Resource.create(dict(resource))

    def export(self, spans: Sequence[SpanItem]) -> bool:
        readable = []
        for item in spans:
            expanded = item.spans() if type(item) is SampleBlock else (item,)
            readable.extend(readable_span(span, self._resource) for span in expanded)
        return self._exporter.export(readable) is SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._exporter.shutdown()
