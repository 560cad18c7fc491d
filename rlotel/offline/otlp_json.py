"""OTLP/JSON lines → plain span records: the one reader of rlotel's traces files.

A traces file holds one `ExportTraceServiceRequest` per line in the OTLP/JSON encoding
(lowerCamelCase fields, hex ids, enums as integers, 64-bit integers as strings or numbers,
a field at its default value left out, as protobuf's JSON mapping does).
`analyze`, `report` and `perfetto` read through here so they agree on every decoding rule.
Reading is tolerant: a truncated or corrupt line is counted and skipped, never raised.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from rlotel.schema import attributes as attr

STATUS_ERROR = 2  # OTLP status.code: 0 unset, 1 ok, 2 error


@dataclass(frozen=True, slots=True)
class SpanLink:
    trace_id: str
    span_id: str
    attributes: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One span with decoded attributes; `resource` is shared by the spans of a resource."""

    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    links: tuple[SpanLink, ...] = ()
    status_code: int = 0
    events: tuple[SpanEvent, ...] = ()  # the reward's gen_ai.evaluation.result, exceptions

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass
class TracesRead:
    """What a read produced: the spans, and how many non-blank lines were not OTLP spans."""

    spans: list[SpanRecord] = field(default_factory=list)
    skipped_lines: int = 0


def decode_value(value: Mapping[str, Any]) -> Any:
    """An OTLP AnyValue as a Python value (intValue may be a string; doubles may be NaN)."""
    if "stringValue" in value:  # the common kinds first: a traces file has ~10 per span
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if not value:
        return None
    ((kind, raw),) = value.items()
    if kind == "doubleValue":
        return float(raw)  # proto3 JSON writes "NaN" / "Infinity" as strings
    if kind == "arrayValue":
        return [decode_value(item) for item in raw.get("values", [])]
    if kind == "kvlistValue":
        return decode_attributes(raw.get("values", []))
    if kind == "bytesValue":
        return base64.b64decode(raw)
    return raw  # boolValue


def decode_attributes(attributes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """OTLP `[{key, value: AnyValue}]` as a dict."""
    return {item["key"]: decode_value(item.get("value", {})) for item in attributes}


def decode_request(request: Mapping[str, Any]) -> list[SpanRecord]:
    """The spans of one ExportTraceServiceRequest; raises KeyError/ValueError when malformed."""
    spans = []
    for resource_spans in request["resourceSpans"]:
        resource = decode_attributes(resource_spans.get("resource", {}).get("attributes", []))
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                spans.append(_decode_span(span, resource))
    return spans


def _decode_span(span: Mapping[str, Any], resource: dict[str, Any]) -> SpanRecord:
    # most spans have no links, events or status: skip building empty tuples for them
    links = span.get("links")
    events = span.get("events")
    status = span.get("status")
    return SpanRecord(
        trace_id=span["traceId"],
        span_id=span["spanId"],
        parent_span_id=span.get("parentSpanId", ""),
        name=span.get("name", ""),
        start_ns=int(span.get("startTimeUnixNano", 0)),
        end_ns=int(span.get("endTimeUnixNano", 0)),
        attributes=decode_attributes(span.get("attributes", ())),
        resource=resource,
        links=tuple(_decode_link(link) for link in links) if links else (),
        status_code=int(status.get("code", 0)) if status else 0,
        events=tuple(_decode_event(event) for event in events) if events else (),
    )


def _decode_link(link: Mapping[str, Any]) -> SpanLink:
    return SpanLink(link["traceId"], link["spanId"], decode_attributes(link.get("attributes", ())))


def _decode_event(event: Mapping[str, Any]) -> SpanEvent:
    return SpanEvent(
        str(event.get("name", "")),
        int(event.get("timeUnixNano", 0)),
        decode_attributes(event.get("attributes", ())),
    )


def parse_line(line: str) -> dict[str, Any] | None:
    """One JSON object from a line, or None when the line is not one (truncated, corrupt).
    orjson reads a line in ~80 % of json's time; json still reads what orjson refuses
    (NaN and Infinity literals)."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        try:
            record = json.loads(line)
        except ValueError:
            return None
    return record if isinstance(record, dict) else None


def read_lines(lines: Iterable[str]) -> TracesRead:
    """Spans of OTLP/JSON lines; blank lines are ignored, any other bad line is counted."""
    read = TracesRead()
    for line in lines:
        if not line.strip():
            continue
        record = parse_line(line)
        spans = decode_or_none(record) if record is not None else None
        if spans is None:
            read.skipped_lines += 1
        else:
            read.spans.extend(spans)
    return read


def decode_or_none(record: Mapping[str, Any]) -> list[SpanRecord] | None:
    """`decode_request`, or None when the record is not a well-formed OTLP request."""
    if "resourceSpans" not in record:
        return None
    try:
        return decode_request(record)
    except (KeyError, ValueError, TypeError, AttributeError):
        return None


def read_file(path: Path) -> TracesRead:
    """Spans of one traces file (bytes that are not UTF-8 only spoil their own line)."""
    with Path(path).open(encoding="utf-8", errors="replace") as lines:
        return read_lines(lines)


def iter_files(path: Path) -> Iterator[Path]:
    """The traces files of a path: the file itself, or a directory's `*.jsonl`, sorted."""
    path = Path(path)
    if path.is_dir():
        yield from sorted(path.glob("*.jsonl"))
    else:
        yield path


def process_label(resource: Mapping[str, Any]) -> str:
    """A readable name for the process that exported a span: service, role and rank."""
    parts = [str(resource.get(attr.SERVICE_NAME, "unknown_service"))]
    if attr.ROLE in resource:
        parts.append(str(resource[attr.ROLE]))
    if attr.RANK in resource:
        parts.append(f"rank {resource[attr.RANK]}")
    return " ".join(parts)


def process_key(resource: Mapping[str, Any]) -> tuple[str, str]:
    """Identity of an exporting process: its label plus the SDK's per-process instance id."""
    return process_label(resource), str(resource.get("service.instance.id", ""))


def clock_offsets(spans: Iterable[SpanRecord]) -> dict[tuple[str, str], tuple[int, int]]:
    """Each process's measured clock offset to the driver's (ns, uncertainty ns): from its
    resource or any of its spans (root spans carry it once it is measured); the most
    certain measurement wins."""
    found: dict[tuple[str, str], tuple[int, int]] = {}
    for span in spans:
        for source in (span.attributes, span.resource):
            offset = source.get(attr.CLOCK_OFFSET_NS)
            if isinstance(offset, int) and not isinstance(offset, bool):
                key = process_key(span.resource)
                uncertainty = source.get(attr.CLOCK_UNCERTAINTY_NS)
                uncertainty = uncertainty if isinstance(uncertainty, int) else 2**62
                if key not in found or uncertainty < found[key][1]:
                    found[key] = (offset, uncertainty)
    return found


def align_clocks(spans: list[SpanRecord]) -> list[SpanRecord]:
    """Spans on the driver's clock: each process's spans shifted by its measured offset
    (`rlotel.base.clock`); processes without one (the driver, one machine) stay as they are.
    Within the measurement's uncertainty, causality decides: a span cannot start before
    its parent in another process did (`_causal_shifts`)."""
    measured = clock_offsets(spans)
    if not measured or not any(offset for offset, _ in measured.values()):
        return spans
    shifts = _causal_shifts(spans, measured)
    aligned = []
    for span in spans:
        shift = shifts.get(process_key(span.resource), 0)
        if not shift:
            aligned.append(span)
        else:
            events = tuple(replace(e, time_ns=e.time_ns - shift) for e in span.events)
            aligned.append(
                replace(
                    span,
                    start_ns=span.start_ns - shift,
                    end_ns=span.end_ns - shift,
                    events=events,
                )
            )
    return aligned


def _causal_shifts(
    spans: list[SpanRecord], measured: dict[tuple[str, str], tuple[int, int]]
) -> dict[tuple[str, str], int]:
    """Per process, the offset to subtract: the measured one, lowered (never by more than
    its uncertainty) until no span of the process starts before its remote parent. The
    midpoint estimate assumes equal legs; the true offset also satisfies this bound."""
    by_id = {(span.trace_id, span.span_id): span for span in spans}
    latest: dict[tuple[str, str], int] = {}  # process → the largest offset causality allows
    for span in spans:
        key = process_key(span.resource)
        if key not in measured or not span.parent_span_id:
            continue
        parent = by_id.get((span.trace_id, span.parent_span_id))
        if parent is None:
            continue
        parent_key = process_key(parent.resource)
        if parent_key == key:
            continue
        parent_start = parent.start_ns - measured.get(parent_key, (0, 0))[0]
        bound = span.start_ns - parent_start
        latest[key] = min(latest.get(key, bound), bound)
    shifts = {}
    for key, (offset, uncertainty) in measured.items():
        bound = latest.get(key, offset)
        shifts[key] = max(min(offset, bound), offset - uncertainty)
    return shifts
