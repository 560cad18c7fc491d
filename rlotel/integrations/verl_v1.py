"""verl's V1 trainer (`trainer.use_v1`, verl 0.9.x): per-sample tails, weight versions, mode.

V1 writes each finished trajectory to TransferQueue from the agent-loop workers and never
reduces the per-sample metrics. rlotel captures them in the *trainer*, when the replay
buffer hands a batch to `_step_once` (`ReplayBuffer._materialize_batch`, shared by the
sync and async buffers and by custom samplers that subclass them): that is the one
process that knows which step consumes a trajectory, so staleness is computed against the
right step, the samples land in the ledger step under `gen` (exemplars and sample spans in
the trainer's trace). The batch's keys (`{uid}_{session}_{output}`) and tags carry the
trajectory's identity, lengths, the step it was generated for (`global_steps`: the span
links that step) and verl's `min_global_steps` / `max_global_steps`; one extra
TransferQueue read fetches the per-sample `metrics` and `extra_fields`.

Real start and end times exist only where the trajectory ran: in the agent-loop worker,
rlotel stamps them (`STAMP_KEY` in the trajectory's `extra_fields`, Unix ns: entering
`_run_agent_loop`, leaving `_compute_score`), with each model turn's times (every
`LLMServerClient.generate` the trajectory awaited: the sample span's `chat` children), each
tool call's name and times (every `ToolAgentLoop._call_tool` of verl's tool agent loop: its
`execute_tool {tool}` children) and the reward verl scored it with (the span's
`gen_ai.evaluation.result` event, and the async-bias input); so with rlotel in the workers
too the sample spans sit at their real times; without it, they are placed by their stage
seconds.

The trainer's mode (`sync`, `colocate_async`, `separate_async`) is read when `fit` starts and
switches the goodput table (V1's `gen` is the trainer waiting in async modes).
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from rlotel.base import clock
from rlotel.integrations import guard
from rlotel.integrations.hooks import Hook
from rlotel.integrations.registered import (
    V1_EVICT,
    V1_FIT,
    V1_REPLAY_BATCH,
    V1_SCORE,
    V1_TOOL,
    V1_TRAJECTORY,
    V1_TURN,
)
from rlotel.schema import vocabulary

log = logging.getLogger("rlotel")

TRAIN_PARTITION = "train"
# extra_fields entry: [start ns, end ns, turns, traceparent of its worker span or None,
# [[start ns, end ns] of each model turn] or None, reward or None,
# [[tool name, start ns, end ns] of each tool call] or None]
STAMP_KEY = "rlotel_trajectory"
# extra_fields entry: the server id (verl's load balancer keys its servers by address) of the
# rollout replica that served the trajectory's last model turn, or None
SERVER_KEY = "rlotel_server"
TQ_WORKER = "AgentLoopWorkerTQ"  # V1's worker class: only its outputs go to TransferQueue
# `_terminal_eviction_reasons`' uid sets, in order → rlotel's discard reason (a group in
# several sets takes the first)
EVICTION_REASONS = ("stale", "filtered", "other")  # stale, DAPO-filtered, failed
SURPLUS = "surplus"  # finished groups sync DAPO clears beyond its batch
_evicting = contextvars.ContextVar("rlotel_verl_evicting", default=False)


@dataclass
class Trajectory:
    """The trajectory this asyncio task runs, as its stamp will carry it."""

    start_ns: int
    traceparent: str | None = None  # its span's, for the stamp
    turns: list[tuple[int, int]] = field(default_factory=list)  # each model turn's start, end
    servers: list[str] = field(default_factory=list)  # where its turns went (sticky: one)
    tools: list[tuple[str, int, int]] = field(default_factory=list)  # name, start, end


_trajectory: contextvars.ContextVar[Trajectory | None] = contextvars.ContextVar(
    "rlotel_trajectory", default=None
)


def traced_materialize(original: Any) -> Any:
    def _materialize_batch(self, *args, **kwargs):
        batch = original(self, *args, **kwargs)
        started = time.perf_counter()
        with V1_REPLAY_BATCH.guarded():  # telemetry never stops training
            V1_REPLAY_BATCH.fault()
            partition_id = args[0] if args else kwargs.get("partition_id")
            if partition_id == TRAIN_PARTITION:
                record_batch(batch)
            V1_REPLAY_BATCH.fired(time.perf_counter() - started)  # in verl's `gen`
        return batch

    return _materialize_batch


def traced_evict(original: Any) -> Any:
    """Record the groups verl is about to evict while TransferQueue still holds them
    (verl's `_clear_groups` deletes them): the step's async-bias reference."""

    def _evict_terminal_groups(self, *args, **kwargs):
        started = time.perf_counter()
        with V1_EVICT.guarded():  # telemetry never stops training
            V1_EVICT.fault()
            partition_id = guard.argument(args, kwargs, 1, "partition_id")
            eviction_reasons = guard.argument(args, kwargs, 2, "eviction_reasons")
            if partition_id == TRAIN_PARTITION and any(eviction_reasons[:3]):
                reasons = dict(zip(EVICTION_REASONS, eviction_reasons[:3], strict=True))
                record_evicted(self.partitions[partition_id], reasons)
            V1_EVICT.fired(time.perf_counter() - started)  # each poll: the hook runs
        token = _evicting.set(True)  # its `_clear_groups` call is recorded above
        try:
            return original(self, *args, **kwargs)
        finally:
            _evicting.reset(token)

    return _evict_terminal_groups


def traced_clear(original: Any) -> Any:
    """verl clears groups outside an eviction only where sync DAPO drops the finished groups
    it does not need once its batch is full: recorded as `surplus` before they are gone."""

    def _clear_groups(self, *args, **kwargs):
        started = time.perf_counter()
        with V1_EVICT.guarded():  # telemetry never stops training
            V1_EVICT.fault()
            partition_id = guard.argument(args, kwargs, 0, "partition_id")
            uids = guard.argument(args, kwargs, 1, "uids")
            if partition_id == TRAIN_PARTITION and uids and not _evicting.get():
                record_evicted(self.partitions[partition_id], {SURPLUS: uids})
            V1_EVICT.fired(time.perf_counter() - started)
        return original(self, *args, **kwargs)

    return _clear_groups


class _Group(NamedTuple):
    """The trajectories of evicted groups, shaped as the `KVBatchMeta` record_batch reads."""

    keys: list[str]
    tags: list[dict]
    partition_id: str


def record_evicted(
    partition: dict[str, dict],
    uids_by_reason: dict[str, Any],
    fetch: Any = None,
    partition_id: str = TRAIN_PARTITION,
) -> None:
    """The groups verl drops, by rlotel's discard reason → one discarded record_samples per
    reason, from the trajectories the buffer's partition (key → tag) still lists (a failed
    group may have none); a group under several reasons counts for the first."""
    seen: set[str] = set()
    for reason, uids in uids_by_reason.items():
        uids = set(uids) - seen
        seen |= uids
        keys = [key for key in partition if key.split("_")[0] in uids]  # as verl clears them
        if keys:
            group = _Group(keys, [partition[key] for key in keys], partition_id)
            record_batch(group, fetch, discarded=reason)


def record_batch(batch: Any, fetch: Any = None, discarded: str | None = None) -> dict[int, str]:
    """Per-sample metrics, identity, lengths, times and weight versions of a V1
    `KVBatchMeta` → record_samples (`discarded`: never trained, and why).

    `fetch(keys, partition_id)` returns the stored per-sample `metrics` and `extra_fields`
    dicts in key order (default: one `transfer_queue.kv_batch_get`)."""
    from rlotel.integrations.process import telemetry

    tel = telemetry()
    if discarded is None:  # the step's token counts are those of the batch it trains
        _set_tokens(tel, batch.tags)
    real = [
        (key, tag)
        for key, tag in zip(batch.keys, batch.tags, strict=True)
        if not tag.get("is_padding", False)
    ]
    if not real:
        return {}
    keys, tags = [key for key, _ in real], [tag for _, tag in real]
    metrics, extras = (fetch or _fetch)(keys, batch.partition_id)
    identity = [_identity(key) for key in keys]
    stamps = [Stamp.read(extra.get(STAMP_KEY)) for extra in extras]
    replica = replicas([extra.get(SERVER_KEY) for extra in extras])
    return tel.record_samples(
        metrics,
        prompt_length=[tag.get("prompt_len") for tag in tags],
        response_length=[tag.get("response_len") for tag in tags],
        min_weight_version=[tag.get("min_global_steps") for tag in tags],
        max_weight_version=[tag.get("max_global_steps") for tag in tags],
        uid=[uid for uid, _, _ in identity],
        session=[session for _, session, _ in identity],
        output=[output for _, _, output in identity],
        turns=[stamp.turns for stamp in stamps],
        start_time_ns=[stamp.start_ns for stamp in stamps],
        end_time_ns=[stamp.end_ns for stamp in stamps],
        trajectory_context=[stamp.context for stamp in stamps],
        turn_times_ns=[stamp.turn_times_ns for stamp in stamps],
        tool_times_ns=[stamp.tool_times_ns for stamp in stamps],
        generated_step=[tag.get("global_steps") for tag in tags],
        replica=replica,
        discarded=discarded,
        **scored(stamps),
    )


def scored(stamps: list[Stamp]) -> dict[str, Any]:
    """record_samples' `reward` (where every sample has one), `data_source` (where any has
    one) and `reward_extra_info` (the components every sample has) from the stamps."""
    fields: dict[str, Any] = {}
    rewards = [stamp.reward for stamp in stamps]
    if rewards and all(reward is not None for reward in rewards):
        fields[vocabulary.SAMPLE_REWARD] = rewards
    if any(stamp.data_source is not None for stamp in stamps):
        fields["data_source"] = [stamp.data_source for stamp in stamps]
    parts = [stamp.reward_extra for stamp in stamps]
    if parts and all(isinstance(part, dict) for part in parts):
        names = [name for name in parts[0] if all(name in part for part in parts)]
        if names:
            fields["reward_extra_info"] = {name: [part[name] for part in parts] for name in names}
    return fields


def replicas(servers: list[Any]) -> list[str] | None:
    """Each trajectory's rollout replica: verl's `replica_rank` of the server (address) its
    worker stamped; None unless every trajectory has one (occupancy then has one pool)."""
    if not servers or not all(isinstance(server, str) for server in servers):
        return None
    from rlotel.integrations import verl_engines

    distinct = sorted(set(servers))
    ranks = dict(zip(distinct, verl_engines.replica_ranks(distinct), strict=True))
    return [ranks[server] for server in servers]


def _set_tokens(tel: Any, tags: list[dict]) -> None:
    """The consuming step's per-sequence token counts, as verl's V1 `_compute_metrics`
    counts them for `timing_per_token_ms/*` and `perf/*`: every row, padding included."""
    step = tel.current_step
    if step is None or step.prompt_tokens is not None:
        return
    step.set_tokens(
        prompt=[tag.get("prompt_len", 0) for tag in tags],
        response=[tag.get("response_len", 0) for tag in tags],
    )


def _identity(key: str) -> tuple[str, Any, Any]:
    """verl's trajectory key `{uid}_{session_id}_{index}` → (uid, session, output)."""
    parts = key.rsplit("_", 2)
    if len(parts) != 3:
        return key, None, None
    uid, session, output = parts
    return uid, _number(session), _number(output)


def _number(text: str) -> int | None:
    return int(text) if text.isdigit() else None


class Stamp(NamedTuple):
    """What the agent-loop worker stamped on a trajectory (all None: no stamp). It travels in
    verl's `extra_fields` (TransferQueue, numpy object columns) as a plain list, `wire()`;
    `read` is the one reader of that list."""

    start_ns: Any = None
    end_ns: Any = None
    turns: Any = None
    traceparent: str | None = None
    turn_times_ns: Any = None
    reward: Any = None
    tool_times_ns: Any = None
    data_source: Any = None  # the prompt's `data_source`, as verl's dataset gives it
    reward_extra: Any = None  # the numeric entries of verl's `reward_extra_info`

    def wire(self) -> list[Any]:
        return list(self)

    @classmethod
    def read(cls, value: Any) -> Stamp:
        """The stamp in `value` (a stamp's list; 3 to 9 fields, older workers wrote fewer)."""
        if not isinstance(value, (list, tuple)) or not 3 <= len(value) <= len(cls._fields):
            return cls()
        return cls(*value)

    @property
    def context(self) -> dict[str, str] | None:
        """Its trajectory's span as a trace-context carrier."""
        return {"traceparent": self.traceparent} if self.traceparent else None


def _fetch(keys: list[str], partition_id: str) -> tuple[list[Any], list[dict]]:
    import transfer_queue as tq

    try:
        data = tq.kv_batch_get(
            keys=keys, partition_id=partition_id, select_fields=["metrics", "extra_fields"]
        )
        extras = [dict(extra) for extra in data["extra_fields"]]
    except Exception:  # an agent loop that set no extra_fields: metrics only
        data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["metrics"])
        extras = [{} for _ in keys]
    return [dict(metrics) for metrics in data["metrics"]], extras


# --- agent-loop worker (the process a trajectory runs in) ----------------------------------


# Ray pickles an actor class it builds at run time (`ray.remote(AgentLoopWorker)`) by value,
# methods included: these two are module-level functions (pickled by reference, imported
# in the worker) that find verl's original there, patched or not.


def _agent_loop_original(hook: Hook, name: str) -> Any:
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    return hook.original(AgentLoopWorker, name)  # as it is where rlotel patched nothing


async def run_agent_loop(self, *args, **kwargs):
    """`AgentLoopWorker._run_agent_loop`: V1 trajectories as spans under the dispatching
    phase, their real start kept for the stamp."""
    original = _agent_loop_original(V1_TRAJECTORY, "_run_agent_loop")
    phase = None
    with V1_TRAJECTORY.guarded():
        phase = _open_trajectory(self)
    if phase is None:
        return await original(self, *args, **kwargs)
    try:
        result = await original(self, *args, **kwargs)
    except BaseException as raised:
        V1_TRAJECTORY.exit_context(phase, raised)
        raise
    V1_TRAJECTORY.exit_context(phase, None)
    return result


def _open_trajectory(worker: Any) -> Any:
    """The trajectory's phase, entered: a child of the caller's (the trainer's `gen`; V1
    dispatches fire-and-forget), its engine calls nest in it. None outside V1's TQ worker
    or a traced call. Every worker (V0's too) keeps the trajectory's start, turns and
    servers for its stamp."""
    trajectory = Trajectory(clock.unix_ns())
    _trajectory.set(trajectory)  # this trajectory's own asyncio task
    if not any(cls.__name__ == TQ_WORKER for cls in type(worker).__mro__):
        return None
    import rlotel
    from rlotel.integrations.verl_workers import call_carrier

    tel, carrier = rlotel.current(), call_carrier()
    if tel is None or carrier is None:  # no traced call dispatched it
        return None
    V1_TRAJECTORY.fault()
    V1_TRAJECTORY.fired()
    phase = tel.phase(vocabulary.TRAJECTORY, context=carrier)
    phase.__enter__()
    try:
        trajectory.traceparent = tel.current_context().get("traceparent")
    except Exception:
        phase.__exit__(None, None, None)
        raise
    return phase


async def compute_score(self, *args, **kwargs):
    """`AgentLoopWorker._compute_score(outputs, ...)`: stamps the trajectory's times, turns,
    tool calls and span."""
    result = await _agent_loop_original(V1_SCORE, "_compute_score")(self, *args, **kwargs)
    with V1_SCORE.guarded():  # telemetry never stops a rollout
        V1_SCORE.fault()
        trajectory = _trajectory.get()
        if trajectory is not None:
            V1_SCORE.fired()
            outputs = args[0] if args else kwargs["outputs"]
            row = args[1] if len(args) > 1 else kwargs.get("kwargs")
            source = row.get("data_source") if isinstance(row, Mapping) else None
            end = clock.unix_ns()
            for output in outputs:
                stamp = Stamp(
                    trajectory.start_ns,
                    end,
                    output.num_turns,
                    trajectory.traceparent,
                    [list(turn) for turn in trajectory.turns] or None,
                    output.reward_score,
                    [list(call) for call in trajectory.tools] or None,
                    source if isinstance(source, str) else None,
                    _numbers(output.extra_fields.get("reward_extra_info")),
                )
                output.extra_fields[STAMP_KEY] = stamp.wire()
                servers = trajectory.servers
                output.extra_fields[SERVER_KEY] = servers[-1] if servers else None
                if "extra_fields" not in output.model_fields_set:
                    output.extra_fields = output.extra_fields  # so as_dict() keeps it
    return result


def _numbers(info: Any) -> dict[str, float] | None:
    """The numeric entries of a `reward_extra_info` dict (a reward's components; its other
    entries, text or lists, are no component)."""
    if not isinstance(info, Mapping):
        return None
    numbers = {
        name: float(value)
        for name, value in info.items()
        if isinstance(name, str) and isinstance(value, (int, float, np.integer, np.floating))
    }
    return numbers or None


def traced_server_generate(original: Any) -> Any:
    """`LLMServerClient.generate` in an agent-loop worker: one model turn of the trajectory
    this task runs (its times; what verl returns or raises is untouched)."""

    async def generate(self, *args, **kwargs):
        trajectory = _trajectory.get()
        if trajectory is None:
            return await original(self, *args, **kwargs)
        start = clock.unix_ns()
        result = await original(self, *args, **kwargs)
        with V1_TURN.guarded():  # telemetry never stops a rollout
            V1_TURN.fault()
            trajectory.turns.append((start, clock.unix_ns()))
            V1_TURN.fired()
        return result

    return generate


def traced_tool_call(original: Any) -> Any:
    """`ToolAgentLoop._call_tool(tool_call, ...)` in an agent-loop worker: one tool call of
    the trajectory this task runs (the name the model called and its times; verl's
    response, its errors and what it raises are untouched)."""

    async def call_tool(self, *args, **kwargs):
        trajectory = _trajectory.get()
        if trajectory is None:
            return await original(self, *args, **kwargs)
        start = clock.unix_ns()
        result = await original(self, *args, **kwargs)
        with V1_TOOL.guarded():  # telemetry never stops a rollout
            V1_TOOL.fault()
            call = args[0] if args else kwargs["tool_call"]
            trajectory.tools.append((str(call.name), start, clock.unix_ns()))
            V1_TOOL.fired()
        return result

    return call_tool


def traced_server_release(original: Any) -> Any:
    """`LLMServerClient._release_server(server_id, ...)`, at the end of each model turn (in
    `generate`'s `finally`): the server the trajectory this task runs was routed to."""

    def release(self, *args, **kwargs):
        trajectory = _trajectory.get()
        if trajectory is not None:
            with V1_TURN.guarded():  # telemetry never stops a rollout
                V1_TURN.fault()
                server = args[0] if args else kwargs["server_id"]
                trajectory.servers.append(str(server))
        return original(self, *args, **kwargs)

    return release


def traced_fit(original: Any) -> Any:
    def fit(self, *args, **kwargs):
        from rlotel.integrations import process

        with V1_FIT.guarded():
            V1_FIT.fault()
            process.declare_verl_driver(self.config, self._get_n_gpus_for_throughput())
            set_mode(getattr(self, "trainer_mode", "sync"))
            register_transfer_queue(self.config)
        try:
            return original(self, *args, **kwargs)
        finally:  # its last steps go out now; an exception of the loop itself propagates
            V1_FIT.fired()  # counted where the loop's telemetry now is
            V1_FIT.attempt(process.flush_driver)
            V1_FIT.attempt(_forget_transfer_queue)

    return fit


TRANSFER_QUEUE_JOB = "transfer-queue"  # the shipped Prometheus job: <sd dir>/transfer-queue-*.json


def register_transfer_queue(config: Any) -> None:
    """TransferQueue's own `/metrics` (its controller's `tq_*` series), when verl's config
    turns them on (`transfer_queue.metrics.enabled`), registered for file discovery beside
    rlotel's processes with the run's name, for the shipped `transfer-queue` job. Looked up
    on a thread: `tq.get_metrics_endpoint()` asks the controller actor (`ray.get`), which
    `fit` never waits on."""
    import threading

    from rlotel.integrations.process import setting

    if not setting(setting(setting(config, "transfer_queue"), "metrics"), "enabled"):
        return
    threading.Thread(
        target=_write_transfer_queue_target, name="rlotel-tq-target", daemon=True
    ).start()


def _write_transfer_queue_target() -> None:
    from rlotel.integrations import process, service
    from rlotel.integrations import ray as ray_integration

    with V1_FIT.guarded():
        import transfer_queue

        endpoint = transfer_queue.get_metrics_endpoint()
        if endpoint:
            run = service.of(process.telemetry()).run
            labels = {"run": run}
            ray_integration.write_target(f"http://{endpoint}/metrics", labels, TRANSFER_QUEUE_JOB)


def _forget_transfer_queue() -> None:
    """TransferQueue closes after `fit`: its target goes with it, not left to be scraped as
    down."""
    from rlotel.integrations import ray as ray_integration

    ray_integration.target_path(TRANSFER_QUEUE_JOB).unlink(missing_ok=True)


def set_mode(mode: str) -> None:
    """Goodput buckets for verl's trainer mode (V1's `gen` is waiting in async modes)."""
    from rlotel.integrations.process import telemetry

    telemetry().set_mode(str(mode))
