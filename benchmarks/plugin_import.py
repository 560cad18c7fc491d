"""`import verl` with rlotel's plugin, without it, and switched on: fresh interpreters,
several rounds, median wall time (issue 13: inert when off)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

ROUNDS = 7
CASES = {
    "without the plugin (VERL_USE_EXTERNAL_PLUGINS=none)": {"VERL_USE_EXTERNAL_PLUGINS": "none"},
    "with the plugin, RLOTEL_ENABLE unset": {},
    "with the plugin, RLOTEL_ENABLE=1": {"RLOTEL_ENABLE": "1"},
}


def seconds(extra: dict[str, str]) -> float:
    environ = {k: v for k, v in os.environ.items() if k not in ("RLOTEL_ENABLE",)}
    environ.update(extra)
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import verl"], env=environ, check=True, capture_output=True
    )
    return time.perf_counter() - started


def main() -> None:
    seconds({})  # warm the page cache
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(ROUNDS):  # interleaved, so drift hits every case alike
        for name, extra in CASES.items():
            times[name].append(seconds(extra))
    base = statistics.median(times[next(iter(CASES))])
    print(f"import verl, median of {ROUNDS} fresh interpreters:")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:55s} {median:6.3f} s  ({median - base:+.3f} s)")


if __name__ == "__main__":
    main()
