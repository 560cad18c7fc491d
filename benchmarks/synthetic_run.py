"""A real rlotel traces file of many steps, for the offline tools' benchmarks: verl's seven
phases around a little work, per-sample timings every step (the slowest few become sample
spans), tokens and MFU. Written through `rlotel.init(traces_file=...)`, untimed."""

from __future__ import annotations

import random
from pathlib import Path

import rlotel

PHASES = ["gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"]


def write_traces(path: Path, steps: int, samples: int, update_work: int = 200, seed: int = 0):
    """`update_work`: the loop length of `update_actor` (the others do 200)."""
    rng = random.Random(seed)
    tel = rlotel.init(run="bench", prometheus_port=None, traces_file=path)
    for number in range(1, steps + 1):
        with tel.step(number) as step:
            for phase in PHASES:
                with tel.phase(phase):
                    sum(range(update_work if phase == "update_actor" else 200))
                    if phase == "gen":
                        tel.record_samples(
                            generate_sequences=[rng.lognormvariate(0, 0.6) for _ in range(samples)],
                            tool_calls=[rng.random() * 0.1 for _ in range(samples)],
                            compute_score=[0.001] * samples,
                            prompt_length=[64] * samples,
                            response_length=[rng.randint(16, 512) for _ in range(samples)],
                        )
            step.set_tokens(prompt=[64] * samples, response=[256] * samples)
            step.set_mfu(actor=0.3 + 0.05 * rng.random())
        if number % 100 == 0:
            tel.flush(60)  # untimed: keeps the export queues from dropping spans
    tel.shutdown(120)
