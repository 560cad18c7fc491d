"""`rlotel demo --ray`: generation in two Ray actors on a local cluster.

Each actor holds a rollout copy of the policy, runs the agent loop on its share of the
prompts and records its samples with the driver's propagated context, so its sample spans
are children of the driver's `gen` span. It returns the per-sample metrics (verl's shape)
and the span ids it made; the driver records the samples again for its histograms and
verl aggregates, using those span ids as exemplars.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import ray
import torch

from rlotel.demo import agent
from rlotel.demo import policy as P
from rlotel.demo.rollout import trajectories, weights_digest
from rlotel.schema import vocabulary as voc


@ray.remote(num_cpus=1)
class RolloutWorker:
    def __init__(self, run: str, traces_file: str, rank: int, seed: int) -> None:
        import rlotel

        torch.set_num_threads(1)
        self.tel = rlotel.init(
            run=run,
            service_name="rlotel-rollout-worker",
            prometheus_port=None,
            traces_file=traces_file,
        )
        self.policy = P.TinyPolicy()
        self.generator = torch.Generator().manual_seed(seed * 1000 + rank)
        self.rank, self.batches = rank, 0

    def load_weights(self, state: dict[str, torch.Tensor]) -> str:
        """update_weights: the actor's new weights into this rollout copy."""
        self.policy.load_state_dict(state)
        return weights_digest(self.policy)

    def generate(
        self, prompts: torch.Tensor, checked: torch.Tensor, carrier: dict[str, str]
    ) -> tuple[agent.Rollout, torch.Tensor, list[dict[str, Any]], dict[int, str]]:
        rollout = agent.rollout(self.policy, prompts, self.generator, checked)
        scores, score_seconds = agent.score(rollout)
        metrics = [
            {
                voc.GENERATE_SEQUENCES: g,
                voc.TOOL_CALLS: t,
                voc.COMPUTE_SCORE: c,
                voc.NUM_PREEMPTED: 0,
            }
            for g, t, c in zip(
                rollout.generate_seconds.tolist(),
                rollout.tool_seconds.tolist(),
                score_seconds,
                strict=True,
            )
        ]
        lengths = rollout.response_lengths.tolist()
        self.batches += 1
        spans = self.tel.record_samples(
            metrics,
            prompt_length=[P.PROMPT_LEN] * len(lengths),
            response_length=lengths,
            context=carrier,
            **trajectories(rollout, scores, f"w{self.rank}-b{self.batches}"),
            **agent.by_source(rollout),  # on its sample spans
        )
        return rollout, scores, metrics, spans

    def shutdown(self) -> None:
        self.tel.shutdown()


def _joined(parts: list[Any]) -> Any:
    """The workers' shares of one Rollout field, in order (tensors or per-sample lists)."""
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts)
    return [item for part in parts for item in part]


class RayRollout:
    """The driver's handle on the workers (a `rlotel.demo.rollout.Generation`): split,
    gather, sync weights, shut down."""

    def __init__(self, run: str, runs_dir: Path, seed: int, workers: int = 2) -> None:
        ray.init(
            address="local",  # always a fresh local cluster, never a user's RAY_ADDRESS
            num_cpus=workers,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
        self.workers = [
            RolloutWorker.remote(run, str(runs_dir / f"traces-worker{rank}.jsonl"), rank, seed)
            for rank in range(workers)
        ]

    def generate(
        self, tel: Any, prompts: torch.Tensor, checked: torch.Tensor, version: int
    ) -> tuple[agent.Rollout, torch.Tensor]:
        """The workers record their samples under the driver's `gen`; the driver records
        them again (verl's per-sample dicts) for its histograms, with the workers' spans
        as exemplars."""
        carrier = tel.current_context()
        shares = zip(
            prompts.chunk(len(self.workers)), checked.chunk(len(self.workers)), strict=True
        )
        results = ray.get(
            [
                worker.generate.remote(p, c, carrier)
                for worker, (p, c) in zip(self.workers, shares, strict=True)
            ]
        )
        rollouts, scores, metrics, spans, offset = [], [], [], {}, 0
        for rollout, score, sample_metrics, picked in results:
            rollouts.append(rollout)
            scores.append(score)
            metrics.extend(sample_metrics)
            spans.update({offset + index: span for index, span in picked.items()})
            offset += len(sample_metrics)
        merged = agent.Rollout(
            **{
                f.name: _joined([getattr(r, f.name) for r in rollouts])
                for f in dataclasses.fields(agent.Rollout)
            }
        )
        tel.record_samples(
            metrics,
            prompt_length=[P.PROMPT_LEN] * len(metrics),
            response_length=merged.response_lengths.numpy(),
            exemplar_spans=spans,
            reward=torch.cat(scores).numpy(),
            **agent.by_source(merged),  # the series by data source
            start_time_ns=merged.start_ns.numpy(),  # real times, per replica: occupancy
            end_time_ns=merged.end_ns.numpy(),
            replica=[str(i) for i, r in enumerate(rollouts) for _ in range(len(r.targets))],
        )
        return merged, torch.cat(scores)

    def load_weights(self, actor: torch.nn.Module) -> bool:
        state = ray.put({k: v.detach().clone() for k, v in actor.state_dict().items()})
        digests = ray.get([worker.load_weights.remote(state) for worker in self.workers])
        return set(digests) == {weights_digest(actor)}

    def shutdown(self) -> None:
        try:
            ray.get([worker.shutdown.remote() for worker in self.workers], timeout=30)
        finally:
            ray.shutdown()
