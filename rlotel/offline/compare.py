"""`rlotel compare BASE NEW`: which window changed between two runs, by how much, how surely.

Both runs are read by `rlotel.offline.analyze` (traces files or directories, run directories, verl
FileLogger JSONL) and reduced to one value per kept step per window: every phase of
`timing_raw`, the step, the unaccounted time (diagnose's rule), throughput, MFU per role,
seconds per sample in `generate_sequences` (verl's mean and max over all samples; p50 and
p99 where the sample spans cover every sample of a step), goodput, idle per role and
staleness. The first steps are dropped: their first-use costs (allocation, compilation,
caches) are not what a comparison is about.

A window compares medians over steps — one slow step (a GC pause, a checkpoint) does not
move a median — and gets a 95 % percentile-bootstrap interval of the relative change
new/base − 1, resampling steps with replacement on each side independently. The resamples'
medians are drawn exactly without building the resamples: the k-th smallest of n draws from
n sorted values is the value at index floor(n·U₍ₖ₎), where U₍ₖ₎ ~ Beta(k, n−k+1) is the k-th
order statistic of n uniforms (and the next one is U₍ₖ₎ + (1 − U₍ₖ₎)·Beta(1, n−k)). So an
interval costs O(resamples) whatever the runs' length, and each window's own seed (the run
seed and its name) makes the output reproducible and independent of the other windows.
A change is significant when its interval excludes 0, unless the window is negligible
(under `NEGLIGIBLE_SHARE` of the step in both runs).

Where both runs' step spans carry figures by data source, each source (in either run) gets
its samples, mean reward and mean response length over the kept steps on each side, means
weighing every step by its samples (`rlotel.offline.sources`), and the change: relative for
samples and response length, new − base for the reward (a mean reward may be 0 or negative).
"""

from __future__ import annotations

import html
import json
import math
import re
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from rlotel.derive.diagnose import diagnose, windows
from rlotel.offline import sources
from rlotel.offline.analyze import Run, StepRecord, load_run, without_gc
from rlotel.offline.otlp_json import SpanRecord
from rlotel.schema import attributes as attr
from rlotel.schema import vocabulary as voc

RESAMPLES = 2000
SEED = 0
WARMUP_SHARE = 0.10  # default --skip: this share of a run's steps, at least one
# A window holding less than this share of the step in both runs is never significant: its
# change moves the step by less than that, and sub-millisecond windows time mostly the
# scheduler (two identical runs side by side differ there by 10 % and more).
NEGLIGIBLE_SHARE = 0.01

# compare's own window names beside the phases (whose names are verl's).
UNACCOUNTED = "unaccounted"
THROUGHPUT = "throughput"
GOODPUT = "goodput"
MFU = "mfu/"  # + role
IDLE = "idle/"  # + role
GEN_SAMPLE = "gen_sample/"  # + mean|max|p50|p99: seconds per sample in generate_sequences
STALENESS = "staleness/"  # + mean|max
# Display order of the non-phase windows and their units.
_GROUPS: tuple[tuple[str, str], ...] = (
    (voc.STEP, "s"),
    (UNACCOUNTED, "s"),
    (THROUGHPUT, "tokens/s/GPU"),
    (MFU, "ratio"),
    (GEN_SAMPLE, "s"),
    (GOODPUT, "ratio"),
    (IDLE, "ratio"),
    (STALENESS, "steps"),
)
_GATE = re.compile(
    r"\s*(?P<window>[^<>\s]+)\s*(?P<op>[<>])\s*(?P<percent>[+-]?(?:\d+\.?\d*|\.\d+))\s*%\s*"
)


class CompareError(Exception):
    """Bad input (a path, a window, an expression): the message is the one line to show."""


@dataclass(frozen=True)
class WindowChange:
    """One window: medians over kept steps, relative change, its 95 % interval."""

    name: str
    unit: str
    base: float | None
    new: float | None
    change: float | None  # new/base − 1; None when a side lacks it or base is 0
    ci95: tuple[float, float] | None
    base_steps: int  # steps that had a value
    new_steps: int
    negligible: bool = False  # a window under NEGLIGIBLE_SHARE of the step in both runs

    @property
    def excludes_zero(self) -> bool:
        return self.ci95 is not None and (self.ci95[0] > 0 or self.ci95[1] < 0)

    @property
    def significant(self) -> bool:
        """The interval excludes 0, and the window is not too small to matter."""
        return self.excludes_zero and not self.negligible


@dataclass(frozen=True)
class Side:
    """What one input gave: how many steps, how many kept, its usual bottleneck."""

    source: Path
    steps: int
    kept: int
    skipped_lines: int
    bottleneck: str  # the most frequent verdict kind over kept steps
    bottleneck_share: float  # of kept steps


@dataclass(frozen=True)
class Gate:
    """`--fail-if` expression: a window's significant change past a threshold fails CI."""

    expression: str
    window: str
    rise: bool  # `>`: a change above the threshold fails; `<`: one below it
    threshold: float  # a fraction (+5 % = 0.05)

    def crossed(self, result: WindowChange) -> bool:
        if not result.significant or result.change is None:
            return False
        return result.change > self.threshold if self.rise else result.change < self.threshold


@dataclass(frozen=True)
class SourceChange:
    """One data source over the kept steps of each run (None: the run never had it)."""

    name: str
    base: sources.SourceTotals | None
    new: sources.SourceTotals | None

    @property
    def only_in(self) -> str | None:
        """ "base" or "new" for a source one run lacks; None when both have it."""
        if self.base is None:
            return "new"
        return "base" if self.new is None else None

    def changes(self) -> dict[str, float | None]:
        """samples and response_mean: new/base − 1; reward_mean: new − base; None where a
        side lacks the figure (or the base is 0, for a ratio)."""
        if self.base is None or self.new is None:
            return dict.fromkeys(SOURCE_FIGURES)
        result: dict[str, float | None] = {}
        for figure in SOURCE_FIGURES:
            base, new = _source_figure(self.base, figure), _source_figure(self.new, figure)
            if base is None or new is None:
                result[figure] = None
            elif figure == "reward_mean":
                result[figure] = new - base
            else:
                result[figure] = new / base - 1 if base else None
        return result

    def as_json(self) -> dict[str, Any]:
        return {
            "base": _source_json(self.base),
            "new": _source_json(self.new),
            "change": self.changes(),
            "only_in": self.only_in,
        }


SOURCE_FIGURES = ("samples", "reward_mean", "response_mean")


def _source_figure(totals: sources.SourceTotals, figure: str) -> float | None:
    value = getattr(totals, figure)
    return None if value is None else float(value)


def _source_json(totals: sources.SourceTotals | None) -> dict[str, Any] | None:
    if totals is None:
        return None
    return {"steps": totals.steps, **{f: getattr(totals, f) for f in SOURCE_FIGURES}}


@dataclass(frozen=True)
class Comparison:
    base: Side
    new: Side
    windows: dict[str, WindowChange]
    verdict: str
    resamples: int
    seed: int
    headline: str | None = None  # the window the verdict names first
    gates: list[tuple[Gate, bool]] = field(default_factory=list)  # (gate, failed)
    # by data source, where both runs' step spans carry the figures; else empty
    sources: list[SourceChange] = field(default_factory=list)

    @property
    def moved(self) -> bool:
        return self.base.bottleneck != self.new.bottleneck

    @property
    def failed(self) -> list[Gate]:
        return [gate for gate, failed in self.gates if failed]

    def as_json(self) -> dict[str, Any]:
        """The stable schema: `windows` (base, new, change, ci95, significant) and `verdict`;
        the rest (runs, bottleneck, gates) is context. Changes are fractions (0.41 = +41 %)."""
        return {
            "windows": {
                name: {
                    "base": w.base,
                    "new": w.new,
                    "change": w.change,
                    "ci95": list(w.ci95) if w.ci95 is not None else None,
                    "significant": w.significant,
                }
                for name, w in self.windows.items()
            },
            "verdict": self.verdict,
            "bottleneck": {
                "base": self.base.bottleneck,
                "new": self.new.bottleneck,
                "moved": self.moved,
            },
            "runs": {
                label: {
                    "source": str(side.source),
                    "steps": side.steps,
                    "kept": side.kept,
                    "skipped_lines": side.skipped_lines,
                }
                for label, side in (("base", self.base), ("new", self.new))
            },
            "resamples": self.resamples,
            "seed": self.seed,
            "negligible": [name for name, w in self.windows.items() if w.negligible],
            "gates": [
                {"expression": g.expression, "window": g.window, "failed": failed}
                for g, failed in self.gates
            ],
            "sources": {change.name: change.as_json() for change in self.sources},
        }


# --- reading ------------------------------------------------------------------------------


def load(path: Path) -> Run:
    """A run from any input `rlotel.offline.analyze` reads; CompareError when there is none."""
    path = Path(path)
    if not path.exists():
        raise CompareError(f"{path} does not exist")
    try:
        run = load_run(path)
    except OSError as error:
        raise CompareError(f"cannot read {path}: {error.strerror or error}") from None
    if not run.steps:
        raise CompareError(
            f"no steps found in {path} ({len(run.files)} file(s), {run.skipped_lines} "
            "unreadable line(s)); expected rlotel traces, a run directory or verl FileLogger JSONL"
        )
    return run


def default_skip(steps: int) -> int:
    """Warm-up steps to drop: the first 10 %, at least one (a run of one step keeps it)."""
    return min(max(1, int(steps * WARMUP_SHARE)), steps - 1)


def step_windows(
    steps: Sequence[StepRecord], phases: Sequence[str], samples: Mapping[str, list[float]]
) -> list[dict[str, float]]:
    """Per step, every window's finite value (a phase a step did not run counts 0 s)."""
    rows = []
    for step in steps:
        row = {name: step.timing_raw.get(name, 0.0) for name in phases}
        row.update(_other_windows(step, samples))
        rows.append({k: v for k, v in row.items() if math.isfinite(v)})
    return rows


_METRIC_WINDOWS: dict[str, str] = {  # a step-metric key → its window
    voc.THROUGHPUT: THROUGHPUT,
    **{f"{voc.AGENT_LOOP}{voc.GENERATE_SEQUENCES}/{s}": GEN_SAMPLE + s for s in ("mean", "max")},
    voc.GOODPUT: GOODPUT,
    **{voc.TRAJECTORY_STALENESS + s: STALENESS + s for s in ("mean", "max")},
}
_PREFIXED_WINDOWS: tuple[tuple[str, str], ...] = ((voc.MFU, MFU), (voc.IDLE_RATIO, IDLE))


def _other_windows(step: StepRecord, samples: Mapping[str, list[float]]) -> dict[str, float]:
    row: dict[str, float] = {}
    if voc.STEP in step.timing_raw:
        row[voc.STEP] = step.timing_raw[voc.STEP]
        row[UNACCOUNTED] = windows(step.facts)["overhead-bound"]
    for key, value in step.metrics.items():
        if key in _METRIC_WINDOWS:
            row[_METRIC_WINDOWS[key]] = value
            continue
        for prefix, window in _PREFIXED_WINDOWS:
            if key.startswith(prefix):
                row[window + key[len(prefix) :]] = value
    spans = samples.get(step.span.trace_id, ()) if step.span is not None else ()
    if spans and step.facts.sequences and len(spans) >= step.facts.sequences:
        row[GEN_SAMPLE + "p50"], row[GEN_SAMPLE + "p99"] = np.quantile(spans, [0.5, 0.99])
    return {k: float(v) for k, v in row.items()}


def sample_seconds(spans: Iterable[SpanRecord]) -> dict[str, list[float]]:
    """`generate_sequences` seconds of the sample spans, by trace (one trace per step)."""
    key = attr.sample_attribute(voc.GENERATE_SEQUENCES, True)
    by_trace: dict[str, list[float]] = defaultdict(list)
    for span in spans:
        if span.name == attr.SAMPLE_SPAN and isinstance(span.attributes.get(key), (int, float)):
            by_trace[span.trace_id].append(float(span.attributes[key]))
    return by_trace


def _unit(name: str) -> str:
    for prefix, unit in _GROUPS:
        if name == prefix or (prefix.endswith("/") and name.startswith(prefix)):
            return unit
    return "s"  # a phase


def _order(names: Iterable[str], phases: Sequence[str]) -> list[str]:
    """Phases as they ran, then the other windows group by group."""

    def group(name: str) -> int:
        for index, (prefix, _) in enumerate(_GROUPS):
            if name == prefix or (prefix.endswith("/") and name.startswith(prefix)):
                return index
        return len(_GROUPS)

    seen = list(dict.fromkeys(names))
    others = sorted((n for n in seen if n not in phases), key=lambda n: (group(n), seen.index(n)))
    return [*phases, *others]


# --- statistics ---------------------------------------------------------------------------


def bootstrap_medians(values: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """Medians of `resamples` resamples of `values` with replacement, drawn exactly from the
    order statistics of uniforms (module docstring) instead of materialising n × resamples."""
    ordered = np.sort(np.asarray(values, dtype=float))
    n = ordered.size
    k = (n + 1) // 2  # 1-based rank of the (lower) middle value
    low = rng.beta(k, n - k + 1, resamples)
    first = ordered[np.minimum((low * n).astype(np.int64), n - 1)]
    if n % 2:
        return first
    high = low + (1 - low) * rng.beta(1, n - k, resamples)
    return (first + ordered[np.minimum((high * n).astype(np.int64), n - 1)]) / 2


def relative_change(
    base: np.ndarray, new: np.ndarray, rng: np.random.Generator, resamples: int = RESAMPLES
) -> tuple[float | None, tuple[float, float] | None]:
    """new/base − 1 of the medians and its 95 % bootstrap interval (None where undefined:
    a base median of 0, fewer than two steps on a side, a resample with a 0 base median)."""
    base_median = float(np.median(base))
    if base_median == 0:
        return None, None
    change = float(np.median(new)) / base_median - 1
    if base.size < 2 or new.size < 2:
        return change, None
    new_medians = bootstrap_medians(new, rng, resamples)
    base_medians = bootstrap_medians(base, rng, resamples)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = new_medians / base_medians - 1
    if not np.isfinite(ratios).all():
        return change, None
    low, high = np.percentile(ratios, [2.5, 97.5])
    return change, (float(low), float(high))


def _window_rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


# --- the comparison -----------------------------------------------------------------------


def compare_runs(
    base: Run,
    new: Run,
    skip: int | None = None,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Comparison:
    """Every window of both runs, the bottleneck of each, and the verdict line."""
    with without_gc():
        return _compare_runs(base, new, skip, resamples, seed)


def _compare_runs(base: Run, new: Run, skip: int | None, resamples: int, seed: int) -> Comparison:
    kept = []
    for run in (base, new):
        drop = default_skip(len(run.steps)) if skip is None else skip
        if drop >= len(run.steps):
            raise CompareError(
                f"--skip {drop} leaves no step of {run.source} ({len(run.steps)} step(s))"
            )
        kept.append(run.steps[drop:])
    phases = list(
        dict.fromkeys(n for steps in kept for s in steps for n in s.timing_raw if n != voc.STEP)
    )
    rows = [
        step_windows(steps, phases, sample_seconds(run.spans))
        for steps, run in zip(kept, (base, new), strict=True)
    ]
    names = _order((n for side in rows for row in side for n in row), phases)
    step_medians = [np.median([row.get(voc.STEP, np.nan) for row in side]) for side in rows]
    results: dict[str, WindowChange] = {}
    for name in names:
        columns = [np.array([row[name] for row in side if name in row]) for side in rows]
        medians = [float(np.median(c)) if c.size else None for c in columns]
        change, ci = (None, None)
        if all(c.size for c in columns):
            change, ci = relative_change(*columns, _window_rng(seed, name), resamples)
        negligible = (name in phases or name == UNACCOUNTED) and all(
            (median or 0.0) < NEGLIGIBLE_SHARE * step
            for median, step in zip(medians, step_medians, strict=True)
        )
        results[name] = WindowChange(
            name, _unit(name), *medians, change, ci, *(c.size for c in columns), negligible
        )
    sides = [_side(run, steps) for run, steps in zip((base, new), kept, strict=True)]
    headline = _headline(results, phases)
    verdict = _verdict(results, headline, *sides)
    by_source = source_changes(*kept)
    return Comparison(*sides, results, verdict, resamples, seed, headline, sources=by_source)


def source_changes(base: Sequence[StepRecord], new: Sequence[StepRecord]) -> list[SourceChange]:
    """Each data source of either side's steps, base's order first; [] unless both sides
    have figures by data source."""
    totals = [sources.by_source(steps) for steps in (base, new)]
    if not all(totals):
        return []
    names = list(dict.fromkeys([*totals[0], *totals[1]]))
    return [SourceChange(name, totals[0].get(name), totals[1].get(name)) for name in names]


def _side(run: Run, kept: Sequence[StepRecord]) -> Side:
    kinds = Counter(diagnose(step.facts).kind for step in kept)
    kind, count = kinds.most_common(1)[0]
    return Side(run.source, len(run.steps), len(kept), run.skipped_lines, kind, count / len(kept))


def _headline(results: Mapping[str, WindowChange], phases: Sequence[str]) -> str | None:
    """The significant window that explains most seconds of the change (a phase or the
    unaccounted time); else the significant window that changed most; None if none did."""
    significant = [w for w in results.values() if w.significant]
    timed = [w for w in significant if w.name in phases or w.name == UNACCOUNTED]
    if timed:
        return max(timed, key=lambda w: abs((w.new or 0.0) - (w.base or 0.0))).name
    others = [w for w in significant if w.name != voc.STEP] or significant
    return max(others, key=lambda w: abs(w.change or 0.0)).name if others else None


def format_percent(fraction: float) -> str:
    """+41 %, -4.2 %: whole percents from 10 % on."""
    percent = fraction * 100
    return f"{percent:+.0f} %" if abs(percent) >= 10 else f"{percent:+.1f} %"


def format_interval(ci95: tuple[float, float]) -> str:
    """[38 %, 44 %], [-3.1 %, 12 %]: signs only where negative, as the verdict reads."""
    low, high = (format_percent(v).lstrip("+") for v in ci95)
    return f"[{low}, {high}]"


def describe(window: WindowChange) -> str:
    """`update_actor +41 % [38 %, 44 %]`."""
    if window.change is None:
        return f"{window.name} n/a"
    text = f"{window.name} {format_percent(window.change)}"
    return text if window.ci95 is None else f"{text} {format_interval(window.ci95)}"


def _verdict(
    results: Mapping[str, WindowChange], headline: str | None, base: Side, new: Side
) -> str:
    if base.bottleneck != new.bottleneck:
        moved = f"the bottleneck moved from {base.bottleneck} to {new.bottleneck}"
    else:
        moved = f"the bottleneck stayed {base.bottleneck}"
    if headline is None:
        return f"no significant change in {len(results)} windows; {moved}"
    parts = [describe(results[headline])]
    step = results.get(voc.STEP)
    if step is not None and headline != voc.STEP and step.significant:
        parts.append(describe(step))
    return "; ".join([*parts, moved])


# --- the regression gate ------------------------------------------------------------------


def parse_gate(expression: str) -> Gate:
    """`update_actor>+10%` → Gate; CompareError with the expected form otherwise."""
    match = _GATE.fullmatch(expression)
    if match is None:
        raise CompareError(
            f"--fail-if {expression!r}: expected WINDOW>+N% or WINDOW<-N%, "
            "e.g. step>+5% or throughput<-5%"
        )
    return Gate(
        expression,
        match["window"],
        match["op"] == ">",
        float(match["percent"]) / 100,
    )


def check_gates(comparison: Comparison, gates: Sequence[Gate]) -> Comparison:
    """The comparison with each gate's outcome; CompareError for a window neither run has."""
    outcomes = []
    for gate in gates:
        result = comparison.windows.get(gate.window)
        if result is None:
            known = ", ".join(comparison.windows)
            raise CompareError(
                f"--fail-if {gate.expression!r}: no window {gate.window!r} in either run "
                f"(windows: {known})"
            )
        outcomes.append((gate, gate.crossed(result)))
    return replace(comparison, gates=outcomes)


# --- the page -----------------------------------------------------------------------------

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
header { background: #1d2330; color: #fff; padding: 14px 24px; }
header h1 { margin: 0 0 4px; font-size: 20px; }
header .meta { color: #c5cad6; font-size: 13px; }
main { padding: 8px 24px 40px; max-width: 1200px; }
section { background: #fff; border: 1px solid #dde1e8; border-radius: 6px; margin: 16px 0;
          padding: 12px 16px; }
#verdict { font-size: 16px; font-weight: 600; }
.note { color: #5b6475; font-size: 12px; }
.warn { background: #fff4d6; border: 1px solid #e8c65a; padding: 6px 10px; border-radius: 4px; }
table { border-collapse: collapse; font-size: 13px; width: 100%; }
th, td { border-bottom: 1px solid #e6e9ef; padding: 3px 8px; text-align: left; }
th { background: #f0f2f6; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.significant td { background: #fff1ee; }
tr.failed td { background: #f9d7d3; font-weight: 600; }
svg line.zero { stroke: #8a93a6; } svg line.ci { stroke: #3b5bdb; stroke-width: 3; }
tr.significant svg line.ci { stroke: #d9480f; } svg circle { fill: #1d2330; }
"""
_PLOT_WIDTH, _PLOT_HEIGHT = 260, 16
# Nothing may be fetched: inline style and one inline script (it checks the data parses).
_CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'"


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "tokens/s/GPU":
        return f"{value:.1f}"
    return f"{value:.4g}" if unit == "s" else f"{value:.3f}"


def significance(window: WindowChange, failed: Iterable[str]) -> str:
    """yes / FAIL (a gate crossed) / `<1%` (excludes 0, but under 1 % of the step)."""
    if window.significant:
        return "FAIL" if window.name in failed else "yes"
    return f"<{NEGLIGIBLE_SHARE:.0%}" if window.excludes_zero else ""


SOURCE_COLUMNS = (
    "data source",
    "samples base",
    "samples new",
    "change",
    "mean reward base",
    "mean reward new",
    "change",
    "mean response tokens base",
    "mean response tokens new",
    "change",
)


def _reward_text(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def source_rows(comparison: Comparison) -> list[list[str]]:
    """The by-source table as text cells (`SOURCE_COLUMNS`), a row per source; a source one
    run lacks says so in its change cells."""
    rows = []
    for change in comparison.sources:
        sides = (change.base, change.new)
        samples = [str(t.samples) if t is not None else "–" for t in sides]
        rewards = [_reward_text(t.reward_mean if t is not None else None) for t in sides]
        lengths = [
            "–" if t is None or t.response_mean is None else f"{t.response_mean:.1f}" for t in sides
        ]
        if change.only_in is not None:
            moved = [f"only in {change.only_in}"] * 3
        else:
            delta = change.changes()
            moved = [
                "n/a" if delta["samples"] is None else format_percent(delta["samples"]),
                "n/a" if delta["reward_mean"] is None else f"{delta['reward_mean']:+.4g}",
                "n/a" if delta["response_mean"] is None else format_percent(delta["response_mean"]),
            ]
        rows.append([change.name, *samples, moved[0], *rewards, moved[1], *lengths, moved[2]])
    return rows


def format_sources(comparison: Comparison) -> str:
    """The by-source table as aligned plain text ("" without figures by data source)."""
    if not comparison.sources:
        return ""
    table = [list(SOURCE_COLUMNS), *source_rows(comparison)]
    widths = [max(len(row[i]) for row in table) for i in range(len(SOURCE_COLUMNS))]
    lines = [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in table
    ]
    kept = " / ".join(str(s.kept) for s in (comparison.base, comparison.new))
    title = f"By data source, over {kept} kept steps (means weigh each step by its samples)"
    return "\n".join([title, *lines])


def _sources_html(comparison: Comparison) -> str:
    """The by-source section ("" without figures by data source in both runs)."""
    if not comparison.sources:
        return ""
    head = "".join(f"<th>{html.escape(column)}</th>" for column in SOURCE_COLUMNS)
    body = "".join(
        f'<tr data-source="{html.escape(row[0])}"><td>{html.escape(row[0])}</td>'
        + "".join(f'<td class="num">{html.escape(cell)}</td>' for cell in row[1:])
        + "</tr>"
        for row in source_rows(comparison)
    )
    return f"""<section><h2>By data source</h2>
<table id="sources"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
<p class="note">Over the kept steps of each run, from the sums and counts on the step spans:
a mean weighs every step by its samples (mean reward = Σ rewards ÷ Σ rewarded samples, mean
response tokens = Σ tokens ÷ Σ samples). Changes: relative for samples and response tokens,
new − base for the mean reward.</p></section>"""


def _interval_svg(window: WindowChange, scale: float) -> str:
    """The change and its interval on an axis shared by every row (0 in the middle)."""
    if window.change is None:
        return ""
    half = _PLOT_WIDTH / 2 - 6

    def x(fraction: float) -> float:
        return round(_PLOT_WIDTH / 2 + fraction / scale * half, 2)

    middle = _PLOT_HEIGHT / 2
    parts = [
        f'<svg width="{_PLOT_WIDTH}" height="{_PLOT_HEIGHT}" role="img" '
        f'aria-label="{html.escape(describe(window))}">',
        f'<line class="zero" x1="{x(0)}" x2="{x(0)}" y1="0" y2="{_PLOT_HEIGHT}"/>',
    ]
    if window.ci95 is not None:
        low, high = window.ci95
        parts.append(f'<line class="ci" x1="{x(low)}" x2="{x(high)}" y1="{middle}" y2="{middle}"/>')
    parts.append(f'<circle cx="{x(window.change)}" cy="{middle}" r="4"/></svg>')
    return "".join(parts)


def render_html(comparison: Comparison) -> str:
    """One self-contained page (no scripts or styles fetched, no network): the verdict, a
    row per window with its interval drawn, and the JSON result inline for machines."""
    failed = {gate.window for gate in comparison.failed}
    bounds = [
        abs(v)
        for w in comparison.windows.values()
        for v in (w.change, *(w.ci95 or ()))
        if v is not None
    ]
    scale = max([0.05, *bounds])
    rows = []
    for w in comparison.windows.values():
        classes = " ".join(
            c for c, on in (("significant", w.significant), ("failed", w.name in failed)) if on
        )
        interval = (
            "–" if w.ci95 is None else f"[{format_percent(w.ci95[0])}, {format_percent(w.ci95[1])}]"
        )
        rows.append(
            f'<tr class="{classes}" data-window="{html.escape(w.name)}">'
            f"<td>{html.escape(w.name)}</td><td>{html.escape(w.unit)}</td>"
            f'<td class="num">{format_value(w.base, w.unit)}</td>'
            f'<td class="num">{format_value(w.new, w.unit)}</td>'
            f'<td class="num">{"–" if w.change is None else format_percent(w.change)}</td>'
            f'<td class="num">{interval}</td><td>{significance(w, failed)}</td>'
            f"<td>{_interval_svg(w, scale)}</td></tr>"
        )
    sides = "".join(
        f"<li>{label}: <code>{html.escape(str(s.source))}</code> — {s.kept} of {s.steps} steps "
        f"kept, mostly {html.escape(s.bottleneck)} ({s.bottleneck_share:.0%} of kept steps)</li>"
        for label, s in (("base", comparison.base), ("new", comparison.new))
    )
    skipped = [
        f"{s.skipped_lines} unreadable line(s) skipped in {html.escape(str(s.source))}"
        for s in (comparison.base, comparison.new)
        if s.skipped_lines
    ]
    gates = "".join(
        f"<li>{html.escape(g.expression)}: {'FAILED' if bad else 'passed'}</li>"
        for g, bad in comparison.gates
    )
    # `<` as \u003c: no `</script>` or `<!--` in the data can end or change the script block
    blob = json.dumps(comparison.as_json(), allow_nan=False).replace("<", "\\u003c")
    title = "rlotel compare"
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{_CSP}">
<title>{title}</title>
<style>{_STYLE}</style>
</head>
<body>
<header><h1>{title}</h1><div class="meta">medians over kept steps; 95 % bootstrap intervals of the
relative change ({comparison.resamples} resamples, seed {comparison.seed})</div></header>
<main>
<section><p id="verdict">{html.escape(comparison.verdict)}</p><ul>{sides}</ul>
{"".join(f'<p class="warn skipped">{s}</p>' for s in skipped)}
{f'<ul id="gates">{gates}</ul>' if gates else ""}</section>
<section><table id="windows"><thead><tr><th>window</th><th>unit</th><th>base</th><th>new</th>
<th>change</th><th>95 % interval</th><th>significant</th><th>change and interval</th></tr></thead>
<tbody>{"".join(rows)}</tbody></table>
<p class="note">Significant: the interval excludes 0 and the window holds at least
{NEGLIGIBLE_SHARE:.0%} of the step in one of the runs (<{NEGLIGIBLE_SHARE:.0%}: the interval
excludes 0, but the window is smaller). Rows share one axis, 0 in the middle,
±{format_percent(scale).lstrip("+")} at the edges.</p></section>
{_sources_html(comparison)}
</main>
<script type="application/json" id="rlotel-compare">{blob}</script>
<script>
const data = JSON.parse(document.getElementById("rlotel-compare").textContent);
document.body.dataset.windows = String(Object.keys(data.windows).length);
document.body.dataset.ready = "1";
</script>
</body>
</html>
"""
