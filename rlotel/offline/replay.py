"""Replay a finished verl run (FileLogger JSONL) as Prometheus history and step traces.

The live recorder maps each step's dict, so the replayed series carry exactly the names
and labels a live run would have shown; a snapshot after each step becomes one timestamped
OpenMetrics sample per series (written by prometheus_client's encoder), which
`promtool tsdb create-blocks-from openmetrics` backfills. verl's file holds no wall-clock
times, so steps are laid on a synthetic clock: each lasts its `timing_s/step` (else
`perf/time_per_step`, else `step_seconds`), and the run ends "now" unless told otherwise.
"""

from __future__ import annotations

import json
import math
import time
from array import array
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector
from prometheus_client.samples import Timestamp

from rlotel import config
from rlotel.base.drops import Drops, as_finite_float
from rlotel.record.ledger import Phase, Trace
from rlotel.schema import attributes as attr
from rlotel.schema import catalogue as cat
from rlotel.schema import vocabulary
from rlotel.series.recorder import Recorder
from rlotel.series.store import SeriesStore, Snapshot
from rlotel.sinks.metrics import exposition
from rlotel.sinks.traces.jsonl import JsonLinesExporter
from rlotel.sinks.traces.otlp import readable_spans
from rlotel.sinks.traces.spans import SpanBuilder

DEFAULT_STEP_SECONDS = 60.0
# The live defaults' caps (series per family; training and validation keys of tel.log).
MAX_SERIES, LOG_KEYS = config.MAX_METRIC_KEYS, (config.MAX_LOG_KEYS, config.MAX_VAL_LOG_KEYS)

# The replayed child spans are laid back to back in verl's order (their real order and
# overlap are not in the file).
STAGE_ORDER = vocabulary.VERL_STAGE_ORDER

Labels = tuple[str, ...]


@dataclass
class ReplayResult:
    steps: int
    series: int  # distinct series in metrics.om (each histogram bucket counts)
    samples: int
    dropped: dict[str, int]  # inputs skipped, by reason
    metrics_path: Path
    traces_path: Path
    step_timestamps: dict[int, float] = field(default_factory=dict)  # step → sample time (s)


@dataclass
class _Clock:
    """Synthetic step windows: span times in ns, sample times in whole ms."""

    begin_ns: list[int]
    end_ns: list[int]
    ms: list[int]  # strictly increasing: promtool refuses a repeated timestamp


def replay(
    jsonl: Path,
    out_dir: Path,
    run: str,
    service_name: str = "rlotel-replay",
    start_time: float | None = None,
    step_seconds: float | None = None,
) -> ReplayResult:
    """Write `metrics.om` (backfillable OpenMetrics) and `traces.jsonl` (OTLP/JSON lines)."""
    fallback = DEFAULT_STEP_SECONDS if step_seconds is None else float(step_seconds)
    if not math.isfinite(fallback) or fallback <= 0:
        raise ValueError(f"step_seconds must be a positive number of seconds, not {step_seconds}")
    if start_time is not None and not (math.isfinite(start_time) and start_time >= 0):
        raise ValueError(f"start_time must be a Unix time in seconds, not {start_time}")
    drops = Drops()
    steps = _read(Path(jsonl), drops)
    clock = _clock([_seconds(data, fallback) for _, data in steps], start_time)

    history = _History()
    store = SeriesStore(run, drops, MAX_SERIES, log_keys=LOG_KEYS)
    recorder = Recorder(store, drops)
    for index, (number, data) in enumerate(steps):
        recorder.observe_log(_without_nulls(data, drops), number)
        store.set(cat.LAST_STEP_TIMESTAMP, clock.ms[index] / 1000)
        history.add(index, store.snapshot())

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = out_dir / "metrics.om"
    collector = history.collector(run, [_timestamp(ms) for ms in clock.ms])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    metrics_path.write_bytes(openmetrics.generate_latest(registry))
    series, samples = collector.series, collector.samples
    traces_path = out_dir / "traces.jsonl"
    _write_traces(traces_path, steps, clock, run, service_name)

    dropped: Counter[str] = Counter()
    for (_, reason), count in drops.snapshot().items():
        dropped[reason] += count
    return ReplayResult(
        steps=len(steps),
        series=series,
        samples=samples,
        dropped=dict(dropped),
        metrics_path=metrics_path,
        traces_path=traces_path,
        step_timestamps={n: ms / 1000 for (n, _), ms in zip(steps, clock.ms, strict=True)},
    )


# --- reading ---------------------------------------------------------------------------


def _read(path: Path, drops: Drops) -> list[tuple[int, dict[str, Any]]]:
    """`{"step": N, "data": {...}}` lines, merged per step (later lines win), by step."""
    logged: dict[int, dict[str, Any]] = {}
    with path.open(encoding="utf-8") as lines:
        for line_number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                drops.add("replay", "bad_line", f"{path}:{line_number}: {exc}")
                continue
            if not isinstance(record, dict) or not isinstance(record.get("data"), dict):
                drops.add("replay", "bad_record", f"{path}:{line_number}: no data dict")
                continue
            step = _step_number(record.get("step"))
            if step is None:
                drops.add("replay", "bad_step", f"{path}:{line_number}: step={record.get('step')}")
                continue
            logged.setdefault(step, {}).update(record["data"])
    return sorted(logged.items())


def _step_number(raw: Any) -> int | None:
    """A non-negative integer step (3.0 counts); None for anything else, bools included."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return None
    if not (math.isfinite(raw) and float(raw).is_integer() and raw >= 0):
        return None
    return int(raw)


def _without_nulls(data: Mapping[str, Any], drops: Drops) -> dict[str, Any]:
    """verl's FileLogger (orjson) writes NaN and ±inf as null: count those apart."""
    kept = {}
    for key, value in data.items():
        if value is None:
            drops.add("metrics", "null", f"{key}=null (NaN or inf in verl's file)")
        else:
            kept[key] = value
    return kept


# --- the synthetic clock ---------------------------------------------------------------


def _seconds(data: Mapping[str, Any], fallback: float) -> float:
    """How long a step lasted: verl's own measurement when the file has one."""
    for key in (vocabulary.TIMING_S + vocabulary.STEP, vocabulary.TIME_PER_STEP):
        value = as_finite_float(data.get(key))[0]
        if value is not None and value > 0:
            return value
    return fallback


def _clock(durations: list[float], start_time: float | None) -> _Clock:
    lengths = [round(seconds * 1e9) for seconds in durations]
    start_ns = (
        time.time_ns() - sum(lengths) if start_time is None else round(start_time * 1e9)
    )  # default: the run ends now, so promtool sees no sample in the future
    clock = _Clock([], [], [])
    now = start_ns
    for length in lengths:
        clock.begin_ns.append(now)
        now += length
        clock.end_ns.append(now)
        ms = now // 1_000_000
        clock.ms.append(max(ms, clock.ms[-1] + 1) if clock.ms else ms)
    return clock


def _timestamp(ms: int) -> str:
    """Seconds text that Prometheus' parser (`int64(float * 1000)`, truncating) reads as ms."""
    text = f"{ms // 1000}.{ms % 1000:03d}"
    if int(float(text) * 1000) != ms:
        text += "5"  # half a millisecond later truncates to `ms` whatever the rounding
    return text


# --- OpenMetrics -----------------------------------------------------------------------


class _History:
    """Every series' value after each step, kept compactly until written family by family."""

    def __init__(self) -> None:
        self.scalars: dict[cat.MetricSpec, dict[Labels, tuple[array, array]]] = {}
        self.histograms: dict[cat.MetricSpec, dict[Labels, list[tuple[int, np.ndarray, float]]]]
        self.histograms = {}

    def add(self, index: int, snapshot: Snapshot) -> None:
        for spec, family in snapshot.scalars.items():
            series = self.scalars.setdefault(spec, {})
            for labels, value in family.items():
                indices, values = series.setdefault(labels, (array("q"), array("d")))
                indices.append(index)
                values.append(value)
        for spec, points in snapshot.histograms.items():
            series = self.histograms.setdefault(spec, {})
            for point in points:
                series.setdefault(point.labels, []).append((index, point.cumulative, point.sum))

    def collector(self, run: str, timestamps: list[Timestamp]) -> _HistoryCollector:
        return _HistoryCollector(self, run, timestamps)


class _HistoryCollector(Collector):
    """The history as prometheus_client families, one timestamped sample per step, so
    replay's OpenMetrics comes from the same encoder (names, escaping, units) as /metrics."""

    def __init__(self, history: _History, run: str, timestamps: list[Timestamp]) -> None:
        self._history = history
        self._run = run
        self._timestamps = timestamps
        self.series = 0
        self.samples = 0

    def collect(self) -> Iterator[Metric]:
        history, run, at = self._history, self._run, self._timestamps
        for spec in cat.CATALOGUE:
            metric = exposition.family(spec)
            if spec in history.scalars:
                for labels, (indices, values) in history.scalars[spec].items():
                    for index, value in zip(indices, values, strict=True):
                        metric.add_metric([run, *labels], value, timestamp=at[index])
                    self.series += 1
                    self.samples += len(values)
            elif spec in history.histograms:
                bounds = exposition.bucket_labels(spec.buckets)  # the live `le` of a default run
                for labels, points in history.histograms[spec].items():
                    for index, cumulative, total in points:
                        buckets = list(zip(bounds, cumulative.tolist(), strict=True))
                        metric.add_metric([run, *labels], buckets, total, timestamp=at[index])
                    self.series += len(bounds) + 2
                    self.samples += (len(bounds) + 2) * len(points)
            else:
                continue
            yield metric


def _timestamp(ms: int) -> Timestamp:
    """Half a millisecond past `ms`: Prometheus' parser (`int64(float * 1000)`, truncating)
    reads it back as exactly `ms` whatever the float rounding."""
    return Timestamp(ms // 1000, (ms % 1000) * 1_000_000 + 500_000)


# --- traces ----------------------------------------------------------------------------


def _write_traces(
    path: Path,
    steps: list[tuple[int, dict[str, Any]]],
    clock: _Clock,
    run: str,
    service_name: str,
) -> None:
    """One line per step: a `step` root and its stages back to back from the step start,
    through the live span path (span builder, OTLP/JSON encoder)."""
    resource = Resource.create({attr.SERVICE_NAME: service_name, attr.RUN: run})
    builder = SpanBuilder(run)
    marked = {attr.RECONSTRUCTED: True}
    path.write_text("")
    writer = JsonLinesExporter(path)
    try:
        for index, (number, data) in enumerate(steps):
            begin = clock.begin_ns[index]
            root = Phase(None, vocabulary.STEP)
            root.start_ns, root.end_ns = begin, clock.end_ns[index]
            trace = Trace(root, number)
            for stage, seconds in _stages(data):
                record = Phase(None, stage)
                record.start_ns = begin
                begin += round(seconds * 1e9)
                record.end_ns = begin
                trace.records.append(record)
            spans = builder.trace(trace, _root_attributes(data), offset_ns=0)
            marked_spans = [
                span._replace(attributes={**span.attributes, **marked}) for span in spans
            ]
            writer.export(readable_spans(marked_spans, resource))
    finally:
        writer.shutdown()


def _stages(data: Mapping[str, Any]) -> list[tuple[str, float]]:
    """The step's windows, verl's known ones in verl's order, then any other timer it logged
    (every timer is a window)."""
    windows = vocabulary.step_windows(vocabulary.timing_from_metrics(data))
    ordered = [
        *(s for s in STAGE_ORDER if s in windows),
        *(n for n in windows if n not in STAGE_ORDER),
    ]
    return [
        (name, windows[name])
        for name in ordered
        if math.isfinite(windows[name]) and windows[name] >= 0
    ]


def _root_attributes(data: Mapping[str, Any]) -> dict[str, float]:
    """What the live step span carries and the file knows: throughput, MFU, unaccounted."""
    attributes: dict[str, float] = {}
    for key, name in (
        (vocabulary.THROUGHPUT, attr.THROUGHPUT),
        (vocabulary.TIME_PER_STEP, attr.TIME_PER_STEP),
    ):
        value = as_finite_float(data.get(key))[0]
        if value is not None:
            attributes[name] = value
    for key, raw in data.items():
        value = as_finite_float(raw)[0] if key.startswith(vocabulary.MFU) else None
        if value is not None:
            attributes[attr.MFU_PREFIX + key[len(vocabulary.MFU) :]] = value
    step = as_finite_float(data.get(vocabulary.TIMING_S + vocabulary.STEP))[0]
    if step is not None and step >= 0:
        covered = sum(seconds for _, seconds in _stages(data))
        attributes[attr.UNACCOUNTED_S] = vocabulary.unaccounted(step, covered)
    return attributes
