"""OTLP span export (from `OTEL_EXPORTER_OTLP_*`) and OpenTelemetry SDK span exporters.

rlotel's own OTLP export encodes span data straight to protobuf bytes
(`rlotel.sinks.traces.otlp_proto`) and sends them through the OTLP exporter package's own
transport: for HTTP its client (session, retries with backoff and Retry-After,
compression, headers, timeout, certificates), for gRPC its exporter (channel,
credentials, insecure, headers, compression, retry on transient codes, reconnect). Each
exporter is made the usual way, so it reads every `OTEL_EXPORTER_OTLP_*` variable
(endpoint and per-signal endpoint, headers, timeout, compression, certificate, insecure)
exactly as before; only `ReadableSpan`s and the SDK encoder are gone from the path. An
installed exporter without those transport pieces gets `ReadableSpan`s as before.

Exporters of your own (`span_exporters=`) take `ReadableSpan`s: span data becomes them
here, on the exporter's own thread, without a tracer (no sampler, no span processor, no
per-span lock).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from rlotel.schema import attributes as attr
from rlotel.sinks.traces.otlp_proto import RequestEncoder
from rlotel.sinks.traces.span_data import (
    EXCEPTION_EVENT,
    SCOPE_NAME,
    SampleBlock,
    SpanData,
    SpanItem,
    exception_attributes,
    span_count,
    status_message,
)

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SCOPE = InstrumentationScope(SCOPE_NAME, schema_url=attr.GENAI_SCHEMA_URL)
_UNSET = Status(StatusCode.UNSET)


def otlp_span_exporter(protocol: str) -> SpanExporter:
    """The OTLP exporter package's own span exporter, configured from the environment."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()


def otlp_exporter(protocol: str, resource: Mapping[str, Any]) -> OtlpExporter | SdkSpanExporter:
    """rlotel's OTLP span export for `protocol` (`grpc` or `http/protobuf`): direct
    protobuf over the exporter package's transport where it has the pieces, else the
    package's exporter fed `ReadableSpan`s."""
    transport = _GrpcTransport.create() if protocol == "grpc" else _HttpTransport.create()
    if transport is None:
        return SdkSpanExporter(otlp_span_exporter(protocol), resource)
    return OtlpExporter(transport, resource)


class OtlpExporter:
    """Span data → one serialized `ExportTraceServiceRequest` per batch → the transport."""

    def __init__(self, transport: _HttpTransport | _GrpcTransport, resource: Mapping[str, Any]):
        self._transport = transport
        self._encoder = RequestEncoder(resource)

    def export(self, spans: Sequence[SpanItem]) -> bool:
        return self._transport.send(self._encoder.request(spans), span_count(spans))

    def shutdown(self) -> None:
        self._transport.shutdown()


class _HttpTransport:
    """The OTLP/HTTP span exporter's client, sent bytes rlotel encoded."""

    def __init__(self, exporter: Any) -> None:
        self._exporter = exporter
        self._client = exporter._client
        self._log = logging.getLogger(type(exporter).__module__)  # folded into rlotel's drops

    @classmethod
    def create(cls) -> _HttpTransport | None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
        if not callable(getattr(getattr(exporter, "_client", None), "export", None)):
            return None  # an exporter of another layout: the SDK path
        return cls(exporter)

    def send(self, payload: bytes, count: int) -> bool:
        if getattr(self._exporter, "_shutdown", False):
            return False
        limit = getattr(self._exporter, "_max_request_size", 0) or 0
        if limit > 0 and len(payload) > limit:
            self._log.warning(
                "Dropping span batch: serialized size %d bytes exceeds max_request_size %d bytes.",
                len(payload),
                limit,
            )
            return False
        return bool(self._client.export(payload).success)

    def shutdown(self) -> None:
        self._exporter.shutdown()


class _GrpcTransport:
    """The OTLP/gRPC span exporter, its stub sending bytes rlotel encoded as they are."""

    def __init__(self, exporter: Any) -> None:
        self._exporter = exporter

    @classmethod
    def create(cls) -> _GrpcTransport | None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        needed = ("_export", "_translate_data", "_count_data", "_initialize_channel_and_stub")
        if not all(hasattr(OTLPSpanExporter, name) for name in needed):
            return None  # an exporter of another layout: the SDK path
        return cls(_serialized_grpc_exporter(OTLPSpanExporter)())

    def send(self, payload: bytes, count: int) -> bool:
        return self._exporter._export((payload, count)) is SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._exporter.shutdown()


def _serialized_grpc_exporter(base: type) -> type:
    """`base` (the package's gRPC span exporter) taking (request bytes, span count): its
    channel, retries and reconnects as they are, its stub without a serializer."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    service = trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"]
    method = f"/{service.full_name}/{service.methods_by_name['Export'].name}"

    class SerializedOTLPSpanExporter(base):  # type: ignore[misc, valid-type]
        def _initialize_channel_and_stub(self) -> None:
            super()._initialize_channel_and_stub()
            export = self._channel.unary_unary(
                method,
                request_serializer=None,  # the request is bytes already
                response_deserializer=trace_service_pb2.ExportTraceServiceResponse.FromString,
            )
            self._client = SimpleNamespace(Export=export)

        def _translate_data(self, data: tuple[bytes, int]) -> bytes:  # type: ignore[override]
            return data[0]

        def _count_data(self, data: tuple[bytes, int]) -> int:  # type: ignore[override]
            return data[1]

    return SerializedOTLPSpanExporter


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
