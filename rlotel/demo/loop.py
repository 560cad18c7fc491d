"""GRPO on the toy task, every window under verl's name and fed to rlotel."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from time import perf_counter

import torch

import rlotel
from rlotel.demo import agent
from rlotel.demo import policy as P
from rlotel.demo.rollout import Generation, LocalRollout, flat
from rlotel.schema import vocabulary as voc

CPU_PEAK_FLOPS = 448e9  # verl's table entry for CPU; override with --peak-flops


@dataclass
class DemoConfig:
    steps: int = 60
    seed: int = 0
    prompts_per_step: int = 32
    group_size: int = 8
    mini_batches: int = 2
    ppo_epochs: int = 1  # passes over the batch in update_actor (a knob for heavy updates)
    lr: float = 3e-3
    clip: float = 0.2
    kl_coef: float = 0.01
    peak_flops: float = CPU_PEAK_FLOPS
    # One core is left to the exporters, as on a GPU node where training does not saturate
    # the host CPUs; with every core in torch, export competes with the math itself.
    torch_threads: int = max(1, (os.cpu_count() or 2) - 1)


@dataclass
class StepResult:
    number: int
    timing_raw: dict[str, float]
    metrics: dict[str, float]
    reward_mean: float
    tool_call_ratio: float
    actor_flops: float
    actor_changed: bool  # update_actor moved the weights
    rollout_synced: bool  # update_weights made the rollout copy equal the actor
    captures: list = field(default_factory=list)  # profiler outputs linked from the step

    def as_json(self) -> dict:
        data = asdict(self)
        data["metrics"] = {k: float(v) for k, v in self.metrics.items()}
        data["captures"] = [str(c.path) for c in self.captures]
        return data


@dataclass
class DemoResult:
    steps: list[StepResult] = field(default_factory=list)
    verdicts: list[rlotel.Verdict] = field(default_factory=list)

    def reward_gain(self, window: int = 5) -> tuple[float, float]:
        """Mean reward of the first and of the last `window` steps."""
        rewards = [s.reward_mean for s in self.steps]
        window = max(1, min(window, len(rewards) // 2 or 1))
        return sum(rewards[:window]) / window, sum(rewards[-window:]) / window


def train(
    tel: rlotel.Telemetry,
    config: DemoConfig,
    on_step: Callable[[StepResult], None] | None = None,
    generation: Generation | None = None,
) -> DemoResult:
    """Train for `config.steps` steps; generation runs where `generation` says (Ray
    actors, say), else in this process."""
    torch.manual_seed(config.seed)
    torch.set_num_threads(config.torch_threads)
    generator = torch.Generator().manual_seed(config.seed)
    actor = P.TinyPolicy()
    reference = copy.deepcopy(actor).requires_grad_(False)
    optimizer = torch.optim.Adam(actor.parameters(), lr=config.lr)
    batch = config.prompts_per_step * config.group_size
    result = DemoResult()
    generation = generation or LocalRollout(actor, generator)

    for number in range(1, config.steps + 1):
        with tel.step(number) as step:
            with tel.phase(voc.GEN):
                prompts = P.make_prompts(config.prompts_per_step, generator)
                prompts = prompts.repeat_interleave(config.group_size, 0)
                checked = torch.arange(batch) // config.group_size % 2 == 1
                # on-policy: generated with the weights synced after the last step
                rollout, scores = generation.generate(tel, prompts, checked, number - 1)
            update = train_on(
                tel, rollout, scores, actor, reference, optimizer, config, generator,
                config.prompts_per_step,
            )  # fmt: skip
            with tel.phase(voc.UPDATE_WEIGHTS):
                rollout_synced = generation.load_weights(actor)

            response_lengths = rollout.response_lengths.tolist()
            step.set_tokens(prompt=[P.PROMPT_LEN] * batch, response=response_lengths)
            seqlens = [P.PROMPT_LEN + n for n in response_lengths]
            flops = P.dense_flops(actor, seqlens)
            step.set_mfu(
                actor=flops * config.ppo_epochs / update.actor_seconds / config.peak_flops,
                actor_infer=flops / 3 / update.infer_seconds / config.peak_flops,
            )
        reward_mean = float(scores.mean())
        tool_ratio = float(rollout.tool_used.float().mean())
        tel.log(
            {
                "critic/score/mean": reward_mean,
                "actor/pg_loss": update.loss,
                "rollout/tool_ratio": tool_ratio,
            },
            step=number,
        )
        outcome = StepResult(
            number,
            dict(step.timing_raw),
            dict(step.metrics),
            reward_mean,
            tool_ratio,
            flops,
            update.actor_changed,
            rollout_synced,
        )
        outcome.captures = step.captures  # filled in when the profiler writes the file
        result.steps.append(outcome)
        result.verdicts.append(step.verdict)
        if on_step is not None:
            on_step(outcome)
    return result


@dataclass
class Update:
    """What one step's training windows did: the loss, their seconds, whether it learned."""

    loss: float
    infer_seconds: float  # old_log_prob, for MFU
    actor_seconds: float  # update_actor, for MFU
    actor_changed: bool


def train_on(
    tel: rlotel.Telemetry,
    rollout: agent.Rollout,
    scores: torch.Tensor,
    actor: P.TinyPolicy,
    reference: P.TinyPolicy,
    optimizer: torch.optim.Optimizer,
    config: DemoConfig,
    generator: torch.Generator,
    prompts_per_step: int,
    groups: torch.Tensor | None = None,
) -> Update:
    """verl's training windows on one batch of trajectories: reward, old_log_prob, ref,
    adv (GRPO), update_actor. The sync and the async loop share them. `groups`: each
    trajectory's group (0 .. prompts_per_step - 1) when groups are not all complete."""
    with tel.phase(voc.REWARD):
        token_scores = agent.token_level_scores(rollout, scores)
    with tel.phase(voc.OLD_LOG_PROB), torch.no_grad():
        started = perf_counter()
        old_log_probs = P.response_log_probs(actor, rollout.tokens)
        infer_seconds = perf_counter() - started
    with tel.phase(voc.REF), torch.no_grad():
        ref_log_probs = P.response_log_probs(reference, rollout.tokens)
    with tel.phase(voc.ADV):
        if groups is None:
            grouped = token_scores.sum(-1).view(prompts_per_step, config.group_size)
            advantages = (grouped - grouped.mean(-1, keepdim=True)) / (
                grouped.std(-1, keepdim=True) + 1e-6
            )
            advantages = advantages.view(-1, 1)
        else:
            advantages = _partial_group_advantages(token_scores.sum(-1), groups)
    before = flat(actor)
    with tel.phase(voc.UPDATE_ACTOR):
        started = perf_counter()
        loss = _update_actor(
            actor, optimizer, rollout, old_log_probs, ref_log_probs, advantages, config,
            generator, tel,
        )  # fmt: skip
        actor_seconds = perf_counter() - started
    return Update(loss, infer_seconds, actor_seconds, not torch.equal(before, flat(actor)))


def _partial_group_advantages(scores: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """GRPO advantages over groups of any size (a lone trajectory has none)."""
    scores = scores.double()
    count = torch.bincount(groups).double()
    mean = torch.bincount(groups, weights=scores) / count
    centred = scores - mean[groups]
    variance = torch.bincount(groups, weights=centred**2) / (count - 1).clamp(min=1)
    advantages = centred / (variance.sqrt()[groups] + 1e-6)
    advantages[count[groups] < 2] = 0.0
    return advantages.float().view(-1, 1)


def _update_actor(
    actor: P.TinyPolicy,
    optimizer: torch.optim.Optimizer,
    rollout: agent.Rollout,
    old_log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    config: DemoConfig,
    generator: torch.Generator,
    tel: rlotel.Telemetry,
) -> float:
    """PPO clipped objective with a k3 KL penalty to the reference, over mini-batches."""
    losses = []
    batches = [
        indices
        for _ in range(config.ppo_epochs)
        for indices in torch.randperm(rollout.tokens.shape[0], generator=generator).chunk(
            config.mini_batches
        )
    ]
    for indices in batches:
        log_probs = P.response_log_probs(actor, rollout.tokens[indices])
        ratio = torch.exp(log_probs - old_log_probs[indices])
        clipped = ratio.clamp(1 - config.clip, 1 + config.clip)
        surrogate = torch.minimum(ratio * advantages[indices], clipped * advantages[indices])
        log_ratio_ref = ref_log_probs[indices] - log_probs
        kl = torch.exp(log_ratio_ref) - log_ratio_ref - 1
        per_token = -surrogate + config.kl_coef * kl
        weights = rollout.loss_mask[indices].float()  # tool responses are not trained on
        loss = (per_token * weights).sum() / weights.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        tel.profile_step()  # one update mini-batch: advances a profiler schedule
        losses.append(float(loss.detach()))
    return sum(losses) / len(losses)
