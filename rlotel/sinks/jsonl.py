"""Span exporter writing OTLP/JSON lines: one `ExportTraceServiceRequest` per line.

The encoding is the OTLP/JSON one (what the Collector's file exporter writes and its
`otlpjsonfile` receiver reads): lowerCamelCase fields, enums as integers, trace and span
ids as lowercase hex rather than protobuf-JSON's base64.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

_ID_FIELDS = frozenset({"traceId", "spanId", "parentSpanId"})


def _hex_ids(node: Any) -> Any:
    """Rewrite every id field in an OTLP dict from base64 to lowercase hex, in place."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_FIELDS and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids(item)
    return node


def spans_to_otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    request = encode_spans(spans)
    return _hex_ids(MessageToDict(request, use_integers_for_enums=True))


class OtlpJsonLinesExporter(SpanExporter):
    """Appends each exported batch to a file as one OTLP/JSON line."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._file = path.open("a", encoding="utf-8")  # init surfaces an unwritable path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        line = json.dumps(spans_to_otlp_json(spans), separators=(",", ":"))
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.write(line + "\n")
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
