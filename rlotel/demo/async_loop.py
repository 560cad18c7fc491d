"""Asynchronous GRPO on the toy task: a rollout thread keeps generating into a bounded
buffer with the weights it has while the trainer updates (verl's fully-async shape).

Weight versions are real: version v is the actor after step v; the rollout picks up a new
version between batches, every sample carries the version it was generated with, and the
trainer evicts batches staler than `evict_staleness` (counted as verl's replay buffer does).
With `max_staleness` N, a trajectory that completes after the trainer has published more
than N newer versions is discarded as stale (verl's staleness threshold; GRPO then
normalises over the rest of its group): in a slow rollout those are the long answers,
so the trained batch drifts
from what was generated (rlotel's async-bias statistics show it). Every discarded sample
is recorded with its reason. `rollout_slowdown` multiplies the rollout's real compute (per
decoding step: long trajectories take longer) and `ppo_epochs` the update's, so either side
can be made the one that waits.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

import rlotel
from rlotel.demo import agent
from rlotel.demo import policy as P
from rlotel.demo.loop import DemoConfig, DemoResult, StepResult, train_on
from rlotel.derive import goodput
from rlotel.schema import vocabulary as voc

MODE = "fully_async"
# Decoding passes see the growing sequence; extra passes per step are scaled by this so
# that a slowdown of F is F× the decoding work.
_FULL_OVER_MEAN_LENGTH = (P.PROMPT_LEN + P.MAX_RESPONSE) / (P.PROMPT_LEN + (P.MAX_RESPONSE - 1) / 2)
WAIT_S = 60.0  # the longest the trainer waits for one batch before it gives up


@dataclass
class AsyncConfig:
    base: DemoConfig = field(default_factory=DemoConfig)
    rollout_slowdown: float = 1.0  # F× the rollout's work (extra real forward passes)
    buffer_batches: int = 2  # the bounded buffer between rollout and trainer
    evict_staleness: int = 3  # batches staler than this (in versions) are evicted when sampled
    max_staleness: int | None = None  # groups completing > N versions behind: discarded


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
    stale: torch.Tensor  # (B,) bool: the trajectory completed too many versions behind

    def identity(self, group_size: int, rows: torch.Tensor) -> dict[str, list]:
        """record_samples' span-only fields of the trajectories at `rows`: who each is,
        when it really ran, and the trainer step its weights came from (its span's link)."""
        indices = rows.tolist()
        return {
            "uid": [f"b{self.number}-{i // group_size}" for i in indices],
            "session": [i % group_size for i in indices],
            "turns": (2 + 2 * self.rollout.tool_used[rows].long()).tolist(),  # + tool, answer
            "start_time_ns": self.rollout.start_ns[rows].tolist(),  # batched: together
            "end_time_ns": self.rollout.end_ns[rows].tolist(),  # each at its last token
            "generated_step": [self.version + 1] * len(indices),  # weights v: from step v
            "turn_times_ns": [self.rollout.turn_times_ns[i] for i in indices],  # GenAI spans
            "tool_times_ns": [self.rollout.tool_times_ns[i] for i in indices],
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
        self._published: list[tuple[int, int]] = []  # (version, Unix ns) the trainer published

    def publish_weights(self, version: int, actor: P.TinyPolicy) -> bool:
        """The trainer's param_sync: a copy of the new weights for the next batch.
        Returns whether the copy equals the actor (what the rollout will load)."""
        state = {k: v.detach().clone() for k, v in actor.state_dict().items()}
        with self._lock:
            self._pending = (version, state)
            self._published.append((version, time.time_ns()))
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
        # A slower engine: more real decoding work per step (scaled so that F× is F× the
        # work of decoding, whose passes see the growing sequence).
        extra = max(0.0, self.config.rollout_slowdown - 1) * _FULL_OVER_MEAN_LENGTH
        rollout = agent.rollout(self.policy, prompts, self._generator, checked, extra)
        scores, score_seconds = agent.score(rollout)
        stale = self._stale(rollout.end_ns)
        self._batches += 1
        return Generated(
            self.version,
            base.prompts_per_step,
            rollout,
            scores,
            score_seconds,
            self._batches,
            (started_ns, time.time_ns()),
            stale,
        )

    def _stale(self, completed_ns: torch.Tensor) -> torch.Tensor:
        """Trajectories that completed after the trainer published more than `max_staleness`
        versions newer than the one they were generated with."""
        limit = self.config.max_staleness
        if limit is None:
            return torch.zeros(completed_ns.shape, dtype=torch.bool)
        with self._lock:
            published = [(v, t) for v, t in self._published if v > self.version]
        behind = torch.zeros(completed_ns.shape, dtype=torch.long)
        for version, at_ns in published:
            behind = torch.where(completed_ns >= at_ns, version - self.version, behind)
        return behind > limit


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
    tel.set_mode(MODE, timeline)
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
    trained: int = 0  # samples trained on (the rest of what was generated was discarded)

    def as_json(self) -> dict:
        data = super().as_json()
        data.pop("verdict")
        data["verdict"] = self.verdict.label if self.verdict is not None else None
        return data


def _next_batch(
    tel: rlotel.Telemetry, worker: RolloutWorker, number: int, config: AsyncConfig
) -> tuple[Generated, torch.Tensor, int]:
    """The oldest batch fresh enough for step `number` with the rows of its groups that
    are not stale, and how many samples were evicted first. Every sample dropped on the
    way is recorded with its reason."""
    evicted, group_size = 0, config.base.group_size
    while True:
        try:
            batch = worker.buffer.get(timeout=WAIT_S)
        except queue.Empty:
            raise RuntimeError(f"no batch from the rollout in {WAIT_S:.0f}s") from worker.error
        rows = torch.arange(batch.rollout.tokens.shape[0])
        if (number - 1) - batch.version > config.evict_staleness:
            _record(tel, batch, rows, group_size, "evicted")
            evicted += rows.numel()
            continue
        stale = batch.stale
        if stale.any():
            _record(tel, batch, rows[stale], group_size, "stale")
        if not stale.all():
            return batch, rows[~stale], evicted


def _record(
    tel: rlotel.Telemetry,
    batch: Generated,
    rows: torch.Tensor,
    group_size: int,
    discarded: str | None = None,
) -> None:
    """The trajectories at `rows`: trained (`discarded` None) or dropped, and why."""
    rollout, size = batch.rollout, rows.numel()
    tel.record_samples(
        generate_sequences=rollout.generate_seconds[rows].numpy(),
        tool_calls=rollout.tool_seconds[rows].numpy(),
        compute_score=[batch.score_seconds[i] for i in rows.tolist()],
        num_preempted=[0] * size,
        prompt_length=[P.PROMPT_LEN] * size,
        response_length=rollout.response_lengths[rows].numpy(),
        min_weight_version=[batch.version] * size,
        max_weight_version=[batch.version] * size,
        reward=batch.scores[rows].numpy(),
        discarded=discarded,
        **agent.by_source(rollout.select(rows)),
        **batch.identity(group_size, rows),
    )


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
            batch, rows, evicted = _next_batch(tel, worker, number, config)
            _record(tel, batch, rows, base.group_size)
            rollout, scores, size = batch.rollout.select(rows), batch.scores[rows], rows.numel()
            groups = torch.unique(rows // base.group_size, return_inverse=True)[1]
        update = train_on(
            tel, rollout, scores, actor, reference, optimizer, base, generator,
            int(groups.max()) + 1, groups,
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
    reward_mean = float(scores.mean())
    tool_ratio = float(rollout.tool_used.float().mean())
    tel.log(
        {
            "critic/score/mean": reward_mean,
            "actor/pg_loss": update.loss,
            "rollout/tool_ratio": tool_ratio,
            voc.TRAINING + voc.OFF_POLICY_EVICTED: evicted,  # verl's replay-buffer key
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
        trained=size,
    )
    outcome.captures = step.captures
    return outcome
