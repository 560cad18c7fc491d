"""A short soak (the full 10k-step one is benchmarks/soak.py): nothing grows but counters.

It runs in a process of its own: threads, sockets and allocations left by other tests in
the pytest process would otherwise be counted as growth. On a run this short the RSS is
allocator noise (±8% seen on 10k steps), so it gets 15%, and 20 points, so each third of
the curve after warm-up is the median of four (with 5 points each third was one sample:
+16.9% once, −7.5% the next run; with 20, 0.0–0.2% in four runs); the traced Python heap
keeps 5%.

1,000 steps: the verdicts compare the points after the first 40% (step 400 on); the
per-phase gauges that the first 1 s tick adds (`rlotel_phase_open_seconds`, ...) must be
there by then, or "series bounded" sees them appear. Step 400 comes ~4 s in here (~10 ms a
step), four ticks of margin; the RSS and heap growth measured over 500 steps were +2.5% and
+0.3%.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a soak in a subprocess

SOAK = Path(__file__).resolve().parent.parent / "benchmarks" / "soak.py"


def test_short_soak_is_flat(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(SOAK),
            "--steps",
            "1000",
            "--points",
            "20",
            "--json",
            "--rss-tolerance",
            "0.15",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert all(report["verdicts"].values()), report
    assert len(report["curve"]) == 21
