"""`rlotel report`: one self-contained HTML page that shows where a run's time went.

The page is data (one JSON blob) plus a fixed page script that draws it with plotly.js's
basic bundle (scatter and bar: every chart here), shipped beside this module and inlined: no
CDN, no network fetch, so the file works from `file://` on a laptop with no Grafana nearby.
The full plotly.min.js (4.8 MB) took 1.7–2.5 s to compile in a fresh browser; the basic
bundle (1.2 MB) keeps a 10,000-step report under 4 MB and interactive within a second.
Numbers come from `rlotel.offline.analyze` (the same ledger `rlotel analyze` prints) and
verdicts from `rlotel.derive.diagnose`, read from the facts each step span recorded: the
live verdicts.

Long runs are downsampled to at most `MAX_POINTS` points per series: consecutive steps are
bucketed evenly, each point is the bucket's mean (the tail's p99 and max, the bucket's max;
the verdict, the bucket's most frequent one). Span trees are kept for at most `MAX_TREES`
steps (the slowest, the profiled, the first and last, the rest evenly spaced).
"""

from __future__ import annotations

import heapq
import html
import itertools
import json
import math
import os
import re
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from rlotel.derive import occupancy
from rlotel.derive.diagnose import FACTS, THRESHOLDS, Diagnoser, Verdict, windows
from rlotel.offline import otlp_json, sources
from rlotel.offline.analyze import (
    Run,
    StepRecord,
    load_run,
    resolve_capture_path,
    thresholds,
    without_gc,
)
from rlotel.offline.otlp_json import SpanRecord
from rlotel.schema import attributes as attr
from rlotel.schema import data_moves as dm
from rlotel.schema import vocabulary as voc

MAX_POINTS = 1000  # about one per pixel of a chart's width: more only costs drawing time
MAX_TREES = 200
FOLD_CALLS = 8  # calls of one name under one span beyond which a waterfall folds them
SHOWN_SLOWEST = 4  # ... keeping the slowest few (and any that failed) as rows of their own
MAX_SLOWEST_SAMPLES = 25
MAX_VERDICT_ROWS = 200
STAGES = voc.AGENT_LOOP_STAGES
# Step metrics drawn when a run has them (goodput and async issues); absent keys are skipped.
EFFICIENCY_PREFIXES = (voc.GOODPUT, voc.IDLE_RATIO, voc.BUCKET_SECONDS)
STALENESS_PREFIX = voc.OFF_POLICY + "trajectory_"
# Async bias and measured rollout occupancy (issue 24), drawn when a run has them.
BIAS_PREFIXES = (voc.ASYNC_BIAS_KS, voc.SAMPLES_DISCARDED)
OCCUPANCY_KEYS = (voc.ROLLOUT_OCCUPANCY, voc.ROLLOUT_TAIL_SECONDS)
ASYNC_SUMMARY = (
    *((f"KS {q} (trained vs generated)", voc.ASYNC_BIAS_KS + q) for q in voc.BIAS_QUANTITIES),
    *((f"discarded {r} (share generated)", voc.SAMPLES_DISCARDED + r) for r in voc.DISCARD_REASONS),
    ("oldest-version staleness, token-weighted (steps)", voc.STALENESS_WORST_TOKEN_WEIGHTED),
    ("rollout occupancy (mean in flight ÷ peak)", voc.ROLLOUT_OCCUPANCY),
    ("rollout tail seconds (in flight < half the peak)", voc.ROLLOUT_TAIL_SECONDS),
)
_PAGE = Path(__file__).with_name("page.html")
_SCRIPT = Path(__file__).with_name("page.js")
PLOTLY_JS = Path(__file__).with_name("plotly-basic.min.js")
# said by the row itself, or by the step's verdict (the facts it was read from)
_HIDDEN_ATTRIBUTES = frozenset({attr.RUN, attr.PHASE, FACTS, THRESHOLDS})


class ReportError(Exception):
    """The input holds nothing to report on; the message says what was read."""


@dataclass(frozen=True)
class ReportResult:
    path: Path
    steps: int
    skipped_lines: int
    size_bytes: int


def write_report(source: Path, out: Path, title: str | None = None) -> ReportResult:
    """Read `source` (file or run directory) and write the HTML report to `out`."""
    source, out = Path(source), Path(out)
    if source.is_file() and source.stat().st_size == 0:
        raise ReportError(f"{source} is empty")
    with without_gc():  # the indexes below are as many small objects as the read made
        run = load_run(source)
        if not run.steps:
            raise ReportError(
                f"no steps found in {source} (read {len(run.files)} file(s), "
                f"{len(run.spans)} span(s), {run.skipped_lines} unreadable line(s)); expected "
                "rlotel traces (OTLP/JSON lines), a run directory or verl FileLogger JSONL"
            )
        data = report_data(run, out.parent, title or _default_title(run))
    page = render_html(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return ReportResult(out, len(run.steps), run.skipped_lines, len(page.encode()))


def _default_title(run: Run) -> str:
    runs = {s.span.attributes.get(attr.RUN) for s in run.steps if s.span is not None}
    runs.discard(None)
    if run.summary and isinstance(run.summary.get("run"), str):
        runs.add(run.summary["run"])
    name = ", ".join(sorted(str(r) for r in runs)) or run.source.name
    return f"rlotel run report — {name}"


def render_html(data: dict[str, Any]) -> str:
    """The page: template + plotly.js + page script + the data as inert JSON."""
    blob = json.dumps(data, separators=(",", ":"), allow_nan=False)
    blob = blob.replace("</", "<\\/")  # never closes the <script> it sits in
    parts = {
        "title": html.escape(data["title"]),
        "plotly": PLOTLY_JS.read_text(encoding="utf-8"),
        "script": _SCRIPT.read_text(encoding="utf-8"),
        "data": blob,
    }
    # one pass over the template: a title or blob that spells a placeholder stays as it is
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m[1]], _PAGE.read_text(encoding="utf-8"))


# --- the data behind the page ---------------------------------------------------------


def report_data(run: Run, out_dir: Path, title: str) -> dict[str, Any]:
    """Everything the page draws, JSON-ready (None where a value is missing)."""
    steps = run.steps
    diagnoser = Diagnoser(thresholds(run))  # the run's own, as live
    verdicts = [diagnoser.observe(step.facts) for step in steps]
    trees = _SpanIndex(run.spans)
    samples = trees.samples_by_step(steps)
    sample_seconds = {n: [_sample_total(span) for span in spans] for n, spans in samples.items()}
    captures = _captures(run, trees, out_dir)
    buckets = _buckets(len(steps), MAX_POINTS)
    stacked = _stacked_phases(steps, trees)
    unaccounted = [windows(s.facts)["overhead-bound"] for s in steps]
    metric_keys = sorted({key for s in steps for key in s.metrics})  # once, not once a prefix
    tree_steps = _tree_steps(steps, captures)
    slowest = max(steps, key=lambda s: s.timing_raw.get("step", 0.0))
    return {
        "title": title,
        "source": str(run.source),
        "generated_unix": int(time.time()),
        "files": [str(f) for f in run.files],
        "skipped_lines": run.skipped_lines,
        "step_count": len(steps),
        "steps_per_point": max((b - a for a, b in buckets), default=1),
        "x": [steps[a].number for a, _ in buckets],
        "step_seconds": _series(buckets, [s.timing_raw.get("step") for s in steps]),
        "phases": list(stacked),
        "seconds": {name: _series(buckets, values) for name, values in stacked.items()},
        "unaccounted": _series(buckets, unaccounted),
        "share": _mean_shares(steps, stacked, unaccounted),
        "throughput": _optional(buckets, steps, voc.THROUGHPUT),
        **_mfu(buckets, steps, metric_keys),
        "tail": _tail(buckets, steps, sample_seconds, trees.trajectories_by_step(steps)),
        "slowest_samples": _slowest_samples(samples, sample_seconds, trees),
        "weight_sync": _weight_sync(buckets, steps, trees),
        "data_movement": _data_movement(buckets, steps),
        "replica_occupancy": _replica_occupancy(buckets, steps, trees),
        "occasional": _occasional(trees.occasional, steps),
        "stalls": _stalls(trees.flagged, steps),
        "verdicts": _verdicts(buckets, steps, verdicts),
        "efficiency": _prefixed(buckets, steps, metric_keys, EFFICIENCY_PREFIXES),
        "staleness": _prefixed(buckets, steps, metric_keys, (STALENESS_PREFIX,)),
        "bias": _prefixed(buckets, steps, metric_keys, BIAS_PREFIXES),
        "occupancy": {
            key: series
            for key in OCCUPANCY_KEYS
            if (series := _optional(buckets, steps, key)) is not None
        },
        "async_summary": _async_summary(steps, metric_keys),
        "data_sources": _data_sources(steps),
        "captures": captures,
        "trees": {
            str(steps[i].number): trees.waterfall(steps[i], verdicts[i], samples, captures)
            for i in tree_steps
        },
        "tree_steps": [steps[i].number for i in tree_steps],
        "span_columns": SpanRow._fields,  # the page reads each row's fields by these names
        "default_step": slowest.number,
        "processes": trees.process_labels(),
        "roles": trees.roles,
    }


def _async_summary(steps: Sequence[StepRecord], metric_keys: list[str]) -> list[dict[str, Any]]:
    """Mean, min and max over steps of each async-bias and occupancy number the run has."""
    rows = []
    for label, key in ASYNC_SUMMARY:
        if key not in metric_keys:
            continue
        values = [v for v in (_finite(s.metrics.get(key)) for s in steps) if v is not None]
        if values:
            rows.append(
                {
                    "label": label,
                    "key": key,
                    "mean": round(sum(values) / len(values), 6),
                    "min": round(min(values), 6),
                    "max": round(max(values), 6),
                    "steps": len(values),
                }
            )
    return rows


def _data_sources(steps: Sequence[StepRecord]) -> list[dict[str, Any]]:
    """A row per data source over the run's steps, from the step spans' sums and counts:
    means weigh each step by its samples (`rlotel.offline.sources`); [] when no step span
    has the figures."""
    totals = sources.by_source(steps)
    everything = sources.total_samples(totals)
    return [
        {
            "name": t.name,
            "steps": t.steps,
            "samples": t.samples,
            "share": t.samples / everything if everything else None,
            "rewarded": t.rewarded,
            "reward_mean": t.reward_mean,
            "response_mean": t.response_mean,
            "generate_p90_s": t.generate_p90_s,
            "last_step": t.last_step,
            "last_reward_mean": t.last_reward_mean,
        }
        for t in totals.values()
    ]


def _buckets(count: int, limit: int) -> list[tuple[int, int]]:
    """[start, end) index ranges: one per step, or `limit` even buckets of a long run."""
    if count <= limit:
        return [(i, i + 1) for i in range(count)]
    edges = np.linspace(0, count, limit + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in itertools.pairwise(edges) if b > a]


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _series(
    buckets: Sequence[tuple[int, int]], values: Sequence[Any], reduce: str = "mean"
) -> list[float | None]:
    """One value per bucket (mean or max of the finite values in it; None if none)."""
    out: list[float | None] = []
    for start, end in buckets:
        finite = [v for v in (_finite(x) for x in values[start:end]) if v is not None]
        if not finite:
            out.append(None)
        else:
            out.append(round(max(finite) if reduce == "max" else sum(finite) / len(finite), 6))
    return out


def _optional(
    buckets: Sequence[tuple[int, int]], steps: Sequence[StepRecord], key: str
) -> list[float | None] | None:
    values = [s.metrics.get(key) for s in steps]
    if all(_finite(v) is None for v in values):
        return None
    return _series(buckets, values)


def _prefixed(
    buckets: Sequence[tuple[int, int]],
    steps: Sequence[StepRecord],
    metric_keys: list[str],
    prefixes: tuple[str, ...],
) -> dict[str, list[float | None]]:
    """A series per metric key that starts with one of `prefixes`, by prefix, then key."""
    return {
        key: _series(buckets, [s.metrics.get(key) for s in steps])
        for prefix in prefixes
        for key in metric_keys
        if key.startswith(prefix)
    }


def _mfu(
    buckets: Sequence[tuple[int, int]], steps: Sequence[StepRecord], metric_keys: list[str]
) -> dict[str, Any]:
    """MFU per role, with verl's 0.0 (no peak FLOPs known for the device, e.g. CPU) as
    unknown: a role with no known step is named in `mfu_unknown`, not drawn as a zero line."""
    known: dict[str, list[float | None]] = {}
    unknown = []
    for key in (k for k in metric_keys if k.startswith(voc.MFU)):
        values = [_finite(s.metrics.get(key)) for s in steps]
        values = [v if v is not None and v > 0 else None for v in values]
        if any(v is not None for v in values):
            known[key[len(voc.MFU) :]] = _series(buckets, values)
        else:
            unknown.append(key[len(voc.MFU) :])
    return {"mfu": known, "mfu_unknown": unknown}


def _stacked_phases(steps: Sequence[StepRecord], trees: _SpanIndex) -> dict[str, list[float]]:
    """Seconds per top-level window per step: a traced step's direct children, else every
    timer of the flat dict but those known to nest or lie outside the step
    (`vocabulary.step_windows`: nested timers would count twice in a stack)."""
    per_step: list[dict[str, float]] = []
    for step in steps:
        if step.span is not None:
            names = {
                child.name for child in trees.children(step.span) if child.name != attr.SAMPLE_SPAN
            }
        else:
            names = set(voc.step_windows(step.timing_raw))
        per_step.append({n: step.timing_raw[n] for n in names if n in step.timing_raw})
    order = list(dict.fromkeys(n for s in steps for n in s.timing_raw if n != "step"))
    present = {n for seconds in per_step for n in seconds}
    return {name: [s.get(name, 0.0) for s in per_step] for name in order if name in present}


def _mean_shares(
    steps: Sequence[StepRecord], stacked: dict[str, list[float]], unaccounted: list[float]
) -> dict[str, float]:
    total = sum(s.timing_raw.get("step", 0.0) for s in steps)
    if total <= 0:
        return {}
    shares = {name: sum(values) / total for name, values in stacked.items()}
    shares["unaccounted"] = sum(unaccounted) / total
    return {name: round(share, 6) for name, share in shares.items()}


def _weight_sync(
    buckets: Sequence[tuple[int, int]], steps: Sequence[StepRecord], trees: _SpanIndex
) -> dict[str, list[float | None]]:
    """Seconds per weight-sync stage per step: the leaf spans under each step's
    `update_weights` (wake_up, collective_rpc, ...), summed by name; {} when none."""
    per_step: list[dict[str, float]] = []
    for step in steps:
        leaves = []
        if step.span is not None:
            todo = [
                span
                for span in trees.named.get((step.span.trace_id, voc.UPDATE_WEIGHTS), ())
                if span.parent_span_id == step.span.span_id
            ]
            while todo:
                span = todo.pop()
                children = trees.children(span)
                if children:
                    todo.extend(children)
                elif span.name != voc.UPDATE_WEIGHTS:
                    leaves.append(span)
        stages: dict[str, float] = defaultdict(float)
        for span in sorted(leaves, key=lambda s: s.start_ns):  # stages in the order they ran
            stages[span.name] += span.seconds
        per_step.append(stages)
    names = list(dict.fromkeys(n for stages in per_step for n in stages))
    return {name: _series(buckets, [s.get(name) for s in per_step]) for name in names}


def _data_movement(
    buckets: Sequence[tuple[int, int]], steps: Sequence[StepRecord]
) -> dict[str, list[float | None]]:
    """Data-movement seconds per step by window and stage (`window stage`), the stages of
    the worker-group calls that move data; {} when no call was recorded."""
    per_step: list[dict[str, float]] = []
    for step in steps:
        moved: dict[str, float] = {}
        for window, facts in (step.facts.data_movement if step.facts else {}).items():
            for stage in dm.MOVING:
                if facts.get(f"{stage}_s"):
                    moved[f"{window} {stage}"] = facts[f"{stage}_s"]
        per_step.append(moved)
    names = sorted({n for moved in per_step for n in moved})
    return {name: _series(buckets, [m.get(name) for m in per_step]) for name in names}


def _replica_occupancy(
    buckets: Sequence[tuple[int, int]], steps: Sequence[StepRecord], trees: _SpanIndex
) -> dict[str, dict[str, list[float | None]]]:
    """Per rollout replica and step, from the real times of every trajectory span in the
    step's trace: occupancy (mean in flight ÷ peak) and tail seconds (in flight < half the
    peak), as `rlotel.derive.occupancy` measures them live. A trajectory's replica is the
    `rl.replica` of the rollout process that served its `generate` calls; {} without
    trajectory spans."""
    per_step: list[dict[str, occupancy.Occupancy]] = []
    for step in steps:
        times: dict[str, list[tuple[int, int]]] = defaultdict(list)
        if step.span is not None:
            for span in trees.named.get((step.span.trace_id, voc.TRAJECTORY), ()):
                times[trees.replica_under(span)].append((span.start_ns, span.end_ns))
        measured = {}
        for replica, pairs in times.items():
            starts, ends = np.array(pairs, dtype=np.int64).T
            found = occupancy.occupancy(starts, ends)
            if found is not None:
                measured[replica] = found
        per_step.append(measured)
    replicas = sorted({r for measured in per_step for r in measured})
    if not replicas:
        return {}

    def series(replica: str, field: str) -> list[float | None]:
        values = [getattr(m[replica], field) if replica in m else None for m in per_step]
        return _series(buckets, values)

    return {
        "ratio": {f"replica {r}": series(r, "ratio") for r in replicas},
        "tail_seconds": {f"replica {r}": series(r, "tail_seconds") for r in replicas},
    }


OCCASIONAL = (voc.TESTING, voc.SAVE_CHECKPOINT)
_BY_TRACE = frozenset({attr.SAMPLE_SPAN, voc.TRAJECTORY, voc.UPDATE_WEIGHTS})  # read by trace
MAX_EVENT_ROWS = 200


def _step_of(span: SpanRecord, by_trace: dict[str, int], starts: Sequence[tuple[int, int]]) -> Any:
    """The step a span belongs to: its trace's, its `rl.step`, else the last step begun
    before it (validation runs between steps, in a trace of its own)."""
    if span.trace_id in by_trace:
        return by_trace[span.trace_id]
    if isinstance(span.attributes.get(attr.STEP), int):
        return span.attributes[attr.STEP]
    before = [number for start, number in starts if start <= span.start_ns]
    return before[-1] if before else None


def _step_lookup(steps: Sequence[StepRecord]) -> tuple[dict[str, int], list[tuple[int, int]]]:
    traced = [s for s in steps if s.span is not None]
    by_trace = {s.span.trace_id: s.number for s in traced}  # type: ignore[union-attr]
    starts = sorted((s.span.start_ns, s.number) for s in traced)  # type: ignore[union-attr]
    return by_trace, starts


def _occasional(spans: Sequence[SpanRecord], steps: Sequence[StepRecord]) -> list[dict[str, Any]]:
    """Validation and checkpoint windows (their spans, else the logged timing_raw), by step."""
    by_trace, starts = _step_lookup(steps)
    rows = [
        {
            "name": span.name,
            "step": _step_of(span, by_trace, starts),
            "seconds": round(span.seconds, 6),
        }
        for span in sorted(spans, key=lambda s: s.start_ns)
        if not span.attributes.get(attr.OPEN_S)
    ]
    seen = {(row["name"], row["step"]) for row in rows}
    rows += [
        {"name": name, "step": step.number, "seconds": round(step.timing_raw[name], 6)}
        for step in steps
        for name in OCCASIONAL
        if name in step.timing_raw and (name, step.number) not in seen
    ]
    return sorted(rows, key=lambda r: (r["step"] is None, r["step"] or 0))[:MAX_EVENT_ROWS]


def _stalls(spans: Sequence[SpanRecord], steps: Sequence[StepRecord]) -> list[dict[str, Any]]:
    """Phases exported while they hung (`rl.stalled`) or left open at exit (`rl.incomplete`):
    `spans` are those flagged so."""
    by_trace, starts = _step_lookup(steps)
    rows = [
        {
            "name": span.name,
            "step": _step_of(span, by_trace, starts),
            "stalled": bool(span.attributes.get(attr.STALLED)),
            "open_s": _finite(span.attributes.get(attr.OPEN_S)),
            "seconds": round(span.seconds, 6),
            "process": otlp_json.process_label(span.resource),
        }
        for span in spans
        if span.attributes.get(attr.STALLED) or span.attributes.get(attr.INCOMPLETE)
    ]
    return sorted(rows, key=lambda r: -(r["open_s"] or r["seconds"]))[:MAX_EVENT_ROWS]


# --- samples and the generation tail ----------------------------------------------------


_STAGE_KEYS = {stage: attr.sample_attribute(stage, True) for stage in STAGES}


def _sample_total(span: SpanRecord) -> float:
    """A sample's seconds: its stages' durations summed (the table's `total_s`)."""
    stages = (_finite(span.attributes.get(key)) for key in _STAGE_KEYS.values())
    return round(sum(v for v in stages if v is not None), 6)


def _sample_row(step: int, span: SpanRecord, process: str) -> dict[str, Any]:
    attributes = span.attributes
    stages = {stage: _finite(attributes.get(key)) for stage, key in _STAGE_KEYS.items()}
    return {
        "step": step,
        "total_s": _sample_total(span),
        **{f"{stage}_s": stages[stage] for stage in STAGES},
        voc.NUM_PREEMPTED: _count_or_unknown(
            attributes.get(attr.sample_attribute(voc.NUM_PREEMPTED, False))
        ),
        voc.PROMPT_LENGTH: attributes.get(attr.INPUT_TOKENS),
        voc.RESPONSE_LENGTH: attributes.get(attr.OUTPUT_TOKENS),
        "index": attributes.get(attr.SAMPLE_INDEX),
        "span_id": span.span_id,
        "trace_id": span.trace_id,
        "process": process,
    }


def _count_or_unknown(value: Any) -> int | None:
    """A count verl marks unknown with a negative value (preemptions: -1) is None."""
    number = _finite(value)
    return int(number) if number is not None and number >= 0 else None


def _tail(
    buckets: Sequence[tuple[int, int]],
    steps: Sequence[StepRecord],
    sample_seconds: dict[int, list[float]],
    trajectories: dict[int, list[float]],
) -> dict[str, Any]:
    """Per step: p50/p90/p99 over every sample of the step, never over the slowest few.

    Every sample is seen where each trajectory exported a span (verl V1's agent loop), or
    where the step's sample spans number its sequences (`rl.sequences`); a step seen only
    through the slowest samples' spans gets no quantiles, only its slowest sample (the
    drill-down). verl's mean and max over every sample are drawn where it logged them."""
    quantiles: dict[str, list[float | None]] = {"p50": [], "p90": [], "p99": []}
    counts, slowest, bases = [], [], []
    for step in steps:
        spans = sorted(sample_seconds.get(step.number, ()))
        every = sorted(trajectories.get(step.number, ()))
        sequences = step.span.attributes.get(attr.SEQUENCES) if step.span is not None else None
        basis = None
        if every and len(every) >= len(spans):
            basis = "trajectory"
        elif spans and isinstance(sequences, int) and len(spans) >= sequences:
            basis, every = "sample", spans
        else:
            every = []
        bases.append(basis)
        counts.append(len(every) or None)
        slowest.append(spans[-1] if spans else None)
        for name, q in (("p50", 0.50), ("p90", 0.90), ("p99", 0.99)):
            quantiles[name].append(quantile(every, q) if every else None)
    return {
        "p50": _series(buckets, quantiles["p50"]),
        "p90": _series(buckets, quantiles["p90"]),
        "p99": _series(buckets, quantiles["p99"], "max"),
        "slowest_span": _series(buckets, slowest, "max"),
        "basis": sorted({b for b in bases if b is not None}),
        "steps_without_every_sample": sum(1 for b in bases if b is None),
        "samples_per_step": _series(buckets, counts),
        "verl_mean": _optional(buckets, steps, f"{voc.AGENT_LOOP}generate_sequences/mean"),
        "verl_max": _optional_max(buckets, steps, f"{voc.AGENT_LOOP}generate_sequences/max"),
    }


def quantile(ordered: Sequence[float], q: float) -> float:
    """numpy's default (linear) quantile of sorted values; a per-step call costs ~1 µs, not
    numpy's ~40 µs."""
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _optional_max(
    buckets: Sequence[tuple[int, int]], steps: Sequence[StepRecord], key: str
) -> list[float | None] | None:
    values = [s.metrics.get(key) for s in steps]
    if all(_finite(v) is None for v in values):
        return None
    return _series(buckets, values, "max")


def _slowest_samples(
    samples: dict[int, list[SpanRecord]], sample_seconds: dict[int, list[float]], trees: _SpanIndex
) -> list[dict[str, Any]]:
    """The table's rows: the slowest samples of the run (a row each, not one a sample)."""
    ranked = heapq.nlargest(
        MAX_SLOWEST_SAMPLES,
        (
            (seconds, number, span)
            for number, spans in samples.items()
            for seconds, span in zip(sample_seconds[number], spans, strict=True)
        ),
        key=lambda ranked: ranked[0],
    )
    return [_sample_row(number, span, trees.process_key(span)[0]) for _, number, span in ranked]


# --- verdicts --------------------------------------------------------------------------


def _verdict_entry(step: int, verdict: Verdict) -> dict[str, Any]:
    return {
        "step": step,
        "label": verdict.label,
        "confidence": verdict.confidence,
        "share": round(verdict.share, 4),
        "evidence": {k: _json_value(v) for k, v in verdict.evidence.items()},
        "next_read": verdict.next_read,
        "trends": {k: {n: _json_value(v) for n, v in t.items()} for k, t in verdict.trends.items()},
    }


def _verdicts(
    buckets: Sequence[tuple[int, int]], steps: Sequence[StepRecord], verdicts: Sequence[Verdict]
) -> dict[str, Any]:
    labels = list(dict.fromkeys(v.label for v in verdicts))
    next_reads = {v.label: v.next_read for v in verdicts}
    points = []  # [label index, confidence, share] per point: the text lives once, by label
    for start, end in buckets:
        counts = Counter(v.label for v in verdicts[start:end])
        label = counts.most_common(1)[0][0]
        first = next(i for i in range(start, end) if verdicts[i].label == label)
        points.append(
            [labels.index(label), verdicts[first].confidence, round(verdicts[first].share, 4)]
        )
    runs: list[dict[str, Any]] = []  # consecutive steps with the same verdict
    for step, verdict in zip(steps, verdicts, strict=True):
        if runs and runs[-1]["label"] == verdict.label:
            runs[-1]["last"] = step.number
            runs[-1]["steps"] += 1
        else:
            runs.append(
                {**_verdict_entry(step.number, verdict), "first": step.number, "last": step.number}
            )
            runs[-1]["steps"] = 1
    return {
        "labels": labels,
        "next_reads": next_reads,
        "points": points,
        "runs": runs[:MAX_VERDICT_ROWS],
        "runs_total": len(runs),
    }


def _json_value(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return str(value)


# --- spans: trees, captures, processes --------------------------------------------------


class SpanRow(NamedTuple):
    """One span of a step's waterfall. The page gets rows as JSON arrays (a 10k-step report
    stays small) with these field names once, `span_columns`, and reads fields by name."""

    name: str
    depth: int
    start_ms: float  # from the step's start
    duration_ms: float
    process: int  # index into `processes`
    span_id: str
    error: bool
    attributes: dict[str, Any]
    role: int  # index into `roles`


class _SpanIndex:
    """Spans by id, by parent and by trace, for trees that cross process files."""

    def __init__(self, spans: Iterable[SpanRecord]) -> None:
        self.by_parent: dict[str, list[SpanRecord]] = defaultdict(list)
        self.by_trace: dict[str, list[SpanRecord]] = defaultdict(list)
        self.captures: list[SpanRecord] = []
        self._processes: dict[tuple[str, str], int] = {}
        self.roles: list[str] = []  # names a waterfall row's role refers to by index
        self._role_of: dict[str, str] = {}  # span id → its role (own, an ancestor's, process's)
        self._by_id: dict[str, SpanRecord] = {}
        self._keys: dict[int, tuple[dict[str, Any], tuple[str, str]]] = {}
        # the few names the page reads by trace, and the flagged spans: one pass, not one a view
        self.named: dict[tuple[str, str], list[SpanRecord]] = defaultdict(list)
        self.occasional: list[SpanRecord] = []
        self.flagged: list[SpanRecord] = []
        for span in spans:
            self._by_id[span.span_id] = span
            self.by_trace[span.trace_id].append(span)
            if span.parent_span_id:
                self.by_parent[span.parent_span_id].append(span)
            name, attributes = span.name, span.attributes
            if name in _BY_TRACE:
                self.named[(span.trace_id, name)].append(span)
            elif name in OCCASIONAL:
                self.occasional.append(span)
            elif name == attr.CAPTURE_SPAN:
                self.captures.append(span)
            if attr.STALLED in attributes or attr.INCOMPLETE in attributes:
                self.flagged.append(span)
            self._processes.setdefault(self.process_key(span), len(self._processes))

    def children(self, span: SpanRecord) -> list[SpanRecord]:
        return [c for c in self.by_parent.get(span.span_id, ()) if c.trace_id == span.trace_id]

    def process_labels(self) -> list[str]:
        labels = [label for label, _ in self._processes]
        repeated = {label for label, n in Counter(labels).items() if n > 1}
        return [
            f"{label} ({instance[:8]})" if label in repeated and instance else label
            for label, instance in self._processes
        ]

    def process_index(self, span: SpanRecord) -> int:
        return self._processes[self.process_key(span)]

    def process_key(self, span: SpanRecord) -> tuple[str, str]:
        """`otlp_json.process_key`, once per resource: the spans of one export share it (a
        10,000-step run has ~130,000 spans and a few hundred resources)."""
        resource = span.resource
        found = self._keys.get(id(resource))
        if found is None or found[0] is not resource:
            found = self._keys[id(resource)] = (resource, otlp_json.process_key(resource))
        return found[1]

    def role(self, span: SpanRecord) -> str:
        """The role a span ran as: its own `rl.role` (a fused worker process hosts actor,
        ref, rollout...: each call says which), else its nearest same-process ancestor's,
        else its process's (resource), else its service name."""
        found = self._role_of.get(span.span_id)
        if found is not None:
            return found
        chain, current, role = [], span, None
        process = self.process_key(span)
        while current is not None and len(chain) < 256:
            own = current.attributes.get(attr.ROLE)
            if own:
                role = str(own)
                break
            if current.span_id in self._role_of:
                role = self._role_of[current.span_id]
                break
            chain.append(current.span_id)
            parent = self._by_id.get(current.parent_span_id)
            current = parent if parent and self.process_key(parent) == process else None
        if role is None:
            resource = span.resource
            role = str(resource.get(attr.ROLE) or resource.get(attr.SERVICE_NAME) or "unknown")
        for span_id in (*chain, span.span_id):
            self._role_of[span_id] = role
        return role

    def role_index(self, span: SpanRecord) -> int:
        role = self.role(span)
        if role not in self.roles:
            self.roles.append(role)
        return self.roles.index(role)

    def replica_under(self, span: SpanRecord) -> str:
        """The `rl.replica` of the first process under `span` whose resource names one
        (the rollout replica that served a trajectory), else "0" as the live metric says."""
        todo = [span]
        for _ in range(10_000):  # a trajectory's subtree: a few spans per turn
            if not todo:
                break
            current = todo.pop(0)
            replica = current.resource.get(attr.REPLICA)
            if replica is not None:
                return str(replica)
            todo.extend(self.children(current))
        return occupancy.DEFAULT_REPLICA

    def trajectories_by_step(self, steps: Sequence[StepRecord]) -> dict[int, list[float]]:
        """Seconds of each trajectory span in a step's trace: one per sample, every sample
        (verl V1's agent loop exports one for each trajectory it runs)."""
        result: dict[int, list[float]] = {}
        for step in steps:
            if step.span is not None:
                seconds = [
                    round(span.seconds, 6)
                    for span in self.named.get((step.span.trace_id, voc.TRAJECTORY), ())
                ]
                if seconds:
                    result[step.number] = seconds
        return result

    def samples_by_step(self, steps: Sequence[StepRecord]) -> dict[int, list[SpanRecord]]:
        """Sample spans by step: by their trace (worker samples carry no rl.step)."""
        result: dict[int, list[SpanRecord]] = {}
        for step in steps:
            if step.span is not None:
                spans = self.named.get((step.span.trace_id, attr.SAMPLE_SPAN))
                if spans:
                    result[step.number] = spans
        return result

    def waterfall(
        self,
        step: StepRecord,
        verdict: Verdict,
        samples: dict[int, list[SpanRecord]],
        captures: Sequence[dict[str, Any]],
    ) -> dict[str, Any]:
        """One step's span tree as rows (depth-first), offsets in ms from the step start."""
        details = {
            "verdict": _verdict_entry(step.number, verdict),
            "timing_raw": {k: round(v, 6) for k, v in step.timing_raw.items()},
            "captures": [i for i, c in enumerate(captures) if step.number in c["covers"]],
            "samples": len(samples.get(step.number, ())),
        }
        if step.span is None:
            return {**details, "rows": []}
        root = step.span
        rows: list[SpanRow] = []
        seen: set[str] = set()

        def visit(span: SpanRecord, depth: int) -> None:
            seen.add(span.span_id)
            attributes = {
                k: _json_value(v) for k, v in span.attributes.items() if k not in _HIDDEN_ATTRIBUTES
            }
            rows.append(
                SpanRow(
                    span.name,
                    depth,
                    round((span.start_ns - root.start_ns) / 1e6, 4),
                    round((span.end_ns - span.start_ns) / 1e6, 4),
                    self.process_index(span),
                    span.span_id,
                    span.status_code == otlp_json.STATUS_ERROR,
                    attributes,
                    self.role_index(span),
                )
            )
            children = sorted(self.children(span), key=lambda s: s.start_ns)
            shown, folded = _fold_ranks(children)
            for child in shown:
                visit(child, depth + 1)
            for group in folded:
                rows.append(self._folded_row(group, depth + 1, root))

        visit(root, 0)
        for orphan in self.by_trace.get(root.trace_id, ()):  # parents not in the input
            parent = self._by_id.get(orphan.parent_span_id)
            if orphan.span_id not in seen and (parent is None or parent.trace_id != root.trace_id):
                visit(orphan, 1)
        return {**details, "rows": rows}

    def _folded_row(self, group: list[SpanRecord], depth: int, root: SpanRecord) -> SpanRow:
        """One row for a worker group's calls not drawn one by one: from the first start
        to the last end, in the process of the slowest, with their durations' spread."""
        start = min(s.start_ns for s in group)
        durations = sorted((s.end_ns - s.start_ns) / 1e6 for s in group)
        slowest = max(group, key=lambda s: s.end_ns - s.start_ns)
        return SpanRow(
            f"{group[0].name} ×{len(group)} more",
            depth,
            round((start - root.start_ns) / 1e6, 4),
            round((max(s.end_ns for s in group) - start) / 1e6, 4),
            self.process_index(slowest),
            "",
            False,  # a call that failed is never folded
            {
                "folded calls": len(group),
                "processes": len({self.process_key(s) for s in group}),
                "ms min": round(durations[0], 4),
                "ms median": round(statistics.median(durations), 4),
                "ms max": round(durations[-1], 4),
            },
            self.role_index(slowest),
        )


def _fold_ranks(children: list[SpanRecord]) -> tuple[list[SpanRecord], list[list[SpanRecord]]]:
    """(the children drawn one by one, the groups folded into a row each). A name called
    more than `FOLD_CALLS` times under one span — a worker group's ranks, 2,048 rows a
    step at 1,024 ranks — keeps its `SHOWN_SLOWEST` slowest calls and any that failed, in
    order; the rest fold (their own children with them)."""
    by_name: dict[str, list[SpanRecord]] = defaultdict(list)
    for child in children:
        by_name[child.name].append(child)
    folded = []
    hidden: set[str] = set()
    for calls in by_name.values():
        if len(calls) <= FOLD_CALLS:
            continue
        kept = heapq.nlargest(SHOWN_SLOWEST, calls, key=lambda s: s.end_ns - s.start_ns)
        keep = {s.span_id for s in kept} | {
            s.span_id for s in calls if s.status_code == otlp_json.STATUS_ERROR
        }
        group = [s for s in calls if s.span_id not in keep]
        hidden.update(s.span_id for s in group)
        folded.append(group)
    shown = [child for child in children if child.span_id not in hidden] if hidden else children
    return shown, folded


def _captures(run: Run, trees: _SpanIndex, out_dir: Path) -> list[dict[str, Any]]:
    """`profile.capture` spans, the steps they cover (range and span links) and a link."""
    linked_from: dict[str, list[int]] = defaultdict(list)
    for step in run.steps:
        if step.span is not None:
            for link in step.span.links:
                linked_from[link.span_id].append(step.number)
    windows: dict[str, set[str]] = defaultdict(set)  # the phases and calls that link it
    for linking in run.spans:
        if linking.links and linking.name != voc.STEP:
            for link in linking.links:
                windows[link.span_id].add(linking.name)
    result = []
    for span in sorted(trees.captures, key=lambda s: s.start_ns):
        attributes = span.attributes
        first = attributes.get(attr.PROFILE_STEP_FIRST)
        last = attributes.get(attr.PROFILE_STEP_LAST, first)
        covers = sorted(
            set(linked_from.get(span.span_id, ()))
            | (set(range(int(first), int(last) + 1)) if isinstance(first, int) else set())
        )
        recorded = str(attributes.get(attr.PROFILE_PATH, ""))
        found = resolve_capture_path(recorded, run.source)
        result.append(
            {
                "path": recorded,
                "href": _relative_href(found, out_dir) if found else None,
                "exists": found is not None,
                "tool": attributes.get(attr.PROFILE_TOOL),
                "role": attributes.get(attr.PROFILE_ROLE),
                "rank": attributes.get(attr.PROFILE_RANK),
                "size_bytes": attributes.get(attr.PROFILE_SIZE),
                "steps": [first, last],
                "mini_batches": [
                    attributes.get(attr.PROFILE_MINI_BATCH_FIRST),
                    attributes.get(attr.PROFILE_MINI_BATCH_LAST),
                ],
                "top_ops": _json_value(attributes.get(attr.PROFILE_TOP_OPS, []))[:5],
                "covers": covers,
                "windows": sorted(windows.get(span.span_id, ())),
                "span_id": span.span_id,
            }
        )
    return result


def _relative_href(path: Path, out_dir: Path) -> str:
    relative = os.path.relpath(path.resolve(), Path(out_dir).resolve())
    return Path(relative).as_posix()


def _tree_steps(steps: Sequence[StepRecord], captures: Sequence[dict[str, Any]]) -> list[int]:
    """Indices of the steps whose span tree the page carries (all, for a short run)."""
    count = len(steps)
    if count <= MAX_TREES:
        return list(range(count))
    by_time = sorted(range(count), key=lambda i: steps[i].timing_raw.get("step", 0.0))
    chosen = set(by_time[-MAX_TREES // 2 :]) | {0, count - 1}
    profiled = {n for c in captures for n in c["covers"]}
    chosen |= {i for i, s in enumerate(steps) if s.number in profiled}
    spare = MAX_TREES - len(chosen)
    if spare > 0:
        chosen |= {int(i) for i in np.linspace(0, count - 1, spare).round()}
    return sorted(chosen)
