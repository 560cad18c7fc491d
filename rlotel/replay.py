"""Replay a finished verl run (FileLogger JSONL) as Prometheus history and step traces.

The live exporter's `PrometheusSink.observe_log` maps each step's dict, so the replayed
series carry exactly the names and labels a live run would have shown; a snapshot after
each step becomes one timestamped OpenMetrics sample per series, which
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from rlotel import catalogue as cat
from rlotel.drops import Drops, as_finite_float
from rlotel.formulas import VERL_STAGE_ORDER
from rlotel.sinks.exposition import bucket_labels
from rlotel.sinks.jsonl import OtlpJsonLinesExporter
from rlotel.sinks.prometheus import PrometheusSink, SeriesStore, Snapshot

DEFAULT_STEP_SECONDS = 60.0
MAX_SERIES = 256  # per family, as live: caps distinct rlotel_train_metric keys

# The replayed child spans are laid back to back in verl's order (their real order and
# overlap are not in the file).
STAGE_ORDER = VERL_STAGE_ORDER

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
    sink = PrometheusSink(SeriesStore(run, drops, MAX_SERIES), drops)
    for index, (number, data) in enumerate(steps):
        sink.observe_log(_without_nulls(data, drops), number)
        sink.store.set(cat.LAST_STEP_TIMESTAMP, clock.ms[index] / 1000)
        history.add(index, sink.store.snapshot())

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = out_dir / "metrics.om"
    with metrics_path.open("w", encoding="utf-8") as out:
        series, samples = history.write(out, run, [_timestamp(ms) for ms in clock.ms])
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
    for key in ("timing_s/step", "perf/time_per_step"):
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

    def write(self, out: TextIO, run: str, timestamps: list[str]) -> tuple[int, int]:
        """The text, families in catalogue order, each series' samples in time order."""
        series = samples = 0
        for spec in cat.CATALOGUE:
            if spec in self.scalars:
                _header(out, spec)
                name = spec.sample_names[0]
                for labels, (indices, values) in self.scalars[spec].items():
                    text = _labels(spec.label_names, (run, *labels))
                    for index, value in zip(indices, values, strict=True):
                        out.write(f"{name}{text} {_number(value)} {timestamps[index]}\n")
                    series += 1
                    samples += len(values)
            elif spec in self.histograms:
                _header(out, spec)
                bounds = bucket_labels(spec.buckets)  # the live `le` of a default run
                names = ("run", *spec.labels, "le")
                for labels, points in self.histograms[spec].items():
                    text = _labels(spec.label_names, (run, *labels))
                    for index, cumulative, total in points:
                        at = timestamps[index]
                        for le, count in zip(bounds, cumulative.tolist(), strict=True):
                            le_text = _labels(names, (run, *labels, le))
                            out.write(f"{spec.name}_bucket{le_text} {count} {at}\n")
                        out.write(f"{spec.name}_count{text} {int(cumulative[-1])} {at}\n")
                        out.write(f"{spec.name}_sum{text} {_number(total)} {at}\n")
                    series += len(bounds) + 2
                    samples += (len(bounds) + 2) * len(points)
        out.write("# EOF\n")
        return series, samples


def _header(out: TextIO, spec: cat.MetricSpec) -> None:
    out.write(f"# HELP {spec.name} {_escape(spec.help)}\n")
    out.write(f"# TYPE {spec.name} {spec.kind}\n")
    if spec.unit and spec.name.endswith(f"_{spec.unit}"):  # OpenMetrics: unit is a suffix
        out.write(f"# UNIT {spec.name} {spec.unit}\n")


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    pairs = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True))
    return "{" + pairs + "}"


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))  # shortest text that parses back to the same double


# --- traces ----------------------------------------------------------------------------


def _write_traces(
    path: Path,
    steps: list[tuple[int, dict[str, Any]]],
    clock: _Clock,
    run: str,
    service_name: str,
) -> None:
    """One line per step: a `step` root and its stages back to back from the step start."""
    collected = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name, "rl.run": run}),
        sampler=ALWAYS_ON,
        shutdown_on_exit=False,
    )
    provider.add_span_processor(SimpleSpanProcessor(collected))
    tracer = provider.get_tracer("rlotel.replay")
    path.write_text("")
    writer = OtlpJsonLinesExporter(path)
    try:
        for index, (number, data) in enumerate(steps):
            begin = clock.begin_ns[index]
            common = {"rl.run": run, "rl.step": number, "rl.reconstructed": True}
            root = tracer.start_span(
                "step",
                context=context_api.Context(),  # a new trace, whatever the caller's context
                attributes={**common, **_root_attributes(data)},
                start_time=begin,
            )
            parent = trace_api.set_span_in_context(root)
            for stage, seconds in _stages(data):
                child = tracer.start_span(
                    stage,
                    context=parent,
                    attributes={**common, "rl.phase": stage},
                    start_time=begin,
                )
                begin += round(seconds * 1e9)
                child.end(end_time=begin)
            root.end(end_time=clock.end_ns[index])
            spans = collected.get_finished_spans()
            if spans:
                writer.export(spans)
            collected.clear()
    finally:
        writer.shutdown()
        provider.shutdown()


def _stages(data: Mapping[str, Any]) -> list[tuple[str, float]]:
    stages = []
    for stage in STAGE_ORDER:
        seconds = as_finite_float(data.get(f"timing_s/{stage}"))[0]
        if seconds is not None and seconds >= 0:
            stages.append((stage, seconds))
    return stages


def _root_attributes(data: Mapping[str, Any]) -> dict[str, float]:
    """What the live step span carries and the file knows: throughput, MFU, unaccounted."""
    attributes: dict[str, float] = {}
    for key in ("perf/throughput", "perf/time_per_step"):
        value = as_finite_float(data.get(key))[0]
        if value is not None:
            attributes["rl." + key.split("/", 1)[1]] = value
    for key, raw in data.items():
        value = as_finite_float(raw)[0] if key.startswith("perf/mfu/") else None
        if value is not None:
            attributes[f"rl.mfu.{key[len('perf/mfu/') :]}"] = value
    step = as_finite_float(data.get("timing_s/step"))[0]
    if step is not None and step >= 0:
        covered = sum(seconds for _, seconds in _stages(data))
        attributes["rl.unaccounted_s"] = max(0.0, step - covered)
    return attributes
