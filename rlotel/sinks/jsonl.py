"""The traces file: span data encoded straight to OTLP/JSON, one request per line.

The encoding is OTLP/JSON (what the Collector's file exporter writes and its
`otlpjsonfile` receiver reads): lowerCamelCase fields, enums as integers, 64-bit integers
as strings, trace and span ids as lowercase hex (not protobuf-JSON's base64). Encoding
plain dicts with orjson costs a few µs a span, where protobuf + MessageToDict cost ~30.
"""

from __future__ import annotations

import numbers
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from rlotel.sinks.spans import SpanData, exception_attributes, status_message

KIND_INTERNAL = 1
STATUS_ERROR = 2
SCOPE = {"name": "rlotel"}


def any_value(value: Any) -> dict[str, Any]:
    """A Python attribute value as an OTLP AnyValue (numpy scalars as their Python kind)."""
    kind = type(value)
    if kind is str:
        return {"stringValue": value}
    if kind is bool:
        return {"boolValue": value}
    if kind is int:
        return {"intValue": str(value)}
    if kind is float:
        return {"doubleValue": value}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [any_value(item) for item in value]}}
    if isinstance(value, numbers.Integral):
        return {"intValue": str(int(value))}
    if isinstance(value, numbers.Real):
        return {"doubleValue": float(value)}
    return {"stringValue": str(value)}


def key_values(attributes: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"key": key, "value": any_value(value)} for key, value in attributes.items()]


def encode_span(span: SpanData) -> dict[str, Any]:
    encoded: dict[str, Any] = {
        "traceId": f"{span.trace_id:032x}",
        "spanId": f"{span.span_id:016x}",
        "name": span.name,
        "kind": KIND_INTERNAL,
        "startTimeUnixNano": str(span.start_ns),
        "endTimeUnixNano": str(span.end_ns),
        "attributes": key_values(span.attributes),
        "status": {},
    }
    if span.parent_span_id:
        encoded["parentSpanId"] = f"{span.parent_span_id:016x}"
    if span.links:
        encoded["links"] = [
            {
                "traceId": f"{link.trace_id:032x}",
                "spanId": f"{link.span_id:016x}",
                "attributes": key_values(link.attributes),
            }
            for link in span.links
        ]
    error = span.error
    if error is not None:
        encoded["status"] = {"code": STATUS_ERROR, "message": status_message(error)}
        encoded["events"] = [
            {
                "timeUnixNano": str(span.end_ns),
                "name": "exception",
                "attributes": key_values(exception_attributes(error)),
            }
        ]
    return encoded


def encode_request(resource: Mapping[str, Any], spans: Sequence[SpanData]) -> dict[str, Any]:
    """One `ExportTraceServiceRequest` with one resource and rlotel's scope."""
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": key_values(resource)},
                "scopeSpans": [{"scope": SCOPE, "spans": [encode_span(s) for s in spans]}],
            }
        ]
    }


class JsonLinesExporter:
    """Appends each exported batch to a file as one OTLP/JSON line, flushed at once."""

    def __init__(self, path: Path, resource: Mapping[str, Any]) -> None:
        self._path = path
        self._resource = dict(resource)
        self._file = path.open("ab")  # init surfaces an unwritable path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[SpanData]) -> bool:
        line = orjson.dumps(encode_request(self._resource, spans)) + b"\n"
        with self._lock:
            if self._file.closed:
                return False
            self._file.write(line)
            self._file.flush()
        return True

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()
