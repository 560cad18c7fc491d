"""The OTLP exporters' own per-attempt warnings, folded into rlotel's counted drops.

A dead or refusing collector makes the OTLP exporters log every attempt and retry
("Transient error … retrying in 0.8s", "Failed to export span batch code: 503"): a line
every few seconds on the training job's stderr. While one of rlotel's export calls runs,
those records are captured on its thread instead, and the first (the cause; the last is a
generic "max retries") becomes the detail of rlotel's rate-limited drop line. Exporters
the application runs itself, on its own threads, keep their logging untouched.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
)


class _Capture(logging.Filter):
    """Holds back records logged on a thread inside `captured()`, remembering the first."""

    def __init__(self) -> None:
        super().__init__()
        self.local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(self.local, "active", False):
            return True
        if not self.local.first:
            self.local.first = record.getMessage()
        return False


_capture = _Capture()
for _name in EXPORTER_LOGGERS:  # inert outside `captured()`, so installed once, at import
    logging.getLogger(_name).addFilter(_capture)


@contextlib.contextmanager
def captured() -> Iterator[Callable[[], str]]:
    """Within: exporter records on this thread are held back; the callable returns the
    first one's message ("" if none was logged)."""
    _capture.local.active, _capture.local.first = True, ""
    try:
        yield lambda: _capture.local.first
    finally:
        _capture.local.active = False
