"""Soak: 10k steps with samples, the endpoint scraped, memory/fds/threads/series tracked.

Prints the curve (every 5% of the run) and whether, after warm-up (the first 40%: in a
40 000-step run RSS climbs until ~6 000 steps, then holds 70–80 MiB), RSS and
the traced Python heap stay flat within 5% (the median of the last third of the points
against that of the first third: single RSS samples jitter by ±8% here as the allocator
takes and returns pages), file descriptors and threads do not grow, and the series count is
bounded.

    python benchmarks/soak.py [--steps N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import tracemalloc
import urllib.request
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import rlotel

PHASES = ["gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"]


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def snapshot(tel: rlotel.Telemetry) -> dict[str, float]:
    """Counted before the scrape: the server closes its side of a scrape's connection just
    after the client has read it, so counting after would race that close."""
    tel.flush(30)
    point = {
        "rss": rss_bytes(),
        "heap": tracemalloc.get_traced_memory()[0],
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": threading.active_count(),
    }
    with urllib.request.urlopen(tel.metrics_url, timeout=10) as response:
        body = response.read().decode()
    return {**point, "series": sum(1 for line in body.splitlines() if line and line[0] != "#")}


def soak(steps: int, points: int = 10, traces_file: Path | None = None) -> list[dict]:
    """Run `steps` steps; return `points + 1` snapshots (the first after one step)."""
    tracemalloc.start()
    tel = rlotel.init(run="soak", prometheus_port=0, traces_file=traces_file)
    rng = np.random.default_rng(0)
    curve = []
    try:
        for number in range(1, steps + 1):
            with tel.step(number) as step:
                for phase in PHASES:
                    with tel.phase(phase):
                        if phase == "gen":
                            tel.record_samples(
                                generate_sequences=rng.lognormal(size=32),
                                tool_calls=rng.exponential(size=32),
                                response_length=rng.integers(1, 4096, size=32),
                            )
                step.set_tokens(prompt=[64] * 32, response=[256] * 32)
                step.set_mfu(actor=0.3)
            tel.log({"actor/pg_loss": float(rng.normal()), "critic/score/mean": 0.5}, number)
            if number == 1 or number % max(1, steps // points) == 0:
                curve.append({"step": number, **snapshot(tel)})
    finally:
        tel.shutdown()
        tracemalloc.stop()
    return curve


def after_warm_up(curve: list[dict]) -> list[dict]:
    return curve[max(1, len(curve) * 2 // 5) :]


def growth(curve: list[dict], key: str) -> float:
    """Median of the last third of the post-warm-up points over that of the first, - 1."""
    after = after_warm_up(curve)
    third = max(1, len(after) // 3)
    early = statistics.median(point[key] for point in after[:third])
    late = statistics.median(point[key] for point in after[-third:])
    return late / early - 1


def verdicts(curve: list[dict], rss_tolerance: float = 0.05) -> dict[str, bool]:
    after = after_warm_up(curve)
    warm, last = after[0], curve[-1]
    return {
        f"rss within {rss_tolerance:.0%} after warm-up": growth(curve, "rss") <= rss_tolerance,
        "heap within 5% after warm-up": growth(curve, "heap") <= 0.05,
        "no fd growth": max(point["fds"] for point in after) <= warm["fds"],
        "no thread growth": max(point["threads"] for point in after) <= warm["threads"],
        "series bounded": last["series"] == warm["series"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--points", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print the curve and verdicts as JSON")
    parser.add_argument(
        "--rss-tolerance", type=float, default=0.05, help="allowed RSS growth after warm-up"
    )
    args = parser.parse_args()
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"rlotel-soak-{os.getpid()}"
    curve = soak(args.steps, args.points, traces_file=workdir / "traces.jsonl")
    if args.json:
        print(json.dumps({"curve": curve, "verdicts": verdicts(curve, args.rss_tolerance)}))
        return
    table = Table(title=f"Soak: {args.steps} steps")
    for column in ("step", "RSS MiB", "Python heap MiB", "fds", "threads", "series"):
        table.add_column(column, justify="right")
    for point in curve:
        table.add_row(
            str(point["step"]),
            f"{point['rss'] / 2**20:.1f}",
            f"{point['heap'] / 2**20:.2f}",
            str(point["fds"]),
            str(point["threads"]),
            str(point["series"]),
        )
    console = Console(width=100)
    console.print(table)
    console.print(
        f"after warm-up, last third vs first third (medians): RSS {growth(curve, 'rss'):+.1%}, "
        f"Python heap {growth(curve, 'heap'):+.1%}"
    )
    for name, ok in verdicts(curve, args.rss_tolerance).items():
        console.print(f"{name}: {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    main()
