"""Goodput buckets, idle ratios per role, weight versions and staleness, async verdicts."""

from __future__ import annotations

import time

import numpy as np
import pytest

import rlotel
from rlotel.derive import goodput
from rlotel.derive.diagnose import StepFacts, diagnose
from tests.helpers import file_spans

S = 1_000_000_000  # one second in ns


def test_sync_buckets_split_the_step_and_goodput_is_productive_share():
    windows = [("gen", 0, 4 * S), ("old_log_prob", 4 * S, 5 * S), ("update_actor", 6 * S, 9 * S)]
    metrics = goodput.step_metrics(windows, 0, 10 * S, goodput.PhaseBuckets())
    assert metrics["rlotel/bucket_seconds/productive"] == 7
    assert metrics["rlotel/bucket_seconds/overhead"] == 3  # old_log_prob + 2 s between windows
    assert metrics["rlotel/goodput"] == 0.7
    assert "rlotel/idle_ratio/trainer" not in metrics  # sync: no roles to compare


def test_async_gen_is_waiting_and_rollout_idle_is_read_off_the_trainer():
    windows = [("gen", 0, 6 * S), ("update_actor", 6 * S, 9 * S), ("update_weights", 9 * S, 10 * S)]
    buckets = goodput.PhaseBuckets().for_mode("separate_async")
    metrics = goodput.step_metrics(windows, 0, 10 * S, buckets)
    assert metrics["rlotel/bucket_seconds/idle"] == 6
    assert metrics["rlotel/idle_ratio/trainer"] == 0.6
    assert metrics["rlotel/idle_ratio/rollout"] == 0.1  # paused for weights only


def test_rollout_windows_are_a_second_role_and_ratios_stay_in_range():
    windows = [
        ("wait_for_enough_samples", 0, 2 * S),
        ("update_actor", 2 * S, 10 * S),
        ("rollout_generate", -5 * S, 3 * S),  # started in the previous step: clipped
        ("rollout_wait_buffer", 3 * S, 10 * S),
    ]
    metrics = goodput.step_metrics(windows, 0, 10 * S, goodput.PhaseBuckets(mode="fully_async"))
    assert metrics["rlotel/idle_ratio/trainer"] == 0.2
    assert metrics["rlotel/idle_ratio/rollout"] == 0.7
    total = sum(v for k, v in metrics.items() if k.startswith("rlotel/bucket_seconds/"))
    assert total == pytest.approx(20)  # two roles × 10 s
    assert metrics["rlotel/goodput"] == pytest.approx((8 + 3) / 20)


def test_overrides_win_and_unknown_bucket_is_a_config_error():
    buckets = goodput.PhaseBuckets(overrides={"gen": "wasted"}).for_mode("colocate_async")
    assert buckets.bucket("gen") == "wasted" and buckets.bucket("mine") == "overhead"
    with pytest.raises(rlotel.ConfigError, match="not a bucket"):
        rlotel.init(prometheus_port=None, phase_buckets={"gen": "useful"})


def test_step_metrics_and_phase_spans_carry_buckets(tmp_path):
    tel = rlotel.init(
        run="g", prometheus_port=None, traces_file=tmp_path / "t.jsonl",
        phase_buckets={"my_wait": "idle"},
    )  # fmt: skip
    with tel.step(1) as step:
        with tel.phase("my_wait"):
            time.sleep(0.02)
        with tel.phase("update_actor"):
            time.sleep(0.02)
    # each window's bucket holds its own seconds, and goodput is the productive share of the
    # step: ratios of what was measured, no margin on how long a sleep took
    timing, metrics = step.timing_raw, step.metrics
    assert timing["my_wait"] >= 0.02 and timing["update_actor"] >= 0.02
    assert metrics["rlotel/bucket_seconds/idle"] == pytest.approx(timing["my_wait"])
    assert metrics["rlotel/bucket_seconds/productive"] == pytest.approx(timing["update_actor"])
    assert metrics["rlotel/goodput"] == pytest.approx(timing["update_actor"] / timing["step"])
    assert sum(v for k, v in metrics.items() if k.startswith("rlotel/bucket_seconds/")) == (
        pytest.approx(timing["step"])
    )
    tel.shutdown()
    buckets = {s["name"]: s["attrs"].get("rl.bucket") for s in file_spans(tmp_path / "t.jsonl")}
    assert buckets == {"step": None, "my_wait": "idle", "update_actor": "productive"}


def test_staleness_is_verls_formula_and_bad_versions_are_dropped():
    tel = rlotel.init(run="s", prometheus_port=None)
    low = [3, 1, 2, -1, 2.5, np.nan, 4]
    high = [3, 3, 2, 2, 3, 3, 2]  # last: min > max
    with tel.step(5) as step:
        tel.record_samples(
            generate_sequences=[1.0] * 7, min_weight_version=low, max_weight_version=high
        )
        tel.record_samples(generate_sequences=[1.0, 2.0], min_weight_version=[1])  # unpaired
    kept_low, kept_high = np.array([3, 1, 2]), np.array([3, 3, 2])
    spans, stale, worst = kept_high - kept_low + 1, 4 - kept_high, 4 - kept_low
    for name, values in (
        ("trajectory_spans", spans),
        ("trajectory_staleness", stale),
        ("trajectory_staleness_worst", worst),
    ):
        for stat in ("mean", "max", "min"):
            key = f"training/off_policy/{name}/{stat}"
            assert step.metrics[key] == getattr(values, stat)(), key
    tel.flush()
    reasons = {key[1]: n for key, n in tel.drops.snapshot().items() if key[0] == "samples"}
    assert reasons.get("non_integer") == 3  # -1, 2.5, NaN: one reason per column, as elsewhere
    assert reasons.get("min_over_max") == 1
    assert reasons.get("missing_version") == 1
    tel.shutdown()


def _facts(idle, timing=None, **extra):
    return StepFacts(1, {"step": 10.0, **(timing or {})}, idle=idle, **extra)


def test_async_verdicts_name_who_waits():
    assert diagnose(_facts({"trainer": 0.7, "rollout": 0.05})).kind == "data-starved"
    assert diagnose(_facts({"trainer": 0.7, "rollout": 0.0}, evicted=8)).kind == (
        "staleness-limited"
    )
    idle_rollout = diagnose(_facts({"trainer": 0.0, "rollout": 0.6}, {"rollout_wait_buffer": 6.0}))
    assert (idle_rollout.kind, idle_rollout.detail) == ("rollout-idle", "buffer-full")
    switching = _facts({"trainer": 0.1, "rollout": 0.1}, {"switch_to_rollout": 5.0})
    assert diagnose(switching).kind == "switch-bound"
    busy = _facts({"trainer": 0.05, "rollout": 0.05}, {"gen": 0.5, "update_actor": 9.0})
    assert diagnose(busy).kind == "update-bound"
