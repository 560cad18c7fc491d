"""Unflagged steps pay nothing measurable for profiling: configured vs not, side by side.

Both telemetries run the same steps (seven phases of small torch work, mini-batch
`profile_step()` calls); one has profiling configured for a step that never comes.
Goal: step-time ratio (configured / not) ≤ 1.01.

    python benchmarks/profile_overhead.py [--steps N] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console

import rlotel

PHASES = ["gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"]


def run_steps(tel: rlotel.Telemetry, steps: int, work: torch.Tensor) -> float:
    started = time.perf_counter()
    for number in range(steps):
        with tel.step(number):
            for phase in PHASES:
                with tel.phase(phase):
                    (work @ work).sum()
                    if phase == "update_actor":
                        for _ in range(4):
                            (work @ work).sum()
                            tel.profile_step()
    elapsed = (time.perf_counter() - started) / steps
    tel.flush(60)  # untimed: neither run's publishing overlaps the other's timing
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rlotel-profile-bench-"))
    work = torch.randn(96, 96)
    plain = rlotel.init(run="plain", prometheus_port=None)
    configured = rlotel.init(
        run="configured",
        prometheus_port=None,
        profile_steps=[10**9],  # configured, never flagged in this run
        profile_dir=workdir,
    )
    run_steps(plain, 20, work)
    run_steps(configured, 20, work)
    ratios = []
    for index in range(args.rounds):
        pair = (configured, plain) if index % 2 else (plain, configured)
        times = {tel.config.run: run_steps(tel, args.steps, work) for tel in pair}
        ratios.append(times["configured"] / times["plain"])
    plain.shutdown()
    configured.shutdown()
    ratio = statistics.median(ratios)
    Console(width=100).print(
        f"unflagged step time, profiling configured / not: median {ratio:.4f} over "
        f"{args.rounds} interleaved rounds of {args.steps} steps "
        f"(rounds: {', '.join(f'{r:.3f}' for r in ratios)}); goal ≤ 1.01 → "
        f"{'met' if ratio <= 1.01 else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
