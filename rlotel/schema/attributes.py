"""Span and resource attribute names: rlotel's `rl.*` namespace and the `gen_ai.*` ones it reuses.

Spans, replay, analyze, the report, diagnose and profiling import these names, so an
attribute is spelled once. OTel GenAI conventions are used where one exists.
"""

from __future__ import annotations

from rlotel.schema import vocabulary as voc

NAMESPACE = "rl."  # every rlotel attribute's prefix (`rl.role` → `role` in a log line)
RUN = "rl.run"
STEP = "rl.step"
PHASE = "rl.phase"
BUCKET = "rl.bucket"  # goodput bucket of a phase: productive, overhead, idle, wasted
INCOMPLETE = "rl.incomplete"  # the step ended by an exception or at exit; or still open
STALLED = "rl.stalled"  # a partial span of a phase open past its stall threshold
STALL_STACK = "rl.stall.stack"  # event: one thread's stack at a stall's onset (on the stalled span)
OPEN_S = "rl.open_s"  # a partial span (exported while open): how long it had been open
RECONSTRUCTED = "rl.reconstructed"  # replayed from a verl log, not measured
UNACCOUNTED_S = "rl.unaccounted_s"
SEQUENCES = "rl.sequences"
TOKENS_PROMPT = "rl.tokens.prompt"
TOKENS_RESPONSE = "rl.tokens.response"
TOKENS_TOTAL = "rl.tokens.total"
THROUGHPUT = "rl.throughput"
TIME_PER_STEP = "rl.time_per_step"
MFU_PREFIX = "rl.mfu."  # + role

BOTTLENECK = "rl.bottleneck"
BOTTLENECK_PREFIX = "rl.bottleneck."  # + evidence name

SAMPLE_SPAN = "sample"  # span name of one trajectory
SAMPLE_INDEX = "rl.sample.index"
SAMPLE_NAMESPACE = "rl.sample"  # also the trace-event category of sample slices (perfetto)
SAMPLE_PREFIX = SAMPLE_NAMESPACE + "."

# --- OpenTelemetry GenAI semantic conventions (status "Development"), pinned -------------
# Every `gen_ai.*` name rlotel emits is spelled here and nowhere else, as published in
# semantic conventions GENAI_SEMCONV (the `opentelemetry-semantic-conventions` Python
# package GENAI_SEMCONV_PACKAGE generates them: tests/test_genai.py checks each name
# against the installed package, so a rename upstream fails the build). A trajectory is
# an `invoke_agent` operation; its turns `chat`, its tool calls `execute_tool {tool}`.
GENAI_SEMCONV = "1.44.0"
GENAI_SCHEMA_URL = f"https://opentelemetry.io/schemas/{GENAI_SEMCONV}"
GENAI_SEMCONV_PACKAGE = "0.66b2"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
OPERATION = "gen_ai.operation.name"
CONVERSATION_ID = "gen_ai.conversation.id"
TOOL_NAME = "gen_ai.tool.name"
OPERATION_INVOKE_AGENT = "invoke_agent"  # a trajectory (the `sample` span)
OPERATION_CHAT = "chat"  # one model turn of it
OPERATION_EXECUTE_TOOL = "execute_tool"  # one tool call of it
CHAT_SPAN = OPERATION_CHAT  # span names: `{operation} {target}` where there is one
TOOL_SPAN_PREFIX = OPERATION_EXECUTE_TOOL + " "  # + gen_ai.tool.name
EVALUATION_EVENT = "gen_ai.evaluation.result"  # the reward, an event on the trajectory
EVALUATION_NAME = "gen_ai.evaluation.name"
EVALUATION_SCORE = "gen_ai.evaluation.score.value"
REWARD_EVALUATION = "reward"  # gen_ai.evaluation.name of the RL reward
GENAI_ATTRIBUTES = (
    INPUT_TOKENS,
    OUTPUT_TOKENS,
    OPERATION,
    CONVERSATION_ID,
    TOOL_NAME,
    EVALUATION_NAME,
    EVALUATION_SCORE,
)
GENAI_OPERATIONS = (OPERATION_INVOKE_AGENT, OPERATION_CHAT, OPERATION_EXECUTE_TOOL)
GENAI_TRAJECTORY_PARTS = (OPERATION_CHAT, OPERATION_EXECUTE_TOOL)  # children of a sample
# Prompts and responses (gen_ai.input.messages, gen_ai.output.messages, tool call
# arguments and results) are never exported: rlotel records timings, lengths and scores.
# A trajectory's identity (verl V1 keys `{uid}_{session}_{index}`, `num_turns`).
SAMPLE_UID = "rl.sample.uid"
SAMPLE_SESSION = "rl.sample.session"
SAMPLE_OUTPUT = "rl.sample.output"  # index of the output within its session
SAMPLE_TURNS = "rl.sample.turns"
SAMPLE_VERSION_MIN = "rl.sample.weight_version.min"
SAMPLE_VERSION_MAX = "rl.sample.weight_version.max"
SAMPLE_STALENESS = "rl.sample.staleness"  # (consuming step - 1) - newest version
SAMPLE_GENERATED_STEP = "rl.sample.generated_step"  # the step whose prompts it answers
SAMPLE_DATA_SOURCE = "rl.sample.data_source"  # verl's `data_source` of the prompt, as given
# The step span's figures by data source: parallel arrays, one entry per source (as labelled
# on the metrics: capped, the rest under `other`). Sums and counts, so that means over
# several steps weight each step by its volume.
DATA_SOURCES = "rl.data_source.names"
DATA_SOURCE_SAMPLES = "rl.data_source.samples"
DATA_SOURCE_REWARD_SUM = "rl.data_source.reward.sum"  # where every sample had a reward
DATA_SOURCE_REWARDED = "rl.data_source.reward.count"
DATA_SOURCE_RESPONSE_SUM = "rl.data_source.response_length.sum"  # tokens
DATA_SOURCE_GENERATE_P90 = "rl.data_source.generate_sequences.p90_s"
LINK_RELATION = "rl.link.relation"  # why a span links another: "generated_in", ...

CAPTURE_SPAN = "profile.capture"
PROFILE_NAMESPACE = "rl.profile"
PROFILE_PREFIX = PROFILE_NAMESPACE + "."
PROFILE_PATH = "rl.profile.path"
PROFILE_SIZE = "rl.profile.size_bytes"
PROFILE_TOOL = "rl.profile.tool"
PROFILE_ROLE = "rl.profile.role"
PROFILE_RANK = "rl.profile.rank"
PROFILE_STEP_FIRST = "rl.profile.step_first"
PROFILE_STEP_LAST = "rl.profile.step_last"
PROFILE_MINI_BATCH_FIRST = "rl.profile.mini_batch_first"
PROFILE_MINI_BATCH_LAST = "rl.profile.mini_batch_last"
PROFILE_TOP_OPS = "rl.profile.top_ops"
PROFILE_PHASES = "rl.profile.phases"
PROFILE_STAGE = "rl.profile.stage"  # the window its writer named (verl: actor_update, train)
PROFILE_REPLICA = "rl.profile.replica"  # a rollout engine's capture: the replica it profiled
PROFILE_TOKEN_START = "rl.profile.token_start"  # the engine's token window, when set
PROFILE_TOKEN_END = "rl.profile.token_end"
PROFILE_HOOK_EVENT = "rl.profile.finish_hook"  # verl ran finish_hook_cmd (an event)
PROFILE_OOM_EVENT = "rl.profile.oom_snapshot"  # verl dumped the allocator at an OOM (an event)
PROFILE_HOOK_COMMAND = "rl.profile.finish_hook.command"  # its program's name, no arguments
PROFILE_HOOK_EXIT_STATUS = "rl.profile.finish_hook.exit_status"  # None: it did not start
PROFILE_HOOK_SECONDS = "rl.profile.finish_hook.duration_s"

SERVICE_NAME = "service.name"
PROCESS_PID = "process.pid"  # OTel semantic conventions (resource)

# Which process a span came from (resource attributes of worker processes).
ROLE = "rl.role"  # actor, rollout, ref, critic, ... (or the worker class)
RANK = "rl.rank"
NODE = "rl.node"
REPLICA = "rl.replica"  # rollout replica
NODE_ID = "rl.node_id"  # Ray's node id (node IPs repeat on one machine's test cluster)

# This process's clock minus the driver's, measured over its first traced call
# (`rlotel.base.clock`): on root spans exported once known; readers shift the process by it.
CLOCK_OFFSET_NS = "rl.clock.offset_ns"
CLOCK_UNCERTAINTY_NS = "rl.clock.uncertainty_ns"

# A phase that ran on several ranks (the driver's span of a worker-group call).
RANKS = "rl.ranks"  # how many ranks replied
SLOWEST_RANK = "rl.rank.slowest"
SLOWEST_RANK_S = "rl.rank.slowest_s"
RANK_SPREAD = "rl.rank.spread"  # slowest ÷ median
DATA_PREFIX = "rl.data."  # + a worker-group phase's seconds by stage and bytes by direction
# ...and of its ranks' compute (time outside torch.distributed collectives, reported by each
# rank with its reply): under collectives every rank replies together, compute tells them apart.
RANK_COMPUTE_SLOWEST = "rl.rank.compute.slowest"
RANK_COMPUTE_SLOWEST_S = "rl.rank.compute.slowest_s"
RANK_COMPUTE_MEDIAN_S = "rl.rank.compute.median_s"
RANK_COMPUTE_SPREAD = "rl.rank.compute.spread"  # slowest compute ÷ median compute
RANK_COLLECTIVE_MAX_S = "rl.rank.collective.max_s"  # the longest any rank waited in them

# A worker's phase (a traced worker method): its seconds inside torch.distributed
# collectives, outside them (compute = the phase's wall time - collective), and the calls.
COMPUTE_S = "rl.compute_s"
COLLECTIVE_S = "rl.collective_s"
COLLECTIVE_CALLS = "rl.collective.calls"

# Per-sample fields → attribute names (seconds get an `_s` suffix).
DURATION_SUFFIX = "_s"


def sample_attribute(field: str, is_duration: bool) -> str:
    """The span attribute of one per-sample field (`gen_ai.usage.*` for lengths)."""
    if field == voc.PROMPT_LENGTH:
        return INPUT_TOKENS
    if field == voc.RESPONSE_LENGTH:
        return OUTPUT_TOKENS
    return f"{SAMPLE_PREFIX}{field}{DURATION_SUFFIX if is_duration else ''}"
