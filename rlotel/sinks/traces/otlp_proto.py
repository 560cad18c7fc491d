"""Span data → an OTLP `ExportTraceServiceRequest` in protobuf wire format, in one pass.

No `ReadableSpan` and no message object per span: building one `Span` message with its
`KeyValue`s through the generated classes costs ~24 µs here, as much as the SDK encoder.
The bytes are what those classes serialize (a test parses them with opentelemetry-proto
and compares field by field with the SDK's encoding of the same spans): every field
number and wire type is read from the generated descriptors, pieces that repeat (an
attribute pair, a key's prefix, a name) are encoded once, and a batch's sample spans
share one template, so a sample span is a few byte joins.

What the SDK path writes, this writes: one resource, scope `rlotel` with the GenAI schema
URL, kind INTERNAL, status (empty unless ERROR, with the exception as an event), span
flags "has is-remote" (+ "is remote" under a remote parent; links: local), trace state
empty, dropped counts 0 (rlotel drops no attribute, event or link).
"""

from __future__ import annotations

import numbers
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf.descriptor import FieldDescriptor
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
    KeyValueList,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import (
    ResourceSpans,
    ScopeSpans,
    Span,
    SpanFlags,
    Status,
)

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

SCHEMA_URL = attr.GENAI_SCHEMA_URL
MAX_CACHED = 65536  # encoded pieces kept (attribute pairs, key prefixes, names)

_WIRE_TYPES = {
    FieldDescriptor.TYPE_DOUBLE: 1,
    FieldDescriptor.TYPE_FIXED64: 1,
    FieldDescriptor.TYPE_SFIXED64: 1,
    FieldDescriptor.TYPE_FIXED32: 5,
    FieldDescriptor.TYPE_SFIXED32: 5,
    FieldDescriptor.TYPE_FLOAT: 5,
    FieldDescriptor.TYPE_STRING: 2,
    FieldDescriptor.TYPE_BYTES: 2,
    FieldDescriptor.TYPE_MESSAGE: 2,
}  # the rest (ints, bools, enums) are varints: wire type 0
_BYTE = [bytes((value,)) for value in range(256)]
_fixed64 = struct.Struct("<Q").pack
_fixed32 = struct.Struct("<I").pack
_double = struct.Struct("<d").pack
_two_bytes = struct.Struct("<H").pack
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def varint(value: int) -> bytes:
    """Protobuf base-128 varint; negative int64 values as their 64-bit two's complement."""
    if 0 <= value < 0x80:
        return _BYTE[value]
    if 0 < value < 0x4000:  # token counts, sample indices: two bytes, one C call
        return _two_bytes(value & 0x7F | 0x80 | (value >> 7) << 8)
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(message: Any, field: str) -> bytes:
    """The key of `message.field` on the wire, from the generated descriptor."""
    descriptor = message.DESCRIPTOR.fields_by_name[field]
    return varint(descriptor.number << 3 | _WIRE_TYPES.get(descriptor.type, 0))


def _len_field(tag: bytes, payload: bytes) -> bytes:
    return tag + varint(len(payload)) + payload


# Every key the encoder writes, by message.field.
_ANY_STRING = _tag(AnyValue, "string_value")
_ANY_BOOL = _tag(AnyValue, "bool_value")
_ANY_INT = _tag(AnyValue, "int_value")
_ANY_DOUBLE = _tag(AnyValue, "double_value")
_ANY_ARRAY = _tag(AnyValue, "array_value")
_ANY_KVLIST = _tag(AnyValue, "kvlist_value")
_ANY_BYTES = _tag(AnyValue, "bytes_value")
_ARRAY_VALUES = _tag(ArrayValue, "values")
_KVLIST_VALUES = _tag(KeyValueList, "values")
_KV_KEY = _tag(KeyValue, "key")
_KV_VALUE = _tag(KeyValue, "value")
_SPAN_TRACE_ID = _tag(Span, "trace_id")
_SPAN_SPAN_ID = _tag(Span, "span_id")
_SPAN_PARENT = _tag(Span, "parent_span_id")
_SPAN_NAME = _tag(Span, "name")
_SPAN_KIND = _tag(Span, "kind")
_SPAN_START = _tag(Span, "start_time_unix_nano")
_SPAN_END = _tag(Span, "end_time_unix_nano")
_SPAN_ATTRIBUTE = _tag(Span, "attributes")
_SPAN_EVENT = _tag(Span, "events")
_SPAN_LINK = _tag(Span, "links")
_SPAN_STATUS = _tag(Span, "status")
_SPAN_FLAGS = _tag(Span, "flags")
_EVENT_TIME = _tag(Span.Event, "time_unix_nano")
_EVENT_NAME = _tag(Span.Event, "name")
_EVENT_ATTRIBUTE = _tag(Span.Event, "attributes")
_LINK_TRACE_ID = _tag(Span.Link, "trace_id")
_LINK_SPAN_ID = _tag(Span.Link, "span_id")
_LINK_ATTRIBUTE = _tag(Span.Link, "attributes")
_LINK_FLAGS = _tag(Span.Link, "flags")
_STATUS_MESSAGE = _tag(Status, "message")
_STATUS_CODE = _tag(Status, "code")
_SCOPE_NAME = _tag(InstrumentationScope, "name")
_RESOURCE_ATTRIBUTE = _tag(Resource, "attributes")
_SCOPE_SPANS_SCOPE = _tag(ScopeSpans, "scope")
_SCOPE_SPANS_SPAN = _tag(ScopeSpans, "spans")
_SCOPE_SPANS_SCHEMA = _tag(ScopeSpans, "schema_url")
_RESOURCE_SPANS_RESOURCE = _tag(ResourceSpans, "resource")
_RESOURCE_SPANS_SCOPE_SPANS = _tag(ResourceSpans, "scope_spans")
_REQUEST_RESOURCE_SPANS = _tag(ExportTraceServiceRequest, "resource_spans")

_KIND_INTERNAL = _SPAN_KIND + varint(Span.SpanKind.SPAN_KIND_INTERNAL)
_STATUS_UNSET = _len_field(_SPAN_STATUS, b"")  # the SDK always writes a status
_STATUS_ERROR = Status.StatusCode.STATUS_CODE_ERROR
_HAS_IS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_FLAGS_LOCAL = _SPAN_FLAGS + _fixed32(_HAS_IS_REMOTE)
_FLAGS_REMOTE = _SPAN_FLAGS + _fixed32(_HAS_IS_REMOTE | _IS_REMOTE)
_LINK_FLAGS_LOCAL = _LINK_FLAGS + _fixed32(_HAS_IS_REMOTE)
_SPAN_ID_PREFIX = _SPAN_SPAN_ID + varint(8)
_DOUBLE_VALUE = _KV_VALUE + varint(9) + _ANY_DOUBLE  # an AnyValue holding a double: 9 bytes


def _text(value: str) -> bytes:
    return value.encode("utf-8", "replace")  # lone surrogates would void the whole request


def any_value(value: Any) -> bytes | None:
    """The payload of an `AnyValue`, or None for a value the SDK's encoder refuses (its
    attribute is left out, as there). numpy and other number types count as their kind."""
    kind = type(value)
    if kind is str:
        return _len_field(_ANY_STRING, _text(value))
    if kind is bool:
        return _ANY_BOOL + (b"\x01" if value else b"\x00")
    if kind is int:
        return _ANY_INT + varint(value) if _INT64_MIN <= value <= _INT64_MAX else None
    if kind is float:
        return _ANY_DOUBLE + _double(value)
    if value is None:
        return b""
    if kind is bytes:
        return _len_field(_ANY_BYTES, value)
    if isinstance(value, (list, tuple)):
        items = []
        for item in value:
            encoded = any_value(item)
            if encoded is None:
                return None  # as the SDK: one bad element loses the attribute
            items.append(_len_field(_ARRAY_VALUES, encoded))
        return _len_field(_ANY_ARRAY, b"".join(items))
    if isinstance(value, Mapping):
        pairs = [key_value(_KVLIST_VALUES, str(k), v) for k, v in value.items()]
        if None in pairs:
            return None
        return _len_field(_ANY_KVLIST, b"".join(pairs))  # type: ignore[arg-type]
    if isinstance(value, numbers.Integral):
        return any_value(int(value))
    if isinstance(value, numbers.Real):
        return any_value(float(value))
    return _len_field(_ANY_STRING, _text(str(value)))


def key_value(tag: bytes, key: str, value: Any) -> bytes | None:
    """One attribute as a field `tag` (a Span's, an Event's, a Resource's ...) holding a
    `KeyValue`; None when the value cannot be encoded."""
    encoded = any_value(value)
    if encoded is None:
        return None
    return _len_field(tag, _len_field(_KV_KEY, _text(key)) + _len_field(_KV_VALUE, encoded))


_pairs: dict[tuple[bytes, str, Any], bytes | None] = {}  # (tag, key, str/bool value) → field
_key_fields: dict[str, bytes] = {}  # key → its KeyValue.key field
_names: dict[str, bytes] = {}  # span name → its Span.name field


def _key_field(key: str) -> bytes:
    field = _key_fields.get(key)
    if field is None:
        if len(_key_fields) >= MAX_CACHED:
            _key_fields.clear()
        field = _key_fields[key] = _len_field(_KV_KEY, _text(key))
    return field


def _attribute(tag: bytes, key: str, value: Any) -> bytes | None:
    """`key_value` with the pieces that repeat cached: a string or bool pair whole, a
    number's key field."""
    kind = type(value)
    if kind is float:
        key_field = _key_field(key)
        return tag + varint(len(key_field) + 11) + key_field + _DOUBLE_VALUE + _double(value)
    if kind is int and _INT64_MIN <= value <= _INT64_MAX:
        key_field = _key_field(key)
        number = varint(value)
        size = len(number) + 1
        return (
            tag
            + varint(len(key_field) + size + 2)
            + key_field
            + _KV_VALUE
            + _BYTE[size]
            + _ANY_INT
            + number
        )
    if kind is str or kind is bool:
        cache_key = (tag, key, value)
        field = _pairs.get(cache_key)
        if field is None:
            if len(_pairs) >= MAX_CACHED:
                _pairs.clear()
            field = _pairs[cache_key] = key_value(tag, key, value)
        return field
    return key_value(tag, key, value)


def attributes_bytes(tag: bytes, attributes: Mapping[str, Any]) -> bytes:
    fields = [_attribute(tag, key, value) for key, value in attributes.items()]
    return b"".join([field for field in fields if field is not None])


def _name_field(name: str) -> bytes:
    field = _names.get(name)
    if field is None:
        if len(_names) >= MAX_CACHED:
            _names.clear()
        field = _names[name] = _len_field(_SPAN_NAME, _text(name)) if name else b""
    return field


def _event(name: str, time_ns: int, attributes: Mapping[str, Any]) -> bytes:
    payload = (
        (_EVENT_TIME + _fixed64(time_ns) if time_ns else b"")
        + (_len_field(_EVENT_NAME, _text(name)) if name else b"")
        + attributes_bytes(_EVENT_ATTRIBUTE, attributes)
    )
    return _len_field(_SPAN_EVENT, payload)


def encode_span(span: SpanData, shared: dict[int, bytes] | None = None) -> bytes:
    """One `ScopeSpans.spans` field: the span as the SDK's encoder writes it. `shared`:
    encoded attributes by the id of their dict, for one request whose spans are all alive
    (the phases of a name share one dict: it is encoded once)."""
    parts = [
        _SPAN_TRACE_ID + b"\x10" + span.trace_id.to_bytes(16, "big"),
        _SPAN_ID_PREFIX + span.span_id.to_bytes(8, "big"),
    ]
    if span.parent_span_id:
        parts.append(_SPAN_PARENT + b"\x08" + span.parent_span_id.to_bytes(8, "big"))
    parts += (
        _name_field(span.name),
        _KIND_INTERNAL,
        _SPAN_START + _fixed64(span.start_ns),
        _SPAN_END + _fixed64(span.end_ns),
    )
    attributes = span.attributes
    if shared is None:
        parts.append(attributes_bytes(_SPAN_ATTRIBUTE, attributes))
    else:
        encoded = shared.get(id(attributes))
        if encoded is None:
            encoded = shared[id(attributes)] = attributes_bytes(_SPAN_ATTRIBUTE, attributes)
        parts.append(encoded)
    error = span.error
    for event in span.events:
        parts.append(_event(event.name, event.time_ns, event.attributes))
    if error is not None:
        parts.append(_event(EXCEPTION_EVENT, span.end_ns, exception_attributes(error)))
    for link in span.links:
        link_payload = (
            _LINK_TRACE_ID
            + b"\x10"
            + link.trace_id.to_bytes(16, "big")
            + _LINK_SPAN_ID
            + b"\x08"
            + link.span_id.to_bytes(8, "big")
            + attributes_bytes(_LINK_ATTRIBUTE, link.attributes)
            + _LINK_FLAGS_LOCAL
        )
        parts.append(_len_field(_SPAN_LINK, link_payload))
    if error is None:
        parts.append(_STATUS_UNSET)
    else:
        message = _len_field(_STATUS_MESSAGE, _text(status_message(error)))
        parts.append(_len_field(_SPAN_STATUS, message + _STATUS_CODE + varint(_STATUS_ERROR)))
    parts.append(_FLAGS_REMOTE if span.remote_parent and span.parent_span_id else _FLAGS_LOCAL)
    body = b"".join(parts)
    return _SCOPE_SPANS_SPAN + varint(len(body)) + body


def _column_prefixes(key: str, whole: bool) -> tuple[bytes, ...] | bytes:
    """What precedes a column's value in each sample's attribute field: for a double one
    constant prefix; for an integer one per varint length (1–10 bytes)."""
    key_field = _key_field(key)
    if not whole:
        return _SPAN_ATTRIBUTE + varint(len(key_field) + 11) + key_field + _DOUBLE_VALUE
    return tuple(
        b""
        if size == 0
        else _SPAN_ATTRIBUTE
        + varint(len(key_field) + size + 3)
        + key_field
        + _KV_VALUE
        + _BYTE[size + 1]
        + _ANY_INT
        for size in range(11)
    )


def encode_block(block: SampleBlock) -> list[bytes]:
    """A batch's sample spans, one `spans` field each, from one template: per sample its
    span id, start time and column values; an invalid (NaN) entry has no attribute."""
    head = _SPAN_TRACE_ID + b"\x10" + block.trace_id.to_bytes(16, "big") + _SPAN_ID_PREFIX
    middle = b""
    if block.parent_span_id:
        middle = _SPAN_PARENT + b"\x08" + block.parent_span_id.to_bytes(8, "big")
    middle += _name_field(attr.SAMPLE_SPAN) + _KIND_INTERNAL + _SPAN_START
    after_start = (
        _SPAN_END + _fixed64(block.end_ns) + attributes_bytes(_SPAN_ATTRIBUTE, block.common)
    )
    tail = _STATUS_UNSET + (
        _FLAGS_REMOTE if block.remote_parent and block.parent_span_id else _FLAGS_LOCAL
    )
    columns = [
        (whole, _column_prefixes(key, whole), key)
        for key, whole in zip(block.keys, block.integral, strict=True)
    ]
    if block.arrays is not None:
        encoded = _block_from_arrays(block, head, middle, after_start, tail, columns)
        if encoded is not None:
            return encoded
    spans_tag, double, small, two = _SCOPE_SPANS_SPAN, _double, _BYTE, _two_bytes
    encoded = []
    for span_id, start, row in zip(block.span_ids, block.starts, block.rows, strict=True):
        parts = [head, span_id.to_bytes(8, "big"), middle, _fixed64(start), after_start]
        for (whole, prefix, key), value in zip(columns, row, strict=True):
            if value != value:  # NaN: invalid, no attribute
                continue
            if whole:
                value = int(value)
                if 0 <= value < 0x80:
                    parts.append(prefix[1] + small[value])  # type: ignore[index]
                elif 0 < value < 0x4000:
                    parts.append(prefix[2] + two(value & 0x7F | 0x80 | (value >> 7) << 8))  # type: ignore[index]
                elif _INT64_MIN <= value <= _INT64_MAX:
                    number = varint(value)
                    parts.append(prefix[len(number)] + number)  # type: ignore[index]
            elif type(value) is float:
                parts.append(prefix + double(value))  # type: ignore[operator]
            else:  # a column of another kind (ints not known to be whole)
                field = _attribute(_SPAN_ATTRIBUTE, key, value)
                if field is not None:
                    parts.append(field)
        parts.append(tail)
        body = b"".join(parts)
        encoded.append(spans_tag + varint(len(body)) + body)
    return encoded


_INT_LIMIT = float(1 << 63)


def _array_columns(block: SampleBlock) -> list[tuple[bool, np.ndarray, np.ndarray]] | None:
    """Per column (as int, present, values: int64 or float64), the row path's rules as
    array operations; None when a cell needs that path (±inf or a negative number in an
    integer column, a value beyond int64, another dtype)."""
    result = []
    for array, whole in zip(block.arrays, block.integral, strict=True):  # type: ignore[arg-type]
        array = np.asarray(array)
        kind = array.dtype.kind
        if kind == "f":
            present = ~np.isnan(array)
            if not whole:
                result.append((False, present, array.astype(np.float64, copy=False)))
                continue
            if not np.isfinite(array[present]).all():
                return None
            values = np.trunc(np.where(present, array, 0.0))  # `int(value)`
            if (values < 0).any() or (values >= _INT_LIMIT).any():
                return None
            result.append((True, present, values.astype(np.int64)))
        elif kind in "iu":  # `tolist` gives ints: int values, whole or not
            if array.size and (array.min() < 0 or array.max() >= 1 << 63):
                return None
            result.append((True, np.ones(array.shape, dtype=bool), array.astype(np.int64)))
        else:
            return None
    return result


def _varint_lengths(values: np.ndarray) -> np.ndarray:
    """Bytes in each non-negative int64's varint (1–9)."""
    lengths = np.ones(values.shape, dtype=np.int64)
    for bits in range(7, 63, 7):
        lengths += values >= (1 << bits)
    return lengths


class _Layout:
    """One fixed record: constant bytes and per-row fields, in order."""

    def __init__(self) -> None:
        self.constant = bytearray()
        self._pieces: list[tuple[Any, Any]] = []  # (numpy format, value for every row)

    def _close_constant(self) -> None:
        if self.constant:
            self._pieces.append((f"S{len(self.constant)}", bytes(self.constant)))
            self.constant = bytearray()

    def field(self, kind: Any, value: Any) -> None:
        self._close_constant()
        self._pieces.append((kind, value))

    def records(self, count: int) -> np.ndarray:
        self._close_constant()
        names = [f"f{index}" for index in range(len(self._pieces))]
        formats = [kind for kind, _ in self._pieces]
        records = np.empty(count, dtype=np.dtype({"names": names, "formats": formats}))
        for name, (_, value) in zip(names, self._pieces, strict=True):
            records[name] = value
        return records


def _block_from_arrays(
    block: SampleBlock,
    head: bytes,
    middle: bytes,
    after_start: bytes,
    tail: bytes,
    columns: list[tuple[bool, Any, str]],
) -> list[bytes] | None:
    """`encode_block`'s bytes, made by numpy a group at a time: samples whose cells have
    the same varint lengths and invalid entries share one fixed record layout (constant
    pieces, span id, start time, doubles, varint bytes), filled column-wise and written
    in one `tobytes`. None when a cell needs the row path."""
    count = block.count
    arrays = _array_columns(block)
    if arrays is None or not count:
        return None
    span_ids = np.array(block.span_ids, dtype=np.uint64).astype(">u8")
    starts = np.array(block.starts, dtype=np.int64)
    if (starts < 0).any():
        return None
    starts = starts.astype("<u8")
    shape = np.zeros((count, len(arrays)), dtype=np.int64)  # per cell: 0 absent, else bytes
    for index, (as_int, present, values) in enumerate(arrays):
        sizes = _varint_lengths(values) if as_int else np.full(count, 8)
        shape[:, index] = np.where(present, sizes, 0)
    prefixes = [  # an int column not known to be whole takes the int prefixes too
        _column_prefixes(key, True) if as_int and not whole else prefix
        for (as_int, _, _), (whole, prefix, key) in zip(arrays, columns, strict=True)
    ]
    if len(arrays) <= 15:  # each cell's 0–10 in four bits: one int per sample to group by
        codes = (shape << (4 * np.arange(len(arrays), dtype=np.int64))).sum(axis=1)
        _, first, group_of = np.unique(codes, return_index=True, return_inverse=True)
        shapes = shape[first]
    else:
        shapes, group_of = np.unique(shape, axis=0, return_inverse=True)
    group_of = group_of.reshape(-1)
    fixed = len(head) + 8 + len(middle) + 8 + len(after_start) + len(tail)
    blobs = []
    for group, sizes in enumerate(shapes.tolist()):
        rows = np.flatnonzero(group_of == group)
        body = fixed
        for (as_int, _, _), size, prefix in zip(arrays, sizes, prefixes, strict=True):
            if size:
                body += size + len(prefix[size] if as_int else prefix)
        layout = _Layout()
        layout.constant += _SCOPE_SPANS_SPAN + varint(body) + head
        layout.field(">u8", span_ids[rows])
        layout.constant += middle
        layout.field("<u8", starts[rows])
        layout.constant += after_start
        for (as_int, _, values), size, prefix in zip(arrays, sizes, prefixes, strict=True):
            if not size:
                continue
            if not as_int:
                layout.constant += prefix
                layout.field("<f8", values[rows])
                continue
            layout.constant += prefix[size]
            cells = values[rows]
            varints = np.empty((rows.size, size), dtype=np.uint8)
            for position in range(size):
                byte = (cells >> (7 * position)) & 0x7F
                varints[:, position] = byte | 0x80 if position < size - 1 else byte
            layout.field(("u1", (size,)), varints)
        layout.constant += tail
        records = layout.records(rows.size)
        blobs.append((rows, records.itemsize, records.tobytes()))
    if len(blobs) == 1:
        return [blobs[0][2]]
    encoded: list[bytes] = [b""] * count
    for rows, size, blob in blobs:  # back in the samples' order
        for position, row in enumerate(rows.tolist()):
            encoded[row] = blob[position * size : (position + 1) * size]
    return encoded


class RequestEncoder:
    """Batches of span data of one resource → serialized `ExportTraceServiceRequest`s."""

    def __init__(self, resource: Mapping[str, Any]) -> None:
        resource_payload = attributes_bytes(_RESOURCE_ATTRIBUTE, resource)
        self._resource = _len_field(_RESOURCE_SPANS_RESOURCE, resource_payload)
        scope = _len_field(_SCOPE_NAME, _text(SCOPE_NAME))
        self._scope = _len_field(_SCOPE_SPANS_SCOPE, scope)
        self._schema = _len_field(_SCOPE_SPANS_SCHEMA, _text(SCHEMA_URL))

    def spans(self, items: Sequence[SpanItem]) -> list[bytes]:
        fields: list[bytes] = []
        shared: dict[int, bytes] = {}
        for item in items:
            if type(item) is SampleBlock:
                fields += encode_block(item)
            else:
                fields.append(encode_span(item, shared))  # type: ignore[arg-type]
        return fields

    def request(self, items: Sequence[SpanItem]) -> bytes:
        scope_spans = self._scope + b"".join(self.spans(items)) + self._schema
        resource_spans = self._resource + _len_field(_RESOURCE_SPANS_SCOPE_SPANS, scope_spans)
        return _len_field(_REQUEST_RESOURCE_SPANS, resource_spans)
