"""Async bias: trained samples against everything generated in the step's window (KS of
response length and reward), discards by reason, token-weighted oldest-version staleness."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import rlotel
from rlotel.derive import async_bias
from rlotel.derive.diagnose import StepFacts, Thresholds, diagnose
from tests.helpers import parse_exposition, scrape

KS = "rlotel/async_bias/ks/"
DISCARDED = "rlotel/samples_discarded/"


def brute_ks(a: np.ndarray, b: np.ndarray) -> float:
    """sup |F_a(x) - F_b(x)| over every observed x, one point at a time."""
    return max(abs(np.mean(a <= x) - np.mean(b <= x)) for x in np.concatenate([a, b]))


@pytest.mark.parametrize("seed", range(8))
def test_ks_matches_brute_force_with_ties_and_unequal_sizes(seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 12, rng.integers(1, 60)).astype(float)  # many ties
    b = rng.normal(5, 3, rng.integers(1, 80)).round(1)
    assert async_bias.ks_statistic(a, b) == pytest.approx(brute_ks(a, b), abs=1e-12)


def test_ks_bounds():
    same = np.arange(10.0)
    assert async_bias.ks_statistic(same, same) == 0.0
    assert async_bias.ks_statistic(same, same + 100) == 1.0


def _tel(mode: str | None = "fully_async", port: int | None = None) -> rlotel.Telemetry:
    tel = rlotel.init(run="bias", prometheus_port=port)
    if mode is not None:
        tel.set_mode(mode)
    return tel


def test_discarded_long_samples_bias_the_trained_batch_and_are_counted_by_reason():
    tel = _tel(port=0)
    try:
        with tel.step(3) as step, tel.phase("wait_for_enough_samples"):
            tel.record_samples(
                generate_sequences=[1.0] * 6,
                response_length=[10, 12, 14, 16, 18, 20],
                reward=[1.0, 0.5, 0.0, -0.5, 1.0, 0.0],
            )
            tel.record_samples(response_length=[90, 95, 99], reward=[-1, -1, -1], discarded="stale")
            tel.record_samples(response_length=[50], reward=[0.0], discarded="filtered")
        metrics = step.metrics
        generated = 10
        assert metrics[DISCARDED + "stale"] == 3 / generated
        assert metrics[DISCARDED + "filtered"] == 1 / generated
        assert metrics[DISCARDED + "evicted"] == 0
        trained = np.array([10, 12, 14, 16, 18, 20.0])
        everything = np.concatenate([trained, [90, 95, 99, 50]])
        assert metrics[KS + "response_length"] == pytest.approx(brute_ks(trained, everything))
        assert metrics[KS + "response_length"] == pytest.approx(0.4)  # the 4 longest: gone
        assert 0 < metrics[KS + "reward"] <= 1
        # verl's keys and the histograms see the trained samples only
        assert metrics["agent_loop/generate_sequences/mean"] == 1.0
        tel.flush()
        series = parse_exposition(scrape(tel.metrics_url))
        run = ("run", "bias")
        for reason, count in (("stale", 3), ("filtered", 1)):
            key = ("rlotel_samples_discarded_total", frozenset({run, ("reason", reason)}))
            assert series[key] == count
        ks = ("rlotel_async_bias_ks", frozenset({run, ("quantity", "response_length")}))
        assert series[ks] == pytest.approx(0.4)
        count = ("rlotel_agent_loop_length_tokens_count", frozenset({run, ("kind", "response")}))
        assert series[count] == 6
    finally:
        tel.shutdown()


def test_async_step_without_discards_has_zero_bias_and_sync_has_none():
    for mode, expected in (("fully_async", 0.0), (None, None)):
        tel = _tel(mode)
        with tel.step(1) as step, tel.phase("gen"):
            tel.record_samples(response_length=[3, 4, 5], reward=[0.1, 0.2, 0.3])
        assert step.metrics.get(KS + "response_length") == expected
        assert step.metrics.get(DISCARDED + "stale") == expected
        tel.shutdown()


def test_a_bad_reason_is_one_drop_and_the_samples_still_count(caplog):
    tel = _tel()
    with caplog.at_level(logging.WARNING, logger="rlotel"):
        with tel.step(1) as step, tel.phase("gen"):
            tel.record_samples(response_length=[1, 2], reward=[0, 1])
            tel.record_samples(response_length=[7, 8], discarded="too-slow")
        assert step.metrics[DISCARDED + "other"] == 0.5
        tel.flush()
    assert tel.drops.snapshot()[("samples", "bad_reason")] == 1
    assert len([r for r in caplog.records if "bad_reason" in r.getMessage()]) == 1
    tel.shutdown()


def test_rewards_may_be_negative_but_not_nan():
    tel = _tel()
    with tel.step(1) as step, tel.phase("gen"):
        tel.record_samples(response_length=[1, 2, 3], reward=[-2.0, float("nan"), 1.0])
        tel.record_samples(response_length=[9], reward=[-2.0], discarded="evicted")
    assert 0 <= step.metrics[KS + "reward"] <= 1
    assert tel.drops.snapshot()[("samples", "non_finite")] == 1
    tel.shutdown()


def test_token_weighted_oldest_version_staleness():
    tel = _tel()
    with tel.step(10) as step, tel.phase("gen"):
        tel.record_samples(
            response_length=[100, 300],
            min_weight_version=[5, 8],
            max_weight_version=[9, 9],
        )
        tel.record_samples(response_length=[1000], min_weight_version=[2], max_weight_version=[2])
    # (step - 1) - oldest, by tokens: (100*4 + 300*1 + 1000*7) / 1400
    expected = (100 * 4 + 300 * 1 + 1000 * 7) / 1400
    assert step.metrics["rlotel/off_policy/trajectory_staleness_worst/token_mean"] == expected
    assert step.metrics["training/off_policy/trajectory_staleness_worst/mean"] == (4 + 1 + 7) / 3
    tel.shutdown()


def test_bias_verdict_past_the_threshold_and_threshold_is_validated():
    facts = StepFacts.from_metrics(
        4,
        {"step": 10.0, "wait_for_enough_samples": 6.0, "update_actor": 3.0},
        {KS + "response_length": 0.35, KS + "reward": 0.1, DISCARDED + "stale": 0.4},
    )
    verdict = diagnose(facts)
    assert (verdict.kind, verdict.detail) == ("async-bias", "response_length")
    assert verdict.evidence["discarded_stale"] == 0.4
    assert diagnose(facts, Thresholds(async_bias_ks=0.5)).kind != "async-bias"
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(rlotel.ConfigError, match="async_bias_ks"):
            Thresholds(async_bias_ks=bad).validated()


def _async_demo(max_staleness: int | None, steps: int = 6):
    """The async demo with a slow rollout; every record_samples call seen on its way."""
    from rlotel.demo.async_loop import AsyncConfig, train_async
    from rlotel.demo.loop import DemoConfig

    tel = rlotel.init(run="async-bias", prometheus_port=None)
    calls: list[dict] = []
    record = tel.record_samples

    def spy(*args, **fields):
        calls.append(fields)
        return record(*args, **fields)

    tel.record_samples = spy
    config = AsyncConfig(
        DemoConfig(steps=steps, seed=3), rollout_slowdown=4, max_staleness=max_staleness
    )
    try:
        result = train_async(tel, config)
    finally:
        tel.shutdown()
    return result, calls


@pytest.mark.slow
def test_async_demo_max_staleness_discards_the_long_groups_and_shows_the_bias():
    filtered, calls = _async_demo(max_staleness=0)
    unfiltered, _ = _async_demo(max_staleness=None)
    later = filtered.steps[1:]  # the first step waits for the very first batch
    stale = [s.metrics["rlotel/samples_discarded/stale"] for s in later]
    assert sum(stale) > 0, "a slow rollout with max staleness 0 discards stale groups"
    for step in filtered.steps:
        for quantity in ("response_length", "reward"):
            assert 0 <= step.metrics[KS + quantity] <= 1
        assert step.metrics["rlotel/samples_discarded/evicted"] == 0
        assert step.trained + step.evicted > 0
    lengths = {
        key: np.concatenate(
            [np.asarray(c["response_length"]) for c in calls if c.get("discarded") == key]
        )
        for key in (None, "stale")
    }
    assert lengths["stale"].mean() > lengths[None].mean()  # the long ones are dropped
    with_filter = np.mean([s.metrics[KS + "response_length"] for s in later])
    without = np.mean([s.metrics[KS + "response_length"] for s in unfiltered.steps[1:]])
    assert with_filter > without
    assert all(s.metrics["rlotel/samples_discarded/stale"] == 0 for s in unfiltered.steps)


@pytest.mark.slow
def test_async_demo_cli_max_staleness_counts_discards_and_the_report_shows_them(tmp_path):
    from tests.test_occupancy import report_async_rows, run_demo

    run = run_demo(
        tmp_path, "--async", "--rollout-slowdown", "4", "--max-staleness", "0", "--steps", "5"
    )
    steps = json.loads((run / "summary.json").read_text())["steps"]
    assert sum(s["metrics"]["rlotel/samples_discarded/stale"] for s in steps) > 0
    for step in steps:
        assert 0 <= step["metrics"][KS + "response_length"] <= 1
        assert 0 <= step["metrics"][KS + "reward"] <= 1
    rows = report_async_rows(run / "report.html")
    assert float(rows["discarded stale (share generated)"][2]) > 0  # the max over steps
    assert 0 <= float(rows["KS response_length (trained vs generated)"][0]) <= 1
    assert "chart-bias" in rows["plots"]
