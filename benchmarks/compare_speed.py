"""`rlotel compare` on two 10,000-step runs: the time from two paths to the verdict.

Both runs are real rlotel traces files (seven phases, 32 per-sample timings a step — the
slowest few become sample spans —, tokens, MFU), written untimed; the second one's
`update_actor` does more work, so there is a change to find. What is timed is what
`rlotel compare BASE NEW --json` does: read both files (`rlotel.offline.analyze`), reduce them to
windows per step, bootstrap every window's interval (2000 resamples), verdict, JSON.
`--format verl` writes verl FileLogger JSONL instead (no spans: the reading is cheaper).
Goal: ≤ 10 s.

    python benchmarks/compare_speed.py [--steps N] [--samples S] [--format traces|verl]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from synthetic_run import PHASES, write_traces  # benchmarks/ is this script's path

from rlotel.cli import commands as cli
from rlotel.schema import vocabulary as voc

BUDGET_S = 10.0


def write_verl_log(path: Path, steps: int, update_seconds: float) -> None:
    """verl FileLogger lines ({"step": N, "data": {...}}) with verl's own key names."""
    rng = random.Random(int(update_seconds * 1000))
    with path.open("w") as out:
        for number in range(1, steps + 1):
            timing = {name: rng.lognormvariate(0, 0.2) for name in PHASES}
            timing["update_actor"] = update_seconds * rng.lognormvariate(0, 0.1)
            timing[voc.STEP] = sum(timing.values()) + 0.05
            data = {f"{voc.TIMING_S}{name}": seconds for name, seconds in timing.items()}
            data[voc.THROUGHPUT] = 1e5 / timing[voc.STEP]
            data[f"{voc.MFU}actor"] = 0.3 + 0.05 * rng.random()
            data[f"{voc.AGENT_LOOP}{voc.GENERATE_SEQUENCES}/mean"] = rng.lognormvariate(0, 0.2)
            data[f"{voc.AGENT_LOOP}{voc.GENERATE_SEQUENCES}/max"] = rng.lognormvariate(1, 0.2)
            out.write(json.dumps({"step": number, "data": data}) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=32, help="per-sample timings a step")
    parser.add_argument("--format", choices=("traces", "verl"), default="traces")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp) / f"{name}.jsonl" for name in ("base", "new")]
        started = time.perf_counter()
        for path, work in zip(paths, (2_000, 6_000), strict=True):
            if args.format == "traces":
                write_traces(path, args.steps, args.samples, work, seed=work)
            else:
                write_verl_log(path, args.steps, work / 1000)
        size = sum(p.stat().st_size for p in paths) / 1e6
        print(
            f"runs: 2 × {args.steps} steps ({args.format}, {args.samples} samples a step), "
            f"{size:.1f} MB, written in {time.perf_counter() - started:.1f}s"
        )
        stdout = io.StringIO()
        started = time.perf_counter()
        with contextlib.redirect_stdout(stdout):
            code = cli.main(["compare", *map(str, paths), "--json"])
        elapsed = time.perf_counter() - started
    result = json.loads(stdout.getvalue())
    print(f"verdict: {result['verdict']}")
    verdict = "ok" if elapsed <= BUDGET_S else "OVER"
    print(f"compare: {elapsed:.2f} s  (goal ≤ {BUDGET_S:g} s) {verdict}; exit code {code}")
    return 0 if code == 0 and elapsed <= BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
