"""record_samples never raises: invalid entries are dropped and counted, valid ones kept."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tests.helpers import parse_exposition, scrape


def histogram_count(tel, stage: str) -> float:
    tel.flush(10)
    samples = parse_exposition(scrape(tel.metrics_url))
    key = ("rlotel_agent_loop_duration_seconds_count", frozenset({("run", "s"), ("stage", stage)}))
    return samples.get(key, 0.0)


def drops(tel) -> dict[str, float]:
    tel.flush(10)
    samples = parse_exposition(scrape(tel.metrics_url))
    return {
        dict(labels)["reason"]: value
        for (name, labels), value in samples.items()
        if name == "rlotel_telemetry_dropped_total" and dict(labels)["signal"] == "samples"
    }


def test_invalid_entries_dropped_valid_kept(make_tel, caplog):
    caplog.set_level(logging.WARNING, logger="rlotel")
    tel = make_tel(run="s")
    with tel.step(1) as step, tel.phase("gen"):
        tel.record_samples(
            generate_sequences=[1.0, float("nan"), float("inf"), -2.0, None, "3", 4.0],
            tool_calls=np.array([0.1, 0.2, np.nan, 0.0, 0.5, 0.1, 0.3]),
            num_preempted=[0, -1, -7, 1.5, 2, None, 1],
        )
    assert histogram_count(tel, "generate_sequences") == 2
    assert histogram_count(tel, "tool_calls") == 6
    assert step.metrics["agent_loop/generate_sequences/max"] == 4.0
    assert step.metrics["agent_loop/num_preempted/min"] == -1
    # slowest = argmax over samples whose stages are all valid: index 6 (4.0 + 0.3)
    assert step.metrics["agent_loop/slowest/generate_sequences"] == 4.0
    assert step.metrics["agent_loop/slowest/tool_calls"] == 0.3
    counted = drops(tel)
    assert counted["non_finite"] >= 3  # nan, inf (durations) + nan tool_calls
    assert sum(counted.values()) == 5 + 1 + 3
    assert any("generate_sequences" in r.getMessage() for r in caplog.records)


def test_mismatched_lengths_keep_histograms(make_tel):
    tel = make_tel(run="s")
    with tel.step(1) as step:
        tel.record_samples(generate_sequences=[1.0, 2.0, 3.0], tool_calls=[0.1, 0.2])
    assert histogram_count(tel, "generate_sequences") == 3
    assert histogram_count(tel, "tool_calls") == 2
    assert "agent_loop/slowest/generate_sequences" not in step.metrics
    assert step.metrics["agent_loop/generate_sequences/mean"] == 2.0
    assert drops(tel)["length_mismatch"] == 1


@pytest.mark.parametrize(
    "call",
    [
        {"generate_sequences": []},
        {"generate_sequences": np.array([])},
        {},
        {"generate_sequences": None},
        {"unknown_field": [1.0]},
        {"generate_sequences": "slow"},
        {"generate_sequences": object()},
        {"generate_sequences": np.array([["a", "b"]])},
    ],
)
def test_degenerate_calls_never_raise(make_tel, call):
    tel = make_tel(run="s")
    with tel.step(1) as step:
        tel.record_samples(**call)
    assert not any(k.startswith("agent_loop/slowest") for k in step.metrics)


def test_bad_records_shapes(make_tel):
    tel = make_tel(run="s")
    with tel.step(1) as step:
        tel.record_samples(42)
        tel.record_samples([{"generate_sequences": 1.0}, "junk", {"tool_calls": 0.5}])
        tel.record_samples([[{"generate_sequences": 2.0}], []])
    assert step.metrics["agent_loop/generate_sequences/max"] == 2.0
    assert histogram_count(tel, "generate_sequences") == 2


def test_a_million_samples(make_tel):
    tel = make_tel(run="s", max_sample_spans=3)
    rng = np.random.default_rng(0)
    values = rng.lognormal(0, 1, 1_000_000)
    values[::1000] = np.nan  # 1000 invalid among them
    with tel.step(1) as step, tel.phase("gen"):
        tel.record_samples(generate_sequences=values, response_length=rng.integers(1, 10, 10**6))
    assert histogram_count(tel, "generate_sequences") == 999_000
    assert step.metrics["agent_loop/generate_sequences/max"] == np.nanmax(values)
    assert drops(tel)["non_finite"] == 1000


def test_samples_outside_a_step_reach_histograms(make_tel):
    tel = make_tel(run="s")
    tel.record_samples(generate_sequences=[0.5, 0.7])
    assert histogram_count(tel, "generate_sequences") == 2
