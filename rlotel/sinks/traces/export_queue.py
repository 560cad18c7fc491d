"""One exporter's queue and thread (a `Worker`): span batches drained in coalesced exports.

The publisher only appends a batch (one per trace). A slow or dead exporter fills its own
queue, which drops its oldest spans (counted), and never holds up the publisher or the
other exporters. Export failures are counted in `rlotel_telemetry_dropped_total`; the
exporters' own retry warnings are folded into rlotel's rate-limited drop line.
"""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from rlotel.base.drops import Drops
from rlotel.publish.publisher import Worker
from rlotel.sinks.traces import exporter_logs
from rlotel.sinks.traces.otlp import HashedResource, readable_spans
from rlotel.sinks.traces.span_data import SpanItem

MAX_QUEUED_SPANS = 65536
MAX_EXPORT_BATCH = 2048


class ExportQueue:
    """One OTel `SpanExporter` behind its own `Worker`: `put` from the publisher; the
    worker's thread makes `ReadableSpan`s of `resource` and exports coalesced batches at
    most every `delay_s`."""

    def __init__(
        self,
        name: str,
        exporter: SpanExporter,
        resource: Resource,
        drops: Drops,
        delay_s: float = 1.0,
    ) -> None:
        self.name = name
        self._exporter = exporter
        self._resource = HashedResource(resource)
        self._drops = drops
        self._worker = Worker(
            f"export-{name}",
            self._export,
            drops,
            MAX_QUEUED_SPANS,
            batch=MAX_EXPORT_BATCH,
            delay_s=delay_s,
        )

    def put(self, spans: list[SpanItem], count: int) -> None:
        """`count`: spans in the batch (a sample block holds many)."""
        if spans:
            self._worker.put((spans, count), count)

    def _export(self, batches: list[tuple[list[SpanItem], int]]) -> None:
        spans = [span for batch, _ in batches for span in batch]
        count = sum(count for _, count in batches)
        with exporter_logs.captured() as first_log:
            try:
                result = self._exporter.export(readable_spans(spans, self._resource))
            except Exception as error:
                self._drops.add("spans", "export_failed", f"{self.name}: {error!r}", count)
                return
        if result is not SpanExportResult.SUCCESS:
            why = first_log() or "no reason given"
            self._drops.add("spans", "export_failed", f"{self.name}: {why}", count)

    def flush(self, deadline: float) -> bool:
        """Export everything queued so far; False if `deadline` (monotonic) passes first."""
        return self._worker.flush(deadline)

    def shutdown(self, deadline: float) -> None:
        self._worker.flush(deadline)
        self._worker.stop(deadline)
        self._exporter.shutdown()
