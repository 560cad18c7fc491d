"""Agent-loop aggregates against verl 0.9.1's own `AgentLoopManager._performance_metrics`."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.experimental.agent_loop import agent_loop

FIELDS = ("generate_sequences", "tool_calls", "compute_score", "num_preempted")


def verl_reference(chunks: list[list[dict]], prompt: list[int], response: list[int]) -> dict:
    """Run verl's reduction on a real DataProto shaped like the agent-loop output."""
    n = len(prompt)
    prompt_width, response_width = max(prompt) + 1, max(response) + 1
    mask = torch.zeros(n, prompt_width + response_width, dtype=torch.int64)
    for i, (p, r) in enumerate(zip(prompt, response, strict=True)):
        mask[i, prompt_width - p : prompt_width] = 1
        mask[i, prompt_width : prompt_width + r] = 1
    output = DataProto.from_dict(
        tensors={"prompts": torch.zeros(n, prompt_width, dtype=torch.int64), "attention_mask": mask}
    )
    return agent_loop.AgentLoopManager._performance_metrics(None, chunks, output)


def random_chunks(rng: random.Random) -> list[list[dict]]:
    workers = rng.randint(1, 4)
    chunks = []
    for _ in range(workers):
        size = rng.choice([1, 1, 2, 5, 13])
        chunk = []
        for _ in range(size):
            zero = rng.random() < 0.2
            chunk.append(
                {
                    "generate_sequences": 0.0 if zero else rng.lognormvariate(0, 1.5),
                    "tool_calls": 0.0 if rng.random() < 0.5 else rng.expovariate(2.0),
                    "compute_score": rng.random() * 0.05,
                    "num_preempted": rng.choice([-1, -1, 0, 0, 1, 3]),
                }
            )
        chunks.append(chunk)
    if rng.random() < 0.1:  # single sample
        chunks = [[chunks[0][0]]]
    return chunks


@pytest.mark.parametrize("seed", range(120))
def test_aggregates_equal_verl(make_tel, seed):
    rng = random.Random(seed)
    chunks = random_chunks(rng)
    n = sum(len(chunk) for chunk in chunks)
    prompt = [rng.randint(1, 50) for _ in range(n)]
    response = [rng.randint(0, 80) for _ in range(n)]
    expected = verl_reference(chunks, prompt, response)

    tel = make_tel(prometheus_port=None)
    with tel.step(seed) as step, tel.phase("gen"):
        if seed % 3 == 0:  # verl's nested worker chunks as they are
            tel.record_samples(chunks, prompt_length=prompt, response_length=response)
        elif seed % 3 == 1:  # flat per-sample dicts
            flat = [sample for chunk in chunks for sample in chunk]
            tel.record_samples(flat, prompt_length=prompt, response_length=response)
        else:  # columns as numpy arrays, split over two calls like two workers
            cut = n // 2
            for part in (slice(0, cut), slice(cut, n)):
                flat = [sample for chunk in chunks for sample in chunk][part]
                if not flat:
                    continue
                tel.record_samples(
                    **{f: np.array([s[f] for s in flat]) for f in FIELDS},
                    prompt_length=np.array(prompt[part]),
                    response_length=np.array(response[part]),
                )
    ours = {k: v for k, v in step.metrics.items() if k.startswith("agent_loop/")}
    assert ours == expected
    for key, value in expected.items():
        assert type(ours[key]) in (type(value), int, float, np.float64), key


def test_unknown_preemptions_stay_in_aggregates_but_not_in_counter(make_tel):
    from tests.helpers import parse_exposition, scrape

    tel = make_tel(run="pre")
    with tel.step(1) as step:
        tel.record_samples(generate_sequences=[1.0, 2.0, 3.0], num_preempted=[-1, 2, -1])
    assert step.metrics["agent_loop/num_preempted/min"] == -1
    assert step.metrics["agent_loop/num_preempted/mean"] == pytest.approx(0.0)
    tel.flush(10)
    samples = parse_exposition(scrape(tel.metrics_url))
    assert samples[("rlotel_agent_loop_preemptions_total", frozenset({("run", "pre")}))] == 2
