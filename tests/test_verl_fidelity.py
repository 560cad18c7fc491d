"""rlotel's step numbers against verl 0.9.1's own functions, on many generated batches."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.trainer.ppo import metric_utils
from verl.utils.profiler.performance import simple_timer

import rlotel
from rlotel.schema import formulas

STAGES = ["gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor"]


def verl_keys(metrics: dict) -> dict:
    """Our dict without rlotel's own additions (`rlotel/goodput`, `rlotel/bucket_seconds/*`)."""
    return {k: v for k, v in metrics.items() if not k.startswith("rlotel/")}


def verl_batch(prompt: list[int], response: list[int]) -> DataProto:
    """A batch shaped as verl's trainer sees it: left-padded prompts, right-padded responses."""
    n = len(prompt)
    max_prompt, max_response = max(prompt, default=0) + 1, max(response, default=0) + 1
    mask = torch.zeros(n, max_prompt + max_response, dtype=torch.int64)
    for i, (p, r) in enumerate(zip(prompt, response, strict=True)):
        mask[i, max_prompt - p : max_prompt] = 1
        mask[i, max_prompt : max_prompt + r] = 1
    responses = torch.zeros(n, max_response, dtype=torch.int64)
    global_token_num = mask.sum(-1).tolist()
    return DataProto.from_dict(
        tensors={"responses": responses, "attention_mask": mask},
        meta_info={"global_token_num": global_token_num},
    )


def verl_metrics(batch: DataProto, timing_raw: dict[str, float], n_gpus: int) -> dict:
    return {
        **metric_utils.compute_timing_metrics(batch, timing_raw),
        **metric_utils.compute_throughout_metrics(batch, timing_raw, n_gpus),
    }


def random_case(rng: random.Random) -> tuple[list[int], list[int]]:
    n = rng.choice([1, 2, 3, 8, 17])
    response_zero = rng.random() < 0.15
    prompt = [rng.randint(0, 64) for _ in range(n)]
    response = [0 if response_zero else rng.randint(0, 96) for _ in range(n)]
    return prompt, response


@pytest.mark.parametrize("seed", range(40))
def test_ledger_step_metrics_equal_verl(make_tel, seed):
    """Real ledger steps (real timings) compared key for key with verl's functions."""
    rng = random.Random(seed)
    prompt, response = random_case(rng)
    n_gpus = rng.choice([1, 2, 8])
    tel = make_tel(prometheus_port=None, n_gpus=n_gpus)
    stages = rng.sample(STAGES, rng.randint(1, len(STAGES)))
    with tel.step(seed) as step:
        for stage in stages:
            for _ in range(rng.randint(1, 2)):  # repeated names are summed
                with tel.phase(stage):
                    sum(range(rng.randint(0, 2000)))
        step.set_tokens(prompt=prompt, response=response)
    assert verl_keys(step.metrics) == verl_metrics(
        verl_batch(prompt, response), step.timing_raw, n_gpus
    )


@pytest.mark.parametrize("seed", range(200))
def test_formulas_equal_verl_on_random_timings(seed):
    rng = random.Random(1000 + seed)
    prompt, response = random_case(rng)
    names = rng.sample([*STAGES, "save_checkpoint", "update_weights", "testing"], 5)
    timing_raw = {
        name: rng.choice([0.0, rng.random() * 10 ** rng.randint(-4, 3)]) for name in names
    }
    timing_raw["step"] = sum(timing_raw.values()) + rng.random()
    n_gpus = rng.randint(1, 64)
    ours = formulas.timing_metrics(timing_raw, sum(prompt), sum(response))
    ours |= formulas.throughput_metrics(timing_raw, sum(prompt) + sum(response), n_gpus)
    assert verl_keys(ours) == verl_metrics(verl_batch(prompt, response), timing_raw, n_gpus)


def test_numpy_and_tensor_token_inputs_match_lists(make_tel):
    tel = make_tel(prometheus_port=None)
    prompt = [5, 9, 0, 31]
    response = [7, 0, 12, 3]
    results = []
    for p, r in (
        (prompt, response),
        (np.array(prompt), np.array(response)),
        (torch.tensor(prompt), torch.tensor(response)),
    ):
        with tel.step(1) as step:
            with tel.phase("gen"):
                pass
            step.set_tokens(prompt=p, response=r)
        results.append(step.metrics["perf/total_num_tokens"])
        assert verl_keys(step.metrics) == verl_metrics(
            verl_batch(prompt, response), step.timing_raw, 1
        )
    assert results == [67, 67, 67]
    assert all(isinstance(value, int) for value in results)


def test_marked_timer_sums_exactly_like_verl_simple_timer():
    """Same bodies timed by verl's and rlotel's timers: same keys, same summing rule."""
    ours: dict[str, float] = {}
    theirs: dict[str, float] = {}
    for name in ["gen", "reward", "gen", "adv", "gen"]:
        with simple_timer(name, theirs):
            pass
        with rlotel.marked_timer(name, ours):
            pass
    assert list(ours) == list(theirs)
    assert all(value > 0 for value in ours.values())
