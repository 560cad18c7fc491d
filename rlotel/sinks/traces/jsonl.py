"""The traces file: one `ExportTraceServiceRequest` per line, in OTLP/JSON.

The request is the message the OTLP exporters send (the SDK's encoder over the same
`ReadableSpan`s), written with protobuf's own JSON mapping: lowerCamelCase fields, enums
as integers, 64-bit integers as strings, NaN and infinities as strings. Only the ids
differ from protobuf-JSON: OTLP/JSON (what the Collector's file exporter writes and its
`otlpjsonfile` receiver reads) wants them as lowercase hex, not base64.
`rlotel.offline.otlp_json` reads the files back.
"""

from __future__ import annotations

import base64
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(record: dict[str, Any]) -> None:
    for field in ID_FIELDS:
        if field in record:
            record[field] = base64.b64decode(record[field]).hex()


def request_json(request: Message) -> str:
    """An `ExportTraceServiceRequest` as one line of OTLP/JSON."""
    data = MessageToDict(request, use_integers_for_enums=True)
    for resource_spans in data.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                _hex_ids(span)
                for link in span.get("links", ()):
                    _hex_ids(link)
    return orjson.dumps(data).decode()


def traces_dir_file(directory: Path, role: str, rank: int | str) -> Path:
    """This process's file in a traces directory: `<role>-<rank>-<pid>.jsonl`."""
    parts = (re.sub(r"[^0-9A-Za-z._=+]+", "_", str(part)) for part in (role, rank, os.getpid()))
    return Path(directory) / f"{'-'.join(parts)}.jsonl"


class JsonLinesExporter(SpanExporter):
    """An OTel `SpanExporter` that appends each exported batch to a file as one OTLP/JSON
    line, flushed at once."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._file = path.open("a", encoding="utf-8")  # init surfaces an unwritable path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        line = request_json(encode_spans(spans)) + "\n"
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.write(line)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()
