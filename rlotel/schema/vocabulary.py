"""verl's vocabulary: stage lists, key prefixes and the unaccounted-time rule, said once.

Spans, the recorder, replay, analyze and diagnose import these names instead of spelling
verl's strings themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

STEP = "step"  # the step's own timer; every other name is a phase

# verl's timer names (`marked_timer(name, timing_raw)` in `fit`): span = NVTX = stage name.
GEN = "gen"  # rollout
REWARD = "reward"
OLD_LOG_PROB = "old_log_prob"  # actor inference (not training)
REF = "ref"
VALUES = "values"  # the critic's inference
ADV = "adv"
UPDATE_CRITIC = "update_critic"
UPDATE_ACTOR = "update_actor"
SAVE_CHECKPOINT = "save_checkpoint"
UPDATE_WEIGHTS = "update_weights"  # new weights back to the rollout
DUMP_ROLLOUT_GENERATIONS = "dump_rollout_generations"
TESTING = "testing"  # validation, outside any step
START_PROFILE, STOP_PROFILE = "start_profile", "stop_profile"  # verl's profiler windows

# Top-level windows of verl's V0 `fit` step, in the order it runs them; their sum against
# `step` gives the unaccounted time when only a logged dict (no nesting) is available.
VERL_STAGE_ORDER: tuple[str, ...] = (
    GEN,
    REWARD,
    OLD_LOG_PROB,
    REF,
    VALUES,
    ADV,
    UPDATE_CRITIC,
    UPDATE_ACTOR,
    SAVE_CHECKPOINT,
    UPDATE_WEIGHTS,
    DUMP_ROLLOUT_GENERATIONS,
)
VERL_STEP_STAGES = frozenset(VERL_STAGE_ORDER)

# Async windows. V1 `separate_async`: the trainer waiting for sampleable data, hybrid
# replicas switching sides (possibly twice a step); the fully-async policy: weight sync and
# the trainer waiting for enough samples. `update_weights` is in the V0 list above.
SWITCH_WAIT = "switch_wait"
SWITCH_TO_TRAINER = "switch_to_trainer"
SWITCH_TO_ROLLOUT = "switch_to_rollout"
PARAM_SYNC = "param_sync"
WAIT_FOR_ENOUGH_SAMPLES = "wait_for_enough_samples"
VERL_ASYNC_STAGES: tuple[str, ...] = (
    SWITCH_WAIT,
    SWITCH_TO_TRAINER,
    SWITCH_TO_ROLLOUT,
    UPDATE_WEIGHTS,
    PARAM_SYNC,
    WAIT_FOR_ENOUGH_SAMPLES,
)
# verl's `CheckpointEngineManager.update_weights` stages (every backend but the colocated
# `naive`), each a window nested in the caller's (rlotel.integrations.verl_weights): verl's
# method names for the manager's own stages, in order; the process group's two worker calls
# nest in `build_process_group`; then the transfer and `finalize`.
CKPT_ABORT = "abort_replicas"
CKPT_RELEASE_KV_CACHE = "release_kv_cache_replicas"
CKPT_BUILD_PROCESS_GROUP = "build_process_group"
CKPT_PREPARE = "prepare"  # each worker's engine: buffers, its address for the topology
CKPT_INIT_PROCESS_GROUP = "init_process_group"
CKPT_TRANSFER = "transfer_weights"  # actor ranks send, rollout workers receive
CKPT_FINALIZE = "finalize"
CKPT_RESUME_KV_CACHE = "resume_kv_cache_replicas"
CKPT_RESUME_GENERATION = "resume_generation_replicas"
CKPT_MANAGER_STAGES: tuple[str, ...] = (
    CKPT_ABORT,
    CKPT_RELEASE_KV_CACHE,
    CKPT_BUILD_PROCESS_GROUP,
    CKPT_RESUME_KV_CACHE,
    CKPT_RESUME_GENERATION,
)
CKPT_STAGES: tuple[str, ...] = (
    CKPT_ABORT,
    CKPT_RELEASE_KV_CACHE,
    CKPT_BUILD_PROCESS_GROUP,
    CKPT_TRANSFER,
    CKPT_FINALIZE,
    CKPT_RESUME_KV_CACHE,
    CKPT_RESUME_GENERATION,
)
# verl 0.9.1's one-step-off policy (experimental/one_step_off_policy/ray_trainer.py): the next
# batch is generated (`generate_async`) while this step trains; its seconds are merged into the
# step that consumes it, so they overlap the step before and cover none of this one. `gen` is
# the trainer awaiting that batch; `sync_rollout_weights` wraps verl's `update_weights`.
GENERATE_ASYNC = "generate_async"
SYNC_ROLLOUT_WEIGHTS = "sync_rollout_weights"
# verl's fully-async rollouter (experimental/fully_async_policy/fully_async_rollouter.py): its
# validation timer, and what it logs at each parameter sync under `fully_async/rollouter/`
# (`active_time`, `version_time` seconds; `idle_ratio`; `step_generated_samples`), all outside
# the trainer's step and not under `timing_s/`.
ROLLOUTER_VALIDATE = "rollouter/validate_time"
# verl's next data plane (its `neo` branch, trainer/ppo/ray_trainer.py): `dataplane/*` timers,
# three before the step's timer, one after it, one nested in `adv`; `materialize` adds up the
# data plane's reads across every window, `materialize_calls` counts them (not seconds).
DATAPLANE = "dataplane/"
DATAPLANE_OUTSIDE_STEP = frozenset(
    DATAPLANE + name
    for name in ("from_single_dict", "get_gen_batch", "repeat_prepare", "prefetch_metrics")
)
DATAPLANE_MATERIALIZE = DATAPLANE + "materialize"
DATAPLANE_NOT_SECONDS = DATAPLANE + "materialize_calls"
# verl 0.9.1's teacher loop (experimental/teacher_loop, on-policy distillation) has no timer of
# its own: teacher log-probs are computed per sample inside the agent loop, within `gen`.

# Windows a concurrent rollout (thread, task) opens next to the trainer: rlotel's names,
# role `rollout` (rlotel.derive.goodput), e.g. the `rlotel demo --async` rollout thread.
ROLLOUT_GENERATE = "rollout_generate"
ROLLOUT_WAIT_BUFFER = "rollout_wait_buffer"  # the bounded buffer is full
ROLLOUT_WAIT_WEIGHTS = "rollout_wait_weights"  # paused while new weights load
ROLLOUT_DISCARDED = "rollout_discarded"  # generation whose samples were thrown away
ROLLOUT_WINDOWS = frozenset(
    {ROLLOUT_GENERATE, ROLLOUT_WAIT_BUFFER, ROLLOUT_WAIT_WEIGHTS, ROLLOUT_DISCARDED}
)

# A trajectory's own window where it runs (the agent-loop worker): its engine calls nest in it.
TRAJECTORY = "trajectory"

# Key prefixes of verl's metric dicts (metric_utils.py, agent_loop.py).
TIMING_S = "timing_s/"
TIMING_PER_TOKEN_MS = "timing_per_token_ms/"
PERF = "perf/"
MFU = "perf/mfu/"
AGENT_LOOP = "agent_loop/"
AGENT_LOOP_SLOWEST = "agent_loop/slowest/"
# verl's agent loop, per sample (`AgentLoopMetrics`): three timed stages, in order, then the
# preemption count and the two lengths; `agent_loop/{stage}/{min,max,mean}` and
# `agent_loop/slowest/{...}` reduce them per step.
GENERATE_SEQUENCES = "generate_sequences"  # the agent loop's generation stage
TOOL_CALLS = "tool_calls"
COMPUTE_SCORE = "compute_score"
AGENT_LOOP_STAGES: tuple[str, ...] = (GENERATE_SEQUENCES, TOOL_CALLS, COMPUTE_SCORE)
NUM_PREEMPTED = "num_preempted"  # int, -1 = unknown
PROMPT_LENGTH = "prompt_length"
RESPONSE_LENGTH = "response_length"
RESPONSE_LENGTH_MEAN = "response_length/mean"  # verl's data metrics: tokens a sample, mean
TIME_PER_STEP = "perf/time_per_step"
THROUGHPUT = "perf/throughput"
TOTAL_NUM_TOKENS = "perf/total_num_tokens"
TRAINING = "training/"  # verl V1's training-side keys (and `validation/` its validation's)
VALIDATION = "validation/"
# + trajectory_{spans,staleness,staleness_worst}/{mean,max,min}
OFF_POLICY = TRAINING + "off_policy/"
TRAJECTORY_STALENESS = OFF_POLICY + "trajectory_staleness/"  # + mean|max|min
# rlotel's own per-step keys (rlotel.derive.goodput): + bucket, + role
RLOTEL = "rlotel/"  # rlotel's own additions to verl's step metrics
GOODPUT = RLOTEL + "goodput"
BUCKET_SECONDS = RLOTEL + "bucket_seconds/"
IDLE_RATIO = RLOTEL + "idle_ratio/"
# Async bias (rlotel.derive.async_bias): trained samples against every sample generated in the
# step's window, two-sample KS per quantity; the share never trained, per reason.
ASYNC_BIAS_KS = RLOTEL + "async_bias/ks/"  # + response_length | reward
SAMPLE_REWARD = "reward"  # rlotel's per-sample field: the reward, any sign
BIAS_QUANTITIES = (RESPONSE_LENGTH, SAMPLE_REWARD)
SAMPLES_DISCARDED = RLOTEL + "samples_discarded/"  # + reason
# surplus: finished groups beyond the batch that sync DAPO drops once its batch is full
DISCARD_REASONS = ("stale", "evicted", "filtered", "surplus", "other")  # other: an unknown reason
# verl#7569: staleness from the oldest version behind each trajectory, weighted by tokens.
STALENESS_WORST_TOKEN_WEIGHTED = RLOTEL + "off_policy/trajectory_staleness_worst/token_mean"
# Rollout occupancy measured from trajectories' real times (rlotel.derive.occupancy).
ROLLOUT_OCCUPANCY = RLOTEL + "rollout_occupancy"  # mean in flight ÷ peak, mean of replicas
ROLLOUT_TAIL_SECONDS = RLOTEL + "rollout_tail_seconds"  # in flight < half the peak
# verl V1 replay-buffer counts, `{training|validation}/...`: → rlotel_replay_evicted_samples
OFF_POLICY_EVICTED = "off_policy/evicted_samples"  # after `training/` or `validation/`
REPLAY_EVICTION_KEYS: dict[str, str] = {
    OFF_POLICY_EVICTED: "staleness",
    "filter_groups/evicted_samples": "filter_groups",
    "filter_groups/discarded_surplus_samples": "filter_groups_surplus",
    "rollout_failure/evicted_samples": "rollout_failure",
}


# verl's validation keys: `val-core/…`, `val-aux/…` (`_validate`, first of all with
# `val_before_train`), `val/…` (its SFT trainers), `validation/…` (the V1 replay buffer's
# validation partition). They get a budget of rlotel_train_metric keys of their own.
VALIDATION_KEY_PREFIXES = ("val-", "val/", "validation/")


def is_validation_key(key: str) -> bool:
    return key.startswith(VALIDATION_KEY_PREFIXES)


def phase_of_timing_key(key: str) -> str | None:
    """`timing_s/gen` → `gen`, `timing_s/dataplane/prefetch_gen` → `dataplane/prefetch_gen`:
    every timer verl logs is a window of its own name. None for other keys and for what verl
    logs under `timing_s/` that is no timer: its agent loop's per-sample reductions
    (`timing_s/agent_loop/…`: min/max/mean, lengths, counts) and counts. The fully-async
    trainer's timer named `timing_s/param_sync` (logged `timing_s/timing_s/param_sync`) is
    `param_sync`."""
    if not key.startswith(TIMING_S):
        return None
    name = key[len(TIMING_S) :].removeprefix(TIMING_S)
    if not name or name.startswith(AGENT_LOOP) or name == DATAPLANE_NOT_SECONDS:
        return None
    return name


def timing_from_metrics(data: Mapping[str, object]) -> dict[str, float]:
    """verl's `timing_raw` back from a logged dict's `timing_s/*` keys (numbers only)."""
    timing: dict[str, float] = {}
    for key, value in data.items():
        name = phase_of_timing_key(key)
        if name is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            timing[name] = float(value)
    return timing


def eviction_reason(key: str) -> str | None:
    """`training/off_policy/evicted_samples` → `staleness`; None for other keys."""
    for prefix in (TRAINING, VALIDATION):
        if key.startswith(prefix):
            return REPLAY_EVICTION_KEYS.get(key[len(prefix) :])
    return None


def unaccounted(step_seconds: float, covered_seconds: float) -> float:
    """Step time covered by no top-level window: the waiting between windows."""
    return max(0.0, step_seconds - covered_seconds)


# Where a flat `timing_raw` (nesting unknown) says a timer did not run inside the step's own
# time: verl times these outside its `step` timer, or beside it (a concurrent rollout), or
# inside another window when that window is in the same dict.
OUTSIDE_STEP = frozenset(
    {TESTING, START_PROFILE, STOP_PROFILE, ROLLOUTER_VALIDATE, *DATAPLANE_OUTSIDE_STEP}
)
CONCURRENT = frozenset({GENERATE_ASYNC, *ROLLOUT_WINDOWS})
_WEIGHT_SYNCS = (UPDATE_WEIGHTS, PARAM_SYNC, SYNC_ROLLOUT_WEIGHTS)
NESTED_IN: dict[str, tuple[str, ...]] = {
    UPDATE_WEIGHTS: (SYNC_ROLLOUT_WEIGHTS,),  # one-step-off's sync wraps verl's
    **{stage: _WEIGHT_SYNCS for stage in (*CKPT_STAGES, CKPT_PREPARE, CKPT_INIT_PROCESS_GROUP)},
    DATAPLANE + "prefetch_adv": (ADV,),
    **{stage: (GEN, GENERATE_ASYNC, ROLLOUT_GENERATE) for stage in AGENT_LOOP_STAGES},
}


# What a flat `timing_raw` never counts as the step's own windows.
NOT_STEP_WINDOWS = frozenset(
    {STEP, DATAPLANE_MATERIALIZE, *OUTSIDE_STEP, *CONCURRENT}  # materialize: spread over others
)


def step_windows(timing: Mapping[str, float]) -> dict[str, float]:
    """The windows of a flat `timing_raw` that cover the step: every timer, known or not
    (`dataplane/prefetch_gen`, a user's own), but the step itself and those known to lie
    outside it, beside it or nested in another window of the same dict."""
    return {
        name: seconds
        for name, seconds in timing.items()
        if name not in NOT_STEP_WINDOWS
        and not (name in NESTED_IN and any(parent in timing for parent in NESTED_IN[name]))
    }


def covered_by_windows(timing: Mapping[str, float]) -> float:
    """Seconds the windows of a flat `timing_raw` cover (`step_windows`)."""
    return sum(step_windows(timing).values())


def covered_by_intervals(intervals: Iterable[tuple[int, int]]) -> float:
    """Seconds covered by (start_ns, end_ns) windows, overlaps counted once."""
    covered, reach = 0, 0
    for start, end in sorted(intervals):
        start = max(start, reach)
        if end > start:
            covered += end - start
            reach = end
    return covered / 1e9


# `rl.role` of verl's processes: verl's own role names (actor, rollout, ref, critic, reward)
# and names for its other actors; the process that runs the trainer loop is the `trainer`.
TRAINER_ROLE = "trainer"
VERL_CLASS_ROLES: dict[str, str] = {
    "TaskRunner": TRAINER_ROLE,
    "TaskRunnerV1": TRAINER_ROLE,
    "vLLMHttpServer": "rollout",
    "SGLangHttpServer": "rollout",
    "GlobalRequestLoadBalancer": "load_balancer",  # routes requests to rollout replicas
    "TRTLLMHttpServer": "rollout",
    "AgentLoopWorker": "agent_loop",
    "RewardLoopWorker": "reward",
    "TransferQueueController": "transfer_queue",
    "SimpleStorageUnit": "transfer_queue",
    # verl's checkpoint-engine worker, colocated with the inference engine's on its GPU
    "CheckpointEngineWorker": "rollout",
}
# verl's worker roles (`actor_rollout_ref`, `critic`, `rm`, ...): the first part names it.
VERL_WORKER_ROLES: dict[str, str] = {
    "actor": "actor",
    "rollout": "rollout",
    "ref": "ref",
    "critic": "critic",
    "rm": "reward",
    "reward": "reward",
}


def verl_worker_role(worker_role: str) -> str:
    """`actor_rollout_ref` → `actor`; `rm` → `reward`; an unknown role as it is."""
    return VERL_WORKER_ROLES.get(worker_role.split("_", 1)[0], worker_role)


# Methods of a fused worker (`actor_rollout_ref`) that run another role's model: the
# reference policy's log-probs are the `ref` window's work, whatever worker hosts them.
METHOD_ROLES: dict[str, str] = {"compute_ref_log_prob": "ref"}


def verl_call_role(worker_role: str, method: str) -> str:
    """The role of one call: `compute_ref_log_prob` of `actor_rollout_ref` → `ref`;
    otherwise the worker's (`verl_worker_role`)."""
    return METHOD_ROLES.get(method) or verl_worker_role(worker_role)


# The role a process hosting several of verl's workers (its colocated `WorkerDict`) is named
# by: the first of these it hosts. Each call's span still carries its own role.
MAIN_ROLES = ("actor", "rollout", "critic", "ref", "reward")


def verl_main_role(worker_roles: Iterable[str]) -> str | None:
    """`{actor_rollout, critic}` → `actor`; `{actor, ref}` → `actor`; `{critic}` → `critic`."""
    roles = [verl_worker_role(role) for role in worker_roles]
    return next((role for role in MAIN_ROLES if role in roles), roles[0] if roles else None)


def verl_class_role(mro_names: Iterable[str]) -> str | None:
    """The role of a verl actor class, from its class names (most derived first)."""
    for name in mro_names:
        if name in VERL_CLASS_ROLES:
            return VERL_CLASS_ROLES[name]
    return None
