"""The series store as a prometheus_client collector: one snapshot per scrape, rendered by
the library's own encoders (text, OpenMetrics with exemplars, every name escaping)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar

from rlotel.schema import catalogue as cat
from rlotel.series.store import HistogramPoint, SeriesStore


def family(spec: cat.MetricSpec) -> Metric:
    """The library's family for a catalogue spec, still without samples; its naming rules
    (unit suffix, counters' `_total`) give the series names the dashboards query."""
    if spec.kind == "histogram":
        return HistogramMetricFamily(spec.name, spec.help, labels=spec.label_names)
    kind = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
    return kind(spec.name, spec.help, labels=spec.label_names, unit=spec.unit)


def bucket_labels(bounds: Iterable[float]) -> list[str]:
    """The `le` label values of a histogram's upper bounds, `+Inf` last."""
    return [*(repr(float(bound)) for bound in bounds), "+Inf"]


def buckets(point: HistogramPoint) -> list[tuple]:
    """(`le`, cumulative count, exemplar or None) per bucket, `+Inf` last."""
    exemplars = {index: Exemplar(*exemplar) for index, exemplar in point.exemplars.items()}
    counts = zip(bucket_labels(point.bounds), point.cumulative.tolist(), strict=True)
    return [(le, float(count), exemplars.get(index)) for index, (le, count) in enumerate(counts)]


class StoreCollector(Collector):
    """Every catalogue family the store holds, each series with the store's `run` label."""

    def __init__(self, store: SeriesStore) -> None:
        self._store = store

    def describe(self) -> Iterator[Metric]:
        """Every family the store can expose, so `/metrics?name[]=…` filters find them."""
        return (family(spec) for spec in cat.CATALOGUE)

    def collect(self) -> Iterator[Metric]:
        snapshot = self._store.snapshot()
        run = self._store.run
        for spec in cat.CATALOGUE:
            out = family(spec)
            if spec.kind == "histogram":
                if spec not in snapshot.histograms:
                    continue
                for point in snapshot.histograms[spec]:
                    out.add_metric([run, *point.labels], buckets(point), point.sum)
            else:
                if spec not in snapshot.scalars:
                    continue
                for labels, value in snapshot.scalars[spec].items():
                    out.add_metric([run, *labels], value)
            yield out


def registry(store: SeriesStore) -> CollectorRegistry:
    """A private registry holding only the store (never the process-global one)."""
    private = CollectorRegistry(auto_describe=False)
    private.register(StoreCollector(store))
    return private
