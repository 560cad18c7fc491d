"""Bottleneck verdict per step: the ledger read the way the reference material reads it.

The window with the largest share of the step is the suspect; the verdict is only as
confident as the evidence that agrees with it (per-sample tails for rollout, MFU for the
update). Two impostors are named for what they are: `old_log_prob` looks like training but
is actor inference, `update_weights` looks like rollout but is weight sync. Across steps, a
window that grew is attributed to tokens (the batch's token structure changed) or to time
per token (the system got slower).
"""

from __future__ import annotations

import json
import math
import statistics
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from rlotel.base.errors import ConfigError
from rlotel.schema import attributes as attr
from rlotel.schema import vocabulary as voc
from rlotel.schema.data_moves import DIRECTIONS, MOVING, RETURNED, SENT, moving_seconds

# Top-level windows by the verdict they point to (verl names); any other window of the step
# (`adv`, a timer rlotel has no word for) competes under its own name: `window-bound/<name>`.
GROUPS: dict[str, tuple[str, ...]] = {
    "rollout-bound": (voc.GEN,),
    "update-bound": (voc.UPDATE_ACTOR, voc.UPDATE_CRITIC),
    "logprob-bound": (voc.OLD_LOG_PROB, voc.REF, voc.VALUES),
    "sync-bound": (voc.UPDATE_WEIGHTS, voc.SYNC_ROLLOUT_WEIGHTS, voc.PARAM_SYNC),
    "reward-bound": (voc.REWARD,),
    "checkpoint": (voc.SAVE_CHECKPOINT,),
    "switch-bound": (voc.SWITCH_TO_TRAINER, voc.SWITCH_TO_ROLLOUT),
}
GROUPED = frozenset(name for names in GROUPS.values() for name in names)
DATA_MOVEMENT = "data-movement-bound"
WINDOW_BOUND = "window-bound"
# The step span's record of the facts its verdict was read from (`StepFacts.to_json`):
# `rlotel analyze` and the report read the verdict again from these, not from the spans.
FACTS = f"{attr.BOTTLENECK_PREFIX}facts"
THRESHOLDS = f"{attr.BOTTLENECK_PREFIX}thresholds"  # a run's own, where not the defaults
LOWER = {"high": "medium", "medium": "low", "low": "low"}  # one notch less sure
STAGES = voc.AGENT_LOOP_STAGES
# The slowest sample's longest stage → the detail with tail evidence, and without it.
STAGE_DETAILS = {
    voc.GENERATE_SEQUENCES: ("generation-tail", "uniform-generation"),
    voc.TOOL_CALLS: ("tool-call-tail", "uniform-tool-calls"),
    voc.COMPUTE_SCORE: ("compute-score-tail", "uniform-compute-score"),
}
NEXT_READ = {
    "rollout-bound": "per-sample tail in rlotel_agent_loop_duration_seconds (p99 vs p50), "
    "the slowest sample's trace, response-length distribution, rollout engine batching",
    "update-bound": "MFU per role; micro-batch size, gradient accumulation, communication "
    "and CPU offload in the actor workers",
    "logprob-bound": "actor/ref inference path (log-prob micro-batch size, dynamic batch "
    "size, recompute settings) — it is inference, not the optimizer",
    "sync-bound": "checkpoint-engine backend, weight bucket size, KV-cache release/resume — "
    "it is weight sync, not rollout",
    "reward-bound": "reward function/model throughput; compute_score per sample",
    "overhead-bound": "time between windows: Python/Ray scheduling, data movement, batch "
    "balancing, logging",
    "checkpoint": "checkpoint frequency and storage bandwidth (save_freq, async save)",
    "data-starved": "the trainer waits for samples: rollout throughput (per-sample tail, "
    "engine queue time), more rollout replicas, or allow more staleness",
    "rollout-idle": "the rollout waits (for new weights or a full buffer): a larger buffer "
    "or staleness bound, faster weight sync, or fewer rollout replicas",
    "switch-bound": "hybrid replicas switching sides: switch threshold "
    "(separate_async/switch/*), fewer switches per step, cheaper KV-cache release/resume",
    "staleness-limited": "samples are too stale and evicted: staleness threshold, "
    "parameter_sync_step, rollout vs trainer speed (rlotel_sample_staleness_steps)",
    "async-bias": "the trained batch no longer looks like what was generated: the discarded "
    "samples (rlotel_samples_discarded_total by reason) are the long or hard ones; allow more "
    "staleness, partial rollouts, or re-queue stale prompts instead of dropping them",
    DATA_MOVEMENT: "moving batches between the driver and the ranks: batch balancing and "
    "padding, fewer or smaller non-tensor columns, TransferQueue instead of the driver's "
    "DataProto, the dispatch mode, object-store spilling (ray memory)",
    "balanced": "no single window dominates: look at trends across steps instead",
    WINDOW_BOUND: "`{name}`, a window rlotel has no reading for: its span's children and "
    'the worker calls inside it (rlotel_step_phase_seconds{{phase="{name}"}})',
}
SUB_NEXT_READ = {
    "generation-tail": "the slowest samples' traces (exemplars) and their response lengths; "
    "max_tokens, partial rollout / over-sampling",
    "tool-call-tail": "tool latency of the slowest samples; tool timeouts and concurrency",
    "compute-score-tail": "compute_score of the slowest samples; async or batched rewards",
    "uniform-generation": "every sample takes about as long (no tail): the engine's own "
    "throughput — decode speed (timing_per_token_ms/gen), batch size (max_num_seqs, "
    "max_num_batched_tokens), rollout replicas and tensor parallelism",
    "uniform-tool-calls": "every sample's tool calls take about as long (no tail): the tool "
    "service's own latency and concurrency",
    "uniform-compute-score": "every sample's compute_score takes about as long (no tail): the "
    "reward function's own cost; async or batched rewards",
    "rollout-tail": "the rollout sat mostly empty waiting for its last long trajectories "
    "(rlotel_rollout_occupancy_ratio): partial rollouts, over-sampling and dropping the "
    "slowest, length caps, or async rollout",
    "controller-overhead": "gen window is high but samples are not: agent-loop controller, "
    "scheduling and output merge",
    "compute-bound": "MFU is high: more GPUs or a smaller model/batch, not tuning",
    # data-movement-bound, by the stage that moved data longest
    "dispatch": "the driver splitting the batch per rank (verl's dispatch_fn): fewer, larger "
    "columns; balance the batch before, not per call",
    "submit": "the driver pickling each rank's share into Ray's object store "
    "(DataProto.__getstate__, non-tensor columns): send fewer or smaller columns, "
    "TransferQueue, a dispatch mode that sends less",
    "transfer": "the batch's way to the ranks and back while the driver waits: object-store "
    "transfer, the ranks unpickling their arguments and pickling their results "
    "(DataProto.__setstate__/__getstate__): send and return less, TransferQueue",
    "fetch": "the replies' transfer and unpickling on the driver (ray.get): return only what "
    "the next window needs; object-store spilling (ray memory)",
    "collect": "concatenating the ranks' replies on the driver (DataProto.concat): fewer "
    "non-tensor columns, TransferQueue",
    "read": "ranks reading their batch from TransferQueue: storage units, batch size per read",
    "write": "ranks writing their results to TransferQueue: storage units, fields written",
    "low-mfu": "MFU is low: micro-batching, communication or offload",
    "moderate-mfu": "MFU is moderate: profile a flagged step to see the split",
}


@dataclass(frozen=True)
class Thresholds:
    """When a window counts as dominant and when evidence agrees. Conservative defaults."""

    dominant_share: float = 0.40  # a window must hold at least this share of the step...
    margin: float = 1.3  # ...and beat the runner-up by this factor, else "balanced"
    tail_ratio: float = 3.0  # max/mean of a per-sample stage that counts as a tail
    tail_length: float = 2.0  # slowest sample's response length ÷ the mean: a long sample
    samples_cover: float = 0.5  # slowest sample / gen window below this: samples don't explain it
    high_mfu: float = 0.35
    low_mfu: float = 0.15
    growth: float = 1.5  # a window grew when ≥ this x its trailing median
    window: int = 10  # trailing steps for trends
    idle_share: float = 0.40  # async: a role idle this share of the step is the story
    stale_steps: float = 4.0  # async: max staleness at which eviction is the likely limit
    straggler_spread: float = 1.5  # slowest rank ÷ median of a phase at which it is named
    async_bias_ks: float = 0.2  # KS of trained vs generated at which the batch is biased
    tail_share: float = 0.5  # rollout tail seconds ÷ gen at which the tail is the story
    data_share: float = 0.25  # a window's data movement ÷ the window at which it is named

    @classmethod
    def from_json(cls, text: Any) -> Thresholds:
        """The thresholds a step span recorded (`THRESHOLDS`); the defaults for anything else."""
        try:
            known = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in json.loads(text).items() if k in known}).validated()
        except Exception:
            return cls()

    def validated(self) -> Thresholds:
        """Raises `ConfigError` (at init) for a threshold the verdict cannot work with."""
        for name, value in vars(self).items():
            if name == "window":
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise ConfigError(
                        f"Thresholds.window must be an integer ≥ 1 (steps), got {value!r}"
                    )
                continue
            if (
                not isinstance(value, (int, float))
                or isinstance(value, bool)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ConfigError(f"Thresholds.{name} must be a finite number ≥ 0, got {value!r}")
        for name in (
            "dominant_share",
            "samples_cover",
            "high_mfu",
            "low_mfu",
            "idle_share",
            "async_bias_ks",
            "tail_share",
            "data_share",
        ):
            if getattr(self, name) > 1:
                raise ConfigError(
                    f"Thresholds.{name} is a share in [0, 1], got {getattr(self, name)!r}"
                )
        if self.low_mfu > self.high_mfu:
            raise ConfigError(
                f"Thresholds.low_mfu ({self.low_mfu}) must not exceed high_mfu ({self.high_mfu})"
            )
        return self


@dataclass(frozen=True)
class StepFacts:
    """What a verdict is read from; built from a closed step or a logged verl dict."""

    number: int
    timing_raw: Mapping[str, float]
    unaccounted: float | None = None  # from nesting when known, else derived
    response_tokens: float | None = None
    sequences: int | None = None
    mfu: Mapping[str, float] = field(default_factory=dict)
    agent_loop: Mapping[str, float] = field(default_factory=dict)  # verl agent_loop/* keys
    idle: Mapping[str, float] = field(default_factory=dict)  # async: idle ratio by role
    evicted: float = 0.0  # replay-buffer samples evicted as stale this step
    staleness_max: float | None = None  # verl trajectory_staleness/max
    # phase → (slowest rank, slowest ÷ median) of phases that ran on several ranks
    stragglers: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    # ...and (slowest rank, slowest ÷ median) of its ranks' compute: time outside
    # torch.distributed collectives, where every rank replies together
    compute_stragglers: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    async_bias: Mapping[str, float] = field(default_factory=dict)  # quantity → KS statistic
    discarded: Mapping[str, float] = field(default_factory=dict)  # reason → share generated
    rollout_tail_seconds: float | None = None  # measured (rlotel.derive.occupancy)
    rollout_occupancy: float | None = None
    response_length_mean: float | None = None  # verl's `response_length/mean`, when logged
    # the step's own windows when the trace says which (its direct children); else read
    # from the flat `timing_raw` by `vocabulary.step_windows`
    top_level: frozenset[str] | None = None
    # phase → its worker-group calls' seconds by stage and bytes by direction
    # (`rlotel.schema.data_moves`): the data half of the ledger
    data_movement: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    @classmethod
    def from_metrics(
        cls, number: int, timing_raw: Mapping[str, float], metrics: Mapping[str, Any], **extra
    ) -> StepFacts:
        mfu = {
            key.removeprefix(voc.MFU): float(value)
            for key, value in metrics.items()
            if key.startswith(voc.MFU)
        }
        agent_loop, idle, evicted, bias, discarded = {}, {}, 0.0, {}, {}
        for key, value in metrics.items():
            name = key.removeprefix(voc.TIMING_S)
            if name.startswith(voc.AGENT_LOOP):
                agent_loop[name] = float(value)
            elif key.startswith(voc.IDLE_RATIO):
                idle[key[len(voc.IDLE_RATIO) :]] = float(value)
            elif key.startswith(voc.ASYNC_BIAS_KS):
                bias[key[len(voc.ASYNC_BIAS_KS) :]] = float(value)
            elif key.startswith(voc.SAMPLES_DISCARDED):
                discarded[key[len(voc.SAMPLES_DISCARDED) :]] = float(value)
            elif voc.eviction_reason(key) == "staleness":
                evicted += float(value)
        stale = metrics.get(voc.TRAJECTORY_STALENESS + "max")
        tail = metrics.get(voc.ROLLOUT_TAIL_SECONDS)
        occupancy = metrics.get(voc.ROLLOUT_OCCUPANCY)
        length = metrics.get(voc.RESPONSE_LENGTH_MEAN)
        return cls(
            number,
            dict(timing_raw),
            mfu=mfu,
            agent_loop=agent_loop,
            idle=idle,
            evicted=evicted,
            staleness_max=None if stale is None else float(stale),
            async_bias=bias,
            discarded=discarded,
            rollout_tail_seconds=None if tail is None else float(tail),
            rollout_occupancy=None if occupancy is None else float(occupancy),
            response_length_mean=None if length is None else float(length),
            **extra,
        )

    def to_json(self) -> str:
        """Every field, exactly (floats as `repr`): what a reader gives `from_json` back."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["top_level"] = None if self.top_level is None else sorted(self.top_level)
        return json.dumps(data, separators=(",", ":"), default=_plain)

    @classmethod
    def from_json(cls, text: Any) -> StepFacts | None:
        """The facts `to_json` wrote; None for anything else (a truncated or foreign value)."""
        try:
            data = json.loads(text)
            known = {f.name for f in fields(cls)}
            data = {key: value for key, value in data.items() if key in known}
            for key in ("stragglers", "compute_stragglers"):
                data[key] = {p: (int(r), float(s)) for p, (r, s) in data.get(key, {}).items()}
            top_level = data.get("top_level")
            data["top_level"] = None if top_level is None else frozenset(top_level)
            facts = cls(**data)
        except (TypeError, ValueError, AttributeError):
            return None
        return facts if isinstance(facts.timing_raw, dict) else None


def _plain(value: Any) -> Any:
    """A numpy scalar as its Python number; anything else JSON cannot write, as text."""
    return value.item() if hasattr(value, "item") else str(value)


@dataclass(frozen=True)
class Verdict:
    kind: str
    detail: str  # sub-kind, or "" when the evidence does not say more
    confidence: str  # low | medium | high
    share: float  # the dominant window's share of the step
    evidence: dict[str, float | str]
    next_read: str
    trends: dict[str, dict[str, float | str]] = field(default_factory=dict)
    facts: StepFacts | None = field(default=None, repr=False, compare=False)  # what it read
    thresholds: Thresholds | None = field(default=None, repr=False, compare=False)  # read with

    @property
    def label(self) -> str:
        return f"{self.kind}/{self.detail}" if self.detail else self.kind

    def attributes(self) -> dict[str, float | str]:
        """Span attributes: `rl.bottleneck`, its evidence, and the facts it was read from."""
        attributes: dict[str, float | str] = {
            attr.BOTTLENECK: self.label,
            f"{attr.BOTTLENECK_PREFIX}confidence": self.confidence,
            f"{attr.BOTTLENECK_PREFIX}share": self.share,
            f"{attr.BOTTLENECK_PREFIX}next": self.next_read,
        }
        for key, value in self.evidence.items():
            attributes[f"{attr.BOTTLENECK_PREFIX}evidence.{key}"] = value
        for name, trend in self.trends.items():
            for key, value in trend.items():
                attributes[f"{attr.BOTTLENECK_PREFIX}trend.{name}.{key}"] = value
        if self.facts is not None:
            attributes[FACTS] = self.facts.to_json()
        if self.thresholds is not None and self.thresholds != Thresholds():
            attributes[THRESHOLDS] = json.dumps(vars(self.thresholds), separators=(",", ":"))
        return attributes


def windows(facts: StepFacts) -> dict[str, float]:
    """Seconds per verdict group, `window-bound/<name>` for each other window of the step
    (known or not), and `overhead-bound` for the unaccounted time."""
    timing = facts.timing_raw
    step = timing.get(voc.STEP, 0.0)
    own = voc.step_windows(timing)
    names = own.keys() if facts.top_level is None else facts.top_level - voc.CONCURRENT
    grouped = {
        kind: sum(timing.get(n, 0.0) for n in group if n in names) for kind, group in GROUPS.items()
    }
    for name in names:
        if name not in GROUPED and name in timing:
            grouped[f"{WINDOW_BOUND}/{name}"] = timing[name]
    moving = {phase: moving_seconds(moves) for phase, moves in facts.data_movement.items()}
    if moving:  # data movement inside a window is its own suspect, not the window's
        for kind in list(grouped):
            names_of = GROUPS.get(kind) or (kind.removeprefix(f"{WINDOW_BOUND}/"),)
            grouped[kind] -= min(grouped[kind], sum(moving.get(n, 0.0) for n in names_of))
        grouped[DATA_MOVEMENT] = sum(moving.values())
    unaccounted = facts.unaccounted
    if unaccounted is None:
        unaccounted = voc.unaccounted(step, sum(own.values()))
    grouped["overhead-bound"] = unaccounted
    return grouped


def diagnose(
    facts: StepFacts,
    thresholds: Thresholds | None = None,
    grouped: dict[str, float] | None = None,
) -> Verdict:
    """Verdict for one step, from its own evidence only (no trends). `grouped`: the step's
    `windows(facts)` where the caller has them already (its own copy: it is changed)."""
    limits = thresholds or Thresholds()
    step = facts.timing_raw.get("step", 0.0)
    if step <= 0:
        return Verdict(
            "balanced", "", "low", 0.0, {"reason": "no step time"}, NEXT_READ["balanced"]
        )
    bias = _bias(facts, limits)
    if bias is not None:
        return bias
    if facts.idle:
        verdict = _async(facts, step, limits)
        if verdict is not None:
            return verdict
    grouped = windows(facts) if grouped is None else grouped
    if facts.idle:  # async: V1's gen is the trainer waiting, judged above, not generation
        grouped.pop("rollout-bound")
    ranked = sorted(grouped.items(), key=lambda item: item[1], reverse=True)
    (kind, seconds), runner_up = ranked[0], ranked[1][1]
    share = seconds / step
    evidence: dict[str, float | str] = {
        "window": kind,
        "share": round(share, 4),
        "runner_up": ranked[1][0],
        "runner_up_share": round(runner_up / step, 4),
        **_efficiency(facts),
    }
    also = _straggler(facts, limits, evidence) + _moving(facts, limits, evidence)
    if share < limits.dominant_share or seconds < limits.margin * runner_up:
        next_read = NEXT_READ["balanced"] + also
        return Verdict("balanced", "", "medium", share, evidence, next_read)
    detail, confidence = "", "low"  # the share alone
    if kind == "rollout-bound":
        detail, confidence = _rollout(facts, seconds, limits, evidence)
    elif kind == "update-bound":
        detail, confidence = _update(facts, limits, evidence)
    elif kind == "logprob-bound":
        parts = {n: facts.timing_raw.get(n, 0.0) for n in GROUPS[kind]}
        detail = max(parts, key=parts.get)
        evidence["impostor"] = "inference path, not the optimizer"
        confidence = "medium"
    elif kind == "sync-bound":
        evidence["impostor"] = "weight sync, not rollout"
        confidence = "medium"
    elif kind == DATA_MOVEMENT:
        detail, confidence = _data_movement(facts, evidence), "medium"
    elif share >= limits.dominant_share and seconds >= 2 * runner_up:
        confidence = "medium"  # reward, overhead, checkpoint: the window is all there is
    if kind.startswith(WINDOW_BOUND):
        kind, detail = WINDOW_BOUND, kind[len(WINDOW_BOUND) + 1 :]
        next_read = NEXT_READ[WINDOW_BOUND].format(name=detail) + also
    else:
        next_read = (SUB_NEXT_READ.get(detail) or NEXT_READ[kind]) + also
    return Verdict(kind, detail, confidence, share, evidence, next_read)


def _efficiency(facts: StepFacts) -> dict[str, float | str]:
    """MFU by role and tokens per sequence, whatever the verdict: what the step achieved."""
    evidence: dict[str, float | str] = {f"mfu_{role}": round(v, 4) for role, v in facts.mfu.items()}
    if facts.response_tokens is not None and facts.sequences:
        evidence["response_tokens_per_sequence"] = round(facts.response_tokens / facts.sequences, 3)
    return evidence


def _data_movement(facts: StepFacts, evidence: dict[str, float | str]) -> str:
    """The stage that moved data longest over the step's windows, and its evidence."""
    stages = {
        stage: sum(moves.get(f"{stage}_s", 0.0) for moves in facts.data_movement.values())
        for stage in MOVING
    }
    stage = max(stages, key=stages.get)
    evidence["data_stage"] = stage
    evidence["data_stage_s"] = round(stages[stage], 6)
    for direction in DIRECTIONS:
        moved = sum(moves.get(f"{direction}_bytes", 0) for moves in facts.data_movement.values())
        if moved:
            evidence[f"data_{direction}_bytes"] = moved
    return stage


def _moving(facts: StepFacts, limits: Thresholds, evidence: dict[str, float | str]) -> str:
    """Names each window whose data movement passes `data_share` of it, whatever the
    verdict; returns what to add to `next_read` ("" when none does)."""
    said = []
    for window, moves in sorted(facts.data_movement.items()):
        seconds = facts.timing_raw.get(window, 0.0)
        moving = moving_seconds(moves)
        if seconds <= 0 or moving < limits.data_share * seconds:
            continue
        stage = max(MOVING, key=lambda name: moves.get(f"{name}_s", 0.0))
        evidence[f"data_share.{window}"] = round(moving / seconds, 4)
        evidence[f"data_stage.{window}"] = stage
        megabytes = (moves.get(f"{SENT}_bytes", 0) + moves.get(f"{RETURNED}_bytes", 0)) / 1e6
        said.append(
            f"{window} {seconds:.3g} s: data movement {moving:.3g} s ({stage} "
            f"{moves.get(f'{stage}_s', 0.0):.3g} s, {megabytes:.3g} MB moved with its calls)"
        )
    return "; " + "; ".join(said) if said else ""


def _straggler(facts: StepFacts, limits: Thresholds, evidence: dict[str, float | str]) -> str:
    """Names the rank that held a multi-rank phase up most, when its spread — of replies,
    or of compute (outside collectives, where all ranks reply together) — passes the
    threshold; returns what to add to `next_read` ("" when no rank stands out)."""
    over = {
        (measure, phase): (rank, spread)
        for measure, spreads in (("reply", facts.stragglers), ("compute", facts.compute_stragglers))
        for phase, (rank, spread) in spreads.items()
        if spread >= limits.straggler_spread
    }
    if not over:
        return ""
    measure, phase = max(over, key=lambda key: over[key][1])
    rank, spread = over[measure, phase]
    evidence["straggler_rank"] = rank
    evidence["straggler_phase"] = phase
    evidence["straggler_spread"] = round(spread, 3)
    evidence["straggler_measure"] = measure
    if measure == "compute":
        return (
            f"; rank {rank} computed {spread:.1f}x the median rank in {phase} while the others "
            "waited for it in collectives: its node and device, or its share of the batch "
            "(sequence balancing)"
        )
    return (
        f"; rank {rank} took {spread:.1f}x the median rank in {phase}: its node and device, "
        "or its share of the batch (sequence balancing)"
    )


def _bias(facts: StepFacts, limits: Thresholds) -> Verdict | None:
    """The trained samples differ from what was generated (KS past the threshold): the
    step is fast or slow, but it learns from a biased batch, which matters more."""
    if not facts.async_bias:
        return None
    quantity = max(facts.async_bias, key=facts.async_bias.get)
    statistic = facts.async_bias[quantity]
    if statistic < limits.async_bias_ks or statistic <= 0:
        return None
    evidence: dict[str, float | str] = {
        f"ks_{name}": round(value, 4) for name, value in facts.async_bias.items()
    }
    for reason, share in facts.discarded.items():
        if share:
            evidence[f"discarded_{reason}"] = round(share, 4)
    confidence = "high" if statistic >= 2 * limits.async_bias_ks else "medium"
    return Verdict("async-bias", quantity, confidence, statistic, evidence, NEXT_READ["async-bias"])


def _async(facts: StepFacts, step: float, limits: Thresholds) -> Verdict | None:
    """Async modes: who waits for whom. Starved trainer (stale samples evicted: limited by
    staleness), idle rollout, or switching hybrid replicas; None when nobody is stuck."""
    trainer, rollout = facts.idle.get("trainer", 0.0), facts.idle.get("rollout", 0.0)
    timing = facts.timing_raw
    switching = sum(
        timing.get(name, 0.0) for name in (voc.SWITCH_TO_TRAINER, voc.SWITCH_TO_ROLLOUT)
    )
    evidence: dict[str, float | str] = {
        "idle_trainer": round(trainer, 4),
        "idle_rollout": round(rollout, 4),
        "switch_share": round(switching / step, 4),
        **_efficiency(facts),
    }
    if facts.staleness_max is not None:
        evidence["staleness_max"] = facts.staleness_max
    if facts.evicted:
        evidence["evicted_stale"] = facts.evicted
    if switching / step >= limits.dominant_share and switching / step >= max(trainer, rollout):
        return Verdict(
            "switch-bound", "", "medium", switching / step, evidence, NEXT_READ["switch-bound"]
        )
    if trainer >= limits.idle_share and trainer >= limits.margin * rollout:
        stale = facts.evicted > 0 or (
            facts.staleness_max is not None and facts.staleness_max >= limits.stale_steps
        )
        kind = "staleness-limited" if stale else "data-starved"
        confidence = "high" if rollout < limits.idle_share / 2 else "medium"
        return Verdict(kind, "", confidence, trainer, evidence, NEXT_READ[kind])
    if rollout >= limits.idle_share and rollout >= limits.margin * trainer:
        waits = {
            "waiting-for-weights": timing.get(voc.ROLLOUT_WAIT_WEIGHTS, 0.0),
            "buffer-full": timing.get(voc.ROLLOUT_WAIT_BUFFER, 0.0),
        }
        detail = max(waits, key=waits.get) if any(waits.values()) else ""
        confidence = "high" if trainer < limits.idle_share / 2 else "medium"
        return Verdict(
            "rollout-idle", detail, confidence, rollout, evidence, NEXT_READ["rollout-idle"]
        )
    return None


def _rollout(
    facts: StepFacts, gen_seconds: float, limits: Thresholds, evidence: dict
) -> tuple[str, str]:
    """gen's share is the start; the per-sample evidence says whether a tail explains it.
    The slowest sample must account for gen (else the controller does); the stage it spent
    longest in names the detail, which claims a tail only with tail evidence: that stage's
    max ÷ mean, or, for generation, the slowest sample's response length well above the
    mean. Without it every sample is about as slow: the stage's own throughput. Confidence
    is high when the tail is also explained (a long response or preemptions behind a long
    generation; the tool or score stage itself)."""
    loop = facts.agent_loop
    slowest = {s: loop.get(f"{voc.AGENT_LOOP_SLOWEST}{s}") for s in STAGES}
    tail = facts.rollout_tail_seconds
    if tail is not None and gen_seconds > 0:
        evidence["rollout_tail_share"] = round(min(tail, gen_seconds) / gen_seconds, 4)
        if facts.rollout_occupancy is not None:
            evidence["rollout_occupancy"] = round(facts.rollout_occupancy, 4)
        if tail >= limits.tail_share * gen_seconds:
            return "rollout-tail", "high"  # measured: most of gen waited for a few samples
    if slowest[voc.GENERATE_SEQUENCES] is None:
        return "", "low"  # gen's share alone: no per-sample evidence
    total = sum(v for v in slowest.values() if v is not None)
    evidence["slowest_sample_s"] = round(total, 6)
    tails = {}
    for stage in STAGES:
        peak = loop.get(f"{voc.AGENT_LOOP}{stage}/max")
        mean = loop.get(f"{voc.AGENT_LOOP}{stage}/mean")
        if peak is not None and mean:
            tails[stage] = peak / mean
            evidence[f"{stage}_max_over_mean"] = round(tails[stage], 3)
    long_sample = _long_sample(facts, limits, evidence)
    preempted = loop.get(voc.AGENT_LOOP_SLOWEST + voc.NUM_PREEMPTED)
    if preempted is not None and preempted > 0:
        evidence["slowest_preempted"] = preempted
    if total < limits.samples_cover * gen_seconds:
        return "controller-overhead", "medium"
    stage = max(STAGES, key=lambda s: slowest[s] or 0.0)
    tailed, uniform = STAGE_DETAILS[stage]
    spread = tails.get(stage, 0.0) >= limits.tail_ratio
    if stage != voc.GENERATE_SEQUENCES:  # the stage itself explains its tail
        return (tailed, "high") if spread else (uniform, "medium")
    if not (spread or long_sample):
        return uniform, "medium"
    explained = (spread and long_sample) or "slowest_preempted" in evidence
    return tailed, "high" if explained else "medium"


def _long_sample(facts: StepFacts, limits: Thresholds, evidence: dict) -> bool:
    """The slowest sample's response length ÷ the step's mean, when both are known."""
    length = facts.agent_loop.get(voc.AGENT_LOOP_SLOWEST + voc.RESPONSE_LENGTH)
    mean = facts.response_length_mean
    if facts.response_tokens and facts.sequences:
        mean = facts.response_tokens / facts.sequences
    if length is None or not mean:
        return False
    ratio = length / mean
    evidence["slowest_length_over_mean"] = round(ratio, 3)
    return ratio >= limits.tail_length


def _update(facts: StepFacts, limits: Thresholds, evidence: dict) -> tuple[str, str]:
    mfu = facts.mfu.get("actor")
    if not mfu:  # absent, or verl's 0.0: no peak FLOPs known for the device (CPU), not low
        return "", "low"
    evidence["mfu_actor"] = round(mfu, 4)
    if mfu >= limits.high_mfu:
        return "compute-bound", "high"
    if mfu < limits.low_mfu:
        return "low-mfu", "high"
    return "moderate-mfu", "medium"


class Diagnoser:
    """Verdicts with trends over a trailing window of steps; thread-safe, one per run."""

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.thresholds = thresholds or Thresholds()
        # each step with its trend windows, computed once: the next `window` steps read them
        self._history: deque[tuple[StepFacts, dict[str, float]]] = deque(
            maxlen=self.thresholds.window
        )
        self._lock = threading.Lock()

    def observe(self, facts: StepFacts) -> Verdict:
        grouped = windows(facts)  # once: the verdict and the trends read the same windows
        verdict = diagnose(facts, self.thresholds, dict(grouped))
        seconds = {**grouped, "step": facts.timing_raw.get("step", 0.0)}
        with self._lock:
            history = [seen for seen in self._history if seen[0].number < facts.number]
            self._history.append((facts, seconds))
        trends = _trends(facts, seconds, history, self.thresholds)
        confidence, evidence = verdict.confidence, verdict.evidence
        update = trends.get("update-bound")
        if verdict.kind == "rollout-bound" and update is not None:
            # the chain's last link: a rollout reading holds while update_actor is steady
            confidence = LOWER[confidence]
            evidence = {**evidence, "update_grew": update["ratio"]}
        return replace(
            verdict,
            confidence=confidence,
            evidence=evidence,
            trends=trends,
            facts=facts,
            thresholds=self.thresholds,
        )


def _trends(
    facts: StepFacts,
    now: dict[str, float],
    history: list[tuple[StepFacts, dict[str, float]]],
    limits: Thresholds,
) -> dict[str, dict[str, float | str]]:
    """Windows (and the step: throughput) that grew vs their trailing median; gen and step
    growth is attributed to tokens or to time per token. `now` and each past step's
    windows are its verdict windows and the step."""
    if len(history) < 3:
        return {}
    trends: dict[str, dict[str, float | str]] = {}
    past = [seconds for _, seconds in history]
    tokens_now = facts.response_tokens
    tokens_past = [f.response_tokens for f, _ in history if f.response_tokens]
    token_ratio = (
        tokens_now / statistics.median(tokens_past) if tokens_now and tokens_past else None
    )
    for kind, seconds in now.items():
        baseline = statistics.median(w.get(kind, 0.0) for w in past)  # a window new now: 0
        if baseline <= 0 or seconds < limits.growth * baseline:
            continue
        ratio = seconds / baseline
        trend: dict[str, float | str] = {"ratio": round(ratio, 3)}
        if kind in ("rollout-bound", "step") and token_ratio is not None:
            trend["tokens_ratio"] = round(token_ratio, 3)
            per_token = ratio / token_ratio
            trend["per_token_ratio"] = round(per_token, 3)
            trend["attribution"] = (
                "tokens: token structure changed, not the system"
                if per_token < limits.growth**0.5
                else "time per token: the system got slower"
            )
        trends[kind] = trend
    return trends
