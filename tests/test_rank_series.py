"""Per-rank series: a worker process's `/metrics` holds the seconds of each method the driver
called on it, labelled with its role and rank, per driver step (one trace per step)."""

from __future__ import annotations

import time

import pytest

import rlotel
from rlotel.record.propagation import traceparent
from tests.helpers import finished_spans, parse_exposition, scrape

NAME = "rlotel_rank_phase_seconds"
STEP_1, STEP_2 = 0x1111, 0x2222  # the driver's trace ids of two steps


def call(tel: rlotel.Telemetry, method: str, trace_id: int, seconds: float) -> None:
    """The worker serving one call from a driver phase of trace `trace_id`."""
    with tel.phase(method, context=traceparent(trace_id, 0xABC)):
        time.sleep(seconds)


def rank_series(tel: rlotel.Telemetry) -> dict[tuple[str, ...], float]:
    assert tel.flush(10)
    found = {}
    for (name, labels), value in parse_exposition(scrape(tel.metrics_url)).items():
        if name == NAME:
            labels = dict(labels)
            found[labels["role"], labels["rank"], labels["phase"]] = value
            assert set(labels) == {"run", "role", "rank", "phase"}  # nothing per call
    return found


def call_seconds(spans: list, method: str, trace_id: int) -> list[float]:
    """The seconds of each exported span of `method` served under the driver's `trace_id`."""
    return [
        (span.end_time - span.start_time) / 1e9
        for span in spans
        if span.name == method and span.context.trace_id == trace_id
    ]


def test_a_workers_calls_become_its_seconds_per_step(make_tel, span_exporter):
    """Each step's series is the sum of that step's calls, as their spans measured them: no
    margin on how long a call took (a loaded machine stretches every sleep)."""
    tel = make_tel(run="w", resource_attributes={"rl.role": "actor", "rl.rank": 1})
    call(tel, "compute_log_prob", STEP_1, 0.05)
    call(tel, "update_actor", STEP_1, 0.10)
    call(tel, "update_actor", STEP_1, 0.05)  # called twice in one step: added up
    first = rank_series(tel)
    assert set(first) == {("actor", "1", "compute_log_prob"), ("actor", "1", "update_actor")}
    spans = finished_spans(tel, span_exporter)
    updates = call_seconds(spans, "update_actor", STEP_1)
    assert len(updates) == 2 and min(updates) >= 0.05
    assert first["actor", "1", "update_actor"] == pytest.approx(sum(updates), abs=1e-6)
    (log_prob,) = call_seconds(spans, "compute_log_prob", STEP_1)
    assert first["actor", "1", "compute_log_prob"] == pytest.approx(log_prob, abs=1e-6)

    call(tel, "update_actor", STEP_2, 0.02)  # the next step starts over
    second = rank_series(tel)
    (update,) = call_seconds(finished_spans(tel, span_exporter), "update_actor", STEP_2)
    assert second["actor", "1", "update_actor"] == pytest.approx(update, abs=1e-6)
    # not called in step 2 (yet): still the latest step that called it
    assert second["actor", "1", "compute_log_prob"] == first["actor", "1", "compute_log_prob"]


def test_only_worker_processes_write_them(make_tel):
    """The driver's own phases (and a process without a rank) never do: one owner."""
    driver = make_tel(run="d", resource_attributes={"rl.role": "trainer"})
    with driver.step(1), driver.phase("update_actor"):
        pass
    call(driver, "update_actor", STEP_1, 0.0)  # no rank: nothing per rank
    assert rank_series(driver) == {}
    samples = parse_exposition(scrape(driver.metrics_url))
    assert any(name == "rlotel_step_phase_seconds" for name, _ in samples)


def test_a_workers_calls_are_not_steps(make_tel):
    """A worker's calls are not steps: the step-breakdown series stay the driver's alone."""
    tel = make_tel(run="w", resource_attributes={"rl.role": "actor", "rl.rank": 0})
    call(tel, "update_actor", STEP_1, 0.0)
    assert rank_series(tel)
    samples = parse_exposition(scrape(tel.metrics_url))
    assert not any(name == "rlotel_step_phase_seconds" for name, _ in samples)
