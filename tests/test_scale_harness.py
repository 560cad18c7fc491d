"""benchmarks/scale.py at two small sizes in one run: it completes through rlotel's own
driver-side functions (real Ray refs, GCS KV, /metrics and the traces file), every process's
KV entry is gone when it stops, a step's spans do not grow with the ranks, and a rank that
never replies is named with its process by the stall watch. Whether the
reply timing stays linear is `tests/test_verl_workers.py`'s (a ratio at sizes where a
quadratic loop stands out from the noise of a loaded machine)."""

from __future__ import annotations

import pytest

from benchmarks import scale, scale_targets

SIZES = [8, 64]


@pytest.mark.slow
def test_the_scale_harness_runs_and_cleans_up():
    results = scale.run(SIZES, steps_per_size=2)
    for n in SIZES:
        figures = results[n]
        assert figures["kv_entries"] == n and figures["kv_left"] == 0
        assert figures["spans_step"] == 1 + len(scale.PHASES)
        assert figures["series"] > 0
        assert figures["stuck_named_s"] > scale.STALL_S  # named, and not before its time
        assert figures["poll_step_pct"] > 0
    print(scale.table(SIZES, results))


@pytest.mark.slow
def test_many_real_worker_targets_up_and_the_slow_rank_named_by_the_shipped_rules():
    """benchmarks/scale_targets.py at a small size: verl's real worker group, each rank's
    /metrics found by the shipped file discovery and scraped by a real Prometheus, every
    shipped rule healthy, and RLSlowRank pending on exactly the slow rank."""
    figures = scale_targets.run(3)
    assert figures["files"] == 3
    (alert,) = figures["slow_rank_alerts"]
    assert alert["rank"] == str(figures["slow_rank"]) and alert["node"] == "127.0.0.1"
    assert figures["rule_errors"] == []
    assert figures["driver_compute_spread"] > 2  # the slow rank's 3x, seen by the driver
    print(figures)
