"""The series store: every catalogue family's values, by label values, backend-neutral.

The recorder writes (on the publisher thread); exporters take consistent snapshots (a
scrape, an OTLP push, a replayed step) and never see a half-written step. Histograms count
buckets with numpy. Label sets per family are capped, the excess counted as drops; the
keys of `rlotel_train_metric` have two budgets of their own, training and validation keys.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from rlotel.base.drops import HOOK_FAILURES, Drops, encodable
from rlotel.base.hook_states import HOOK_EVENTS, HOOK_STATES
from rlotel.base.queue_moves import QUEUE_MOVES
from rlotel.schema import catalogue as cat
from rlotel.schema import vocabulary as voc


class Exemplar(NamedTuple):
    """A bucket's example observation: trace/span ids, its value and Unix time (s)."""

    labels: dict[str, str]
    value: float
    timestamp: float


Labels = tuple[str, ...]


class _Histogram:
    """Cumulative bucket counts (numpy), sum, min, max and each bucket's latest exemplar."""

    __slots__ = ("bound_list", "bounds", "count", "cumulative", "exemplars", "max", "min", "sum")

    SMALL = 16  # below this many values, per-value bisection beats numpy's call overhead

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bound_list = list(bounds)
        self.bounds = np.asarray(bounds, dtype=np.float64)
        self.cumulative = np.zeros(len(bounds), dtype=np.int64)  # observations <= bound
        self.count = 0
        self.sum = 0.0
        self.min = np.inf
        self.max = -np.inf
        self.exemplars: dict[int, Exemplar] = {}

    def observe(self, values: np.ndarray, exemplars: list[Exemplar]) -> None:
        if not values.size:
            return
        if values.size < self.SMALL:
            for value in values.tolist():
                self.cumulative[bisect_left(self.bound_list, value) :] += 1
        else:
            # One vectorised comparison per bound: ~7x faster than searchsorted + bincount
            # for the ~20 bounds a histogram has, and it gives Prometheus' `le` counts.
            self.cumulative += [np.count_nonzero(values <= bound) for bound in self.bounds]
        self.count += values.size
        self.sum += float(values.sum())
        self.min = min(self.min, float(values.min()))
        self.max = max(self.max, float(values.max()))
        for exemplar in sorted(exemplars, key=lambda e: e.value):  # slowest written last
            self.exemplars[bisect_left(self.bound_list, exemplar.value)] = exemplar

    def observe_counts(self, values: np.ndarray, counts: np.ndarray) -> None:
        """`counts[i]` observations of `values[i]` (ascending): a tally, no sample arrays."""
        if not values.size:
            return
        at_or_below = np.concatenate(([0], np.cumsum(counts)))
        self.cumulative += at_or_below[np.searchsorted(values, self.bounds, side="right")]
        self.count += int(at_or_below[-1])
        self.sum += float(np.dot(values, counts))
        self.min = min(self.min, float(values[0]))
        self.max = max(self.max, float(values[-1]))


class HistogramPoint(NamedTuple):
    labels: Labels
    bounds: tuple[float, ...]  # upper bounds, +Inf implied
    cumulative: np.ndarray  # observations <= each bound, then the total (+Inf)
    sum: float
    min: float
    max: float
    exemplars: dict[int, Exemplar]

    @property
    def counts(self) -> np.ndarray:
        """Per-bucket counts (OTLP's bucket_counts), the last one above every bound."""
        return np.diff(self.cumulative, prepend=0)


class Snapshot(NamedTuple):
    """A consistent copy of every series, for one scrape or one OTLP export."""

    scalars: dict[cat.MetricSpec, dict[Labels, float]]
    histograms: dict[cat.MetricSpec, list[HistogramPoint]]
    version: tuple[int, int, int]  # SeriesStore.version when it was taken


class SeriesStore:
    """Values of every catalogue family, by label values (without `run`).

    `buckets` replaces the catalogue's upper bounds of histograms by family name (validated
    by `Config`). `log_keys` = (training, validation) caps of `rlotel_train_metric`'s keys
    (default: `max_series` each)."""

    def __init__(
        self,
        run: str,
        drops: Drops,
        max_series: int,
        buckets: Mapping[str, tuple[float, ...]] | None = None,
        log_keys: tuple[int, int] | None = None,
    ) -> None:
        self.run = run
        self._bounds = {
            spec: tuple((buckets or {}).get(spec.name, spec.buckets))
            for spec in cat.CATALOGUE
            if spec.kind == "histogram"
        }
        self._drops = drops
        self._max_series = max_series
        train, validation = log_keys or (max_series, max_series)
        self._key_caps = {False: train, True: validation}  # by "is a validation key"
        self._key_counts = {False: 0, True: 0}
        self._lock = threading.Lock()
        self._scalars: dict[cat.MetricSpec, dict[Labels, float]] = {}
        self._histograms: dict[cat.MetricSpec, dict[Labels, _Histogram]] = {}
        self._writes = 0

    def bounds(self, spec: cat.MetricSpec) -> tuple[float, ...]:
        """A histogram family's upper bounds (the catalogue's, or as configured)."""
        return self._bounds[spec]

    @property
    def version(self) -> tuple[int, int, int]:
        """A cache key: changes whenever a series, a drop or a hook failure count may change."""
        return self._writes, self._drops.total, HOOK_FAILURES.total

    def _admit(self, spec: cat.MetricSpec, family: Mapping, labels: Labels) -> bool:
        if labels in family:
            return True
        if not all(encodable(label) for label in labels):
            self._drops.add("metrics", "bad_label", f"{spec.name}: a label is not valid UTF-8")
            return False
        if spec is cat.TRAIN_METRIC:
            return self._admit_key(labels[0])
        if len(family) < self._max_series:
            return True
        self._drops.add(
            "metrics", "label_cap", f"{spec.name}{list(labels)}: {self._max_series} series reached"
        )
        return False

    def _admit_key(self, key: str) -> bool:
        """A new `tel.log` key, in the training or the validation budget."""
        validation = voc.is_validation_key(key)
        cap = self._key_caps[validation]
        if self._key_counts[validation] < cap:
            self._key_counts[validation] += 1
            return True
        kind, reason = (
            ("validation", "val_log_key_cap") if validation else ("training", "log_key_cap")
        )
        self._drops.add(
            "metrics", reason, f"{cat.TRAIN_METRIC.name}[{key!r}]: {cap} {kind} keys reached"
        )
        return False

    def set(self, spec: cat.MetricSpec, value: float, *labels: str) -> None:
        with self._lock:
            self._writes += 1
            family = self._scalars.setdefault(spec, {})
            if self._admit(spec, family, labels):
                family[labels] = value

    def replace(self, spec: cat.MetricSpec, value: float, *labels: str) -> None:
        """The family's only series from now on (a state, like the current verdict)."""
        with self._lock:
            self._writes += 1
            self._scalars[spec] = {labels: value}

    def inc(self, spec: cat.MetricSpec, amount: float, *labels: str) -> None:
        with self._lock:
            self._writes += 1
            family = self._scalars.setdefault(spec, {})
            if self._admit(spec, family, labels):
                family[labels] = family.get(labels, 0.0) + amount

    def observe(
        self,
        spec: cat.MetricSpec,
        values: np.ndarray,
        *labels: str,
        exemplars: list[Exemplar] = (),  # type: ignore[assignment]
    ) -> None:
        with self._lock:
            histogram = self._histogram(spec, labels)
            if histogram is not None:
                histogram.observe(values, exemplars)

    def observe_counts(self, spec: cat.MetricSpec, values: np.ndarray, counts: np.ndarray) -> None:
        """A tally (ascending values, counts of each) into an unlabelled histogram."""
        with self._lock:
            histogram = self._histogram(spec, ())
            if histogram is not None:
                histogram.observe_counts(values, counts)

    def _histogram(self, spec: cat.MetricSpec, labels: Labels) -> _Histogram | None:
        """The series to write (created on first use), None past the label-set cap."""
        self._writes += 1
        family = self._histograms.setdefault(spec, {})
        if not self._admit(spec, family, labels):
            return None
        histogram = family.get(labels)
        if histogram is None:
            histogram = family[labels] = _Histogram(self._bounds[spec])
        return histogram

    def snapshot(self) -> Snapshot:
        with self._lock:
            version = self.version
            scalars = {spec: dict(family) for spec, family in self._scalars.items()}
            histograms = {
                spec: [
                    HistogramPoint(
                        labels,
                        self._bounds[spec],
                        np.append(h.cumulative, h.count),
                        h.sum,
                        h.min,
                        h.max,
                        dict(h.exemplars),
                    )
                    for labels, h in family.items()
                ]
                for spec, family in self._histograms.items()
            }
            drops = self._drops.snapshot()
            hooks, hook_seconds = HOOK_EVENTS.snapshot()
        for (signal, reason), count in drops.items():
            scalars.setdefault(cat.DROPPED, {})[(signal, reason)] = float(count)
        for hook, count in hooks.items():
            scalars.setdefault(cat.INTEGRATION_EVENTS, {})[(hook,)] = float(count)
        for hook, seconds in hook_seconds.items():
            scalars.setdefault(cat.INTEGRATION_SECONDS, {})[(hook,)] = seconds
        for hook, count in HOOK_FAILURES.snapshot().items():
            scalars.setdefault(cat.INTEGRATION_FAILURES, {})[(hook,)] = float(count)
        for hook, state in HOOK_STATES.snapshot().items():
            scalars.setdefault(cat.INTEGRATION_HOOKS, {})[(hook, state)] = 1.0
        for labels, totals in QUEUE_MOVES.snapshot().items():
            for spec, total in zip(
                (cat.QUEUE_SECONDS, cat.QUEUE_BYTES, cat.QUEUE_OPS), totals, strict=True
            ):
                scalars.setdefault(spec, {})[labels] = float(total)
        return Snapshot(scalars, histograms, version)
