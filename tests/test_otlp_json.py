"""The OTLP/JSON-lines reader: AnyValue decoding, rlotel's own files, tolerance."""

from __future__ import annotations

import json

import pytest

import rlotel
from rlotel.offline import otlp_json


def test_any_value_decoding() -> None:
    decode = otlp_json.decode_value
    assert decode({"intValue": "9007199254740993"}) == 9007199254740993  # 64-bit as string
    assert decode({"intValue": 7}) == 7
    assert decode({"doubleValue": 0.25}) == 0.25
    assert decode({"doubleValue": "NaN"}) != decode({"doubleValue": "NaN"})  # NaN stays NaN
    assert decode({"doubleValue": "Infinity"}) == float("inf")
    assert decode({"boolValue": True}) is True
    assert decode({"stringValue": "gen"}) == "gen"
    assert decode({"bytesValue": "AAE="}) == b"\x00\x01"
    assert decode({"arrayValue": {"values": [{"stringValue": "a"}, {"intValue": "2"}]}}) == [
        "a",
        2,
    ]
    nested = {"kvlistValue": {"values": [{"key": "k", "value": {"intValue": "3"}}]}}
    assert decode(nested) == {"k": 3}
    assert decode({}) is None


def _write_run(path, steps: int = 3) -> list:
    tel = rlotel.init(run="oj", prometheus_port=None, traces_file=path)
    closed = []
    for number in range(1, steps + 1):
        with tel.step(number) as step:
            with tel.phase("gen"):
                tel.record_samples(generate_sequences=[0.1, 0.3], response_length=[5, 9])
            with tel.phase("update_actor"):
                sum(range(5000))
        closed.append(step)
        tel.flush()  # one line (one export batch) per step
    with pytest.raises(ZeroDivisionError), tel.step(steps + 1), tel.phase("reward"):
        1 / 0  # noqa: B018 - the failing phase is exported with status ERROR
    tel.shutdown()
    return closed


def test_reads_rlotel_traces_file(tmp_path) -> None:
    path = tmp_path / "traces.jsonl"
    closed = _write_run(path)
    read = otlp_json.read_file(path)
    assert read.skipped_lines == 0
    by_id = {s.span_id: s for s in read.spans}
    roots = sorted(
        (s for s in read.spans if s.name == "step"), key=lambda s: s.attributes["rl.step"]
    )
    assert [r.attributes["rl.step"] for r in roots] == [1, 2, 3, 4]  # ints, not strings
    for root, step in zip(roots, closed, strict=False):
        assert len(root.trace_id) == 32 and len(root.span_id) == 16
        int(root.trace_id, 16), int(root.span_id, 16)  # hex
        assert root.parent_span_id == ""
        assert root.seconds == pytest.approx(step.timing_raw["step"], abs=1e-6)
        assert root.resource["service.name"] == "rlotel"
        assert root.resource["rl.run"] == "oj"
    for span in read.spans:
        if span.parent_span_id:
            parent = by_id[span.parent_span_id]
            assert parent.trace_id == span.trace_id
            assert parent.start_ns <= span.start_ns and span.end_ns <= parent.end_ns
    samples = [s for s in read.spans if s.name == "sample"]
    assert {s.attributes["gen_ai.usage.output_tokens"] for s in samples} == {5, 9}
    assert all(by_id[s.parent_span_id].name == "gen" for s in samples)
    failed = next(s for s in read.spans if s.name == "reward")
    assert failed.status_code == otlp_json.STATUS_ERROR


def test_truncated_and_corrupt_lines_are_counted_not_raised(tmp_path) -> None:
    path = tmp_path / "traces.jsonl"
    _write_run(path)
    lines = path.read_text().splitlines()
    whole = otlp_json.read_file(path)
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text(
        "\n".join(
            [
                lines[0],
                lines[1][: len(lines[1]) // 2],  # truncated mid-object
                "not json at all",
                json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "x"}]}]}]}),
                "[1, 2]",
                "",
                *lines[2:],
            ]
        )
        + "\n\xff\xfe garbage bytes"
    )
    read = otlp_json.read_file(damaged)
    assert read.skipped_lines == 5
    kept = {s.span_id for s in read.spans}
    expected = {
        s.span_id
        for s in whole.spans
        if s.span_id not in {t.span_id for t in otlp_json.read_lines([lines[1]]).spans}
    }
    assert kept == expected


def test_process_labels_name_role_and_rank() -> None:
    resource = {"service.name": "trainer", "rl.role": "actor", "rl.rank": 3}
    assert otlp_json.process_label(resource) == "trainer actor rank 3"
    assert otlp_json.process_label({}) == "unknown_service"
    assert otlp_json.process_key({**resource, "service.instance.id": "abc"}) == (
        "trainer actor rank 3",
        "abc",
    )
