"""Span shape, NVTX mirroring, failure handling and verl timer semantics of the ledger."""

from __future__ import annotations

import time

import pytest
from opentelemetry.trace import StatusCode

import rlotel
from tests.helpers import finished_spans

PHASES = ("gen", "reward", "old_log_prob", "adv", "update_actor", "update_weights")


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_step_span_tree_matches_timing_raw(tel, span_exporter):
    with tel.step(7) as step:
        for name in PHASES:
            with tel.phase(name):
                busy(0.001)
    spans = finished_spans(tel, span_exporter)
    by_name = {span.name: span for span in spans}
    assert set(by_name) == {"step", *PHASES}
    root = by_name["step"]
    assert root.parent is None
    assert root.attributes["rl.step"] == 7 and isinstance(root.attributes["rl.step"], int)
    for name in PHASES:
        span = by_name[name]
        assert span.parent.span_id == root.context.span_id
        assert span.context.trace_id == root.context.trace_id
        assert span.attributes["rl.phase"] == name
        assert abs((span.end_time - span.start_time) / 1e9 - step.timing_raw[name]) < 1e-6
    assert abs((root.end_time - root.start_time) / 1e9 - step.timing_raw["step"]) < 1e-6
    assert set(step.timing_raw) == {"step", *PHASES}
    # Phases ran in order inside the step window.
    starts = [by_name[name].start_time for name in PHASES]
    assert starts == sorted(starts) and starts[0] >= root.start_time
    assert by_name[PHASES[-1]].end_time <= root.end_time


def test_nested_phases_nest_spans_and_sum_repeats(tel, span_exporter):
    with tel.step(1) as step:
        with tel.phase("update_actor"):
            for _ in range(3):
                with tel.phase("mini_batch"):
                    busy(0.0005)
        with tel.phase("update_actor"):
            busy(0.0005)
    spans = finished_spans(tel, span_exporter)
    actors = [s for s in spans if s.name == "update_actor"]
    minis = [s for s in spans if s.name == "mini_batch"]
    assert len(actors) == 2 and len(minis) == 3
    assert {m.parent.span_id for m in minis} == {actors[0].context.span_id} or {
        m.parent.span_id for m in minis
    } == {actors[1].context.span_id}
    total = sum((s.end_time - s.start_time) for s in minis) / 1e9
    assert step.timing_raw["mini_batch"] == pytest.approx(total, abs=3e-6)
    total_actor = sum((s.end_time - s.start_time) for s in actors) / 1e9
    assert step.timing_raw["update_actor"] == pytest.approx(total_actor, abs=2e-6)


def test_nvtx_names_equal_span_names(tel, span_exporter, recording_nvtx):
    with tel.step(3):
        with tel.phase("gen", color="red"):
            with tel.phase("generate_sequences"):
                pass
        with tel.phase("update_actor", color="blue"):
            pass
    timing: dict[str, float] = {}
    with rlotel.marked_timer("testing", timing, color="green"):
        pass
    spans = finished_spans(tel, span_exporter)
    assert sorted(recording_nvtx.pushed) == sorted(span.name for span in spans)
    assert recording_nvtx.depth == 0
    assert ("push", "gen", "red") in recording_nvtx.events
    assert ("push", "testing", "green") in recording_nvtx.events
    assert recording_nvtx.events[0] == ("push", "step", None)


def test_exception_in_phase_is_recorded_and_propagates_unchanged(
    tel, span_exporter, recording_nvtx
):
    error = RuntimeError("CUDA out of memory (simulated)")
    with pytest.raises(RuntimeError) as caught, tel.step(4) as step:
        with tel.phase("gen"):
            pass
        with tel.phase("update_actor"):
            busy(0.001)
            raise error
    assert caught.value is error
    assert recording_nvtx.depth == 0
    assert step.timing_raw["update_actor"] >= 0.001
    spans = {span.name: span for span in finished_spans(tel, span_exporter)}
    for name in ("update_actor", "step"):
        span = spans[name]
        assert span.status.status_code is StatusCode.ERROR
        assert "CUDA out of memory" in span.status.description
        event = span.events[0]
        assert event.name == "exception"
        assert event.attributes["exception.type"] == "RuntimeError"
    assert spans["gen"].status.status_code is StatusCode.UNSET


def test_marked_timer_sums_like_verl(tel, span_exporter):
    timing_raw: dict[str, float] = {}
    with tel.step(2) as step:
        for _ in range(3):
            with rlotel.marked_timer("reward", timing_raw):
                busy(0.0003)
        with rlotel.marked_timer("adv", timing_raw, color="cyan", domain="d", category="c"):
            pass
    spans = [s for s in finished_spans(tel, span_exporter) if s.name == "reward"]
    assert len(spans) == 3
    measured = sum((s.end_time - s.start_time) for s in spans) / 1e9
    assert timing_raw["reward"] == pytest.approx(measured, abs=3e-6)
    assert timing_raw["reward"] == pytest.approx(step.timing_raw["reward"], abs=1e-9)
    assert set(timing_raw) == {"reward", "adv"}


def test_marked_timer_without_telemetry_still_sums():
    assert rlotel.current() is None
    timing: dict[str, float] = {"gen": 1.0}
    with rlotel.marked_timer("gen", timing):
        busy(0.0002)
    assert timing["gen"] > 1.0002


def test_marked_timer_failure_keeps_timing(tel):
    timing: dict[str, float] = {}
    with pytest.raises(KeyError), rlotel.marked_timer("reward", timing):
        raise KeyError("x")
    assert timing["reward"] > 0


def test_phase_outside_step_is_its_own_root(tel, span_exporter):
    with tel.step(5):
        with tel.phase("gen"):
            pass
    with tel.phase("testing"):
        with tel.phase("gen"):
            pass
    spans = finished_spans(tel, span_exporter)
    testing = next(s for s in spans if s.name == "testing")
    assert testing.parent is None
    step_root = next(s for s in spans if s.name == "step")
    assert testing.context.trace_id != step_root.context.trace_id
    assert testing.attributes["rl.step"] == 5  # the last global step it follows
    inner = [s for s in spans if s.name == "gen" and s.parent.span_id == testing.context.span_id]
    assert len(inner) == 1


def test_exception_in_step_body_marks_step_error(tel, span_exporter):
    with pytest.raises(ValueError), tel.step(9):
        with tel.phase("gen"):
            pass
        raise ValueError("bad batch")
    spans = {s.name: s for s in finished_spans(tel, span_exporter)}
    assert spans["step"].status.status_code is StatusCode.ERROR
    assert spans["gen"].status.status_code is StatusCode.UNSET


def test_without_tokens_throughput_is_absent(tel):
    with tel.step(1) as step, tel.phase("gen"):
        pass
    assert "perf/time_per_step" in step.metrics
    assert "perf/throughput" not in step.metrics
    assert "perf/total_num_tokens" not in step.metrics
    assert not any(key.startswith("timing_per_token_ms/") for key in step.metrics)


def test_sdk_disabled_keeps_verl_dict(monkeypatch, span_exporter):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    tel = rlotel.init(run="off", prometheus_port=0, span_exporters=[span_exporter])
    try:
        assert tel.metrics_url is None
        with tel.step(1) as step:
            with tel.phase("gen"):
                pass
            step.set_tokens(prompt=[3, 4], response=[5, 6])
        assert step.metrics["perf/total_num_tokens"] == 18
        assert "timing_s/gen" in step.metrics
        tel.flush(5)
        assert span_exporter.get_finished_spans() == ()
    finally:
        tel.shutdown()


def test_service_name_and_run_on_resource(make_tel, span_exporter, monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "ppo-trainer")
    tel = make_tel(run="exp42")
    with tel.step(0):
        pass
    span = finished_spans(tel, span_exporter)[0]
    assert span.resource.attributes["service.name"] == "ppo-trainer"
    assert span.resource.attributes["rl.run"] == "exp42"


def test_nvtx_package_backend_pushes_and_pops():
    """The `nvtx` package path works (ranges go nowhere without Nsight, but must not fail)."""
    import nvtx as nvtx_package

    from rlotel.record.nvtx import _NvtxPackage, detect_backend

    backend = _NvtxPackage(nvtx_package)
    for name, color in (("gen", "red"), ("gen", "red"), ("update_actor", None)):
        backend.push(name, color)
        backend.pop()
    dummy = getattr(nvtx_package._lib, "DummyDomain", ())
    if isinstance(nvtx_package.get_domain(), dummy):
        assert detect_backend() is None  # no tool attached: skip NVTX calls entirely
    else:
        assert isinstance(detect_backend(), _NvtxPackage)
