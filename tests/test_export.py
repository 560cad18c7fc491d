"""OTLP export (HTTP and gRPC, switched on by OTEL_EXPORTER_OTLP_*) and the traces file."""

from __future__ import annotations

import json

import pytest

import rlotel
from tests.helpers import file_spans
from tests.otlp_receiver import GrpcReceiver, HttpReceiver

PHASES = ("gen", "reward", "old_log_prob", "adv", "update_actor", "update_weights")


def run_steps(tel: rlotel.Telemetry, steps: int) -> list[rlotel.Step]:
    done = []
    for number in range(steps):
        with tel.step(number) as step:
            for phase in PHASES:
                with tel.phase(phase):
                    sum(range(5000))
            step.set_tokens(prompt=[10, 12], response=[20, 5])
        done.append(step)
    with pytest.raises(ZeroDivisionError), tel.step(steps) as failing:
        with tel.phase("gen"):
            pass
        with tel.phase("update_actor"):
            _ = 1 / 0
    done.append(failing)
    return done


def check_tree(spans: list[dict], steps: list[rlotel.Step]) -> None:
    """`spans`: dicts with name, trace, id, parent, start, end, attrs, status."""
    roots = {s["attrs"]["rl.step"]: s for s in spans if s["name"] == "step"}
    assert sorted(roots) == [step.number for step in steps]
    for step in steps:
        root = roots[step.number]
        assert root["parent"] in ("", None)
        children = {s["name"]: s for s in spans if s["parent"] == root["id"]}
        expected = set(step.timing_raw) - {"step"}
        assert set(children) == expected
        for name, child in children.items():
            assert child["trace"] == root["trace"]
            assert abs((child["end"] - child["start"]) / 1e9 - step.timing_raw[name]) < 1e-6
        assert abs((root["end"] - root["start"]) / 1e9 - step.timing_raw["step"]) < 1e-6
    failing = roots[steps[-1].number]
    assert failing["status"] == 2  # STATUS_CODE_ERROR
    actor = next(s for s in spans if s["parent"] == failing["id"] and s["name"] == "update_actor")
    assert actor["status"] == 2


def proto_spans(received) -> list[dict]:
    spans = []
    for span, resource in received.spans():
        assert resource["service.name"] == "otlp-test" and resource["rl.run"] == "otlp"
        attrs = {}
        for kv in span.attributes:
            kind = kv.value.WhichOneof("value")
            attrs[kv.key] = getattr(kv.value, kind)
        spans.append(
            {
                "name": span.name,
                "trace": span.trace_id.hex(),
                "id": span.span_id.hex(),
                "parent": span.parent_span_id.hex(),
                "start": span.start_time_unix_nano,
                "end": span.end_time_unix_nano,
                "attrs": attrs,
                "status": span.status.code,
            }
        )
    return spans


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_otlp_receiver_gets_span_tree(protocol, monkeypatch):
    receiver = HttpReceiver() if protocol == "http/protobuf" else GrpcReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "otlp-test")
    if protocol == "grpc":
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    tel = rlotel.init(run="otlp", prometheus_port=None)
    try:
        steps = run_steps(tel, 3)
        assert tel.flush(10)
    finally:
        tel.shutdown()
        receiver.stop()
    spans = proto_spans(receiver)
    assert len(spans) == sum(len(s.timing_raw) for s in steps)
    check_tree(spans, steps)
    assert all(s["attrs"]["rl.step"] in range(4) for s in spans)


def test_traces_file_is_otlp_json_lines(tmp_path, monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    path = tmp_path / "runs" / "traces.jsonl"
    tel = rlotel.init(run="file", prometheus_port=None, traces_file=path)
    try:
        steps = run_steps(tel, 3)
        with tel.phase("testing"):
            pass
    finally:
        tel.shutdown()
    spans = file_spans(path, run="file")
    check_tree([s for s in spans if s["name"] != "testing"], steps)
    testing = [s for s in spans if s["name"] == "testing"]
    assert len(testing) == 1 and testing[0]["parent"] == ""


def test_traces_file_parses_with_protobuf_after_id_decoding(tmp_path):
    """The lines are valid ExportTraceServiceRequest JSON once ids are read as hex."""
    import base64

    from google.protobuf.json_format import ParseDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    path = tmp_path / "t.jsonl"
    tel = rlotel.init(run="file", prometheus_port=None, traces_file=path)
    with tel.step(1), tel.phase("gen"):
        pass
    tel.shutdown()

    def to_b64(node):
        if isinstance(node, dict):
            return {
                k: base64.b64encode(bytes.fromhex(v)).decode()
                if k in ("traceId", "spanId", "parentSpanId")
                else to_b64(v)
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [to_b64(v) for v in node]
        return node

    for line in path.read_text().splitlines():
        request = ParseDict(to_b64(json.loads(line)), ExportTraceServiceRequest())
        names = {s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans}
        assert names == {"step", "gen"}


@pytest.mark.timing  # training's and shutdown's wall time against fixed bounds (2 s, 3.5 s)
def test_shutdown_is_bounded_against_a_blackhole(monkeypatch):
    """A collector that accepts connections and never answers cannot hold training."""
    import socket
    import time

    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(16)
        port = blackhole.getsockname()[1]
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        tel = rlotel.init(run="blackhole", prometheus_port=None, shutdown_timeout_s=2.0)
        started = time.monotonic()
        run_steps(tel, 2)
        training = time.monotonic() - started
        started = time.monotonic()
        tel.shutdown()
        elapsed = time.monotonic() - started
    assert training < 2.0  # export happens off the training thread
    assert elapsed < 3.5, f"shutdown took {elapsed:.1f}s with a 2s budget"


@pytest.mark.slow
def test_exit_without_shutdown_still_flushes(tmp_path):
    """A script that forgets tel.shutdown() still gets its spans written at exit."""
    import subprocess
    import sys

    path = tmp_path / "t.jsonl"
    script = (
        "import rlotel\n"
        f"tel = rlotel.init(run='file', prometheus_port=None, traces_file={str(path)!r})\n"
        "for n in range(3):\n"
        "    with tel.step(n):\n"
        "        with tel.phase('gen'):\n"
        "            pass\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    steps = sorted(s["attrs"]["rl.step"] for s in file_spans(path) if s["name"] == "step")
    assert steps == [0, 1, 2]


def test_a_step_with_sample_spans_and_rank_seconds_keeps_both(make_tel, span_exporter):
    """A verl step records samples in `gen` and waits on worker ranks in `update_actor`:
    the sample blocks among its spans must not stop the rank spread being attached (they
    once made the whole step's spans a dropped `sink_error`)."""
    from rlotel.schema import attributes as attr
    from tests.helpers import finished_spans

    tel = make_tel(max_sample_spans=2)
    with tel.step(1):
        with tel.phase("gen"):
            tel.record_samples(generate_sequences=[2.0, 3.0, 5.0])
        with tel.phase("update_actor"):
            tel.record_rank_seconds({0: 1.0, 1: 3.0})
    spans = {s.name: s for s in finished_spans(tel, span_exporter)}
    assert set(spans) == {"step", "gen", "sample", "update_actor"}
    assert spans["update_actor"].attributes[attr.RANK_SPREAD] == pytest.approx(1.5)
    assert tel.drops.snapshot() == {}


def test_rank_spread_lands_on_its_phase_only_beside_sample_spans(tmp_path):
    """Phases of one name share their attributes until one gets its ranks' spread; a step
    with sample spans (a column block) and a spread exports both."""
    from rlotel.schema import attributes as attr

    path = tmp_path / "t.jsonl"
    tel = rlotel.init(run="file", prometheus_port=None, traces_file=path, max_sample_spans=2)
    with tel.step(1):
        with tel.phase("gen"):
            tel.record_samples(generate_sequences=[1.0, 2.0, 3.0])
        with tel.phase("update_actor"):
            tel.record_rank_seconds({0: 1.0, 1: 3.0})
        with tel.phase("update_actor"):
            pass
    tel.shutdown()
    spans = file_spans(path, run="file")
    actors = [s for s in spans if s["name"] == "update_actor"]
    assert len(actors) == 2
    assert sorted(attr.SLOWEST_RANK in s["attrs"] for s in actors) == [False, True]
    assert sum(s["name"] == "sample" for s in spans) == 2
