"""The recorder: closed steps, samples and verl's logged keys → catalogue series.

The one place that knows which series a step, a sample batch or a `tel.log` key becomes;
it writes the series store that every metrics exporter reads. It is the pipeline's
metrics sink, on the publisher thread.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlotel.base.drops import Drops, as_finite_float, describe, encodable
from rlotel.derive import sources
from rlotel.publish.sink import Sink
from rlotel.record import ranks
from rlotel.record.capture import Capture
from rlotel.record.ledger import RemotePhase, Step, Trace
from rlotel.record.samples import DURATION_FIELDS, LENGTH_KINDS, PREEMPTED, SampleBatch
from rlotel.schema import catalogue as cat
from rlotel.schema import vocabulary as voc
from rlotel.series.store import Exemplar, SeriesStore

if TYPE_CHECKING:
    from rlotel.derive.stall import OpenPhase


class Recorder(Sink):
    """Maps closed steps, sample batches, captures and `tel.log` dicts onto the store."""

    def __init__(
        self, store: SeriesStore, drops: Drops, rank: tuple[str, str] | None = None
    ) -> None:
        self.store = store
        self._drops = drops
        self._rank = rank  # (role, rank) of a worker process: its calls become per-rank series
        self._rank_calls: dict[str, tuple[int, float]] = {}  # method → (trace id, seconds)
        self._phases_seen: set[str] = set()
        self._open_seen: set[str] = set()  # phases whose open age was ever exposed
        self._ledger_keys: set[str] = set()  # verl keys the last ledger step produced
        self._last_counted = -1
        self._tokens_split = False  # the ledger counts tokens by part: verl's total is a sum

    def on_step(self, step: Step) -> None:
        self.observe_step(step)
        self.on_trace(step.trace)
        consumed = step.summary.consumed  # verl V1's per-trajectory staleness and version span
        if consumed is not None:
            self.store.observe_counts(cat.SAMPLE_STALENESS, *consumed.staleness)
            self.store.observe_counts(cat.SAMPLE_WEIGHT_SPAN, *consumed.spans)
        for replica, measured in step.summary.occupancy.items():  # rlotel.derive.occupancy
            self.store.set(cat.ROLLOUT_OCCUPANCY, measured.ratio, replica)
            self.store.set(cat.ROLLOUT_TAIL, measured.tail_seconds, replica)

    def on_trace(self, trace: Trace) -> None:
        if self._rank is not None and isinstance(trace.root, RemotePhase):
            self.observe_rank_call(trace)
        for batch in trace.samples:
            self.on_samples(batch)
        rank_time = trace.rank_time
        if rank_time is not None:  # a worker call: compute vs collectives of this rank
            labels = (rank_time.phase, rank_time.role, str(rank_time.rank))
            self.store.set(cat.RANK_COMPUTE, rank_time.compute_s, *labels)
            self.store.set(cat.RANK_COLLECTIVE, rank_time.collective_s, *labels)

    def on_log(self, data: Mapping[str, Any], step: Any) -> None:
        self.observe_log(data, step)

    def on_capture(self, capture: Capture) -> None:
        self.store.inc(cat.PROFILE_CAPTURES, 1.0, capture.tool)

    def on_open_phases(self, phases: Sequence[OpenPhase]) -> None:
        """Each watched phase's open age and stall flag; 0 once it has no open span."""
        store, open_now = self.store, {phase.name: phase for phase in phases}
        self._open_seen.update(open_now)
        for name in self._open_seen:
            phase = open_now.get(name)
            store.set(cat.PHASE_OPEN, phase.age_s if phase else 0.0, name)
            store.set(cat.PHASE_STALLED, 1.0 if phase and phase.stalled else 0.0, name)

    def observe_rank_call(self, trace: Trace) -> None:
        """A method the driver called on this worker (a remote phase): its seconds within
        the driver's step, which is the call's trace (one trace per step). A method called
        again in the same step adds up; its first call in a later step starts over."""
        call = trace.root
        last_trace, last_s = self._rank_calls.get(call.name, (0, 0.0))  # trace ids are never 0
        seconds = call.seconds + (last_s if last_trace == trace.trace_id else 0.0)
        self._rank_calls[call.name] = (trace.trace_id, seconds)
        self.store.set(cat.RANK_PHASE_SECONDS, seconds, call.name, *self._rank)

    # --- closed steps (publisher thread) ---------------------------------------------------

    def observe_step(self, step: Step) -> None:
        store = self.store
        self._ledger_keys = set(step.metrics)
        self._tokens_split |= step.prompt_tokens is not None
        phases = {name: value for name, value in step.timing_raw.items() if name != "step"}
        # The next tick exposes every phase of the step and the step itself (0 while none is
        # open), whether or not a tick happened to fall inside it.
        self._open_seen.update(step.timing_raw)
        self._set_phase_seconds(phases)
        for name, value in phases.items():
            store.observe(cat.PHASE_DURATION, np.array([value]), name)
        seconds = step.timing_raw["step"]
        store.set(cat.STEP_TIME, seconds)
        store.observe(cat.STEP_DURATION, np.array([seconds]))
        store.set(cat.STEP_UNACCOUNTED, step.unaccounted_seconds)
        verdict = step.summary.verdict
        if verdict is not None:
            store.replace(cat.BOTTLENECK, 1.0, verdict.kind, verdict.detail)
        self._count_step(step.number)
        for spread in ranks.spreads(step.rank_seconds).values():
            store.set(cat.PHASE_RANK_SPREAD, spread.spread, spread.phase)
        for spread in ranks.compute_spreads(step.rank_compute).values():
            store.set(cat.PHASE_RANK_COMPUTE_SPREAD, spread.spread, spread.phase)
        for moves in step.data_moves.values():
            for stage, seconds in moves.seconds.items():
                store.inc(cat.DATA_MOVEMENT_SECONDS, seconds, moves.phase, stage)
            for direction, moved in moves.bytes.items():
                store.inc(cat.DATA_MOVEMENT_BYTES, float(moved), moves.phase, direction)
        self._observe_goodput(step.metrics)
        for key, value in step.metrics.items():
            if key.startswith((voc.AGENT_LOOP, voc.OFF_POLICY)) and not key.startswith(
                voc.AGENT_LOOP_SLOWEST
            ):
                continue  # min/max/mean are verl's view; the histograms hold every sample
            if not key.startswith((voc.TIMING_S, voc.RLOTEL)):
                self._map_known(key, value)
        if step.prompt_tokens is not None:
            for kind, count in (("prompt", step.prompt_tokens), ("response", step.response_tokens)):
                store.set(cat.STEP_TOKENS, float(count), kind)
                store.inc(cat.TOKENS, float(count), kind)

    def _observe_goodput(self, metrics: Mapping[str, float]) -> None:
        """rlotel.derive.goodput's per-step keys: goodput, seconds by bucket, idle ratio by role."""
        store = self.store
        if voc.GOODPUT in metrics:
            store.set(cat.GOODPUT, metrics[voc.GOODPUT])
        for key, value in metrics.items():
            if key.startswith(voc.BUCKET_SECONDS):
                store.inc(cat.BUCKET_SECONDS, value, key[len(voc.BUCKET_SECONDS) :])
            elif key.startswith(voc.IDLE_RATIO):
                store.set(cat.ROLE_IDLE, value, key[len(voc.IDLE_RATIO) :])
            elif key.startswith(voc.ASYNC_BIAS_KS):
                store.set(cat.ASYNC_BIAS_KS, value, key[len(voc.ASYNC_BIAS_KS) :])

    def _set_phase_seconds(self, phases: Mapping[str, float]) -> None:
        self._phases_seen.update(phases)
        for name in self._phases_seen:
            self.store.set(cat.STEP_PHASE_SECONDS, phases.get(name, 0.0), name)

    def _count_step(self, number: int) -> None:
        self.store.inc(cat.STEPS, 1.0)
        self.store.set(cat.STEP, float(number))
        self.store.set(cat.LAST_STEP_TIMESTAMP, time.time())
        self._last_counted = number

    def _exemplars(
        self, batch: SampleBatch, name: str, spec: cat.MetricSpec, timestamp: float
    ) -> list[Exemplar]:
        """The slowest sample span of each bucket (the one a bucket keeps), found with
        numpy: a step with 10k traced samples builds ~20 exemplars, not 10k."""
        column = batch.columns[name]
        spans = [span for span in batch.spans if span.index < column.size]
        if not spans:
            return []
        values = column[[span.index for span in spans]]
        measured = ~np.isnan(values)
        spans = [span for span, keep in zip(spans, measured.tolist(), strict=True) if keep]
        values = values[measured]
        if not spans:
            return []
        buckets = np.searchsorted(np.asarray(self.store.bounds(spec)), values, side="left")
        order = np.lexsort((values, buckets))  # by bucket, then value: each bucket's max last
        last = order[np.append(buckets[order][1:] != buckets[order][:-1], True)]
        trace_id = f"{batch.trace_id:032x}"
        return [
            Exemplar(
                {"trace_id": trace_id, "span_id": f"{spans[i].span_id:016x}"},
                float(values[i]),
                timestamp,
            )
            for i in last.tolist()
        ]

    def on_samples(self, batch: SampleBatch) -> None:
        """Every valid sample into the stage/length histograms; sample spans as exemplars.
        Samples generated and never trained are only counted, by reason."""
        if batch.discarded is not None:
            self.store.inc(cat.SAMPLES_DISCARDED, float(batch.size), batch.discarded)
            return
        age_s = (time.perf_counter_ns() - batch.end_ns) / 1e9 if batch.end_ns else 0.0
        timestamp = time.time() - age_s
        for name, spec, label in (
            *((f, cat.AGENT_LOOP_DURATION, f) for f in DURATION_FIELDS),
            *((f, cat.AGENT_LOOP_LENGTH, kind) for f, kind in LENGTH_KINDS.items()),
        ):
            if name not in batch.columns:
                continue
            exemplars = self._exemplars(batch, name, spec, timestamp)
            self.store.observe(spec, batch.valid(name), label, exemplars=exemplars)
        if PREEMPTED in batch.columns:
            reported = batch.valid(PREEMPTED)
            self.store.inc(cat.AGENT_LOOP_PREEMPTIONS, float(reported[reported >= 0].sum()))
        for method, spec, value, labels in sources.series(batch):  # and by data source
            getattr(self.store, method)(spec, value, *labels)

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
            elif (phase := voc.phase_of_timing_key(key)) is not None:
                if value < 0:
                    self._drops.add("metrics", "negative", f"{key}={value}")
                elif not encodable(key):
                    self._drops.add("metrics", "bad_label", "a timing_s/ key is not valid UTF-8")
                else:
                    phases[phase] = value
            elif fresh or key not in self._ledger_keys:
                self._map_known(key, value)  # what the ledger's step did not already say
        if not fresh:
            return
        seconds = phases.pop(voc.STEP, None)
        if phases:
            self._set_phase_seconds(phases)
        if number is None:
            return
        if seconds is not None:
            self.store.set(cat.STEP_TIME, seconds)
            self.store.observe(cat.STEP_DURATION, np.array([seconds]))
            covered = voc.covered_by_windows(phases)
            self.store.set(cat.STEP_UNACCOUNTED, voc.unaccounted(seconds, covered))
        for name, value in phases.items():
            self.store.observe(cat.PHASE_DURATION, np.array([value]), name)
        self._count_step(int(number))

    def _map_known(self, key: str, value: float) -> None:
        """Gauges of one verl metric key; unknown keys go to the capped generic gauge, where
        a negative value stands (a loss may be below 0) unless it is a `timing_s/` key."""
        target: tuple = (cat.TRAIN_METRIC, value, key)
        reason = voc.eviction_reason(key)
        if reason is not None:
            target = (cat.REPLAY_EVICTED, value, reason)
        elif key.startswith(voc.TIMING_PER_TOKEN_MS):
            target = (cat.PHASE_TIME_PER_TOKEN, value / 1000, key[len(voc.TIMING_PER_TOKEN_MS) :])
        elif key == voc.THROUGHPUT:
            target = (cat.THROUGHPUT, value)
        elif key == voc.TIME_PER_STEP:
            target = (cat.STEP_TIME, value)
        elif key == voc.TOTAL_NUM_TOKENS:
            if self._tokens_split:
                return  # counted by part (prompt, response); the total is their sum
            target = (cat.STEP_TOKENS, value, cat.TOKENS_UNSPLIT)
        elif key.startswith(voc.MFU):
            target = (cat.MFU, value, key[len(voc.MFU) :])
        elif key.startswith((voc.AGENT_LOOP_SLOWEST, voc.TIMING_S + voc.AGENT_LOOP_SLOWEST)):
            field = key.rsplit("/", 1)[1]
            if field in DURATION_FIELDS:
                target = (cat.AGENT_LOOP_SLOWEST, value, field)
            elif field in LENGTH_KINDS:
                target = (cat.AGENT_LOOP_SLOWEST_LENGTH, value, LENGTH_KINDS[field])
        if value < 0 and (target[0] is not cat.TRAIN_METRIC or key.startswith(voc.TIMING_S)):
            self._drops.add("metrics", "negative", f"{key}={value}")
        elif reason is not None:
            self.store.inc(*target)  # evicted samples: a count
        else:
            self.store.set(*target)
            if key == voc.TOTAL_NUM_TOKENS:  # only verl's total is known: counted once, unsplit
                self.store.inc(cat.TOKENS, value, cat.TOKENS_UNSPLIT)
