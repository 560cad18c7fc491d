"""verl 0.9.1's separate-async trainer (`PPOTrainerSeparateAsync`) as rlotel sees it.

Three global steps of the V1 separate_async trainer run with rlotel's verl plugin installed,
`parameter_sync_step=2` and hybrid switching on. A step that begins in rollout mode lends the
hybrid replicas to generation until enough prompt groups are sampleable (`switch_wait`) and
takes them back (`switch_to_trainer`); every step trains on two mini-batches (`gen`,
`old_log_prob`, `adv`, `update_actor`, each twice) and syncs the standalone rollout
(`update_weights`); where verl decides to (always after the first step, never after the
last) it hands the hybrid replicas back (`switch_to_rollout`, twice in one step). The test
checks that every window is its own span with its goodput bucket, that the spans sum to the
trainer's own `timing_raw` (which verl's `marked_timer` fills), and the separate-async
goodput, bucket seconds and idle ratios.

Real, and unpatched but for rlotel's one hook (`verl.utils.profiler.performance._timer`,
which the plugin replaces in production too):
- the trainer's methods: `on_step_begin`, `prepare_step` (→ `PPOTrainer.prepare_step`:
  dataloader batch → pending prompt tags in TransferQueue → rollout),
  `_wait_for_sampleable_and_switch`, `_timed_switch_to_trainer`, `switch_to_trainer`,
  `PPOTrainer.step` with its `parameter_sync_step` loop of `_step_once` (`gen` =
  `ReplayBufferAsync.sample`, `_balance_batch`, `_compute_old_log_prob` in rollout-correction
  bypass mode, GRPO `_compute_advantage`, `_update_actor`), `on_sample_begin/end`,
  `on_step_end` (verl's switch decision, `update_weights`, `switch_to_rollout`),
  `switch_to_rollout`, `add/remove_replicas_from_balancer`, `clear_sticky_cache`,
  `_init_hybrid_rollout_state`, `_build_replay_buffer`, `_start/_stop_profiling`,
  `_consume_sync_metrics`; verl's `marked_timer` (the NVTX variant: `nvtx` imports here);
- `ReplayBufferAsync` polling real TransferQueue 0.1.11 (controller and storage actors on
  a local loopback Ray cluster); the rollout writes prompt status tags and trajectories with
  `AgentLoopWorkerTQ`'s calls and formats (`AgentLoopOutput.as_dict`,
  `list_of_dict_to_tensordict`, the same tags), so `switch_wait` ends when the replay buffer
  sees the groups another thread finished;
- the global load balancer: verl's `GlobalRequestLoadBalancer` Ray actor (`get_router_handle`),
  which the trainer adds the hybrid replica to and removes it from, and which routes every
  rollout request.
Ray is needed for those two: the switch methods `ray.get` the balancer actor, and
TransferQueue's controller and storage are Ray actors. The one setting changed on a real
object: the replay buffer polls every 0.05 s (verl's default, 2 s, would make each wait 2 s).

Stood in (they need GPUs, FSDP, vLLM, NCCL or a dataset):
- the trainer is made with `object.__new__` and given only the attributes those methods
  read: `__init__`/`init` build Ray worker groups, vLLM replicas and checkpoint engines;
  its config is a DictConfig of the keys read, valued as a separate_async run sets them;
- the actor worker group: a bigram policy in this process; `update_actor` reads the batch
  from TransferQueue and takes one PPO-clip Adam step;
- the rollout (agent-loop manager and the vLLM replicas `standalone-0`, `hybrid-0`): one
  thread decoding with the replica's copy of the policy (reward: share of target tokens);
  an aborted request restarts (vLLM would resume it: verl's partial rollout);
- the checkpoint managers: copy the actor's weights into the replicas (decoding waits for
  the copy), abort / sleep (free the weights) / resume the hybrid replica;
- `fit`: its loop body is run as written (the `step` timer, hooks, `step`, sync metrics,
  `tq.kv_clear`) without validation, checkpoints, `_compute_metrics` and Tracking.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import ray
import torch
import transfer_queue as tq

import rlotel
from tests.helpers import file_spans

pytestmark = pytest.mark.slow  # Ray and TransferQueue start in ~30 s on two cores

VOCAB, PROMPT_LEN, RESPONSE_LEN, TARGET = 8, 3, 6, 3
TRAIN_BATCH, SYNC_STEPS, N = 4, 2, 2  # prompts per step, parameter_sync_step, rollout.n
STEPS = 3  # the last never hands the hybrid replicas back
STANDALONE, HYBRID = "standalone-0", "hybrid-0"
POLL_S = 0.05  # the replay buffer's poll interval (verl's default is 2 s)
BOUND_S = 120  # the whole run; each wait inside is bounded too
TOLERANCE_S = 1e-6
CLOCK_SLACK_NS = 2_000_000  # a time.time_ns() of the rollout thread vs span times
BUCKETS = {
    "switch_wait": "idle",
    "gen": "idle",  # V1 async: the trainer waiting for the replay buffer
    "switch_to_trainer": "overhead",
    "switch_to_rollout": "overhead",
    "update_weights": "overhead",
    "old_log_prob": "overhead",
    "adv": "overhead",
    "update_actor": "productive",
}


def _config():
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "data": {"train_batch_size": TRAIN_BATCH, "gen_batch_size": None},
            "trainer": {
                "nnodes": 1,
                "n_gpus_per_node": 1,
                "critic_warmup": 0,
                "v1": {
                    "trainer_mode": "separate_async",
                    "separate_async": {"parameter_sync_step": SYNC_STEPS},
                    "sampler": {
                        "max_off_policy_threshold": None,
                        "max_off_policy_strategy": "drop",
                        "sampler_kwargs": {},
                    },
                },
            },
            "actor_rollout_ref": {
                "actor": {
                    "ppo_mini_batch_size": TRAIN_BATCH // SYNC_STEPS,
                    "calculate_entropy": False,
                    "entropy_coeff": 0.0,
                    "ppo_epochs": 1,
                    "data_loader_seed": 0,
                    "shuffle": False,
                },
                "rollout": {
                    "n": N,
                    "temperature": 1.0,
                    "nnodes": 1,
                    "n_gpus_per_node": 1,
                    "calculate_log_probs": True,
                },
            },
            "algorithm": {
                "adv_estimator": "grpo",
                "gamma": 1.0,
                "lam": 1.0,
                "norm_adv_by_std_in_grpo": True,
                "use_kl_in_reward": False,
                "rollout_correction": {"bypass_mode": True},
            },
            "global_profiler": {"steps": None, "profile_continuous_steps": False},
        }
    )


# --- stand-ins -----------------------------------------------------------------------------


class Policy(torch.nn.Module):
    """The actor: next-token logits from the previous token."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.zeros(VOCAB, VOCAB))

    def log_probs(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        previous = torch.cat([prompts[:, -1:], responses[:, :-1]], dim=1)
        log_p = torch.log_softmax(self.table[previous], dim=-1)
        return log_p.gather(-1, responses.unsqueeze(-1)).squeeze(-1)


class ActorWorkerGroup:
    """`actor_rollout_wg`: one data-parallel rank holding the policy."""

    def __init__(self) -> None:
        self._dispatch_info = {"actor": [0]}  # read by `_balance_batch`
        self.policy = Policy()
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=0.1)
        self.updates = 0

    def update_actor(self, batch: Any) -> dict:
        """One PPO-clip step on the batch's trajectories, read from TransferQueue."""
        fields = ["prompts", "responses", "response_mask", "old_log_probs", "advantages"]
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=fields
        )
        prompts, responses, mask, old, advantages = (
            torch.stack(list(data[name].unbind())) for name in fields
        )
        ratio = torch.exp(self.policy.log_probs(prompts, responses) - old)
        clipped = torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
        loss = -(clipped * mask).sum() / mask.sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.updates += 1
        return {"metrics": {"pg_loss": [loss.item()], "mfu": [0.0]}}


class Aborted(Exception):
    pass


class Replica:
    """A rollout server: its copy of the weights, their version, and the abort gate."""

    def __init__(self, name: str, table: torch.Tensor) -> None:
        self.name = name
        self.cond = threading.Condition()
        self.table: torch.Tensor | None = table.detach().clone()  # None: asleep
        self.version = 0
        self.paused = False  # aborted and not resumed: new requests wait
        self.epoch = 0  # each abort stops the requests in flight

    def load(self, table: torch.Tensor, version: int) -> None:
        with self.cond:
            self.table, self.version = table.detach().clone(), version
            self.cond.notify_all()

    def abort(self) -> None:
        with self.cond:
            self.epoch += 1
            self.paused = True
            self.cond.notify_all()

    def sleep(self) -> None:
        with self.cond:
            self.table = None

    def resume(self) -> None:
        with self.cond:
            self.paused = False
            self.cond.notify_all()

    def generate(self, last_token: int, generator: torch.Generator, temperature: float):
        """Sample RESPONSE_LEN tokens: (tokens, log-probs, min and max weight version)."""
        with self.cond:
            epoch = self.epoch
            ready = self.cond.wait_for(
                lambda: self.epoch != epoch or (not self.paused and self.table is not None),
                timeout=0.5,
            )
            if not ready or self.epoch != epoch:
                raise Aborted(self.name)
        tokens, log_probs, versions = [], [], []
        previous = last_token
        for _ in range(RESPONSE_LEN):
            with self.cond:
                if self.epoch != epoch or self.table is None:
                    raise Aborted(self.name)
                logits = self.table[previous] / temperature
                versions.append(self.version)
            probs = torch.softmax(logits, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=generator))
            tokens.append(token)
            log_probs.append(float(torch.log(probs[token])))
            previous = token
        return tokens, log_probs, min(versions), max(versions)


class StandaloneCheckpointManager:
    """`standalone_checkpoint_manager`: the actor's weights into the standalone replicas."""

    def __init__(self, actor: ActorWorkerGroup, replicas: list[Replica]) -> None:
        self.actor, self.replicas, self.syncs = actor, replicas, 0

    def update_weights(self, global_steps: int) -> dict:
        for replica in self.replicas:
            replica.load(self.actor.policy.table, global_steps)
        self.syncs += 1
        return {}


class HybridCheckpointManager(StandaloneCheckpointManager):
    """`checkpoint_manager` of the hybrid replicas (colocated with the trainer)."""

    def abort_replicas(self, reject_request: bool = False) -> None:
        for replica in self.replicas:
            replica.abort()

    def sleep_replicas(self) -> None:
        for replica in self.replicas:
            replica.sleep()

    def resume_generation_replicas(self) -> None:
        for replica in self.replicas:
            replica.resume()


class Prompts:
    """The train dataloader: batches of TRAIN_BATCH prompts, as `collate_fn` returns them."""

    def __iter__(self):
        generator = torch.Generator().manual_seed(1)
        for index in range(0, 100 * TRAIN_BATCH, TRAIN_BATCH):
            ids = torch.randint(0, VOCAB, (TRAIN_BATCH, PROMPT_LEN), generator=generator)
            raw = [[{"role": "user", "content": " ".join(map(str, row))}] for row in ids.tolist()]
            yield {
                "input_ids": ids,
                "raw_prompt": np.array(raw, dtype=object),
                "index": np.arange(index, index + TRAIN_BATCH),
            }


class Rollout:
    """The agent-loop manager and its servers: `generate_sequences` hands prompts to a
    thread that writes what `AgentLoopWorkerTQ` writes, routed by the real balancer."""

    def __init__(self, balancer: Any, replicas: dict[str, Replica], temperature: float) -> None:
        self.balancer, self.replicas, self.temperature = balancer, replicas, temperature
        self.todo: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.generator = torch.Generator().manual_seed(0)
        self.finished_ns: dict[str, tuple[int, int]] = {}  # uid → (global_steps, time_ns)
        self.generate_seconds: dict[str, float] = {}  # trajectory key → seconds
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="rollout", daemon=True)
        self.thread.start()

    def generate_sequences(self, batch: Any) -> None:
        """`AgentLoopManagerTQ.generate_sequences`: dispatch, do not wait (its prompt split)."""
        from tensordict.tensorclass import NonTensorData, NonTensorStack

        for i in range(len(batch)):
            prompt = {}
            for key, value in batch.items():
                if isinstance(value, torch.Tensor):
                    prompt[key] = value[i]
                elif isinstance(value, NonTensorStack):
                    prompt[key] = value[i].data
                elif isinstance(value, NonTensorData):
                    prompt[key] = value.data
            self.todo.put(prompt)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                prompt = self.todo.get(timeout=0.05)
            except queue.Empty:
                continue
            try:
                self._run_prompt(prompt)
            except BaseException as error:  # the trainer's bounded wait reports it
                self.error = error
                return

    def _decode(self, request_id: str, last_token: int):
        for _ in range(100):
            server, _handle = ray.get(self.balancer.acquire_server.remote(request_id), timeout=30)
            try:
                return self.replicas[server].generate(last_token, self.generator, self.temperature)
            except Aborted:
                continue
            finally:
                ray.get(self.balancer.release_server.remote(server), timeout=30)
        raise RuntimeError(f"{request_id}: aborted 100 times")

    def _run_prompt(self, prompt: dict) -> None:
        from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        uid, global_steps = prompt["uid"], int(prompt["global_steps"])
        prompt_ids = [int(t) for t in prompt["input_ids"]]
        tq.kv_put(key=uid, partition_id="train", tag={"status": "running"})
        keys, fields, tags = [], [], []
        for session in range(N):
            start = time.perf_counter()
            tokens, log_probs, low, high = self._decode(f"{uid}_{session}", prompt_ids[-1])
            seconds = time.perf_counter() - start
            output = AgentLoopOutput(
                prompt_ids=prompt_ids,
                response_ids=tokens,
                response_mask=[1] * len(tokens),
                response_logprobs=log_probs,
                reward_score=sum(t == TARGET for t in tokens) / len(tokens),
                num_turns=2,
                metrics=AgentLoopMetrics(generate_sequences=seconds),
                extra_fields={"min_global_steps": low, "max_global_steps": high},
            )
            field = output.as_dict()
            field["uid"] = uid  # AgentLoopWorkerTQ adds the prompt's fields
            key = f"{uid}_{session}_0"
            keys.append(key)
            fields.append(field)
            tags.append(
                {
                    "status": "success",
                    "prompt_len": len(prompt_ids),
                    "response_len": len(tokens),
                    "seq_len": len(prompt_ids) + len(tokens),
                    "global_steps": global_steps,
                    "min_global_steps": low,
                    "max_global_steps": high,
                }
            )
            self.generate_seconds[key] = seconds
        tq.kv_batch_put(
            keys=keys, fields=list_of_dict_to_tensordict(fields), tags=tags, partition_id="train"
        )
        tq.kv_put(key=uid, partition_id="train", tag={"status": "finished"})
        self.finished_ns[uid] = (global_steps, time.time_ns())


# --- the trainer -----------------------------------------------------------------------------


@dataclass
class StepRun:
    number: int
    handle: Any  # rlotel's step
    timing_raw: dict[str, float]  # the trainer's own self.timing_raw
    metrics: dict[str, Any]  # what fit would log (verl's)
    keys: list[str]  # trajectories trained on


def _trainer(config, balancer, rollout, actor, standalone, hybrid):
    from verl.trainer.config import HybridRolloutSwitchConfig
    from verl.trainer.ppo.v1.trainer_separate_async import (
        HybridEngineMode,
        PPOTrainerSeparateAsync,
    )

    trainer = object.__new__(PPOTrainerSeparateAsync)
    # what PPOTrainer.__init__ and PPOTrainerSeparateAsync.__init__ set from the config
    trainer.config = config
    trainer.use_critic = trainer.use_reference_policy = False
    trainer.trainer_mode = config.trainer.v1.trainer_mode
    trainer.parameter_sync_step = config.trainer.v1.separate_async.parameter_sync_step
    trainer.local_trigger_step = 0
    trainer._restored_tq_prompt_count = 0
    trainer.replay_buffer = trainer._build_replay_buffer()
    trainer.replay_buffer.poll_interval = POLL_S
    trainer.hybrid_rollout_config = HybridRolloutSwitchConfig(
        enable_switch=True, switch_threshold_ratio=0.5
    )
    trainer._init_hybrid_rollout_state()
    # what _setup / fit would build: workers, servers, managers, dataloader
    trainer.actor_rollout_wg = actor
    trainer.tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=0)
    trainer.reward_loop_manager = SimpleNamespace(reward_loop_worker_handles=[])  # in the loop
    trainer.agent_loop_manager = rollout
    trainer.train_dataloader, trainer.train_dataloader_it = Prompts(), None
    trainer.llm_server_manager = SimpleNamespace(server_addresses=[HYBRID], server_handles=[HYBRID])
    trainer.standalone_server_manager = SimpleNamespace(global_load_balancer=balancer)
    trainer.checkpoint_manager = hybrid
    trainer.standalone_checkpoint_manager = standalone
    trainer.global_steps, trainer.total_training_steps = 1, STEPS
    trainer.prev_step_profile = trainer.curr_step_profile = trainer.next_step_profile = False
    # _setup's end: the hybrid replicas start in rollout mode, registered with the balancer
    trainer.current_mode = HybridEngineMode.ROLLOUT
    trainer.add_replicas_to_balancer()
    return trainer


def _fit(self, steps: int) -> list[StepRun]:
    """`PPOTrainer.fit`'s loop body as written (`self`: the trainer, as in verl, where
    the plugin reads the step number from)."""
    from verl.utils.debug import marked_timer

    runs = []
    for _ in range(steps):
        metrics: dict = {}
        self.timing_raw = {}
        with marked_timer("step", self.timing_raw):
            handle = rlotel.current().current_step
            self.on_step_begin()
            self._start_profiling()
            batch = self.step(metrics, self.timing_raw)
            self._stop_profiling()
            self.on_step_end()
            metrics.update(self._consume_sync_metrics())
        tq.kv_clear(keys=batch.keys, partition_id=batch.partition_id)
        runs.append(StepRun(self.global_steps, handle, dict(self.timing_raw), metrics, batch.keys))
        self.global_steps += 1
    return runs


def _run_bounded(trainer, rollout) -> list[StepRun]:
    result: dict[str, Any] = {}

    def train() -> None:
        try:
            result["runs"] = _fit(trainer, STEPS)
        except BaseException as error:
            result["error"] = error

    thread = threading.Thread(target=train, name="trainer", daemon=True)
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), f"no result in {BOUND_S} s; rollout error: {rollout.error!r}"
    if "error" in result:
        raise result["error"]
    return result["runs"]


@pytest.fixture
def cluster(monkeypatch):
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray.init(num_cpus=8, address="local", include_dashboard=False, log_to_driver=False)
    try:
        tq.init()  # controller + 2 storage actors
        yield
    finally:
        try:
            tq.close()
        finally:
            ray.shutdown()


# --- the test --------------------------------------------------------------------------------


def test_separate_async_windows_are_spans_that_sum_to_verls_timing_raw(cluster, tmp_path):
    from verl.workers.rollout.router import get_router_handle

    from rlotel.integrations import verl as plugin
    from rlotel.integrations import verl_v1

    config = _config()
    actor = ActorWorkerGroup()
    replicas = {name: Replica(name, actor.policy.table) for name in (STANDALONE, HYBRID)}
    balancer = get_router_handle(servers={STANDALONE: STANDALONE})
    rollout = Rollout(balancer, replicas, config.actor_rollout_ref.rollout.temperature)
    standalone = StandaloneCheckpointManager(actor, [replicas[STANDALONE]])
    hybrid = HybridCheckpointManager(actor, [replicas[HYBRID]])
    traces = tmp_path / "t.jsonl"
    tel = rlotel.init(run="sepasync", prometheus_port=None, traces_file=traces)
    plugin.install()
    try:
        verl_v1.set_mode("separate_async")
        trainer = _trainer(config, balancer, rollout, actor, standalone, hybrid)
        runs = _run_bounded(trainer, rollout)
        assert tel.flush(30)
    finally:
        rollout.stop.set()
        rollout.thread.join(10)
        plugin.uninstall()
        tel.shutdown()
    assert rollout.error is None
    assert actor.updates == STEPS * SYNC_STEPS and standalone.syncs == STEPS
    spans = file_spans(traces, run="sepasync")

    switched = [run.metrics["separate_async/decision/should_switch_to_rollout"] for run in runs]
    assert switched[0] == 1.0  # no switch cost measured yet: verl lends the GPUs
    assert switched[-1] == 0.0  # the last step: verl never lends them
    for run, began_in_rollout, switches in zip(runs, [1.0, *switched[:-1]], switched, strict=True):
        (root,) = [s for s in spans if s["name"] == "step" and s["attrs"]["rl.step"] == run.number]
        phases = [s for s in spans if s["trace"] == root["trace"] and "rl.phase" in s["attrs"]]
        assert all(s["parent"] == root["id"] for s in phases)  # verl's windows are top level

        # one span per window verl opened: repeats are separate spans, not merged
        expected = dict.fromkeys(("gen", "old_log_prob", "adv", "update_actor"), SYNC_STEPS)
        expected["update_weights"] = 1
        if began_in_rollout:
            expected |= {"switch_wait": 1, "switch_to_trainer": 1}
        if switches:
            expected["switch_to_rollout"] = 2  # prepare, then wake-up: one key in verl
        assert Counter(s["name"] for s in phases) == expected, run.number
        for span in phases:
            assert span["attrs"]["rl.bucket"] == BUCKETS[span["name"]], span["name"]

        # the spans sum to the trainer's own timing_raw, and so does rlotel's step
        verl = run.timing_raw
        untimed = set(verl) - {*expected, "step"}  # on_step_begin presets switch_wait = 0.0
        assert untimed <= {"switch_wait"} and all(verl[name] == 0.0 for name in untimed)
        for name, seconds in verl.items():
            ns = sum(s["end"] - s["start"] for s in [root, *phases] if s["name"] == name)
            assert ns / 1e9 == pytest.approx(seconds, abs=TOLERANCE_S), name
        timed = {name: seconds for name, seconds in verl.items() if name not in untimed}
        assert run.handle.timing_raw == pytest.approx(timed, abs=TOLERANCE_S)
        metrics = run.handle.metrics
        for name, seconds in timed.items():
            assert metrics[f"timing_s/{name}"] == pytest.approx(seconds, abs=TOLERANCE_S)

        # switch_wait ended when the replay buffer saw the groups the rollout had finished
        finished = sorted(ns for step, ns in rollout.finished_ns.values() if step == run.number)
        assert len(finished) == TRAIN_BATCH
        if began_in_rollout:
            ratio = run.metrics["separate_async/switch/threshold_ratio"]
            threshold = min(max(round(ratio * TRAIN_BATCH), TRAIN_BATCH // SYNC_STEPS), TRAIN_BATCH)
            (wait,) = [s for s in phases if s["name"] == "switch_wait"]
            assert wait["start"] - CLOCK_SLACK_NS < finished[threshold - 1]
            assert finished[threshold - 1] < wait["end"] + CLOCK_SLACK_NS

        # goodput in separate_async mode (rlotel/derive/goodput.py): trainer time outside windows
        # is overhead; the rollout runs in other processes and is idle only during syncs
        wall = verl["step"]
        idle = verl.get("switch_wait", 0.0) + verl["gen"]
        seconds = {b: metrics[f"rlotel/bucket_seconds/{b}"] for b in BUCKETS.values()}
        seconds["wasted"] = metrics["rlotel/bucket_seconds/wasted"]
        assert seconds["idle"] == pytest.approx(idle, abs=TOLERANCE_S)
        assert seconds["productive"] == pytest.approx(verl["update_actor"], abs=TOLERANCE_S)
        assert seconds["wasted"] == 0
        assert sum(seconds.values()) == pytest.approx(wall, abs=TOLERANCE_S)  # one role
        assert (
            seconds["overhead"]
            >= sum(verl[name] for name in verl if BUCKETS.get(name) == "overhead") - TOLERANCE_S
        )
        trainer_idle = metrics["rlotel/idle_ratio/trainer"]
        rollout_idle = metrics["rlotel/idle_ratio/rollout"]
        assert 0 < trainer_idle < 1 and 0 < rollout_idle < 1
        assert trainer_idle == pytest.approx(idle / wall, abs=TOLERANCE_S)
        assert (seconds["productive"] + seconds["overhead"]) / wall == pytest.approx(
            1 - trainer_idle, abs=TOLERANCE_S
        )  # busy + idle = wall
        assert rollout_idle == pytest.approx(verl["update_weights"] / wall, abs=TOLERANCE_S)
        assert metrics["rlotel/goodput"] == pytest.approx(verl["update_actor"] / wall, abs=1e-9)

        # rlotel's V1 capture saw both mini-batches of the step
        generate = [rollout.generate_seconds[key] for key in run.keys]
        assert len(generate) == TRAIN_BATCH * N
        assert metrics["agent_loop/generate_sequences/max"] == pytest.approx(max(generate))
        assert metrics["agent_loop/generate_sequences/min"] == pytest.approx(min(generate))
