"""Prometheus series for closed steps and logged dicts, served on `/metrics`.

A custom collector over plain arrays: the publisher thread writes, scrapes read a snapshot,
the training thread never touches either. Histograms count buckets with numpy. Every
series carries `run`; label sets per family are capped, excess counted as drops.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar

from rlotel import catalogue as cat
from rlotel.drops import Drops, as_finite_float, describe, encodable
from rlotel.formulas import VERL_STEP_STAGES
from rlotel.ledger import Step
from rlotel.samples import DURATION_FIELDS, LENGTH_KINDS, PREEMPTED, SampleBatch
from rlotel.sinks import endpoint, exposition

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
    version: tuple[int, int]  # SeriesStore.version when it was taken


class SeriesStore(Collector):
    """Values of every catalogue family, by label values (without `run`).

    `buckets` replaces the catalogue's upper bounds of histograms by family name (validated
    by `Config`)."""

    def __init__(
        self,
        run: str,
        drops: Drops,
        max_series: int,
        buckets: Mapping[str, tuple[float, ...]] | None = None,
    ) -> None:
        self.run = run
        self._bounds = {
            spec: tuple((buckets or {}).get(spec.name, spec.buckets))
            for spec in cat.CATALOGUE
            if spec.kind == "histogram"
        }
        self._drops = drops
        self._max_series = max_series
        self._lock = threading.Lock()
        self._scalars: dict[cat.MetricSpec, dict[Labels, float]] = {}
        self._histograms: dict[cat.MetricSpec, dict[Labels, _Histogram]] = {}
        self._writes = 0

    @property
    def version(self) -> tuple[int, int]:
        """Changes whenever a series or a drop count may have changed (cache key)."""
        return self._writes, self._drops.total

    def _admit(self, spec: cat.MetricSpec, family: Mapping, labels: Labels) -> bool:
        if labels in family:
            return True
        if not all(encodable(label) for label in labels):
            self._drops.add("metrics", "bad_label", f"{spec.name}: a label is not valid UTF-8")
            return False
        if len(family) < self._max_series:
            return True
        self._drops.add(
            "metrics", "label_cap", f"{spec.name}{list(labels)}: {self._max_series} series reached"
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
            self._writes += 1
            family = self._histograms.setdefault(spec, {})
            if not self._admit(spec, family, labels):
                return
            histogram = family.get(labels)
            if histogram is None:
                histogram = family[labels] = _Histogram(self._bounds[spec])
            histogram.observe(values, exemplars)

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
        for (signal, reason), count in drops.items():
            scalars.setdefault(cat.DROPPED, {})[(signal, reason)] = float(count)
        return Snapshot(scalars, histograms, version)

    def describe(self) -> Iterator[Metric]:
        """Every family this store can expose, so `/metrics?name[]=…` filters find them."""
        return (exposition.library_family(spec) for spec in cat.CATALOGUE)

    def collect(self) -> Iterator[Metric]:
        scalars, histograms, _ = self.snapshot()
        for spec in cat.CATALOGUE:
            family = exposition.library_family(spec)
            if spec.kind == "histogram":
                if spec not in histograms:
                    continue
                bounds = exposition.bucket_labels(self._bounds[spec])
                for point in histograms[spec]:
                    cumulative = point.counts.cumsum()
                    buckets = [
                        (le, float(c), point.exemplars[i])
                        if i in point.exemplars
                        else (le, float(c))
                        for i, (le, c) in enumerate(zip(bounds, cumulative, strict=True))
                    ]
                    family.add_metric([self.run, *point.labels], buckets, point.sum)
                yield family
                continue
            if spec not in scalars:
                continue
            for labels, value in scalars[spec].items():
                family.add_metric([self.run, *labels], value)
            yield family


class PrometheusSink:
    """Maps closed steps and `tel.log` dicts onto catalogue series."""

    def __init__(self, store: SeriesStore, drops: Drops) -> None:
        self.store = store
        self._drops = drops
        self._phases_seen: set[str] = set()
        self._ledger_keys: set[str] = set()  # verl keys the last ledger step produced
        self._last_counted = -1
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.store)
        self._server = None
        self.url: str | None = None

    def serve(
        self,
        addr: str,
        port: int,
        tls: tuple[str, str] | None = None,
        credentials: tuple[str, str] | None = None,
        port_retries: int = 0,
    ) -> str:
        app = exposition.wsgi_app(exposition.Renderer(self.store), self.registry)
        self._server = endpoint.serve(app, addr, port, tls, credentials, port_retries)
        host = f"[{addr}]" if ":" in addr else addr
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://{host}:{self._server.server_port}/metrics"
        return self.url

    def release_in_child(self) -> None:
        """In a forked child: close its copy of the listening socket (the serving threads
        stayed in the parent), so a child that outlives the parent does not hold the port."""
        if self._server is not None:
            self._server.socket.close()
            self._server = None

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # --- closed steps (publisher thread) ---------------------------------------------------

    def observe_step(self, step: Step) -> None:
        store = self.store
        self._ledger_keys = set(step.metrics)
        phases = {name: value for name, value in step.timing_raw.items() if name != "step"}
        self._set_phase_seconds(phases)
        for name, value in phases.items():
            store.observe(cat.PHASE_DURATION, np.array([value]), name)
        seconds = step.timing_raw["step"]
        store.set(cat.STEP_TIME, seconds)
        store.observe(cat.STEP_DURATION, np.array([seconds]))
        store.set(cat.STEP_UNACCOUNTED, step.unaccounted_seconds)
        verdict = step.verdict
        if verdict is not None:
            store.replace(cat.BOTTLENECK, 1.0, verdict.kind, verdict.detail)
        self._count_step(step.number)
        for key, value in step.metrics.items():
            if key.startswith("agent_loop/") and not key.startswith("agent_loop/slowest/"):
                continue  # min/max/mean are verl's view; the histograms hold every sample
            if not key.startswith("timing_s/"):
                self._map_known(key, value)
        if step.prompt_tokens is not None:
            for kind, count in (
                ("prompt", step.prompt_tokens),
                ("response", step.response_tokens),
                ("total", step.total_tokens),
            ):
                store.set(cat.STEP_TOKENS, float(count), kind)
                store.inc(cat.TOKENS, float(count), kind)

    def _set_phase_seconds(self, phases: Mapping[str, float]) -> None:
        self._phases_seen.update(phases)
        for name in self._phases_seen:
            self.store.set(cat.STEP_PHASE_SECONDS, phases.get(name, 0.0), name)

    def _count_step(self, number: int) -> None:
        self.store.inc(cat.STEPS, 1.0)
        self.store.set(cat.STEP, float(number))
        self.store.set(cat.LAST_STEP_TIMESTAMP, time.time())
        self._last_counted = number

    def observe_samples(self, batch: SampleBatch) -> None:
        """Every valid sample into the stage/length histograms; sample spans as exemplars."""
        age_s = (time.perf_counter_ns() - batch.end_ns) / 1e9 if batch.end_ns else 0.0
        timestamp = time.time() - age_s
        for name, spec, label in (
            *((f, cat.AGENT_LOOP_DURATION, f) for f in DURATION_FIELDS),
            *((f, cat.AGENT_LOOP_LENGTH, kind) for f, kind in LENGTH_KINDS.items()),
        ):
            if name not in batch.columns:
                continue
            exemplars = [
                Exemplar(
                    {
                        "trace_id": f"{batch.trace_id:032x}",
                        "span_id": f"{span.span_id:016x}",
                    },
                    span.values[name],
                    timestamp,
                )
                for span in batch.spans
                if name in span.values
            ]
            self.store.observe(spec, batch.valid(name), label, exemplars=exemplars)
        if PREEMPTED in batch.columns:
            reported = batch.valid(PREEMPTED)
            self.store.inc(cat.AGENT_LOOP_PREEMPTIONS, float(reported[reported >= 0].sum()))

    # --- tel.log (publisher thread) --------------------------------------------------------

    def observe_log(self, data: Mapping[Any, Any], step: Any) -> None:
        """verl `Tracking.log` dicts: known keys to the catalogue, other scalars generic.

        For a step the ledger already closed, the ledger's numbers stand and only keys it
        did not produce are taken (e.g. throughput when tokens were never given to the
        ledger), so a verl run that both times phases and logs its dict is neither counted
        twice nor overwritten with a second measurement.
        """
        number = as_finite_float(step)[0]
        if number is None or not float(number).is_integer() or number < 0:
            self._drops.add("metrics", "bad_step", f"tel.log step={describe(step)} ignored")
            number = None
        fresh = number is None or int(number) != self._last_counted
        phases: dict[str, float] = {}
        for key, raw in data.items():
            if not isinstance(key, str) or not key:
                self._drops.add("metrics", "bad_key", f"key {key!r} is not a non-empty string")
                continue
            value, why = as_finite_float(raw)
            if value is None:
                self._drops.add("metrics", why, f"{key}={describe(raw)}")
            elif key.startswith("timing_s/") and "/" not in key[9:]:
                if value < 0:
                    self._drops.add("metrics", "negative", f"{key}={value}")
                elif not encodable(key):
                    self._drops.add("metrics", "bad_label", "a timing_s/ key is not valid UTF-8")
                else:
                    phases[key[9:]] = value
            elif fresh or key not in self._ledger_keys:
                self._map_known(key, value)  # what the ledger's step did not already say
        if not fresh:
            return
        seconds = phases.pop("step", None)
        if phases:
            self._set_phase_seconds(phases)
        if number is None:
            return
        if seconds is not None:
            self.store.set(cat.STEP_TIME, seconds)
            self.store.observe(cat.STEP_DURATION, np.array([seconds]))
            covered = sum(v for k, v in phases.items() if k in VERL_STEP_STAGES)
            self.store.set(cat.STEP_UNACCOUNTED, max(0.0, seconds - covered))
        for name, value in phases.items():
            self.store.observe(cat.PHASE_DURATION, np.array([value]), name)
        total = as_finite_float(data.get("perf/total_num_tokens"))[0]
        if total is not None and total >= 0:
            self.store.inc(cat.TOKENS, total, "total")
        self._count_step(int(number))

    def _map_known(self, key: str, value: float) -> None:
        """Gauges of one verl metric key; unknown keys go to the capped generic gauge."""
        store = self.store
        target: tuple | None = None
        if key.startswith("timing_per_token_ms/"):
            target = (cat.PHASE_TIME_PER_TOKEN, value / 1000, key[20:])
        elif key == "perf/throughput":
            target = (cat.THROUGHPUT, value)
        elif key == "perf/time_per_step":
            target = (cat.STEP_TIME, value)
        elif key == "perf/total_num_tokens":
            target = (cat.STEP_TOKENS, value, "total")
        elif key.startswith("perf/mfu/"):
            target = (cat.MFU, value, key[9:])
        elif key.startswith(("agent_loop/slowest/", "timing_s/agent_loop/slowest/")):
            field = key.rsplit("/", 1)[1]
            if field in DURATION_FIELDS:
                target = (cat.AGENT_LOOP_SLOWEST, value, field)
            elif field in LENGTH_KINDS:
                target = (cat.AGENT_LOOP_SLOWEST_LENGTH, value, LENGTH_KINDS[field])
        if target is None:
            if key.startswith("timing_s/") and value < 0:
                self._drops.add("metrics", "negative", f"{key}={value}")
            else:
                store.set(cat.TRAIN_METRIC, value, key)
        elif value < 0:
            self._drops.add("metrics", "negative", f"{key}={value}")
        else:
            store.set(*target)
