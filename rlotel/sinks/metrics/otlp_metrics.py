"""Catalogue series pushed over OTLP when `OTEL_EXPORTER_OTLP_*` is configured.

The numbers come from the same store Prometheus scrapes (numpy histograms), converted to
OTLP explicit-bucket histograms with the catalogue's bounds, cumulative sums and gauges, so
an OTLP backend and Prometheus see the same series. Exported every
`OTEL_METRIC_EXPORT_INTERVAL` ms (default 60000), on `tel.flush()` and at shutdown.
"""

from __future__ import annotations

import threading
import time

from opentelemetry.sdk.metrics import Exemplar
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from rlotel.base.drops import Drops
from rlotel.publish.sink import Sink
from rlotel.schema import catalogue as cat
from rlotel.series.store import SeriesStore, Snapshot
from rlotel.sinks.traces import exporter_logs

# UCUM units, as OTel semantic conventions write them.
_UNITS = {"seconds": "s", "tokens": "{token}", "ratio": "1", "": "1"}


def otlp_metric_exporter(protocol: str) -> MetricExporter:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    return OTLPMetricExporter()


def to_metrics_data(
    snapshot: Snapshot, run: str, resource: Resource, start_ns: int, now_ns: int
) -> MetricsData:
    metrics: list[Metric] = []
    for spec in cat.CATALOGUE:
        unit = _UNITS.get(spec.unit, spec.unit)
        if spec.kind == "histogram":
            points = [
                HistogramDataPoint(
                    attributes=_attributes(spec, run, p.labels),
                    start_time_unix_nano=start_ns,
                    time_unix_nano=now_ns,
                    count=int(p.cumulative[-1]),
                    sum=p.sum,
                    bucket_counts=[int(c) for c in p.counts],
                    explicit_bounds=list(p.bounds),
                    min=p.min,
                    max=p.max,
                    exemplars=[_exemplar(e) for e in p.exemplars.values()],
                )
                for p in snapshot.histograms.get(spec, [])
            ]
            if points:
                data = Histogram(points, AggregationTemporality.CUMULATIVE)
                metrics.append(Metric(spec.name, spec.help, unit, data))
            continue
        values = snapshot.scalars.get(spec)
        if not values:
            continue
        points = [
            NumberDataPoint(_attributes(spec, run, labels), start_ns, now_ns, value)
            for labels, value in values.items()
        ]
        if spec.kind == "counter":
            data = Sum(points, AggregationTemporality.CUMULATIVE, is_monotonic=True)
        else:
            data = Gauge(points)
        metrics.append(Metric(spec.name, spec.help, unit, data))
    scope = ScopeMetrics(InstrumentationScope("rlotel"), metrics, "")
    return MetricsData([ResourceMetrics(resource, [scope], "")])


def _attributes(spec: cat.MetricSpec, run: str, labels: tuple[str, ...]) -> dict[str, str]:
    return dict(zip(spec.label_names, (run, *labels), strict=True))


def _exemplar(exemplar) -> Exemplar:
    return Exemplar(
        filtered_attributes={},
        value=exemplar.value,
        time_unix_nano=int((exemplar.timestamp or time.time()) * 1e9),
        span_id=int(exemplar.labels["span_id"], 16),
        trace_id=int(exemplar.labels["trace_id"], 16),
    )


class OtlpMetricsPusher(Sink):
    """Exports the store periodically from its own thread; failures are counted."""

    def __init__(
        self,
        exporter: MetricExporter,
        store: SeriesStore,
        run: str,
        resource: Resource,
        drops: Drops,
        interval_s: float,
    ) -> None:
        self._exporter = exporter
        self._store = store
        self._run = run
        self._resource = resource
        self._drops = drops
        self._interval_s = interval_s
        self._start_ns = time.time_ns()
        self._lock = threading.Lock()  # one export at a time
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rlotel-otlp-metrics", daemon=True)
        self._thread.start()

    def export(self, timeout_s: float) -> bool:
        data = to_metrics_data(
            self._store.snapshot(), self._run, self._resource, self._start_ns, time.time_ns()
        )
        with self._lock, exporter_logs.captured() as first_log:
            try:
                result = self._exporter.export(data, timeout_millis=timeout_s * 1000)
            except Exception as error:
                self._drops.add("metrics", "export_failed", f"OTLP metrics: {error!r}")
                return False
        if result is not MetricExportResult.SUCCESS:
            why = first_log() or "no reason given"
            self._drops.add("metrics", "export_failed", f"OTLP metrics: {why}")
            return False
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.export(min(self._interval_s, 10.0))

    def force_flush(self, deadline: float) -> bool:
        return self.export(max(0.1, deadline - time.monotonic()))

    def shutdown(self, deadline: float) -> None:
        self._stop.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        timeout_s = max(0.1, deadline - time.monotonic())
        self.export(timeout_s)
        self._exporter.shutdown(timeout_millis=timeout_s * 1000)
