"""A closed step's derived numbers: built once, from what the ledger recorded.

The ledger only records (phase times, tokens, MFU, samples, ranks' seconds). Everything
verl derives from that — `timing_raw`, `timing_s/*`, `perf/*`, `agent_loop/*` — and what
rlotel adds (staleness, goodput, async bias, occupancy, the facts a verdict is read from)
is computed here, as a pure function of the record. The pipeline builds it before fan-out
and adds the verdict; every sink then reads `step.summary` the same way. A training-thread
reader that asks first (`step.metrics` right after the step closes) gets the very same
object, built once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlotel.derive import async_bias, goodput, occupancy, sources, staleness
from rlotel.derive.diagnose import StepFacts, Verdict
from rlotel.record import ranks, samples
from rlotel.schema import formulas, vocabulary
from rlotel.schema.data_moves import DataMoves


class StepRecord(Protocol):
    """What a summary is built from: a closed step as the ledger recorded it."""

    number: int
    trace: Any  # rlotel.record.ledger.Trace (the ledger is below this layer: not imported)
    prompt_tokens: int | float | None
    response_tokens: int | float | None
    mfu: Mapping[str, float]
    sequences: int | None
    rank_seconds: Mapping[int, ranks.RankSeconds]
    rank_compute: Mapping[int, ranks.RankCompute]
    data_moves: Mapping[int, DataMoves]

    @property
    def total_tokens(self) -> int | float | None: ...


@dataclass(frozen=True)
class StepSummary:
    timing_raw: dict[str, float]  # verl's: seconds per phase name (repeats summed), `step`
    metrics: dict[str, float]  # verl's keys and rlotel's (staleness, goodput, bias, ...)
    unaccounted_seconds: float  # step time covered by no top-level phase
    consumed: staleness.Consumed | None  # weight versions of the trained samples
    occupancy: dict[str, occupancy.Occupancy] = field(default_factory=dict)  # by replica
    facts: StepFacts | None = None  # what the bottleneck verdict is read from
    verdict: Verdict | None = None  # added by the pipeline, with the run's trends
    sources: dict[str, sources.SourceFigures] = field(default_factory=dict)  # by data source


def summarize(step: StepRecord, n_gpus: int, buckets: goodput.PhaseBuckets) -> StepSummary:
    """verl's numbers (and rlotel's) of one closed step; `verdict` left to the pipeline."""
    trace = step.trace
    timing: dict[str, float] = {}
    top_level: list[goodput.Window] = []  # one pass: verl's sums and the top-level windows
    seconds_of = timing.get
    for record in trace.records:
        end = record.end_ns
        if end:
            name, start = record.name, record.start_ns
            timing[name] = seconds_of(name, 0) + (end - start) / 1e9  # `record.seconds`
            if record.parent is None:
                top_level.append((name, start, end))
    timing[vocabulary.STEP] = trace.root.seconds
    metrics = formulas.timing_metrics(timing, step.prompt_tokens, step.response_tokens)
    metrics.update(formulas.throughput_metrics(timing, step.total_tokens, n_gpus))
    metrics.update(formulas.mfu_metrics(step.mfu))
    consumed, replicas, by_source = None, {}, {}
    if trace.samples:
        trained = [batch for batch in trace.samples if batch.discarded is None]
        if trained:
            metrics.update(samples.verl_aggregates(trained))
            consumed = staleness.consumed(step.number, trained)
            metrics.update(staleness.off_policy_metrics(consumed))
            metrics.update(staleness.token_weighted(step.number, trained))
        metrics.update(async_bias.bias_metrics(trace.samples, buckets.is_async))
        replicas = occupancy.by_replica(trace.samples)
        by_source = sources.step_figures(trace.samples)
        metrics.update(occupancy.step_metrics(replicas))
    root = trace.root
    metrics.update(
        goodput.trace_metrics(
            top_level,
            root.start_ns,
            root.end_ns,
            buckets,
            metrics.get(vocabulary.ROLLOUT_TAIL_SECONDS, 0.0),
        )
    )
    covered = vocabulary.covered_by_intervals(  # within the step (`generate_async` is beside)
        (max(start, root.start_ns), min(end, root.end_ns)) for _, start, end in top_level
    )
    unaccounted = vocabulary.unaccounted(timing[vocabulary.STEP], covered)
    facts = StepFacts.from_metrics(
        step.number,
        timing,
        metrics,
        unaccounted=unaccounted,
        response_tokens=step.response_tokens,
        sequences=step.sequences,
        top_level=frozenset(name for name, _, _ in top_level),
        stragglers={
            spread.phase: (spread.slowest_rank, spread.spread)
            for spread in ranks.spreads(step.rank_seconds).values()
        },
        compute_stragglers={
            spread.phase: (spread.slowest_rank, spread.spread)
            for spread in ranks.compute_spreads(step.rank_compute).values()
        },
        data_movement=data_movement(step.data_moves, trace.records),
    )
    return StepSummary(
        timing, metrics, unaccounted, consumed, replicas or {}, facts, sources=by_source
    )


def data_movement(
    moves: Mapping[int, DataMoves], records: Iterable[Any]
) -> dict[str, dict[str, float]]:
    """Top-level window → its worker-group calls' seconds by stage and bytes (a call made in
    a phase nested in a window counts in that window; windows of one name summed)."""
    window_of = {}
    for record in records:
        top = record
        while top.parent is not None:
            top = top.parent
        window_of[record.span_id] = top.name
    by_window: dict[str, dict[str, float]] = {}
    for span_id, record in moves.items():
        into = by_window.setdefault(window_of.get(span_id, record.phase), {})
        for key, value in record.facts().items():
            into[key] = into.get(key, 0) + value
    return by_window
