"""`rlotel perfetto`: trace-event format rules, lanes, and torch.profiler captures on the
spans' clock (real captures from rlotel's own profiler)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import rlotel
from rlotel.cli import commands as cli
from rlotel.offline.perfetto import pack_lanes, write_perfetto

METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def check_trace_event_format(trace: dict) -> list[dict]:
    """The JSON object format's rules a viewer relies on; returns the events."""
    assert set(trace) >= {"traceEvents"} and trace["displayTimeUnit"] in ("ms", "ns")
    events = trace["traceEvents"]
    named: set[tuple[int, int]] = set()
    for event in events:
        assert isinstance(event["ph"], str) and isinstance(event["name"], str)
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
        if event["ph"] == "M":
            assert event["name"] in METADATA, event
            if event["name"].endswith("_name"):
                assert isinstance(event["args"]["name"], str)
                named.add((event["pid"], event["tid"]))
            continue
        assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0, event
        if event["ph"] == "X":
            assert isinstance(event["dur"], (int, float)) and event["dur"] >= 0, event
        assert isinstance(event.get("args", {}), dict)
    used = {(e["pid"], e["tid"]) for e in events if e["ph"] != "M"}
    assert used <= named, "every track has a thread_name"
    assert {(pid, 0) for pid, _ in used} <= named, "every process has a process_name"
    return events


def check_nesting_per_thread(events: list[dict]) -> None:
    """Complete slices on one thread either nest or do not overlap."""
    by_thread: dict[tuple[int, int], list[dict]] = {}
    for event in events:
        if event["ph"] == "X" and event.get("cat", "").startswith("rl."):
            by_thread.setdefault((event["pid"], event["tid"]), []).append(event)
    for slices in by_thread.values():
        stack: list[float] = []
        for event in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1] <= event["ts"]:
                stack.pop()
            assert not stack or event["ts"] + event["dur"] <= stack[-1] + 1e-3
            stack.append(event["ts"] + event["dur"])


def test_spans_become_named_tracks_and_slices(tmp_path) -> None:
    traces = tmp_path / "traces.jsonl"
    tel = rlotel.init(run="pf", prometheus_port=None, traces_file=traces)
    closed = []
    for number in (1, 2):
        with tel.step(number) as step:
            with tel.phase("gen"):
                sum(range(50_000))
                tel.record_samples(generate_sequences=[0.2, 0.4, 0.3], response_length=[3, 4, 5])
            with tel.phase("update_actor"):
                sum(range(50_000))
        closed.append(step)
    tel.shutdown()

    out = tmp_path / "trace.json.gz"
    assert cli.main(["perfetto", str(traces), "-o", str(out)]) == 0
    trace = json.loads(gzip.decompress(out.read_bytes()))
    events = check_trace_event_format(trace)
    check_nesting_per_thread(events)
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"phases", "samples"} <= names
    assert [e["args"]["name"] for e in events if e["name"] == "process_name"] == ["rlotel"]
    steps = sorted((e for e in events if e["name"] == "step"), key=lambda e: e["ts"])
    for slice_, step in zip(steps, closed, strict=True):
        assert slice_["ph"] == "X" and slice_["args"]["rl.step"] == step.number
        assert slice_["dur"] == pytest.approx(step.timing_raw["step"] * 1e6, abs=1)
        assert "rl.bottleneck" in slice_["args"] and len(slice_["args"]["span_id"]) == 16
    assert steps[0]["ts"] == 0  # µs from the earliest span
    samples = [e for e in events if e["name"] == "sample"]
    assert len(samples) == 6 and all("gen_ai.usage.output_tokens" in e["args"] for e in samples)


def test_concurrent_spans_get_their_own_lanes(tmp_path) -> None:
    from rlotel.offline.otlp_json import SpanRecord

    def span(name: str, start: int, end: int) -> SpanRecord:
        return SpanRecord("t" * 32, name, "", name, start, end, {}, {})

    lanes = pack_lanes([span("a", 0, 10), span("b", 2, 5), span("c", 4, 12), span("d", 10, 11)])
    assert [[s.name for s in lane] for lane in lanes] == [["a", "b", "d"], ["c"]]


def test_verl_log_has_no_timeline(tmp_path, capsys) -> None:
    log = tmp_path / "exp.jsonl"
    log.write_text(json.dumps({"step": 1, "data": {"timing_s/step": 1.0}}) + "\n")
    assert cli.main(["perfetto", str(log), "-o", str(tmp_path / "t.json")]) == 1
    assert "no spans found" in capsys.readouterr().err


@pytest.mark.slow
def test_profiler_capture_merged_on_the_spans_clock(tmp_path) -> None:
    """A real torch.profiler capture of step 2: its ops sit inside step 2's update_actor."""
    import torch

    run_dir = tmp_path / "run"
    tel = rlotel.init(
        run="pf",
        prometheus_port=None,
        traces_file=run_dir / "traces.jsonl",
        profile_steps=[2],
        profile_dir=run_dir / "profile",
    )
    weights = torch.randn(64, 64, requires_grad=True)
    for number in (1, 2, 3):
        with tel.step(number):
            with tel.phase("gen"):
                torch.randn(128, 64) @ weights.detach()
            with tel.phase("update_actor"):
                for _ in range(5):
                    loss = (torch.randn(128, 64) @ weights).pow(2).mean()
                    loss.backward()
    tel.shutdown()
    (capture,) = (run_dir / "profile").glob("*step2*.json.gz")

    result = write_perfetto(run_dir, tmp_path / "trace.json")
    assert result.captures_merged == 1 and result.captures_missing == 0
    events = check_trace_event_format(json.loads(result.path.read_text()))
    check_nesting_per_thread(events)
    (update,) = [
        e
        for e in events
        if e["name"] == "update_actor" and e.get("cat") == "rl.phase" and e["args"]["rl.step"] == 2
    ]
    ops = [e for e in events if e.get("cat") == "cpu_op" and e["pid"] == update["pid"]]
    assert ops, "the capture's operators are on the trainer's process"
    assert {e["tid"] for e in ops}.isdisjoint({update["tid"]})  # own track, same process
    inside = [
        e
        for e in ops
        if update["ts"] <= e["ts"] and e["ts"] + e["dur"] <= update["ts"] + update["dur"]
    ]
    names = {e["name"] for e in inside}
    assert {"aten::mm", "aten::pow"} <= names or {"aten::matmul", "aten::pow"} <= names, names
    # the record_function range of the same name lands on the span to within 0.2 ms
    (annotation,) = [
        e for e in events if e.get("cat") == "user_annotation" and e["name"] == "update_actor"
    ]
    assert annotation["ts"] == pytest.approx(update["ts"], abs=200)
    assert annotation["dur"] == pytest.approx(update["dur"], rel=0.05, abs=200)
    # no op of step 2's update lands in step 1 or 3
    steps = {e["args"]["rl.step"]: e for e in events if e["name"] == "step"}
    for op in (e for e in ops if e["name"] in ("aten::pow",)):
        assert steps[2]["ts"] <= op["ts"] <= steps[2]["ts"] + steps[2]["dur"]
    assert Path(capture).is_file()
