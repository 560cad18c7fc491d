"""Finished spans as plain data: what the span builder makes and every exporter reads.

Backend-neutral and cheap to build on the publisher thread: each exporter's own thread
turns it into the SDK's `ReadableSpan`s (`otlp`), which the OTLP exporters send and the
traces file writes.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from rlotel.schema import attributes as attr

SCOPE_NAME = "rlotel"  # the instrumentation scope of every span rlotel exports
EXCEPTION_EVENT = "exception"  # the OTel event an error adds (semantic conventions)


class LinkData(NamedTuple):
    trace_id: int
    span_id: int
    attributes: dict[str, Any]


class EventData(NamedTuple):
    """A span event (the reward's `gen_ai.evaluation.result`); time in Unix ns."""

    name: str
    time_ns: int
    attributes: dict[str, Any]


class SpanData(NamedTuple):
    """One finished span, backend-neutral; times are Unix nanoseconds."""

    trace_id: int
    span_id: int
    parent_span_id: int  # 0 for a root
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: Sequence[LinkData] = ()
    error: BaseException | None = None
    remote_parent: bool = False
    events: Sequence[EventData] = ()  # besides the exception event of an error


def exception_attributes(error: BaseException) -> dict[str, Any]:
    """The OTel `exception` event's attributes (semantic conventions)."""
    return {
        "exception.type": type(error).__name__,
        "exception.message": str(error),
        "exception.stacktrace": "".join(
            traceback.format_exception(type(error), error, error.__traceback__)
        ),
        "exception.escaped": "True",
    }


def status_message(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class SampleBlock(NamedTuple):
    """The sample spans of one batch as columns: the publisher builds one block, not a
    `SpanData` per sample; exporters expand it (`spans`) on their own threads."""

    trace_id: int
    parent_span_id: int
    remote_parent: bool
    end_ns: int
    starts: list[int]
    span_ids: list[int]
    common: dict[str, Any]
    keys: tuple[str, ...]  # attribute per column (the sample index first)
    integral: tuple[bool, ...]
    rows: list[tuple]  # per sample: its value in each column, NaN where invalid

    @property
    def count(self) -> int:
        return len(self.span_ids)

    def rows_as_attributes(self) -> Iterator[tuple[int, int, dict[str, Any]]]:
        """Per sample: its span id, start and span attributes."""
        for span_id, start, row in zip(self.span_ids, self.starts, self.rows, strict=True):
            attributes = dict(self.common)
            for key, whole, value in zip(self.keys, self.integral, row, strict=True):
                if value == value:  # not NaN: an invalid entry has no attribute
                    attributes[key] = int(value) if whole else value
            yield span_id, start, attributes

    def spans(self) -> list[SpanData]:
        return [
            SpanData(
                self.trace_id,
                span_id,
                self.parent_span_id,
                attr.SAMPLE_SPAN,
                start,
                self.end_ns,
                attributes,
                remote_parent=self.remote_parent,
            )
            for span_id, start, attributes in self.rows_as_attributes()
        ]


SpanItem = SpanData | SampleBlock  # what an exporter receives in a batch


def span_count(items: Sequence[SpanItem]) -> int:
    return sum(item.count if type(item) is SampleBlock else 1 for item in items)
