"""What a broken collector costs training: step time against a blackholed or 503-answering
OTLP endpoint vs a healthy one, side by side.

Four telemetries export spans and metrics over OTLP/HTTP to four receivers, each in a
process of its own (as a Collector would be): two answer 200, one 503, one never answers.
The same steps (seven phases of ~1 ms of torch work each) run on each, interleaved in rounds.
The second healthy one is the A/A control: its ratio is this machine's noise.
Goal: ratios (faulty / healthy) ≤ 1.02 — export failures stay on background threads.

    python benchmarks/collector_faults.py [--steps N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import rlotel

ROOT = Path(__file__).resolve().parent.parent
PHASES = ["gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"]
RECEIVERS = {"healthy": "ok", "healthy (A/A)": "ok", "503": "unavailable", "blackhole": "blackhole"}
RECEIVER = """
import sys
from tests.otlp_receiver import FaultyReceiver
receiver = FaultyReceiver(sys.argv[1])
print(receiver.endpoint, flush=True)
sys.stdin.read()  # until the benchmark closes our stdin
"""


def start_receiver(mode: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-c", RECEIVER, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    return process, process.stdout.readline().strip()


def run_steps(tel: rlotel.Telemetry, steps: int, work: torch.Tensor) -> float:
    started = time.perf_counter()
    for number in range(steps):
        with tel.step(number) as step:
            for phase in PHASES:
                with tel.phase(phase):
                    (work @ work).sum()
            step.set_tokens(prompt=[64] * 8, response=[256] * 8)
    elapsed = (time.perf_counter() - started) / steps
    tel.flush(3)  # untimed, bounded: a blackhole never lets it finish
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    work = torch.randn(384, 384)
    receivers, tels = [], {}
    runs = list(RECEIVERS)
    os.environ.update(
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",  # seconds per request
        OTEL_METRIC_EXPORT_INTERVAL="2000",  # ms: metric pushes fail during the run too
    )
    try:
        for index, run in enumerate(runs):
            process, endpoint = start_receiver(RECEIVERS[run])
            receivers.append(process)
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
            tels[run] = rlotel.init(run=f"faults-{index}", prometheus_port=None)
            run_steps(tels[run], 20, work)
        ratios: dict[str, list[float]] = {run: [] for run in runs[1:]}
        for index in range(args.rounds):
            order = runs if index % 2 == 0 else runs[::-1]
            times = {run: run_steps(tels[run], args.steps, work) for run in order}
            for run in runs[1:]:
                ratios[run].append(times[run] / times["healthy"])
        dropped = {run: tels[run].drops.total for run in runs}
        for tel in tels.values():
            tel.shutdown()
    finally:
        for process in receivers:
            process.stdin.close()
            process.wait(10)
    console = Console(width=100)
    for run, values in ratios.items():
        ratio = statistics.median(values)
        verdict = (
            ""
            if RECEIVERS[run] == "ok"
            else f"; goal ≤ 1.02 → {'met' if ratio <= 1.02 else 'NOT met'}"
        )
        console.print(
            f"step time, collector {run} / healthy: median {ratio:.3f} over {args.rounds} "
            f"rounds of {args.steps} steps (rounds: {', '.join(f'{r:.3f}' for r in values)}); "
            f"{dropped[run]} inputs counted dropped{verdict}"
        )
    console.print(f"healthy collector: {dropped['healthy']} dropped")


if __name__ == "__main__":
    main()
