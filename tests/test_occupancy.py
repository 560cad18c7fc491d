"""Rollout occupancy measured from what held each replica's engine (model turns, else whole
trajectories): per replica, the
tail seconds moved from productive to idle, the rollout-tail verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rlotel
from rlotel.derive import goodput, occupancy
from rlotel.derive.diagnose import StepFacts, Thresholds, diagnose
from tests.helpers import parse_exposition, scrape

S = 1_000_000_000
T0 = 1_700_000_000 * S  # a Unix time in ns


def test_trajectories_that_start_and_end_together_occupy_fully():
    measured = occupancy.occupancy(np.full(16, T0), np.full(16, T0 + 3 * S))
    assert measured.ratio == 1.0
    assert measured.tail_seconds == 0.0
    assert measured.peak == 16


def test_one_long_trajectory_among_short_ones_is_the_tail():
    starts = np.full(10, T0)
    ends = np.array([T0 + 1 * S] * 9 + [T0 + 5 * S])
    measured = occupancy.occupancy(starts, ends)
    assert measured.tail_seconds == pytest.approx(4.0)  # its lone stretch, 1 s .. 5 s
    assert measured.ratio == pytest.approx((10 * 1 + 1 * 4) / 5 / 10)
    assert measured.busy_seconds == pytest.approx(5.0)


def test_gaps_between_batches_are_not_counted():
    starts = np.array([T0, T0, T0 + 10 * S, T0 + 10 * S])
    ends = starts + S
    measured = occupancy.occupancy(starts, ends)
    assert (measured.ratio, measured.tail_seconds, measured.busy_seconds) == (1.0, 0.0, 2.0)


def test_zero_length_trajectories_measure_nothing():
    assert occupancy.occupancy(np.full(3, T0), np.full(3, T0)) is None


def test_step_metrics_per_replica_series_and_goodput_moves_the_tail():
    tel = rlotel.init(run="occ", prometheus_port=0)
    try:
        with tel.step(1) as step:
            with tel.phase("gen"):
                tel.record_samples(
                    generate_sequences=[1.0] * 4,
                    start_time_ns=[T0] * 4,
                    end_time_ns=[T0 + S, T0 + S, T0 + S, T0 + 2 * S],  # replica a: tail 1 s
                    replica=["a", "a", "b", "b"],
                )
        # a: two together for 1 s → 1, no tail; b: 2 for 1 s then 1 for 1 s → 0.75, tail 0
        # (1 is not below half of 2); the step: means over replicas
        assert step.summary.occupancy["a"].ratio == 1.0
        assert step.summary.occupancy["b"].ratio == pytest.approx(0.75)
        assert step.metrics["rlotel/rollout_occupancy"] == pytest.approx(0.875)
        assert step.metrics["rlotel/rollout_tail_seconds"] == 0.0
        tel.flush()
        series = parse_exposition(scrape(tel.metrics_url))
        key = ("rlotel_rollout_occupancy_ratio", frozenset({("run", "occ"), ("replica", "b")}))
        assert series[key] == pytest.approx(0.75)
    finally:
        tel.shutdown()


def test_model_turns_measure_the_engine_not_the_whole_trajectory():
    """Both trajectories on replica a last 10 s (tool calls, reward), but the engine served
    sample 0 for its first 4 s and sample 1 twice for 1 s: 2 in flight, then 1, then 2 again
    over the 4 s the engine was busy → 0.75. On b one sample of the batch has no turns, so
    that batch is measured from its trajectories (1.0), as when no turns are given at all."""
    tel = rlotel.init(run="occ", prometheus_port=None)
    try:
        with tel.step(1) as step:
            with tel.phase("gen"):
                for replica, turns in (
                    ("a", [[(T0, T0 + 4 * S)], [(T0, T0 + S), (T0 + 3 * S, T0 + 4 * S)]]),
                    ("b", [[(T0, T0 + S)], []]),
                ):
                    tel.record_samples(
                        generate_sequences=[4.0, 2.0],
                        start_time_ns=[T0] * 2,
                        end_time_ns=[T0 + 10 * S] * 2,
                        turn_times_ns=turns,
                        replica=replica,
                    )
        a, b = step.summary.occupancy["a"], step.summary.occupancy["b"]
        assert (a.ratio, a.busy_seconds, a.peak) == (pytest.approx(0.75), 4.0, 2)
        assert (b.ratio, b.busy_seconds) == (1.0, 10.0)
    finally:
        tel.shutdown()


def test_sync_gen_tail_moves_from_productive_to_idle():
    windows = [("gen", 0, 4 * S), ("update_actor", 4 * S, 10 * S)]
    buckets = goodput.PhaseBuckets()
    before = goodput.step_metrics(windows, 0, 10 * S, buckets)
    after = goodput.step_metrics(windows, 0, 10 * S, buckets, rollout_tail_s=3.0)
    assert before["rlotel/bucket_seconds/productive"] == 10
    assert after["rlotel/bucket_seconds/productive"] == 7
    assert after["rlotel/bucket_seconds/idle"] == 3
    capped = goodput.step_metrics(windows, 0, 10 * S, buckets, rollout_tail_s=30.0)
    assert capped["rlotel/bucket_seconds/productive"] == 6  # never more than gen itself


def test_rollout_role_tail_raises_its_idle_ratio():
    windows = [("wait_for_enough_samples", 0, 2 * S), ("update_actor", 2 * S, 10 * S)]
    windows.append(("rollout_generate", 0, 10 * S))
    buckets = goodput.PhaseBuckets(mode="fully_async")
    metrics = goodput.step_metrics(windows, 0, 10 * S, buckets, rollout_tail_s=2.5)
    assert metrics["rlotel/idle_ratio/rollout"] == 0.25
    assert metrics["rlotel/idle_ratio/trainer"] == 0.2


def test_tail_dominating_gen_is_a_rollout_tail_verdict():
    timing = {"step": 10.0, "gen": 8.0, "update_actor": 1.0}
    loop = {
        "agent_loop/slowest/generate_sequences": 7.5,
        "agent_loop/generate_sequences/max": 7.5,
        "agent_loop/generate_sequences/mean": 2.0,
    }
    tail = {**loop, "rlotel/rollout_tail_seconds": 5.0, "rlotel/rollout_occupancy": 0.4}
    verdict = diagnose(StepFacts.from_metrics(1, timing, tail))
    assert verdict.label == "rollout-bound/rollout-tail"
    assert verdict.evidence["rollout_tail_share"] == 0.625
    assert diagnose(StepFacts.from_metrics(1, timing, loop)).detail == "generation-tail"
    loose = Thresholds(tail_share=0.9)
    assert diagnose(StepFacts.from_metrics(1, timing, tail), loose).detail == "generation-tail"
    with pytest.raises(rlotel.ConfigError, match="tail_share"):
        Thresholds(tail_share=2).validated()


def test_bad_times_are_counted_once_and_the_rest_measured(tmp_path):
    tel = rlotel.init(  # traced: sample spans read the same times
        run="occ", prometheus_port=None, max_sample_spans=8, traces_file=tmp_path / "t.jsonl"
    )
    with tel.step(1) as step, tel.phase("gen"):
        tel.record_samples(
            generate_sequences=[1.0, 1.0, 1.0],
            start_time_ns=[T0, T0, T0 + 5 * S],
            end_time_ns=[T0 + S, T0 + S, T0],  # the third ends before it starts
        )
    assert step.summary.occupancy["0"].ratio == 1.0
    tel.flush()
    assert tel.drops.snapshot()[("samples", "bad_time")] == 1
    tel.shutdown()


@pytest.mark.slow
def test_demo_loop_measures_occupancy_in_range(demo_run):
    """The demo loop's own step results, as the shared demo run (tests/conftest.py) wrote
    them to summary.json."""
    steps = json.loads((demo_run / "summary.json").read_text())["steps"]
    assert steps
    for step in steps:
        assert 0 < step["metrics"]["rlotel/rollout_occupancy"] <= 1
        assert 0 <= step["metrics"]["rlotel/rollout_tail_seconds"] <= step["timing_raw"]["gen"]


def report_async_rows(report: Path) -> dict[str, list[str]]:
    """The async-bias/occupancy table of a report as headless Chromium renders it."""
    from tests.chromium import Chromium, chromium_binary, file_url

    if chromium_binary() is None:
        pytest.fail("chromium is not installed: `make system-deps` installs Debian's")
    with Chromium() as browser:
        load = browser.open(file_url(report), "document.body.dataset.drawn === '1'")
        assert load.console_errors == [] and load.requests == []
        found = browser.evaluate(
            """JSON.stringify({
              hidden: document.getElementById('async-bias').hidden,
              rows: [...document.querySelectorAll('#async-summary tr')].slice(1)
                      .map(r => [...r.cells].map(c => c.textContent)),
              plots: [...document.querySelectorAll('#async-bias .js-plotly-plot')].map(e => e.id),
            })"""
        )
    found = json.loads(found)
    assert not found["hidden"]
    return {row[0]: row[1:] for row in found["rows"]} | {"plots": found["plots"]}


def run_demo(runs: Path, *args: str) -> Path:
    command = [
        sys.executable, "-m", "rlotel.cli", "demo", "--port", "0", "--runs-dir", str(runs),
        *args,
    ]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rollout occupancy" in result.stdout
    return runs / "demo"


@pytest.mark.slow
def test_demo_occupancy_is_in_range_and_the_report_shows_it(demo_run):
    """The shared demo run (tests/conftest.py: 4 steps)."""
    assert "rollout occupancy" in (demo_run.parent / "rep.stdout").read_text()
    run = demo_run
    steps = json.loads((run / "summary.json").read_text())["steps"]
    values = [s["metrics"]["rlotel/rollout_occupancy"] for s in steps]
    assert all(0 < v <= 1 for v in values), values
    rows = report_async_rows(run / "report.html")
    shown = float(rows["rollout occupancy (mean in flight ÷ peak)"][0])
    assert shown == pytest.approx(sum(values) / len(values), rel=1e-3)
    assert "chart-occupancy" in rows["plots"]
