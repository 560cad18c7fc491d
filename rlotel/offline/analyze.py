"""Read a run back: rlotel's OTLP/JSON traces, a run directory, or verl's FileLogger JSONL.

Every source becomes per-step (timing_raw, metrics) records, so `rlotel analyze` prints the
same ledger table as the demo and `rlotel report` draws the same numbers. Spans are decoded
by `rlotel.offline.otlp_json`; lines that are neither OTLP requests nor verl log lines are
counted as skipped, never raised. A step's verdict is read from the facts the live verdict
read, recorded on its step span (`rl.bottleneck.facts`): the same label and confidence as
live. Only a trace without them has its facts rebuilt from the spans, which hold the
slowest samples alone (the live verdict read every sample).
"""

from __future__ import annotations

import gc
import json
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rlotel.derive.diagnose import FACTS, THRESHOLDS, StepFacts, Thresholds
from rlotel.offline import otlp_json
from rlotel.offline.otlp_json import SpanRecord
from rlotel.schema import attributes as attr
from rlotel.schema import formulas
from rlotel.schema import vocabulary as voc

SUMMARY_FILE = "summary.json"  # the demo's per-step timing_raw and metrics
# agent-loop stage → the sample span's duration attribute of it
_STAGE_KEYS = {stage: attr.sample_attribute(stage, True) for stage in voc.AGENT_LOOP_STAGES}


@dataclass
class StepRecord:
    number: int
    timing_raw: dict[str, float]
    metrics: dict[str, float]
    facts: StepFacts
    span: SpanRecord | None = None  # the `step` root span, when read from traces
    recorded: bool = False  # `facts` are the live verdict's own, from the step span


@dataclass
class Run:
    """Everything read from a path: steps (sorted), all spans, and what could not be read."""

    source: Path
    steps: list[StepRecord] = field(default_factory=list)
    spans: list[SpanRecord] = field(default_factory=list)
    skipped_lines: int = 0
    files: list[Path] = field(default_factory=list)
    summary: dict[str, Any] | None = None


def thresholds(run: Run) -> Thresholds:
    """The verdict thresholds the run was diagnosed with live (recorded on its step spans
    where not the defaults): offline verdicts are read with the same."""
    recorded = next(
        (s.attributes[THRESHOLDS] for s in run.spans if THRESHOLDS in s.attributes), None
    )
    return Thresholds.from_json(recorded) if recorded is not None else Thresholds()


def load_steps(path: Path) -> list[StepRecord]:
    """Steps from a file, or from every `*.jsonl` file of a directory; sorted by step."""
    return load_run(path).steps


@contextmanager
def without_gc() -> Iterator[None]:
    """Reading a run makes millions of small dicts and frees few: the cyclic collector's
    passes over the growing heap cost ~40 % of a 10,000-step read and find nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load_run(path: Path) -> Run:
    """A traces file, a directory of them (plus the demo's summary.json), or a verl log."""
    with without_gc():
        return _load_run(Path(path))


def _load_run(path: Path) -> Run:
    run = Run(source=path, files=list(otlp_json.iter_files(path)))
    logged: dict[int, dict[str, float]] = {}
    for file in run.files:
        with file.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if line.strip():
                    _read_line(line, run, logged)
    run.spans = otlp_json.align_clocks(_without_superseded_partials(run.spans))
    summary_path = path / SUMMARY_FILE if path.is_dir() else None
    if summary_path is not None and summary_path.is_file():
        run.summary = _read_summary(summary_path)
    steps = _steps_from_spans(run.spans)
    traced = {s.number for s in steps}
    steps += [s for s in _steps_from_verl_log(logged) if s.number not in traced]
    if not steps and run.summary is not None:
        steps = _steps_from_summary(run.summary)
    elif run.summary is not None:
        _merge_summary_metrics(steps, run.summary)
    run.steps = sorted(steps, key=lambda s: s.number)
    return run


def _without_superseded_partials(spans: list[SpanRecord]) -> list[SpanRecord]:
    """A stalled phase's partial span (`rl.stalled`, exported while it hung) and its trace's
    open spans come again, complete, if the trace closed: keep the complete ones."""
    partial = {
        (s.trace_id, s.span_id)
        for s in spans
        if s.attributes.get(attr.INCOMPLETE) and s.attributes.get(attr.OPEN_S) is not None
    }
    if not partial:
        return spans
    complete = {
        (s.trace_id, s.span_id)
        for s in spans
        if (s.trace_id, s.span_id) in partial and s.attributes.get(attr.OPEN_S) is None
    }
    return [
        s
        for s in spans
        if not ((s.trace_id, s.span_id) in complete and s.attributes.get(attr.OPEN_S) is not None)
    ]


def _read_line(line: str, run: Run, logged: dict[int, dict[str, float]]) -> None:
    record = otlp_json.parse_line(line)
    if record is None:
        run.skipped_lines += 1
        return
    spans = otlp_json.decode_or_none(record)
    if spans is not None:
        run.spans.extend(spans)
    elif _is_verl_log_line(record):
        logged.setdefault(int(record["step"]), {}).update(record["data"])
    else:
        run.skipped_lines += 1


def _is_verl_log_line(record: dict[str, Any]) -> bool:
    step = record.get("step")
    return (
        isinstance(step, int)
        and not isinstance(step, bool)
        and isinstance(record.get("data"), dict)
    )


def _read_summary(path: Path) -> dict[str, Any] | None:
    try:
        summary = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except ValueError:
        return None
    return summary if isinstance(summary, dict) and isinstance(summary.get("steps"), list) else None


def _steps_from_spans(spans: list[SpanRecord]) -> list[StepRecord]:
    by_trace: dict[str, list[SpanRecord]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
    steps = []
    for trace in by_trace.values():
        root = next((s for s in trace if s.name == "step" and not s.parent_span_id), None)
        if root is None:
            continue
        timing: dict[str, float] = {}
        top_level: set[str] = set()  # the step's own windows (a nested one never competes)
        stragglers: dict[str, tuple[int, float]] = {}
        compute_stragglers: dict[str, tuple[int, float]] = {}
        for span in sorted(trace, key=lambda s: s.start_ns):  # phases in the order they ran
            if span.resource != root.resource:
                continue  # another process's spans (workers) are in the tree, not the ledger
            if span is not root and attr.PHASE in span.attributes:
                timing[span.name] = timing.get(span.name, 0) + span.seconds
                if span.parent_span_id == root.span_id:
                    top_level.add(span.name)
                _rank_spread(span, attr.SLOWEST_RANK, attr.RANK_SPREAD, stragglers)
                _rank_spread(
                    span, attr.RANK_COMPUTE_SLOWEST, attr.RANK_COMPUTE_SPREAD, compute_stragglers
                )
        timing["step"] = root.seconds
        attributes = root.attributes
        prompt = attributes.get(attr.TOKENS_PROMPT)
        response = attributes.get(attr.TOKENS_RESPONSE)
        metrics = formulas.timing_metrics(timing, prompt, response)
        number = int(attributes.get(attr.STEP, -1))
        mfu = {
            k[len(attr.MFU_PREFIX) :]: v
            for k, v in attributes.items()
            if k.startswith(attr.MFU_PREFIX)
        }
        metrics.update({f"{voc.MFU}{role}": value for role, value in mfu.items()})
        metrics[voc.TIME_PER_STEP] = root.seconds
        if prompt is not None and response is not None:
            metrics[voc.TOTAL_NUM_TOKENS] = prompt + response
        if attr.THROUGHPUT in attributes:
            metrics[voc.THROUGHPUT] = attributes[attr.THROUGHPUT]
        recorded = StepFacts.from_json(attributes[FACTS]) if FACTS in attributes else None
        facts = recorded or StepFacts(  # a trace without them (older): read from the spans
            number,
            timing,
            unaccounted=attributes.get(attr.UNACCOUNTED_S),
            response_tokens=response,
            sequences=attributes.get(attr.SEQUENCES),
            mfu=mfu,
            agent_loop=_slowest_from_samples(trace),
            stragglers=stragglers,
            compute_stragglers=compute_stragglers,
            top_level=frozenset(top_level),
        )
        steps.append(StepRecord(number, timing, metrics, facts, root, recorded is not None))
    return steps


def _rank_spread(
    span: SpanRecord, rank_key: str, spread_key: str, into: dict[str, tuple[int, float]]
) -> None:
    """A driver phase's slowest rank and spread (replies, or compute), as the ledger's
    verdict read them; the phase's widest span if it ran more than once."""
    rank, spread = span.attributes.get(rank_key), span.attributes.get(spread_key)
    if (
        isinstance(rank, int)
        and isinstance(spread, (int, float))
        and (span.name not in into or spread > into[span.name][1])
    ):
        into[span.name] = (rank, float(spread))


def _slowest_from_samples(trace: list[SpanRecord]) -> dict[str, float]:
    """The slowest exported sample's stages, as verl's agent_loop/slowest/* keys."""
    samples = [s for s in trace if s.name == attr.SAMPLE_SPAN]
    if not samples:
        return {}

    def total(span: SpanRecord) -> float:
        return sum(span.attributes.get(key, 0.0) for key in _STAGE_KEYS.values())

    slowest = max(samples, key=total)
    keys = {
        f"{voc.AGENT_LOOP_SLOWEST}{stage}": slowest.attributes.get(key, 0.0)
        for stage, key in _STAGE_KEYS.items()
    }
    if attr.OUTPUT_TOKENS in slowest.attributes:
        keys[voc.AGENT_LOOP_SLOWEST + voc.RESPONSE_LENGTH] = slowest.attributes[attr.OUTPUT_TOKENS]
    return keys


def _numeric(data: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in data.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def _steps_from_verl_log(logged: dict[int, dict[str, Any]]) -> list[StepRecord]:
    steps = []
    for number, data in logged.items():
        timing = voc.timing_from_metrics(data)
        if voc.STEP not in timing:
            continue
        metrics = _numeric(data)
        facts = StepFacts.from_metrics(number, timing, metrics)
        steps.append(StepRecord(number, timing, metrics, facts))
    return steps


def _steps_from_summary(summary: dict[str, Any]) -> list[StepRecord]:
    """The demo's summary.json alone (its traces missing): timing_raw and metrics per step."""
    logged = {}
    for step in summary["steps"]:
        if isinstance(step, dict) and isinstance(step.get("number"), int):
            timing = step.get("timing_raw") or {}
            metrics = step.get("metrics") or {}
            logged[step["number"]] = {
                **{f"{voc.TIMING_S}{k}": v for k, v in timing.items()},
                **metrics,
            }
    return _steps_from_verl_log(logged)


def _merge_summary_metrics(steps: list[StepRecord], summary: dict[str, Any]) -> None:
    """Keys only the summary has (goodput, idle ratios, staleness, ...) join the span steps."""
    by_number = {s.get("number"): s for s in summary["steps"] if isinstance(s, dict)}
    for step in steps:
        logged = by_number.get(step.number)
        if logged and isinstance(logged.get("metrics"), dict):
            for key, value in _numeric(logged["metrics"]).items():
                step.metrics.setdefault(key, value)
            if step.recorded:
                continue  # the verdict's facts as the live one read them: nothing to add
            logged_loop = StepFacts.from_metrics(step.number, {}, step.metrics).agent_loop
            step.facts = replace(step.facts, agent_loop={**logged_loop, **step.facts.agent_loop})


def resolve_capture_path(recorded: str, source: Path) -> Path | None:
    """A capture file as recorded (absolute or relative to where the run ran), else found
    by name under the run directory (a run copied elsewhere keeps working)."""
    if not recorded:
        return None
    path = Path(recorded)
    if path.is_file():
        return path.resolve()
    base = source if source.is_dir() else source.parent
    for candidate in (base / path, base / "profile" / path.name):
        if candidate.is_file():
            return candidate.resolve()
    return next(base.rglob(path.name), None)
