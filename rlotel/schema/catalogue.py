"""The one list of rlotel's Prometheus metrics.

Exporters, the dashboards builder and the alert rules import these specs, so a panel or
rule that names a metric missing here fails the build instead of showing an empty graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Kind = Literal["gauge", "counter", "histogram"]

PREFIX = "rlotel_"

# RL windows span milliseconds (a reward call) to an hour (a long rollout or checkpoint):
# roughly three buckets per decade from 10 ms to 3600 s.
_DECADES = np.outer(10.0 ** np.arange(-2, 4), [1.0, 2.5, 5.0]).ravel()
DURATION_BUCKETS: tuple[float, ...] = (
    *(float(f"{v:.3g}") for v in _DECADES if v < 3600.0),
    3600.0,
)

# Per-sample windows are shorter than phases (a reward call, a tool call): from 1 ms.
_SAMPLE_DECADES = np.outer(10.0 ** np.arange(-3, 4), [1.0, 2.5, 5.0]).ravel()
SAMPLE_DURATION_BUCKETS: tuple[float, ...] = (
    *(float(f"{v:.3g}") for v in _SAMPLE_DECADES if v < 3600.0),
    3600.0,
)
# Prompt and response lengths: powers of two from 1 to 2^20 (~1M) tokens.
LENGTH_BUCKETS: tuple[float, ...] = tuple(float(2**k) for k in range(21))


@dataclass(frozen=True)
class MetricSpec:
    """Name, kind, unit and labels of one metric family; `run` is added to every series."""

    name: str
    kind: Kind
    unit: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    @property
    def label_names(self) -> tuple[str, ...]:
        return ("run", *self.labels)

    @property
    def sample_names(self) -> tuple[str, ...]:
        return exposed_names(self.name, self.kind)


def exposed_names(name: str, kind: Kind) -> tuple[str, ...]:
    """A family's series names as the text exposition writes them (what PromQL queries)."""
    if kind == "counter":
        return (f"{name}_total",)
    if kind == "histogram":
        return (f"{name}_bucket", f"{name}_sum", f"{name}_count")
    return (name,)


STEP_PHASE_SECONDS = MetricSpec(
    "rlotel_step_phase_seconds",
    "gauge",
    "seconds",
    "Seconds spent in each phase during the last completed step (0 for a phase seen earlier "
    "in the run but absent from that step).",
    ("phase",),
)
PHASE_DURATION = MetricSpec(
    "rlotel_phase_duration_seconds",
    "histogram",
    "seconds",
    "Per-step total seconds of each phase (repeated phases within a step are summed).",
    ("phase",),
    DURATION_BUCKETS,
)
STEP_TIME = MetricSpec(
    "rlotel_step_time_seconds",
    "gauge",
    "seconds",
    "Wall time of the last completed step (verl perf/time_per_step).",
)
STEP_DURATION = MetricSpec(
    "rlotel_step_duration_seconds",
    "histogram",
    "seconds",
    "Wall time of every completed step.",
    (),
    DURATION_BUCKETS,
)
STEP_UNACCOUNTED = MetricSpec(
    "rlotel_step_unaccounted_seconds",
    "gauge",
    "seconds",
    "Seconds of the last step covered by no top-level phase (waiting between windows).",
)
STEPS = MetricSpec("rlotel_steps", "counter", "", "Completed steps.")
STEP = MetricSpec("rlotel_step", "gauge", "", "Global step of the last completed or logged step.")
LAST_STEP_TIMESTAMP = MetricSpec(
    "rlotel_last_step_timestamp_seconds",
    "gauge",
    "seconds",
    "Unix time at which the last step completed (alert when it stops moving).",
)
PHASE_TIME_PER_TOKEN = MetricSpec(
    "rlotel_phase_time_per_token_seconds",
    "gauge",
    "seconds",
    "verl timing_per_token_ms of the last step, in seconds per token.",
    ("phase",),
)
THROUGHPUT = MetricSpec(
    "rlotel_throughput_tokens_per_second_per_gpu",
    "gauge",
    "",
    "verl perf/throughput of the last step: total tokens / (step seconds * GPUs).",
)
STEP_TOKENS = MetricSpec(
    "rlotel_step_tokens",
    "gauge",
    "tokens",
    "Tokens in the last step by kind: prompt and response, or unsplit where only verl's total"
    " is known. Each token is counted under one kind; the total is sum without (kind).",
    ("kind",),
)
TOKENS = MetricSpec(
    "rlotel_tokens",
    "counter",
    "tokens",
    "Tokens processed by kind (as rlotel_step_tokens).",
    ("kind",),
)
TOKENS_UNSPLIT = "unsplit"  # the kind of verl's perf/total_num_tokens when its parts are unknown
MFU = MetricSpec(
    "rlotel_mfu_ratio",
    "gauge",
    "ratio",
    "Model FLOPs utilisation of the last step by role (verl perf/mfu/*).",
    ("role",),
)
TRAIN_METRIC = MetricSpec(
    "rlotel_train_metric",
    "gauge",
    "",
    "Any other numeric scalar passed to tel.log, by key (distinct keys are capped).",
    ("key",),
)
AGENT_LOOP_DURATION = MetricSpec(
    "rlotel_agent_loop_duration_seconds",
    "histogram",
    "seconds",
    "Per-sample agent-loop seconds by stage (generate_sequences, tool_calls, compute_score); "
    "exemplars link the slowest samples to their spans.",
    ("stage",),
    SAMPLE_DURATION_BUCKETS,
)
AGENT_LOOP_LENGTH = MetricSpec(
    "rlotel_agent_loop_length_tokens",
    "histogram",
    "tokens",
    "Per-sample prompt and response lengths.",
    ("kind",),
    LENGTH_BUCKETS,
)
AGENT_LOOP_PREEMPTIONS = MetricSpec(
    "rlotel_agent_loop_preemptions",
    "counter",
    "",
    "Preemptions reported by agent-loop samples (samples reporting -1, unknown, add nothing).",
)
AGENT_LOOP_SLOWEST = MetricSpec(
    "rlotel_agent_loop_slowest_seconds",
    "gauge",
    "seconds",
    "Stage seconds of the last step's slowest sample (verl agent_loop/slowest/*).",
    ("stage",),
)
AGENT_LOOP_SLOWEST_LENGTH = MetricSpec(
    "rlotel_agent_loop_slowest_length_tokens",
    "gauge",
    "tokens",
    "Prompt and response length of the last step's slowest sample.",
    ("kind",),
)
PROFILE_CAPTURES = MetricSpec(
    "rlotel_profile_captures",
    "counter",
    "",
    "Profiler captures linked from step spans, by tool (torch, torch_memory, nsys).",
    ("tool",),
)
BOTTLENECK = MetricSpec(
    "rlotel_step_bottleneck",
    "gauge",
    "",
    "1 for the last step's bottleneck verdict (rlotel.derive.diagnose); one series per run.",
    ("verdict", "detail"),
)
DROPPED = MetricSpec(
    "rlotel_telemetry_dropped",
    "counter",
    "",
    "Telemetry inputs dropped, by signal and reason; training is never interrupted.",
    ("signal", "reason"),
)
INTEGRATION_EVENTS = MetricSpec(
    "rlotel_integration_events",
    "counter",
    "",
    "Times each zero-code integration hook fired in this process (verl's timers, Tracking, "
    "replay batches, worker calls, ...); one that stops counting has stopped firing.",
    ("hook",),
)
INTEGRATION_SECONDS = MetricSpec(
    "rlotel_integration_seconds",
    "counter",
    "seconds",
    "Seconds the hooks that do work in the caller's thread cost it (e.g. the V1 replay "
    "batch's per-sample read, inside verl's gen window).",
    ("hook",),
)
INTEGRATION_FAILURES = MetricSpec(
    "rlotel_integration_failures",
    "counter",
    "",
    "Times rlotel's own part of a zero-code hook raised in this process; the library's call "
    "ran on as it would without rlotel (one log line per hook).",
    ("hook",),
)
INTEGRATION_HOOKS = MetricSpec(
    "rlotel_integration_hooks",
    "gauge",
    "",
    "1 for each zero-code hook of this process in its state (attached; not_attached: its "
    "target moved or its patch raised, the telemetry it gives is lost); `rlotel doctor` reads "
    "it with the events and failures.",
    ("hook", "state"),
)

# Weight versions a sample lags or spans: integers, fine where small, coarser further out.
STEP_COUNT_BUCKETS: tuple[float, ...] = tuple(
    float(n) for n in (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
)

PHASE_OPEN = MetricSpec(
    "rlotel_phase_open_seconds",
    "gauge",
    "seconds",
    "Age of the quietest open span of each phase in this process (0 while none is open): a "
    "stuck step never closes, this shows it while it hangs.",
    ("phase",),
)
PHASE_STALLED = MetricSpec(
    "rlotel_phase_stalled",
    "gauge",
    "",
    "1 while none of the phase's open spans has shown progress (child phases, samples, "
    "worker replies, work other processes run under it) for stall_after_s "
    "(RLOTEL_STALL_AFTER_S), else 0; how long it ran is no part of it.",
    ("phase",),
)
PHASE_RANK_SPREAD = MetricSpec(
    "rlotel_phase_rank_spread_ratio",
    "gauge",
    "ratio",
    "Slowest rank's seconds divided by the median rank's, for each phase of the last step that "
    "ran on several ranks (1 = balanced).",
    ("phase",),
)
RANK_PHASE_SECONDS = MetricSpec(
    "rlotel_rank_phase_seconds",
    "gauge",
    "seconds",
    "Seconds one worker process (a rank of a worker group: role, rank) spent in each method "
    "the driver called, during the latest driver step that called it (its trace), summed "
    "over that step's calls. Only worker processes write it.",
    ("phase", "role", "rank"),
)
PHASE_RANK_COMPUTE_SPREAD = MetricSpec(
    "rlotel_phase_rank_compute_spread_ratio",
    "gauge",
    "ratio",
    "Slowest rank's compute seconds (outside torch.distributed collectives) divided by the "
    "median rank's, for each phase of the last step whose ranks reported them (1 = balanced; "
    "under collectives every rank replies together, so this is the straggler's tell).",
    ("phase",),
)
RANK_COMPUTE = MetricSpec(
    "rlotel_rank_compute_seconds",
    "gauge",
    "seconds",
    "A worker rank's seconds outside torch.distributed collectives in its last traced call "
    "of each phase (its own compute); exposed by the worker process.",
    ("phase", "role", "rank"),
)
RANK_COLLECTIVE = MetricSpec(
    "rlotel_rank_collective_seconds",
    "gauge",
    "seconds",
    "A worker rank's seconds inside torch.distributed collectives (waiting for the other "
    "ranks, plus the transfer) in its last traced call of each phase; exposed by the worker.",
    ("phase", "role", "rank"),
)
DATA_MOVEMENT_SECONDS = MetricSpec(
    "rlotel_data_movement_seconds",
    "counter",
    "seconds",
    "Seconds of the driver's worker-group calls by phase and stage: dispatch, serialize, "
    "submit, wait, transfer, deserialize, read, work, write, fetch, collect and other add up "
    "to the calls' wall time (serialize and deserialize: DataProto's pickling; read and "
    "write: the slowest rank's TransferQueue reads and writes).",
    ("phase", "stage"),
)
DATA_MOVEMENT_BYTES = MetricSpec(
    "rlotel_data_movement_bytes",
    "counter",
    "bytes",
    "Bytes the driver's worker-group calls moved by phase and direction: sent to and "
    "returned from the ranks with the calls, read from and written to TransferQueue by the "
    "ranks (tensor and array sizes).",
    ("phase", "direction"),
)
QUEUE_SECONDS = MetricSpec(
    "rlotel_queue_seconds",
    "counter",
    "seconds",
    "Seconds this process spent in data-queue operations (TransferQueue put and get, fully "
    "async's MessageQueue put and get) by queue and operation.",
    ("queue", "op"),
)
QUEUE_BYTES = MetricSpec(
    "rlotel_queue_bytes",
    "counter",
    "bytes",
    "Bytes this process put into or got from a data queue, by queue and operation.",
    ("queue", "op"),
)
QUEUE_OPS = MetricSpec(
    "rlotel_queue_operations",
    "counter",
    "",
    "Data-queue operations this process made, by queue and operation.",
    ("queue", "op"),
)
GOODPUT = MetricSpec(
    "rlotel_goodput_ratio",
    "gauge",
    "ratio",
    "Productive seconds of the last step divided by its wall time.",
)
BUCKET_SECONDS = MetricSpec(
    "rlotel_bucket_seconds",
    "counter",
    "seconds",
    "Phase seconds by goodput bucket (productive, overhead, idle, wasted).",
    ("bucket",),
)
ROLE_IDLE = MetricSpec(
    "rlotel_role_idle_ratio",
    "gauge",
    "ratio",
    "Fraction of the last step's wall time a role (trainer, rollout) spent idle, 0 to 1.",
    ("role",),
)
SAMPLE_STALENESS = MetricSpec(
    "rlotel_sample_staleness_steps",
    "histogram",
    "steps",
    "Per-sample staleness at consumption: (step - 1) - the newest weight version it used.",
    (),
    STEP_COUNT_BUCKETS,
)
SAMPLE_WEIGHT_SPAN = MetricSpec(
    "rlotel_sample_weight_span_steps",
    "histogram",
    "steps",
    "Weight versions a trajectory spans: newest - oldest + 1.",
    (),
    STEP_COUNT_BUCKETS,
)
REPLAY_EVICTED = MetricSpec(
    "rlotel_replay_evicted_samples",
    "counter",
    "",
    "Samples evicted from the replay buffer, by reason (staleness, filter_groups, "
    "rollout_failure, ...).",
    ("reason",),
)
ASYNC_BIAS_KS = MetricSpec(
    "rlotel_async_bias_ks",
    "gauge",
    "",
    "Two-sample KS statistic (0 to 1) of the last step's trained samples against every sample "
    "generated in its window (trained plus discarded), by quantity (response_length, reward).",
    ("quantity",),
)
SAMPLES_DISCARDED = MetricSpec(
    "rlotel_samples_discarded",
    "counter",
    "",
    "Generated samples never trained, by reason (stale, evicted, filtered, surplus, other), as "
    "recorded with record_samples(..., discarded=reason).",
    ("reason",),
)
ROLLOUT_OCCUPANCY = MetricSpec(
    "rlotel_rollout_occupancy_ratio",
    "gauge",
    "ratio",
    "Last step's rollout occupancy per replica, from what held its engine (each model turn, "
    "where measured, else each trajectory from start to end): mean in flight divided by the "
    "peak in flight (1 = all ran to the end together).",
    ("replica",),
)
ROLLOUT_TAIL = MetricSpec(
    "rlotel_rollout_tail_seconds",
    "gauge",
    "seconds",
    "Seconds of the last step during which a rollout replica had fewer than half its peak "
    "in flight (waiting for the last long samples; in flight as for the occupancy).",
    ("replica",),
)

# By verl's `data_source` (record_samples(data_source=...)): the first MAX_DATA_SOURCES
# sources seen keep their name, later ones are labelled `other` (rlotel_data_sources_folded).
# Counters of sums and counts, so that a mean over any window weighs each step by its volume.
SOURCE_SAMPLES = MetricSpec(
    "rlotel_source_samples",
    "counter",
    "",
    "Trained samples by data source.",
    ("data_source",),
)
SOURCE_REWARD = MetricSpec(
    "rlotel_source_reward",
    "counter",
    "",
    "Sum of the absolute rewards of the trained samples by data source and sign (positive, "
    "negative): a counter cannot go down, so the signed sum is positive - negative, and the "
    "mean reward over a window is that over rlotel_source_rewarded_samples.",
    ("data_source", "sign"),
)
SOURCE_REWARDED = MetricSpec(
    "rlotel_source_rewarded_samples",
    "counter",
    "",
    "Trained samples with a reward, by data source (the divisor of the mean reward).",
    ("data_source",),
)
SOURCE_REWARD_COMPONENT = MetricSpec(
    "rlotel_source_reward_component",
    "counter",
    "",
    "Sum of the absolute values of each numeric reward_extra_info component (verl's custom "
    "reward dict) by component, data source and sign, as rlotel_source_reward.",
    ("component", "data_source", "sign"),
)
SOURCE_REWARD_COMPONENT_SAMPLES = MetricSpec(
    "rlotel_source_reward_component_samples",
    "counter",
    "",
    "Trained samples with a value of the component, by component and data source.",
    ("component", "data_source"),
)
SOURCE_STAGE_DURATION = MetricSpec(
    "rlotel_source_stage_duration_seconds",
    "histogram",
    "seconds",
    "Per-sample agent-loop seconds by data source and stage (generate_sequences, tool_calls, "
    "compute_score); as rlotel_agent_loop_duration_seconds, split by source.",
    ("data_source", "stage"),
    SAMPLE_DURATION_BUCKETS,
)
SOURCE_LENGTH = MetricSpec(
    "rlotel_source_length_tokens",
    "histogram",
    "tokens",
    "Per-sample prompt and response lengths by data source.",
    ("data_source", "kind"),
    LENGTH_BUCKETS,
)
DATA_SOURCES_FOLDED = MetricSpec(
    "rlotel_data_sources_folded_samples",
    "counter",
    "",
    "Samples whose data source came after the first MAX_DATA_SOURCES and is labelled other.",
)

# Every spec defined above, in definition order: a family cannot be defined and left out.
CATALOGUE: tuple[MetricSpec, ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, MetricSpec)
)

BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in CATALOGUE}


def series_names() -> set[str]:
    """Every series name a PromQL query may use."""
    return {name for spec in CATALOGUE for name in spec.sample_names}
