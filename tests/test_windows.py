"""Every timer verl logs is a named window: one rlotel has no word for, and a nested `a/b`
one, are windows of their own name and covered time, never unaccounted — in `/metrics`, in
the verdict and in the report — while what verl logs under `timing_s/` that is no timer of
the step (the agent loop's per-sample reductions, validation, one-step-off's generation
beside the step) covers none of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlotel.derive.diagnose import StepFacts, diagnose, windows
from rlotel.offline.analyze import load_run
from rlotel.offline.report import report_data
from rlotel.schema import vocabulary as voc
from tests.helpers import parse_exposition, scrape

# A flat dict as verl logs it: an unknown timer, verl's next data plane's nested timers (one
# before the step's timer), the agent loop's reductions, validation after the step, the
# fully-async trainer's `timing_s/param_sync` timer as verl logs it.
LOGGED = {
    "timing_s/step": 10.0,
    "timing_s/gen": 2.0,
    "timing_s/my_timer": 4.5,
    "timing_s/dataplane/prefetch_gen": 1.5,
    "timing_s/dataplane/get_gen_batch": 0.7,
    "timing_s/dataplane/materialize_calls": 12.0,
    "timing_s/agent_loop/generate_sequences/max": 1.9,
    "timing_s/agent_loop/slowest/response_length": 32.0,
    "timing_s/testing": 30.0,
    "timing_s/timing_s/param_sync": 0.5,
    "timing_s/update_actor": 1.0,
}
COVERED = 2.0 + 4.5 + 1.5 + 0.5 + 1.0  # gen, my_timer, prefetch_gen, param_sync, update_actor
WINDOWS = {"gen", "my_timer", "dataplane/prefetch_gen", "param_sync", "update_actor"}


def test_the_vocabulary_reads_every_timer_and_only_timers():
    timing = voc.timing_from_metrics(LOGGED)
    assert set(timing) == WINDOWS | {"step", "testing", "dataplane/get_gen_batch"}
    assert set(voc.step_windows(timing)) == WINDOWS
    assert voc.covered_by_windows(timing) == COVERED


def test_one_step_off_generation_beside_the_step_and_its_wrapped_sync_cover_once():
    """verl 0.9.1's one-step-off merges the next batch's `generate_async` (run while the
    step before trained) into this step's dict, and times `update_weights` inside its own
    `sync_rollout_weights`."""
    timing = {
        "step": 10.0,
        "gen": 0.5,
        "generate_async": 9.0,
        "sync_rollout_weights": 3.0,
        "update_weights": 2.9,
        "update_actor": 5.0,
    }
    assert voc.step_windows(timing) == {"gen": 0.5, "sync_rollout_weights": 3.0, "update_actor": 5}
    assert windows(StepFacts(1, timing))["overhead-bound"] == pytest.approx(1.5)


def test_unknown_and_nested_timers_are_windows_in_metrics_not_unaccounted(make_tel):
    tel = make_tel(run="windows")
    tel.log(LOGGED, step=1)
    assert tel.flush(10)
    series = parse_exposition(scrape(tel.metrics_url))
    phases = {
        dict(labels)["phase"]: value
        for (name, labels), value in series.items()
        if name == "rlotel_step_phase_seconds"
    }
    assert phases == {name: LOGGED[f"timing_s/{name}"] for name in WINDOWS - {"param_sync"}} | {
        "param_sync": 0.5,
        "testing": 30.0,
        "dataplane/get_gen_batch": 0.7,
    }
    unaccounted = series["rlotel_step_unaccounted_seconds", frozenset({("run", "windows")})]
    assert unaccounted == pytest.approx(10.0 - COVERED)


def test_an_unknown_window_is_the_verdict_and_a_report_phase(tmp_path: Path):
    verdict = diagnose(StepFacts.from_metrics(1, voc.timing_from_metrics(LOGGED), LOGGED))
    assert verdict.label == "window-bound/my_timer"
    assert "my_timer" in verdict.next_read
    assert verdict.evidence["runner_up"] == "rollout-bound"  # gen 2.0, unaccounted 0.5

    log = tmp_path / "verl.jsonl"  # verl's FileLogger lines
    log.write_text("".join(json.dumps({"step": n, "data": LOGGED}) + "\n" for n in (1, 2)))
    data = report_data(load_run(log), tmp_path, "windows")
    assert set(data["phases"]) == WINDOWS
    assert data["share"]["unaccounted"] == pytest.approx((10.0 - COVERED) / 10.0)
    assert data["share"]["dataplane/prefetch_gen"] == pytest.approx(0.15)
