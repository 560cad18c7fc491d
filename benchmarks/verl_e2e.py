"""verl's real `main_ppo` with the rlotel plugin on ÷ off, per window, side by side.

Alternating runs (off, on, off, on, ...) of the e2e recipe (`tests/e2e/main_ppo.py`: V1,
GRPO, vLLM rollout, tiny model, CPU, `unshare -n -m`, scraped every 15 s); each run's
windows read from verl's own file logger (`timing_s/*`), steps ≥ 2 (step 1 warms vLLM
up). Per window: the median over a run's steps, then the median over runs of each side;
the ratio on ÷ off and the difference in milliseconds; and the ratio within each pair
(its median and range). Absolute times here are noisy (2 shared cores): read ratios.
Beside each difference, a 95 % interval (runs resampled on each side, 2,000 times) and what
it says of the goal (≤ 1.02 or ≤ +5 ms): met (the interval's top within it), not met (its
bottom above it), or not resolved by these runs.

    .venv/bin/python benchmarks/verl_e2e.py [--pairs 2] [--steps 6] [--env K=V ...]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlotel.schema import vocabulary as voc
from tests.e2e.main_ppo import run_isolated

FIRST_MEASURED_STEP = 2
# Prometheus' default interval: the harness scrapes every process it finds, which at the
# tests' half second is a load (parse, files) on the plugin-on side only
SCRAPE_EVERY_S = 15.0
RESAMPLES = 2_000
GOAL_RATIO, GOAL_MS = 1.02, 5.0  # a window's goal: within either


def windows(work: Path) -> dict[str, float]:
    """Median seconds per window (and `step`) over the run's steps ≥ 2."""
    per_window: dict[str, list[float]] = {}
    for line in (work / "verl.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["step"] < FIRST_MEASURED_STEP:
            continue
        for name, seconds in voc.timing_from_metrics(record["data"]).items():
            per_window.setdefault(name, []).append(seconds)
    return {name: statistics.median(values) for name, values in per_window.items()}


def interval(off: list[float], on: list[float]) -> tuple[float, float]:
    """95 % bootstrap interval of median(on) − median(off), runs resampled on each side."""
    draw = random.Random(0)
    differences = sorted(
        statistics.median(draw.choices(on, k=len(on)))
        - statistics.median(draw.choices(off, k=len(off)))
        for _ in range(RESAMPLES)
    )
    return differences[int(0.025 * RESAMPLES)], differences[int(0.975 * RESAMPLES) - 1]


def verdict(off: float, low: float, high: float) -> str:
    allowed = max(off * (GOAL_RATIO - 1), GOAL_MS / 1000)
    return "met" if high <= allowed else "not met" if low > allowed else "not resolved"


def one_run(
    plugin: bool, steps: int, assets: Path | None, environment: list[str]
) -> tuple[dict[str, float], Path]:
    work = Path(tempfile.mkdtemp(prefix="rl-bench-", dir="/tmp"))
    argv = [str(work), "--steps", str(steps), *([] if plugin else ["--off"])]
    argv += ["--scrape-every", str(SCRAPE_EVERY_S)]
    argv += [f"--env={item}" for item in environment if plugin]
    if assets is not None:
        argv += ["--assets", str(assets)]
    result = run_isolated(argv)
    if result.returncode != 0:
        tail = (work / "console.log").read_text(errors="replace")[-3000:]
        raise SystemExit(f"main_ppo failed (plugin {'on' if plugin else 'off'}):\n{tail}")
    return windows(work), work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument(
        "--env", action="append", default=[], help="K=V for every process of the plugin-on runs"
    )
    parser.add_argument("--save", type=Path, help="each run's window medians, as JSON")
    options = parser.parse_args()
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    assets: Path | None = None
    made: list[Path] = []
    try:
        for pair in range(options.pairs):
            for plugin in (False, True) if pair % 2 == 0 else (True, False):
                measured, work = one_run(plugin, options.steps, assets, options.env)
                assets = assets or work / "assets"
                made.append(work)
                runs[plugin].append(measured)
                print(f"pair {pair + 1}, plugin {'on ' if plugin else 'off'}: step "
                      f"{measured[voc.STEP]:.3f} s", flush=True)  # fmt: skip
    finally:
        for work in made:
            shutil.rmtree(work, ignore_errors=True)
    names = sorted(set.intersection(*(set(r) for r in runs[False] + runs[True])))
    names.sort(key=lambda n: (n != voc.STEP, n))
    print(f"\nverl main_ppo, steps {FIRST_MEASURED_STEP}-{options.steps}, {options.pairs} "
          "alternating pairs; median of run medians")  # fmt: skip
    print(f"{'window':<18}{'off s':>10}{'on s':>10}{'on/off':>9}{'Δ ms':>9}{'95 % ms':>18}"
          f"  {'goal':<14}per pair on/off")  # fmt: skip
    for name in names:
        offs, ons = [r[name] for r in runs[False]], [r[name] for r in runs[True]]
        off, on = statistics.median(offs), statistics.median(ons)
        ratio = on / off if off else float("nan")
        low, high = interval(offs, ons)
        pairs = sorted(a / b for a, b in zip(ons, offs, strict=True) if b)
        spread = f"median {statistics.median(pairs):.3f} [{pairs[0]:.3f}, {pairs[-1]:.3f}]"
        print(f"{name:<18}{off:>10.4f}{on:>10.4f}{ratio:>9.3f}{(on - off) * 1000:>9.1f}"
              f"{f'[{low * 1000:.1f}, {high * 1000:.1f}]':>18}  {verdict(off, low, high):<14}"
              f"{spread}")  # fmt: skip
    if options.save:
        options.save.write_text(json.dumps({"off": runs[False], "on": runs[True]}, indent=1))


if __name__ == "__main__":
    main()
