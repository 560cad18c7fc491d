"""Where the demo's generation runs: the rollout interface the training loop holds.

`LocalRollout` generates in the training process (verl's colocated engine); the Ray
implementation (`rlotel.demo.ray_rollout.RayRollout`) generates in actors. Both record
their samples into the step and take the actor's new weights at `update_weights`.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Protocol

import torch

import rlotel
from rlotel.demo import agent
from rlotel.demo import policy as P
from rlotel.schema import vocabulary as voc


class Generation(Protocol):
    def generate(
        self, tel: rlotel.Telemetry, prompts: torch.Tensor, checked: torch.Tensor, version: int
    ) -> tuple[agent.Rollout, torch.Tensor]:
        """Roll out and score the prompts inside the open `gen` phase, recording every
        sample; `version` is the weight version the rollout copy holds."""

    def load_weights(self, actor: torch.nn.Module) -> bool:
        """update_weights: the actor's weights into the rollout copies; True when every
        copy now equals the actor."""

    def shutdown(self) -> None: ...


def trajectories(rollout: agent.Rollout, scores: torch.Tensor, batch_id: str) -> dict:
    """record_samples' trajectory fields: each sample's uid, reward, and when its turns
    and calculator calls ran (the GenAI `chat` / `execute_tool` spans)."""
    return {
        "uid": [f"{batch_id}-{index}" for index in range(len(scores))],
        voc.SAMPLE_REWARD: scores.tolist(),
        "turn_times_ns": rollout.turn_times_ns,
        "tool_times_ns": rollout.tool_times_ns,
    }


def weights_digest(module: torch.nn.Module) -> str:
    """SHA-256 of a module's weights: equal digests mean equal weights, across processes."""
    digest = hashlib.sha256()
    for tensor in module.state_dict().values():
        digest.update(tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


def flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


class LocalRollout:
    """Generation in the training process, on a copy of the actor's weights."""

    def __init__(self, actor: torch.nn.Module, generator: torch.Generator) -> None:
        self._policy = copy.deepcopy(actor)  # the inference engine's copy of the weights
        self._generator = generator

    def generate(
        self, tel: rlotel.Telemetry, prompts: torch.Tensor, checked: torch.Tensor, version: int
    ) -> tuple[agent.Rollout, torch.Tensor]:
        rollout = agent.rollout(self._policy, prompts, self._generator, checked)
        scores, score_seconds = agent.score(rollout)  # in the loop, as verl
        batch = len(prompts)
        tel.record_samples(
            generate_sequences=rollout.generate_seconds.numpy(),
            tool_calls=rollout.tool_seconds.numpy(),
            compute_score=score_seconds,
            num_preempted=[0] * batch,  # the toy engine never preempts
            prompt_length=[P.PROMPT_LEN] * batch,
            response_length=rollout.response_lengths.numpy(),
            min_weight_version=[version] * batch,
            max_weight_version=[version] * batch,
            **trajectories(rollout, scores, f"step{version + 1}"),
            **agent.by_source(rollout),  # data_source, reward_extra_info
            start_time_ns=rollout.start_ns.numpy(),  # each trajectory's real times: occupancy
            end_time_ns=rollout.end_ns.numpy(),
        )
        return rollout, scores

    def load_weights(self, actor: torch.nn.Module) -> bool:
        self._policy.load_state_dict(actor.state_dict())
        return torch.equal(flat(self._policy), flat(actor))

    def shutdown(self) -> None:
        pass
