"""A short soak (the full 10k-step one is benchmarks/soak.py): nothing grows but counters."""

from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "soak", Path(__file__).resolve().parent.parent / "benchmarks" / "soak.py"
)
soak = importlib.util.module_from_spec(spec)
spec.loader.exec_module(soak)


def test_short_soak_is_flat(tmp_path):
    curve = soak.soak(1500, points=5, traces_file=tmp_path / "traces.jsonl")
    checks = soak.verdicts(curve)
    assert all(checks.values()), (checks, curve)
