"""Asynchronous GRPO on the toy task: a rollout thread keeps generating into a bounded
buffer with the weights it has while the trainer updates (verl's fully-async shape).

Weight versions are real: version v is the actor after step v; the rollout picks up a new
version between batches, every sample carries the version it was generated with, and the
trainer evicts batches staler than `max_staleness` (counted as verl's replay buffer does).
`rollout_slowdown` multiplies the rollout's real compute and `ppo_epochs` the update's, so
either side can be made the one that waits.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from time import perf_counter

import torch

import rlotel
from rlotel import goodput
from rlotel import vocabulary as voc
from rlotel.demo import agent
from rlotel.demo import policy as P
from rlotel.demo.loop import DemoConfig, DemoResult, StepResult, train_on

MODE = "fully_async"
WAIT_S = 60.0  # the longest the trainer waits for one batch before it gives up


@dataclass
class AsyncConfig:
    base: DemoConfig = field(default_factory=DemoConfig)
    rollout_slowdown: float = 1.0  # F× the rollout's work (extra real forward passes)
    buffer_batches: int = 2  # the bounded buffer between rollout and trainer
    max_staleness: int = 3  # batches staler than this (in versions) are evicted


@dataclass
class Generated:
    """One batch in the buffer, with the weight version it was generated under."""

    version: int
    prompts_per_step: int
    rollout: agent.Rollout
    scores: torch.Tensor
    score_seconds: list[float]
    number: int  # the rollout's batch counter: prompt uids are `b<number>-<prompt>`
    window_ns: tuple[int, int]  # Unix start and end of its (batched) generation

    def identity(self, group_size: int) -> dict[str, list]:
        """record_samples' span-only fields: who each sample is, when it really ran, and
        the trainer step its weights came from (the step its span links)."""
        size = self.rollout.tokens.shape[0]
        return {
            "uid": [f"b{self.number}-{i // group_size}" for i in range(size)],
            "session": [i % group_size for i in range(size)],
            "turns": (2 + 2 * self.rollout.tool_used.long()).tolist(),  # + tool call, answer
            "start_time_ns": [self.window_ns[0]] * size,  # decoded together: one window
            "end_time_ns": [self.window_ns[1]] * size,
            "generated_step": [self.version + 1] * size,  # weights v: published by step v
            "reward": self.scores.tolist(),
            "turn_times_ns": self.rollout.turn_times_ns,  # GenAI chat / execute_tool spans
            "tool_times_ns": self.rollout.tool_times_ns,
        }


class RolloutWorker(threading.Thread):
    """Generates batches with its own copy of the weights until stopped."""

    def __init__(self, config: AsyncConfig, initial: P.TinyPolicy, timeline: goodput.Timeline):
        super().__init__(name="rlotel-demo-rollout", daemon=True)
        self.config = config
        self.policy = copy.deepcopy(initial)
        self.version = 0
        self.buffer: queue.Queue[Generated] = queue.Queue(maxsize=config.buffer_batches)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._timeline = timeline
        self._pending: tuple[int, dict] | None = None
        self._lock = threading.Lock()
        self._generator = torch.Generator().manual_seed(config.base.seed + 1)
        self._batches = 0

    def publish_weights(self, version: int, actor: P.TinyPolicy) -> bool:
        """The trainer's param_sync: a copy of the new weights for the next batch.
        Returns whether the copy equals the actor (what the rollout will load)."""
        state = {k: v.detach().clone() for k, v in actor.state_dict().items()}
        with self._lock:
            self._pending = (version, state)
        return all(torch.equal(state[k], v) for k, v in actor.state_dict().items())

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self._load_weights()
                with self._timeline.window(voc.ROLLOUT_GENERATE):
                    batch = self._generate()
                with self._timeline.window(voc.ROLLOUT_WAIT_BUFFER):
                    while not self.stop.is_set():
                        try:
                            self.buffer.put(batch, timeout=0.05)
                            break
                        except queue.Full:
                            continue
        except BaseException as error:  # reported to the trainer, which stops
            self.error = error

    def _load_weights(self) -> None:
        with self._timeline.window(voc.ROLLOUT_WAIT_WEIGHTS), self._lock:
            if self._pending is not None:
                self.version, state = self._pending
                self.policy.load_state_dict(state)
                self._pending = None

    @torch.no_grad()
    def _generate(self) -> Generated:
        base = self.config.base
        started_ns = time.time_ns()
        prompts = P.make_prompts(base.prompts_per_step, self._generator)
        prompts = prompts.repeat_interleave(base.group_size, 0)
        checked = torch.arange(prompts.shape[0]) // base.group_size % 2 == 1
        rollout = agent.rollout(self.policy, prompts, self._generator, checked)
        extra = round((self.config.rollout_slowdown - 1) * P.MAX_RESPONSE)
        if extra > 0:  # a slower engine: more real decoding work per sample
            started = perf_counter()
            for _ in range(extra):
                self.policy(rollout.tokens)
            rollout.generate_seconds += perf_counter() - started  # batched: all wait
        scores, score_seconds = agent.score(rollout)
        self._batches += 1
        return Generated(
            self.version,
            base.prompts_per_step,
            rollout,
            scores,
            score_seconds,
            self._batches,
            (started_ns, time.time_ns()),
        )


def train_async(
    tel: rlotel.Telemetry,
    config: AsyncConfig,
    on_step: Callable[[StepResult], None] | None = None,
) -> DemoResult:
    """Train for `config.base.steps` steps against a concurrent rollout thread."""
    base = config.base
    torch.manual_seed(base.seed)
    torch.set_num_threads(base.torch_threads)
    generator = torch.Generator().manual_seed(base.seed)
    actor = P.TinyPolicy()
    reference = copy.deepcopy(actor).requires_grad_(False)
    optimizer = torch.optim.Adam(actor.parameters(), lr=base.lr)
    timeline = goodput.Timeline()
    tel.ledger.phase_buckets = replace(tel.ledger.phase_buckets, mode=MODE, timeline=timeline)
    worker = RolloutWorker(config, actor, timeline)
    worker.start()
    result = DemoResult()
    try:
        for number in range(1, base.steps + 1):
            outcome = _step(tel, config, number, worker, actor, reference, optimizer, generator)
            result.steps.append(outcome)
            result.verdicts.append(outcome.verdict)
            if on_step is not None:
                on_step(outcome)
    finally:
        worker.stop.set()
        worker.join(10)
    return result


@dataclass
class AsyncStepResult(StepResult):
    verdict: rlotel.Verdict | None = None
    evicted: int = 0
    versions: list[int] = field(default_factory=list)

    def as_json(self) -> dict:
        data = super().as_json()
        data.pop("verdict")
        data["verdict"] = self.verdict.label if self.verdict is not None else None
        return data


def _next_batch(worker: RolloutWorker, number: int, max_staleness: int) -> tuple[Generated, int]:
    """The oldest batch fresh enough for step `number`, and how many were evicted first."""
    evicted = 0
    while True:
        try:
            batch = worker.buffer.get(timeout=WAIT_S)
        except queue.Empty:
            raise RuntimeError(f"no batch from the rollout in {WAIT_S:.0f}s") from worker.error
        if (number - 1) - batch.version <= max_staleness:
            return batch, evicted
        evicted += batch.rollout.tokens.shape[0]


def _step(
    tel: rlotel.Telemetry,
    config: AsyncConfig,
    number: int,
    worker: RolloutWorker,
    actor: P.TinyPolicy,
    reference: P.TinyPolicy,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
) -> AsyncStepResult:
    base = config.base
    with tel.step(number) as step:
        with tel.phase(voc.WAIT_FOR_ENOUGH_SAMPLES):
            batch, evicted = _next_batch(worker, number, config.max_staleness)
            rollout, size = batch.rollout, batch.rollout.tokens.shape[0]
            tel.record_samples(
                generate_sequences=rollout.generate_seconds.numpy(),
                tool_calls=rollout.tool_seconds.numpy(),
                compute_score=batch.score_seconds,
                num_preempted=[0] * size,
                prompt_length=[P.PROMPT_LEN] * size,
                response_length=rollout.response_lengths.numpy(),
                min_weight_version=[batch.version] * size,
                max_weight_version=[batch.version] * size,
                **batch.identity(base.group_size),
            )
        update = train_on(
            tel, rollout, batch.scores, actor, reference, optimizer, base, generator,
            batch.prompts_per_step,
        )  # fmt: skip
        with tel.phase(voc.PARAM_SYNC):
            synced = worker.publish_weights(number, actor)
        response_lengths = rollout.response_lengths.tolist()
        step.set_tokens(prompt=[P.PROMPT_LEN] * size, response=response_lengths)
        flops = P.dense_flops(actor, [P.PROMPT_LEN + n for n in response_lengths])
        step.set_mfu(
            actor=flops * base.ppo_epochs / update.actor_seconds / base.peak_flops,
            actor_infer=flops / 3 / update.infer_seconds / base.peak_flops,
        )
    reward_mean = float(batch.scores.mean())
    tool_ratio = float(rollout.tool_used.float().mean())
    tel.log(
        {
            "critic/score/mean": reward_mean,
            "actor/pg_loss": update.loss,
            "rollout/tool_ratio": tool_ratio,
            "training/off_policy/evicted_samples": evicted,  # verl's replay-buffer key
        },
        step=number,
    )
    outcome = AsyncStepResult(
        number,
        dict(step.timing_raw),
        dict(step.metrics),
        reward_mean,
        tool_ratio,
        flops,
        update.actor_changed,
        rollout_synced=synced,
        verdict=step.verdict,
        evicted=evicted,
        versions=[batch.version],
    )
    outcome.captures = step.captures
    return outcome
