"""The traces file: span data written straight as OTLP/JSON text, one request per line.

The encoding is OTLP/JSON (what the Collector's file exporter writes and its
`otlpjsonfile` receiver reads): lowerCamelCase fields, enums as integers, 64-bit integers
as strings, trace and span ids as lowercase hex (not protobuf-JSON's base64), NaN and
infinities as the strings protobuf-JSON uses. Each span is formatted into a JSON fragment
from cached pieces (an attribute pair that repeats — run, step, phase name — is encoded
once), because building nested dicts per span and serialising them cost ~15 µs a span
here; this costs a few. `rlotel.sinks.traces.otlp_json` reads the files back.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

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

KIND_INTERNAL = 1
STATUS_ERROR = 2
SCOPE = {"name": SCOPE_NAME}
SCHEMA_URL = attr.GENAI_SCHEMA_URL  # the semantic conventions the standard names follow
MAX_CACHED = 65536  # encoded pieces kept (attribute pairs, key prefixes, names)

_prefixes: dict[tuple[str, str], str] = {}
_strings: dict[tuple[str, str], str] = {}


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
        return {"doubleValue": _finite_or_name(value)}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [any_value(item) for item in value]}}
    if isinstance(value, numbers.Integral):
        return {"intValue": str(int(value))}
    if isinstance(value, numbers.Real):
        return {"doubleValue": _finite_or_name(float(value))}
    return {"stringValue": str(value)}


def _finite_or_name(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _prefix(key: str, field: str) -> str:
    """`{"key":"<key>","value":{"<field>":` — the constant start of a numeric pair."""
    cache_key = (key, field)
    text = _prefixes.get(cache_key)
    if text is None:
        if len(_prefixes) >= MAX_CACHED:
            _prefixes.clear()
        text = _prefixes[cache_key] = (
            '{"key":' + orjson.dumps(key).decode() + ',"value":{"' + field + '":'
        )
    return text


def _attribute(key: str, value: Any) -> str:
    kind = type(value)
    if kind is float:
        if value - value == 0.0:  # finite (NaN and infinities are not)
            return f"{_prefix(key, 'doubleValue')}{value!r}}}}}"
    elif kind is int:
        return f'{_prefix(key, "intValue")}"{value}"}}}}'
    elif kind is str:
        text = _strings.get((key, value))
        if text is None:
            if len(_strings) >= MAX_CACHED:
                _strings.clear()
            text = _strings[(key, value)] = orjson.dumps(
                {"key": key, "value": {"stringValue": value}}
            ).decode()
        return text
    return orjson.dumps({"key": key, "value": any_value(value)}).decode()


def key_values(attributes: Mapping[str, Any]) -> str:
    """The text of an OTLP KeyValue list."""
    return "[" + ",".join([_attribute(key, value) for key, value in attributes.items()]) + "]"


# A span whose attributes are strings, ints and finite floats (nearly all of them) is one
# `%` into a template made once per shape: keys, types and string values.
_templates: dict[tuple, str] = {}


def _span_template(shape: tuple, name: str, has_parent: bool) -> str:
    key = (shape, name, has_parent)
    template = _templates.get(key)
    if template is not None:
        return template
    pieces = []
    for attribute_key, marker in shape:
        if marker is int:
            pieces.append(_prefix(attribute_key, "intValue").replace("%", "%%") + '"%d"}}')
        elif marker is float:
            pieces.append(_prefix(attribute_key, "doubleValue").replace("%", "%%") + "%r}}")
        else:
            pieces.append(_attribute(attribute_key, marker).replace("%", "%%"))
    parent = '"parentSpanId":"%016x",' if has_parent else ""
    template = (
        '{"traceId":"%032x","spanId":"%016x",'
        + parent
        + '"name":'
        + orjson.dumps(name).decode().replace("%", "%%")
        + ',"kind":1,"startTimeUnixNano":"%d","endTimeUnixNano":"%d","attributes":['
        + ",".join(pieces)
        + '],"status":{}}'
    )
    if len(_templates) >= MAX_CACHED:
        _templates.clear()
    _templates[key] = template
    return template


def _plain_span(span: SpanData) -> str | None:
    """The templated encoding, or None when the span needs the general one."""
    if span.links or span.error is not None or span.events:
        return None
    shape = []
    values: list[Any] = [span.trace_id, span.span_id]
    if span.parent_span_id:
        values.append(span.parent_span_id)
    values += (span.start_ns, span.end_ns)
    for key, value in span.attributes.items():
        kind = type(value)
        if kind is str:
            shape.append((key, value))
        elif kind is int or (kind is float and value - value == 0.0):
            shape.append((key, kind))
            values.append(value)
        else:
            return None
    template = _span_template(tuple(shape), span.name, bool(span.parent_span_id))
    return template % tuple(values)


_names: dict[str, str] = {}


def _name(name: str) -> str:
    text = _names.get(name)
    if text is None:
        if len(_names) >= MAX_CACHED:
            _names.clear()
        text = _names[name] = orjson.dumps(name).decode()
    return text


class Shared:
    """Pieces of one request whose spans are all alive: the attributes' text by the id of
    their dict (the phases of a name share one: it is encoded once) and each trace id's
    hex (formatting a 128-bit int costs a microsecond here; `bytes.hex` does not)."""

    __slots__ = ("attributes", "traces")

    def __init__(self) -> None:
        self.attributes: dict[int, str] = {}
        self.traces: dict[int, str] = {}


_SHARED_SPAN = (
    '{"traceId":"%s","spanId":"%s",%s"name":%s,"kind":'
    + str(KIND_INTERNAL)
    + ',"startTimeUnixNano":"%d","endTimeUnixNano":"%d","attributes":%s,"status":{}}'
)


def encode_span(span: SpanData, shared: Shared | None = None) -> str:
    """`shared`: pieces of the request (see `Shared`)."""
    if shared is not None and not (span.links or span.error is not None or span.events):
        attributes = span.attributes
        text = shared.attributes.get(id(attributes))
        if text is None:
            text = shared.attributes[id(attributes)] = key_values(attributes)
        trace = shared.traces.get(span.trace_id)
        if trace is None:
            trace = shared.traces[span.trace_id] = span.trace_id.to_bytes(16, "big").hex()
        parent = span.parent_span_id
        return _SHARED_SPAN % (
            trace,
            span.span_id.to_bytes(8, "big").hex(),
            f'"parentSpanId":"{parent.to_bytes(8, "big").hex()}",' if parent else "",
            _name(span.name),
            span.start_ns,
            span.end_ns,
            text,
        )
    plain = _plain_span(span)
    if plain is not None:
        return plain
    name = _name(span.name)
    parent = f'"parentSpanId":"{span.parent_span_id:016x}",' if span.parent_span_id else ""
    extra = ""
    if span.links:
        links = ",".join(
            f'{{"traceId":"{link.trace_id:032x}","spanId":"{link.span_id:016x}",'
            f'"attributes":{key_values(link.attributes)}}}'
            for link in span.links
        )
        extra += f',"links":[{links}]'
    status = "{}"
    error = span.error
    events = [
        f'{{"timeUnixNano":"{event.time_ns}","name":{orjson.dumps(event.name).decode()},'
        f'"attributes":{key_values(event.attributes)}}}'
        for event in span.events
    ]
    if error is not None:
        status = orjson.dumps({"code": STATUS_ERROR, "message": status_message(error)}).decode()
        events.append(
            f'{{"timeUnixNano":"{span.end_ns}","name":"{EXCEPTION_EVENT}",'
            f'"attributes":{key_values(exception_attributes(error))}}}'
        )
    if events:
        extra += f',"events":[{",".join(events)}]'
    return (
        f'{{"traceId":"{span.trace_id:032x}","spanId":"{span.span_id:016x}",{parent}'
        f'"name":{name},"kind":{KIND_INTERNAL},"startTimeUnixNano":"{span.start_ns}",'
        f'"endTimeUnixNano":"{span.end_ns}","attributes":{key_values(span.attributes)},'
        f'"status":{status}{extra}}}'
    )


def encode_block(block: SampleBlock) -> str:
    """A batch's sample spans: one template, one `%` per sample; a sample with an invalid
    (NaN) entry takes the general path, without that attribute."""
    pieces = []
    for key, value in block.common.items():
        pieces.append(_attribute(key, value).replace("%", "%%"))
    for key, whole in zip(block.keys, block.integral, strict=True):
        if whole:
            pieces.append(_prefix(key, "intValue").replace("%", "%%") + '"%d"}}')
        else:
            pieces.append(_prefix(key, "doubleValue").replace("%", "%%") + "%r}}")
    parent = f'"parentSpanId":"{block.parent_span_id:016x}",' if block.parent_span_id else ""
    head = f'{{"traceId":"{block.trace_id:032x}","spanId":"'
    template = (
        '%016x",'
        + parent.replace("%", "%%")
        + f'"name":{orjson.dumps(attr.SAMPLE_SPAN).decode()},"kind":{KIND_INTERNAL},'
        + '"startTimeUnixNano":"%d",'
        + f'"endTimeUnixNano":"{block.end_ns}","attributes":['
        + ",".join(pieces)
        + '],"status":{}}'
    )
    encoded = []
    expanded = None
    for position, (span_id, start, row) in enumerate(
        zip(block.span_ids, block.starts, block.rows, strict=True)
    ):
        total = sum(row)  # NaN or infinite if any entry is (or finite ones overflow:
        if total - total == 0.0:  # then the general path, which is right for those too)
            encoded.append(head + template % (span_id, start, *row))
        else:
            expanded = expanded or block.spans()
            encoded.append(encode_span(expanded[position]))
    return ",".join(encoded)


def _encode(item: SpanItem) -> str:
    return encode_block(item) if type(item) is SampleBlock else encode_span(item)


def encode_request(resource: Mapping[str, Any], spans: Sequence[SpanItem]) -> str:
    """One `ExportTraceServiceRequest` with one resource and rlotel's scope, as text."""
    shared = Shared()
    return (
        f'{{"resourceSpans":[{{"resource":{{"attributes":{key_values(resource)}}},'
        f'"scopeSpans":[{{"scope":{orjson.dumps(SCOPE).decode()},"schemaUrl":"{SCHEMA_URL}",'
        '"spans":['
        + ",".join(
            [
                encode_block(item) if type(item) is SampleBlock else encode_span(item, shared)
                for item in spans
            ]
        )
        + "]}]}]}"
    )


def traces_dir_file(directory: Path, role: str, rank: int | str) -> Path:
    """This process's file in a traces directory: `<role>-<rank>-<pid>.jsonl`."""
    parts = (re.sub(r"[^0-9A-Za-z._=+]+", "_", str(part)) for part in (role, rank, os.getpid()))
    return Path(directory) / f"{'-'.join(parts)}.jsonl"


class JsonLinesExporter:
    """Appends each exported batch to a file as one OTLP/JSON line, flushed at once."""

    def __init__(self, path: Path, resource: Mapping[str, Any]) -> None:
        self._path = path
        self._resource = dict(resource)
        self._file = path.open("a", encoding="utf-8")  # init surfaces an unwritable path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[SpanItem]) -> bool:
        line = encode_request(self._resource, spans) + "\n"
        with self._lock:
            if self._file.closed:
                return False
            self._file.write(line)
            self._file.flush()
        return True

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()
