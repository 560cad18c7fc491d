"""Demo step time with telemetry on vs off (OTEL_SDK_DISABLED), same work, interleaved.

"On" is everything the demo ships: /metrics served, spans to the OTLP/JSON traces file,
per-sample histograms and exemplar spans. "Off" runs the same loop with
OTEL_SDK_DISABLED=true (the ledger still times phases, nothing is exported). Goal: on/off
step-time ratio ≤ 1.02 with the demo's default of leaving one core to the exporters, and
with torch on every core (there export competes with the math for CPU, so the ratio is
the exporters' CPU share of a step).

On a shared 2-core machine a step's time drifts ±10–30 % over seconds (neighbours), so whole
runs compared one after the other disagree by more than the goal even when both are off.
Here one process holds an "on", an "off" and a second "off" telemetry; each turn trains the
same seeded model for a few steps under each of them in rotating order, timed from outside
rlotel (wall and process CPU between the demo's step callbacks, the turn's first step and
its export left out) up to the end of a flush of that telemetry, so that a turn carries all
of its own export (on one core an upper bound: the flush exports while the training thread
waits, where a run exports beside it) and neighbouring seconds are compared. The off ÷ off
ratio (A/A) is printed beside on ÷ off: its spread is how far the ratio can be trusted. The
CPU of rlotel's own threads (publisher, exporters, /metrics server) a step is read from
their thread clocks, which neighbours do not move: the exporters' share of a step.

    python benchmarks/demo_overhead.py [--turns N] [--steps S]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import rlotel
from rlotel.demo.loop import DemoConfig, train
from rlotel.telemetry import Telemetry


def telemetry(enabled: bool, workdir: Path) -> Telemetry:
    if enabled:
        os.environ.pop("OTEL_SDK_DISABLED", None)
    else:
        os.environ["OTEL_SDK_DISABLED"] = "true"
    return rlotel.init(
        run="bench", prometheus_port=0, traces_file=workdir / f"traces-{time.time_ns()}.jsonl"
    )


def rlotel_threads_cpu() -> float:
    """CPU seconds of rlotel's own threads so far (their names start with "rlotel")."""
    return sum(
        time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        for thread in threading.enumerate()
        if thread.name.startswith("rlotel") and thread.ident is not None
    )


def timed(tel: Telemetry, steps: int, threads: int) -> tuple[float, float, float]:
    """Wall, process-CPU and rlotel-thread CPU seconds of `steps` demo steps after a first,
    untimed one, up to the end of a flush of what they published."""
    marks: list[tuple[float, float, float]] = []

    def mark(_: object = None) -> None:
        if not marks:
            tel.flush()  # the untimed first step's export stays out of the timed window
        marks.append((time.perf_counter(), time.process_time(), rlotel_threads_cpu()))

    train(tel, DemoConfig(steps=steps + 1, seed=0, torch_threads=threads), on_step=mark)
    tel.flush()
    mark()
    first, last = marks[0], marks[-1]
    return last[0] - first[0], last[1] - first[1], last[2] - first[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per telemetry a turn")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rlotel-demo-bench-"))
    cores = os.cpu_count() or 2
    console = Console(width=100)
    cases = {"on": telemetry(True, workdir), "off": telemetry(False, workdir)}
    cases["off (A/A)"] = telemetry(False, workdir)
    names = list(cases)
    for threads, label in ((DemoConfig().torch_threads, "demo default"), (cores, "every core")):
        timed(cases["on"], 2, threads)  # warm-up: imports, allocator, thread pools
        figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
        for turn in range(args.turns):
            for name in names[turn % 3 :] + names[: turn % 3]:  # each goes first in turn
                figures[name].append(timed(cases[name], args.steps, threads))
        table = Table(
            title=f"Demo step, torch on {threads} of {cores} cores ({label}), "
            f"{args.turns} turns x {args.steps} steps each"
        )
        columns = ("telemetry", "wall ms/step", "process CPU ms/step", "rlotel threads", "÷ off")
        for column in columns:
            table.add_column(column, justify="left" if column == "telemetry" else "right")
        for name in names:
            ratios = [a[0] / b[0] for a, b in zip(figures[name], figures["off"], strict=True)]
            quartiles = statistics.quantiles(ratios, n=4)
            table.add_row(
                name,
                f"{statistics.median(w for w, _, _ in figures[name]) / args.steps * 1e3:.1f}",
                f"{statistics.median(c for _, c, _ in figures[name]) / args.steps * 1e3:.1f}",
                f"{sum(b for _, _, b in figures[name]) / args.turns / args.steps * 1e3:.2f}",
                f"{statistics.median(ratios):.3f} (IQR {quartiles[0]:.3f}–{quartiles[2]:.3f})",
            )
        console.print(table)
        on_off = statistics.median(
            a[0] / b[0] for a, b in zip(figures["on"], figures["off"], strict=True)
        )
        background = sum(b for _, _, b in figures["on"]) - sum(b for _, _, b in figures["off"])
        step_cpu = sum(c for _, c, _ in figures["off"])
        per_step_ms = background / args.turns / args.steps * 1e3
        console.print(
            f"on/off (wall): {on_off:.3f}; goal ≤ 1.02 → {'met' if on_off <= 1.02 else 'NOT met'}"
            f"; rlotel's threads with telemetry on: {per_step_ms:.2f} ms a step, "
            f"{background / step_cpu:.2%} of an off step's process CPU"
        )
    for tel in cases.values():
        tel.shutdown()


if __name__ == "__main__":
    main()
