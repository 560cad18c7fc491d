"""verl 0.9.1's V1 path on real TransferQueue and Ray (loopback): trajectories written the
way `AgentLoopWorkerTQ._agent_loop_postprocess` writes them (real `AgentLoopOutput.as_dict`,
`list_of_dict_to_tensordict`, the same tags), consumed by the real `ReplayBuffer.sample`
inside a step. The agent-loop worker itself needs an LLM server, which does not run on this
CPU box: the nearest real layer is its storage format and calls, used here unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, register

import rlotel
from rlotel.integrations.registered import (
    REGISTRY,
    ROLLOUT_REPLICA,
    V1_EVICT,
    V1_FIT,
    V1_REPLAY_BATCH,
    V1_SCORE,
    V1_TOOL,
    V1_TRAJECTORY,
    V1_TURN,
)
from tests.helpers import attach_hooks, detach_hooks, parse_exposition, scrape

# V1's hooks (the trainer, its replay buffer, the agent-loop worker and its model turns)
V1_HOOKS = tuple(
    hook.name
    for hook in (V1_FIT, V1_REPLAY_BATCH, V1_EVICT, V1_TRAJECTORY, V1_SCORE, V1_TURN, V1_TOOL)
)

STEP = 5
# (uid, session, min_global_steps, max_global_steps, generate, tools, score, preempted, resp)
TRAJECTORIES = [
    ("p0", 0, 4, 4, 0.50, 0.10, 0.01, 0, 3),
    ("p0", 1, 2, 4, 2.00, 0.00, 0.02, 1, 5),
    ("p1", 0, 1, 3, 0.25, 0.30, 0.03, -1, 2),
    ("p1", 1, 3, 3, 0.75, 0.00, 0.04, 2, 4),
]


@pytest.fixture(scope="module")
def transfer_queue_cluster():
    """One Ray cluster and TransferQueue for the module (each start is ~20 s on 2 cores)."""
    import ray
    import transfer_queue as tq

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only
        patch.delenv("RAY_ADDRESS", raising=False)
        for attempt in (1, 2):  # Ray gives its raylet a fixed 30 s to register; beside a real
            try:  # run on 2 cores that can pass once (x16): a second start, not a longer wait
                ray.init(num_cpus=4, address="local", include_dashboard=False, log_to_driver=False)
                break
            except Exception as error:
                ray.shutdown()
                if attempt == 2 or "timed out during startup" not in str(error):
                    raise
        try:
            tq.init()  # controller + 2 storage actors: needs ≥ 3 logical CPUs
            yield tq
        finally:
            try:
                tq.close()
            finally:
                ray.shutdown()


@pytest.fixture
def transfer_queue(transfer_queue_cluster):
    """The module's TransferQueue, its train partition empty for each test."""
    tq = transfer_queue_cluster
    yield tq
    left = list(tq.kv_list(partition_id="train").get("train", {}))
    if left:
        tq.kv_clear(keys=left, partition_id="train")


def _write_trajectories(
    tq, steps: dict[str, int] | None = None, extra: dict[str, dict] | None = None
) -> None:
    """What AgentLoopWorkerTQ does: prompt status tags, then each trajectory's as_dict().
    `steps`: the step each prompt was generated for (default STEP - 1); `extra`: more
    `extra_fields` of each trajectory (by key)."""
    steps, extra = steps or {}, extra or {}
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    for uid in ("p0", "p1"):
        tag = {"is_prompt": True, "status": "finished", "global_steps": steps.get(uid, STEP - 1)}
        tq.kv_put(key=uid, partition_id="train", tag=tag)
    keys, fields, tags = [], [], []
    for uid, session, low, high, gen, tools, score, preempted, response in TRAJECTORIES:
        output = AgentLoopOutput(
            prompt_ids=[1, 2],
            response_ids=list(range(3, 3 + response)),
            response_mask=[1] * response,
            num_turns=2,
            metrics=AgentLoopMetrics(
                generate_sequences=gen, tool_calls=tools, compute_score=score,
                num_preempted=preempted,
            ),
            extra_fields={
                "min_global_steps": low, "max_global_steps": high,
                **extra.get(f"{uid}_{session}_0", {}),
            },
        )  # fmt: skip
        field = output.as_dict()
        keys.append(f"{uid}_{session}_0")
        fields.append(field)
        tags.append(
            {
                "status": "success",
                "prompt_len": 2,
                "response_len": response,
                "seq_len": 2 + response,
                "global_steps": steps.get(uid, STEP - 1),
                "min_global_steps": field["extra_fields"]["min_global_steps"],
                "max_global_steps": field["extra_fields"]["max_global_steps"],
            }
        )
    tq.kv_batch_put(
        keys=keys, fields=list_of_dict_to_tensordict(fields), tags=tags, partition_id="train"
    )


def _verl_off_policy(tags: list[dict], global_steps: int) -> dict[str, float]:
    """PPOTrainer._compute_metrics, section 5, verbatim on the batch's tags."""
    min_global_steps = np.array([tag["min_global_steps"] for tag in tags], dtype=int)
    max_global_steps = np.array([tag["max_global_steps"] for tag in tags], dtype=int)
    trajectory_spans = max_global_steps - min_global_steps + 1
    trajectory_staleness = (global_steps - 1) - max_global_steps
    trajectory_staleness_worst = (global_steps - 1) - min_global_steps
    result = {}
    for name, values in (
        ("trajectory_spans", trajectory_spans),
        ("trajectory_staleness", trajectory_staleness),
        ("trajectory_staleness_worst", trajectory_staleness_worst),
    ):
        for stat in ("mean", "max", "min"):
            result[f"training/off_policy/{name}/{stat}"] = getattr(values, stat)()
    return result


@pytest.mark.slow
def test_v1_replay_buffer_batch_becomes_samples_and_staleness(transfer_queue, tmp_path):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    _write_trajectories(transfer_queue)
    buffer = ReplayBuffer(
        trainer_mode="sync",
        trainer_config={},
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs={},
        poll_interval=0.05,
        train_batch_size=2,
        gen_batch_size=2,
    )
    tel = rlotel.init(run="v1", prometheus_port=0, traces_file=tmp_path / "traces.jsonl")
    attach_hooks(*V1_HOOKS)
    try:
        with tel.step(STEP) as step:
            with tel.phase("gen"):
                batch, _ = buffer.sample(global_steps=STEP, partition_id="train", batch_size=2)
        assert len(batch.keys) == 4
        metrics = step.metrics
        expected = _verl_off_policy(batch.tags, STEP)
        assert {k: metrics[k] for k in expected} == expected
        by_key = {f"{t[0]}_{t[1]}_0": t for t in TRAJECTORIES}
        generate = [by_key[key][4] for key in batch.keys]
        assert metrics["agent_loop/generate_sequences/max"] == max(generate)
        assert metrics["agent_loop/num_preempted/min"] == -1
        assert metrics["agent_loop/slowest/response_length"] == 5  # p0_1: 2.02 s in all
        tel.flush()
        series = parse_exposition(scrape(tel.metrics_url))
        run = ("run", "v1")
        stage = frozenset({run, ("stage", "generate_sequences")})
        assert series[("rlotel_agent_loop_duration_seconds_count", stage)] == 4
        # staleness (4 - max): 0, 0, 1, 1 → two at le=0, all four at le=1
        stale = "rlotel_sample_staleness_steps_bucket"
        assert series[(stale, frozenset({run, ("le", "0.0")}))] == 2
        assert series[(stale, frozenset({run, ("le", "1.0")}))] == 4
        assert series[("rlotel_sample_weight_span_steps_sum", frozenset({run}))] == 1 + 3 + 3 + 1
    finally:
        detach_hooks(*V1_HOOKS)
        tel.shutdown()


@pytest.mark.slow
def test_v1_groups_verl_evicts_as_stale_are_the_steps_async_bias_reference(
    transfer_queue, tmp_path
):
    """verl's async buffer with `max_off_policy_threshold=1`, strategy drop: p1, generated
    two steps back, is evicted (its 2 trajectories deleted from TransferQueue); rlotel has
    recorded them as discarded first, so the step's KS compares the trained p0 with both."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

    from rlotel.integrations import guard

    _write_trajectories(transfer_queue, steps={"p0": STEP, "p1": STEP - 2})
    buffer = ReplayBufferAsync(
        trainer_mode="colocate_async",
        trainer_config={},
        max_off_policy_threshold=1,
        max_off_policy_strategy="drop",
        sampler_kwargs={},
        poll_interval=0.05,
        train_batch_size=1,
        gen_batch_size=1,
    )
    tel = rlotel.init(run="v1", prometheus_port=0, traces_file=tmp_path / "traces.jsonl")
    attach_hooks(*V1_HOOKS)
    try:
        with tel.step(STEP) as step:
            with tel.phase("gen"):
                batch, evicted = buffer.sample(
                    global_steps=STEP, partition_id="train", batch_size=1
                )
        assert evicted["training/off_policy/evicted_samples"] == 1  # verl counts groups
        assert sorted(batch.keys) == ["p0_0_0", "p0_1_0"]
        assert not transfer_queue.kv_list(partition_id="train").get("train", {}).keys() & {
            "p1_0_0",
            "p1_1_0",
        }
        metrics = step.metrics
        assert metrics["rlotel/samples_discarded/stale"] == 0.5  # 2 of 4 generated
        # response lengths: trained {3, 5}, generated {2, 3, 4, 5}: the CDFs differ by 1/4
        assert metrics["rlotel/async_bias/ks/response_length"] == pytest.approx(0.25)
        tel.flush()
        series = parse_exposition(scrape(tel.metrics_url))
        discarded = (
            "rlotel_samples_discarded_total",
            frozenset({("run", "v1"), ("reason", "stale")}),
        )
        assert series[discarded] == 2
        # rlotel's part failing leaves verl's eviction as it was: counted, never raised
        _write_trajectories(transfer_queue, steps={"p0": STEP + 1, "p1": STEP - 2})
        guard.inject([V1_EVICT.name])
        with tel.step(STEP + 1):
            batch, evicted = buffer.sample(
                global_steps=STEP + 1, partition_id="train", batch_size=1
            )
        assert evicted["training/off_policy/evicted_samples"] == 1
        assert sorted(batch.keys) == ["p0_0_0", "p0_1_0"]
        tel.flush()
        series = parse_exposition(scrape(tel.metrics_url))
        assert series[discarded] == 2
        failed = {
            dict(labels).get("hook"): value
            for (name, labels), value in series.items()
            if name == "rlotel_integration_failures_total"
        }
        assert failed[V1_EVICT.name] >= 1  # each poll of the wait: its own call
    finally:
        guard.inject([])
        detach_hooks(*V1_HOOKS)
        tel.shutdown()


@pytest.mark.slow
def test_v1_groups_verl_filters_dapo_style_are_discarded_as_filtered(transfer_queue, tmp_path):
    """verl's DAPO group filter (`filter_groups_metric`): p1's trajectories share one `acc`,
    so verl evicts the group; rlotel records its 2 trajectories as `filtered`."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

    acc = {"p0_0_0": 0.0, "p0_1_0": 1.0, "p1_0_0": 1.0, "p1_1_0": 1.0}
    extra = {key: {"reward_extra_info": {"acc": value}} for key, value in acc.items()}
    _write_trajectories(transfer_queue, extra=extra)
    buffer = ReplayBufferAsync(
        trainer_mode="colocate_async",
        trainer_config={},
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs={},
        poll_interval=0.05,
        refill_fn=lambda count: None,  # the trainer would submit `count` new prompts
        filter_groups_metric="acc",
        train_batch_size=1,
        gen_batch_size=1,
    )
    tel = rlotel.init(run="v1", prometheus_port=0, traces_file=tmp_path / "traces.jsonl")
    attach_hooks(*V1_HOOKS)
    try:
        with tel.step(STEP) as step:
            batch, evicted = buffer.sample(global_steps=STEP, partition_id="train", batch_size=1)
        assert evicted["training/filter_groups/evicted_samples"] == 1
        assert sorted(batch.keys) == ["p0_0_0", "p0_1_0"]
        assert step.metrics["rlotel/samples_discarded/filtered"] == 0.5
        assert step.metrics["rlotel/samples_discarded/stale"] == 0
    finally:
        detach_hooks(*V1_HOOKS)
        tel.shutdown()


@pytest.mark.slow
def test_v1_finished_groups_sync_dapo_drops_beyond_its_batch_are_discarded_as_surplus(
    transfer_queue, tmp_path
):
    """Sync DAPO (`ReplayBuffer` in `sync` mode): both groups carry signal, the batch takes
    one, and verl clears the other as surplus (`filter_groups/discarded_surplus_samples`);
    rlotel records its 2 trajectories as `surplus` before they are gone, and nothing twice."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    acc = {"p0_0_0": 0.0, "p0_1_0": 1.0, "p1_0_0": 1.0, "p1_1_0": 0.0}
    extra = {key: {"reward_extra_info": {"acc": value}} for key, value in acc.items()}
    _write_trajectories(transfer_queue, extra=extra)
    buffer = ReplayBuffer(
        trainer_mode="sync",
        trainer_config={},
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs={},
        poll_interval=0.05,
        refill_fn=lambda count: None,  # the trainer would submit `count` new prompts
        filter_groups_metric="acc",
        train_batch_size=1,
        gen_batch_size=1,
    )
    tel = rlotel.init(run="v1", prometheus_port=0, traces_file=tmp_path / "traces.jsonl")
    attach_hooks(*V1_HOOKS)
    try:
        with tel.step(STEP) as step:
            batch, dropped = buffer.sample(global_steps=STEP, partition_id="train", batch_size=1)
        assert dropped == {"training/filter_groups/discarded_surplus_samples": 1}
        assert len(batch.keys) == 2
        assert step.metrics["rlotel/samples_discarded/surplus"] == 0.5
        assert step.metrics["rlotel/samples_discarded/filtered"] == 0
        tel.flush()
        series = parse_exposition(scrape(tel.metrics_url))
        surplus = (
            "rlotel_samples_discarded_total",
            frozenset({("run", "v1"), ("reason", "surplus")}),
        )
        assert series[surplus] == 2
    finally:
        detach_hooks(*V1_HOOKS)
        tel.shutdown()


@pytest.mark.slow
def test_v1_trainer_mode_switches_goodput_table():
    from verl.trainer.ppo.v1 import trainer_base

    from rlotel.integrations import verl_v1

    tel = rlotel.init(run="mode", prometheus_port=None)
    attach_hooks(*V1_HOOKS)
    try:
        assert trainer_base.PPOTrainer.fit is not REGISTRY.original(trainer_base.PPOTrainer, "fit")
        verl_v1.set_mode("separate_async")
        with tel.step(1) as step, tel.phase("gen"):
            pass
        assert step.metrics["rlotel/bucket_seconds/idle"] > 0  # V1 async gen = waiting
        assert "rlotel/idle_ratio/trainer" in step.metrics
    finally:
        detach_hooks(*V1_HOOKS)
        tel.shutdown()


# --- the agent-loop worker's own path: verl's AgentLoopWorkerTQ writing to TransferQueue ---


@register("rlotel_matmul")
class MatmulAgentLoop(AgentLoopBase):
    """A user's custom agent loop (verl's plugin point): real torch work as "generation",
    its response length set by the prompt, timed like verl's loops time theirs."""

    def __init__(self, **_components):  # no tokenizer or server: nothing to serve here
        pass

    async def run(self, sampling_params, **kwargs):
        import time

        import torch
        from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

        started = time.perf_counter()
        work = torch.randn(64, 64)
        for _ in range(20 * (1 + kwargs["session_id"])):  # later sessions work longer
            work = torch.tanh(work @ work)
        response = 2 + kwargs["session_id"]
        return AgentLoopOutput(
            prompt_ids=[1, 2, 3],
            response_ids=list(range(response)),
            response_mask=[1] * response,
            num_turns=2 + kwargs["session_id"],
            metrics=AgentLoopMetrics(generate_sequences=time.perf_counter() - started),
            extra_fields={"min_global_steps": kwargs["global_steps"], "max_global_steps": 4},
        )


def _tq_worker():
    """verl's AgentLoopWorkerTQ itself (the class behind its Ray actor), with the
    attributes its trajectory path reads; no LLM server, tokenizer or reward workers."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    worker_class = AgentLoopWorkerTQ.__ray_metadata__.modified_class.__mro__[1]
    worker = object.__new__(worker_class)
    worker.config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": 2}}, "data": {}})
    worker.llm_client = worker.tokenizer = worker.processor = None
    worker.hf_model_type = worker.dataset_cls = None
    worker.tools, worker.reward_loop_worker_handles, worker.distillation_enabled = [], None, False
    return worker


@pytest.mark.slow
def test_v1_worker_trajectories_reach_the_consuming_step_with_identity_times_and_links(
    transfer_queue, tmp_path
):
    import asyncio
    import time

    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    from tests.helpers import file_spans

    tel = rlotel.init(
        run="v1w", prometheus_port=None, traces_file=tmp_path / "t.jsonl", max_sample_spans=4
    )
    attach_hooks(*V1_HOOKS)
    worker = _tq_worker()
    generated = STEP - 1
    try:
        with tel.step(generated), tel.phase("gen"):  # the trainer dispatches step 4's prompts
            uids = ["q0", "q1"]
            tag = {"is_prompt": True, "status": "pending", "global_steps": generated}
            transfer_queue.kv_batch_put(keys=uids, partition_id="train", tags=[tag] * 2)
            before = time.time_ns()

            async def rollout():  # what AgentLoopWorkerTQ.generate_sequences spawns
                trajectory = {"step": generated, "sample_index": 0, "rollout_n": 0}
                await asyncio.gather(
                    *(
                        worker._run_prompt(
                            {"uid": uid, "agent_name": "rlotel_matmul", "global_steps": generated},
                            {},
                            trajectory={**trajectory, "validate": False},
                        )
                        for uid in uids
                    )
                )

            asyncio.run(rollout())
            after = time.time_ns()
        buffer = ReplayBuffer(
            trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None,
            max_off_policy_strategy="drop", sampler_kwargs={}, poll_interval=0.05,
            train_batch_size=2, gen_batch_size=2,
        )  # fmt: skip
        with tel.step(STEP) as step, tel.phase("gen"):
            batch, _ = buffer.sample(global_steps=STEP, partition_id="train", batch_size=2)
        assert sorted(batch.keys) == ["q0_0_0", "q0_1_0", "q1_0_0", "q1_1_0"]
        assert step.metrics["training/off_policy/trajectory_staleness/max"] == (STEP - 1) - 4
    finally:
        detach_hooks(*V1_HOOKS)
        tel.shutdown()
    spans = file_spans(tmp_path / "t.jsonl", run="v1w")
    steps = {s["attrs"]["rl.step"]: s for s in spans if s["name"] == "step"}
    samples = [s for s in spans if s["name"] == "sample"]
    assert len(samples) == 4
    for sample in samples:
        attrs = sample["attrs"]
        key = f"{attrs['rl.sample.uid']}_{attrs['rl.sample.session']}_{attrs['rl.sample.output']}"
        assert key in batch.keys
        assert attrs["rl.sample.turns"] == 2 + attrs["rl.sample.session"]
        assert attrs["gen_ai.usage.output_tokens"] == 2 + attrs["rl.sample.session"]
        assert attrs["rl.sample.weight_version.min"] == generated
        assert attrs["rl.sample.generated_step"] == generated
        assert sample["trace"] == steps[STEP]["trace"]  # consumed in step 5
        assert before <= sample["start"] < sample["end"] <= after  # its real times, in step 4
        ((trace, span_id, link),) = sample["links"]
        assert (trace, span_id) == (steps[generated]["trace"], steps[generated]["id"])
        assert link["rl.link.relation"] == "generated_in"
    slowest = max(samples, key=lambda s: s["attrs"]["rl.sample.generate_sequences_s"])
    assert (
        step.metrics["agent_loop/slowest/response_length"]
        == slowest["attrs"]["gen_ai.usage.output_tokens"]
    )


def test_v1_stamps_give_sample_spans_their_model_turns_tool_calls_and_reward(
    make_tel, span_exporter
):
    """What the agent-loop worker stamps on a trajectory (its times, each model turn's
    `LLMServerClient.generate`, verl's reward score, each `ToolAgentLoop._call_tool`)
    becomes the sample span's `chat` and `execute_tool {tool}` children and its
    `gen_ai.evaluation.result` event, when the trainer's replay buffer hands the batch to a
    step; a stamp without tool calls (single-turn, or a worker's older rlotel) has none."""
    from types import SimpleNamespace

    from rlotel.integrations import verl_v1

    tel = make_tel(max_sample_spans=4)
    start = 1_700_000_000_000_000_000
    stamps = [
        [
            start,
            start + 900,
            2,
            None,
            [[start + 100, start + 300], [start + 500, start + 800]],
            0.5,
            [["toy_calculator", start + 320, start + 480]],
        ],
        [start, start + 700, 1, None, [[start + 200, start + 600]], 1.0],
    ]
    batch = SimpleNamespace(
        keys=["q0_0_0", "q0_1_0"],
        tags=[{"prompt_len": 3, "response_len": 4, "global_steps": 1}] * 2,
        partition_id="train",
    )

    def fetch(keys, partition_id):
        metrics = [{"generate_sequences": 0.5, "tool_calls": 0.0} for _ in keys]
        return metrics, [{verl_v1.STAMP_KEY: stamp} for stamp in stamps]

    with tel.step(1), tel.phase("gen"):
        verl_v1.record_batch(batch, fetch)
    assert tel.flush(10)
    spans = span_exporter.get_finished_spans()
    samples = {s.attributes["gen_ai.conversation.id"]: s for s in spans if s.name == "sample"}
    assert sorted(samples) == ["q0_0_0", "q0_1_0"]
    for (key, sample), stamp in zip(sorted(samples.items()), stamps, strict=True):
        chats = sorted(
            (s.start_time - start, s.end_time - start)
            for s in spans
            if s.name == "chat" and s.parent.span_id == sample.context.span_id
        )
        assert chats == [(a - start, b - start) for a, b in stamp[4]], key
        calls = [
            (s.name, s.attributes["gen_ai.operation.name"], s.attributes["gen_ai.tool.name"])
            for s in spans
            if s.name.startswith("execute_tool") and s.parent.span_id == sample.context.span_id
        ]
        times = sorted(
            (s.start_time - start, s.end_time - start)
            for s in spans
            if s.name.startswith("execute_tool") and s.parent.span_id == sample.context.span_id
        )
        tools = stamp[6] if len(stamp) > 6 else []
        assert calls == [(f"execute_tool {tool}", "execute_tool", tool) for tool, _, _ in tools]
        assert times == [(a - start, b - start) for _, a, b in tools], key
        (event,) = [e for e in sample.events if e.name == "gen_ai.evaluation.result"]
        assert event.attributes["gen_ai.evaluation.score.value"] == stamp[5]


class _Replica:  # what rlotel reads of verl's RolloutReplica: its rank and its address
    def __init__(self, rank: int, address: str) -> None:
        self.replica_rank, self._server_address = rank, address


def test_each_trajectory_counts_for_the_replica_verl_routed_it_to(make_tel, span_exporter):
    """The server a trajectory's worker stamped (verl's load balancer keys servers by
    address) becomes verl's `replica_rank` of the replica serving there: the sample span's
    `rl.replica` and one occupancy series per replica, each from its own trajectories."""
    from types import SimpleNamespace

    from rlotel.integrations import verl_engines, verl_v1

    replicas = [_Replica(0, "127.0.0.1:4000"), _Replica(1, "127.0.0.1:3000")]  # not sorted
    for replica in replicas:
        verl_engines.note_replica(replica)
    tel = make_tel(run="rep", max_sample_spans=4)
    t0, s = 1_700_000_000_000_000_000, 1_000_000_000
    # replica 0: two side by side for 1 s (1.0); replica 1: two for 1 s, one more for 1 s
    routed = [
        ("127.0.0.1:4000", 0, s),
        ("127.0.0.1:3000", 0, s),
        ("127.0.0.1:4000", 0, s),
        ("127.0.0.1:3000", 0, 2 * s),
    ]
    batch = SimpleNamespace(
        keys=[f"q0_{i}_0" for i in range(4)],
        tags=[{"prompt_len": 3, "response_len": 4, "global_steps": 1}] * 4,
        partition_id="train",
    )

    def fetch(keys, partition_id):
        extras = [
            {verl_v1.STAMP_KEY: [t0 + a, t0 + b, 1], verl_v1.SERVER_KEY: server}
            for server, a, b in routed
        ]
        return [{"generate_sequences": 0.5} for _ in keys], extras

    try:
        with tel.step(1) as step, tel.phase("gen"):
            verl_v1.record_batch(batch, fetch)
    finally:
        ROLLOUT_REPLICA.state.clear()
    assert {name: o.ratio for name, o in step.summary.occupancy.items()} == {
        "0": 1.0,
        "1": pytest.approx(0.75),
    }
    assert tel.flush(10)
    labelled = {
        s.attributes["gen_ai.conversation.id"]: s.attributes["rl.replica"]
        for s in span_exporter.get_finished_spans()
        if s.name == "sample"
    }
    assert labelled == {"q0_0_0": "0", "q0_1_0": "1", "q0_2_0": "0", "q0_3_0": "1"}
    series = parse_exposition(scrape(tel.metrics_url))
    for replica, ratio in (("0", 1.0), ("1", 0.75)):
        key = ("rlotel_rollout_occupancy_ratio", frozenset({("run", "rep"), ("replica", replica)}))
        assert series[key] == pytest.approx(ratio)
