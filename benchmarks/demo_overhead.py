"""Demo step time with telemetry on vs off (OTEL_SDK_DISABLED), same seed, interleaved.

"On" is everything the demo ships: /metrics served, spans to the OTLP/JSON traces file,
per-sample histograms and exemplar spans. "Off" runs the same loop with
OTEL_SDK_DISABLED=true (the ledger still times phases, nothing is exported). Goal: on/off
step-time ratio ≤ 1.02 (median of rounds) with the demo's default of leaving one core to
the exporters, and with torch on every core (there export competes with the math for
CPU, so the ratio is the exporters' CPU share of a step).

    python benchmarks/demo_overhead.py [--steps N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import rlotel
from rlotel.demo.loop import DemoConfig, train


def run_once(enabled: bool, steps: int, workdir: Path, threads: int) -> float:
    """Mean wall seconds per step of one demo run."""
    if enabled:
        os.environ.pop("OTEL_SDK_DISABLED", None)
    else:
        os.environ["OTEL_SDK_DISABLED"] = "true"
    tel = rlotel.init(
        run="bench", prometheus_port=0, traces_file=workdir / f"traces-{time.time_ns()}.jsonl"
    )
    started = time.perf_counter()
    train(tel, DemoConfig(steps=steps, seed=0, torch_threads=threads))
    elapsed = time.perf_counter() - started
    tel.shutdown()
    return elapsed / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rlotel-demo-bench-"))
    cores = os.cpu_count() or 2
    console = Console(width=100)
    for threads, label in ((DemoConfig().torch_threads, "demo default"), (cores, "every core")):
        run_once(True, 3, workdir, threads)  # warm-up: imports, allocator, thread pools
        on, off = [], []
        for index in range(args.rounds):  # alternate which goes first
            order = (True, False) if index % 2 == 0 else (False, True)
            for enabled in order:
                (on if enabled else off).append(run_once(enabled, args.steps, workdir, threads))
        ratios = [a / b for a, b in zip(on, off, strict=True)]
        table = Table(
            title=f"Demo step time, torch on {threads} of {cores} cores ({label}), "
            f"{args.rounds} interleaved rounds x {args.steps} steps"
        )
        for column in ("telemetry", "median ms/step", "min ms/step"):
            table.add_column(column, justify="left" if column == "telemetry" else "right")
        for name, values in (("on (export)", on), ("off (OTEL_SDK_DISABLED)", off)):
            table.add_row(
                name, f"{statistics.median(values) * 1e3:.2f}", f"{min(values) * 1e3:.2f}"
            )
        console.print(table)
        ratio = statistics.median(ratios)
        console.print(
            f"on/off ratio: median {ratio:.3f} (rounds: {', '.join(f'{r:.3f}' for r in ratios)})"
            + f"; goal ≤ 1.02 → {'met' if ratio <= 1.02 else 'NOT met'}"
        )


if __name__ == "__main__":
    main()
