"""Step time with a scraper hitting /metrics at 50 requests/s vs no scraper, side by side.

Goal: inflation ≤ 2% (ratio ≤ 1.02). Steps do ~10 ms of real torch work and record
samples, so the exposition is realistic (histograms, ~100 series). As in the demo, torch
gets all cores but one: the scrapes (≈1 ms of CPU each here) run on the spare core, as
they would on a GPU node whose host CPUs training does not saturate.

    python benchmarks/scrape_load.py [--steps N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import rlotel
from tests.test_scrape_load import scraper


def run_steps(tel: rlotel.Telemetry, steps: int, rng: np.random.Generator) -> float:
    work = torch.randn(384, 384)
    started = time.perf_counter()
    for number in range(steps):
        with tel.step(number) as step:
            with tel.phase("gen"):
                (work @ work).sum()
                tel.record_samples(generate_sequences=rng.lognormal(size=64))
            with tel.phase("update_actor"):
                (work @ work @ work).sum()
            step.set_tokens(prompt=[4] * 64, response=[64] * 64)
    elapsed = (time.perf_counter() - started) / steps
    tel.flush(30)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    tel = rlotel.init(run="scrape-bench", prometheus_port=0)
    rng = np.random.default_rng(0)
    run_steps(tel, 50, rng)
    ratios, scrapes = [], 0
    for index in range(args.rounds):
        times = {}
        for loaded in (False, True) if index % 2 == 0 else (True, False):
            stop, bodies = threading.Event(), []
            thread = threading.Thread(target=scraper, args=(tel.metrics_url, stop, bodies))
            if loaded:
                thread.start()
            times[loaded] = run_steps(tel, args.steps, rng)
            stop.set()
            if loaded:
                thread.join(10)
                scrapes += len(bodies)
        ratios.append(times[True] / times[False])
    tel.shutdown()
    ratio = statistics.median(ratios)
    Console(width=100).print(
        f"step time with a 50/s scraper / without: median {ratio:.3f} over {args.rounds} "
        f"interleaved rounds of {args.steps} steps ({scrapes} scrapes; rounds: "
        f"{', '.join(f'{r:.3f}' for r in ratios)}); goal ≤ 1.02 → "
        f"{'met' if ratio <= 1.02 else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
