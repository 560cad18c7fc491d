"""One exporter's thread: a bounded queue of span batches, drained in coalesced exports.

The publisher only appends a batch (one per trace). A slow or dead exporter fills its own
queue, which drops its oldest spans (counted), and never holds up the publisher or the
other exporters. Export failures are counted in `rlotel_telemetry_dropped_total`; the
exporters' own retry warnings are folded into rlotel's rate-limited drop line.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from rlotel.base.drops import Drops
from rlotel.sinks.traces import exporter_logs
from rlotel.sinks.traces.span_data import SpanItem

MAX_QUEUED_SPANS = 65536
MAX_EXPORT_BATCH = 2048


class SpanBatchExporter(Protocol):
    """Writes a batch of span data somewhere; returns False (or raises) on failure."""

    def export(self, spans: Sequence[SpanItem]) -> bool: ...

    def shutdown(self) -> None: ...


class ExportQueue:
    """`put` from the publisher; a daemon thread exports at most every `delay_s`."""

    def __init__(
        self, name: str, exporter: SpanBatchExporter, drops: Drops, delay_s: float = 1.0
    ) -> None:
        self.name = name
        self._exporter = exporter
        self._drops = drops
        self._delay_s = delay_s
        self._batches: deque[list[SpanItem]] = deque()
        self._queued = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._busy = False
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"rlotel-export-{name}", daemon=True)
        self._thread.start()

    def put(self, spans: list[SpanItem], count: int) -> None:
        """`count`: spans in the batch (a sample block holds many)."""
        if not spans:
            return
        with self._lock:
            self._batches.append((spans, count))
            self._queued += count
            while self._queued > MAX_QUEUED_SPANS and len(self._batches) > 1:
                _, dropped_count = self._batches.popleft()
                self._queued -= dropped_count
                self._drops.add(
                    "spans",
                    "queue_full",
                    f"{self.name}: {MAX_QUEUED_SPANS} spans waiting to export",
                    dropped_count,
                )
        if self._delay_s <= 0 or self._queued >= MAX_EXPORT_BATCH:
            self._wake.set()

    def _take(self) -> tuple[list[SpanItem], int]:
        with self._lock:
            spans: list[SpanItem] = []
            taken = 0
            while self._batches and taken < MAX_EXPORT_BATCH:
                batch, count = self._batches.popleft()
                spans.extend(batch)
                taken += count
            self._queued -= taken
            self._busy = bool(spans)
            return spans, taken

    def _run(self) -> None:
        while True:
            self._wake.wait(self._delay_s if self._delay_s > 0 else None)
            self._wake.clear()
            while True:
                spans, count = self._take()
                if not spans:
                    break
                self._export(spans, count)
                with self._lock:
                    self._busy = False
                    self._idle.notify_all()
            if self._stopping:
                return

    def _export(self, spans: list[SpanItem], count: int) -> None:
        with exporter_logs.captured() as first_log:
            try:
                done = self._exporter.export(spans)
            except Exception as error:
                self._drops.add("spans", "export_failed", f"{self.name}: {error!r}", count)
                return
        if not done:
            why = first_log() or "no reason given"
            self._drops.add("spans", "export_failed", f"{self.name}: {why}", count)

    def flush(self, deadline: float) -> bool:
        """Export everything queued so far; False if `deadline` (monotonic) passes first."""
        self._wake.set()
        with self._lock:
            while self._batches or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._wake.set()
                self._idle.wait(min(remaining, 0.05))
        return True

    def shutdown(self, deadline: float) -> None:
        self.flush(deadline)
        self._stopping = True
        self._wake.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        self._exporter.shutdown()
