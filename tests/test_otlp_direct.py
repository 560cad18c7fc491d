"""Span data leaves through the OTLP exporters' public API, and the traces file holds the
same messages: a real receiver over HTTP and gRPC gets the ids, parents, attributes,
links and events the span data has, and the file's line is that request in OTLP/JSON.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExportResult

import rlotel
from rlotel.offline.otlp_json import read_file
from rlotel.record.propagation import traceparent
from rlotel.sinks.traces import otlp
from rlotel.sinks.traces.jsonl import JsonLinesExporter, request_json
from rlotel.sinks.traces.span_data import EventData, LinkData, SampleBlock, SpanData
from tests.otlp_receiver import GrpcReceiver, HttpReceiver

TRACE = 0x0AF7651916CD43DD8448EB211C80319C


def failed() -> BaseException:
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError as error:
        return error


def every_kind_of_span() -> list[SpanData | SampleBlock]:
    """Each feature the encoder writes: attribute kinds (arrays, maps, None, numpy, int64
    limits, NaN), events, links, errors, remote parents, sample blocks with NaN cells."""
    attributes = {
        "rl.run": "r",
        "rl.step": 3,
        "zero": 0,
        "negative": -5,
        "int64.max": 2**63 - 1,
        "int64.min": -(2**63),
        "too.big": 2**64,  # the SDK's encoder refuses it: left out
        "ratio": 1.5,
        "nan": float("nan"),
        "inf": float("-inf"),
        "flag": True,
        "off": False,
        "empty": "",
        "unicode": "grüße ✓",
        "ints": [1, 2, 3],
        "strings": ("a", "b"),
        "doubles": [1.5, -2.5],
        "bools": [True, False],
        "nothing": [],
        "map": {"a": 1, "b": "x"},
        "none": None,
        "numpy.float": np.float64(2.5),
    }
    return [
        SpanData(
            TRACE,
            0x1111,
            0x9999,
            "step",
            1_700_000_000_000_000_000,
            1_700_000_001_000_000_000,
            attributes,
            [LinkData(0xABC, 0xDEF, {"rl.link.relation": "generated_in", "rl.step": 2})],
            failed(),
            True,
        ),
        SpanData(
            TRACE,
            0x2222,
            0x1111,
            "gen",
            1_700_000_000_100_000_000,
            1_700_000_000_900_000_000,
            {"rl.phase": "gen"},
            (),
            None,
            False,
            [EventData("gen_ai.evaluation.result", 1_700_000_000_800_000_000, {"score": 0.5})],
        ),
        SpanData(TRACE, 0x3333, 0, "", 5, 6, {}),  # a root without a name
        SampleBlock(
            TRACE,
            0x2222,
            False,
            1_700_000_000_900_000_000,
            [1_700_000_000_200_000_000 + i for i in range(4)],
            [0x100, 0x101, 0x102, 2**64 - 1],
            {"rl.run": "r", "gen_ai.operation.name": "invoke_agent"},
            (
                "rl.sample.index",
                "rl.sample.generate_sequences_s",
                "gen_ai.usage.output_tokens",
                "x",
            ),
            (True, False, True, False),
            [
                (0, 1.5, 300, 1),
                (1, float("nan"), 2**40, 2.0),
                (2, 0.0, float("nan"), -3),
                (3, 1e300, 127, float("nan")),
            ],
        ),
        SampleBlock(TRACE, 0x4444, True, 10, [9], [0x200], {}, ("i",), (True,), [(128,)]),
    ]


def sent_and_written(spans: list, tmp_path) -> tuple[ExportTraceServiceRequest, str]:
    """`spans` sent by the OTLP/HTTP exporter to a real receiver and written to a file."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    receiver = HttpReceiver()
    resource = {"service.name": "direct", "rl.run": "r", "process.pid": 7}
    sender = OTLPSpanExporter(f"{receiver.endpoint}/v1/traces")
    path = tmp_path / "spans.jsonl"
    writer = JsonLinesExporter(path)
    readable = otlp.readable_spans(spans, Resource(resource))
    try:
        assert sender.export(readable) is SpanExportResult.SUCCESS
        assert writer.export(readable) is SpanExportResult.SUCCESS
    finally:
        sender.shutdown()
        writer.shutdown()
        receiver.stop()
    (request,) = receiver.requests
    return request, path.read_text()


def test_the_receiver_gets_every_kind_of_span_and_the_file_holds_the_same_request(tmp_path):
    request, text = sent_and_written(every_kind_of_span(), tmp_path)
    assert text == request_json(request) + "\n"
    (resource_spans,) = request.resource_spans
    (scope_spans,) = resource_spans.scope_spans
    assert scope_spans.scope.name == "rlotel" and scope_spans.schema_url
    spans = {int.from_bytes(span.span_id, "big"): span for span in scope_spans.spans}
    assert len(spans) == 3 + 4 + 1
    step = spans[0x1111]
    assert step.trace_id == TRACE.to_bytes(16, "big")
    assert step.parent_span_id == (0x9999).to_bytes(8, "big")
    assert step.status.code == 2 and step.status.message.startswith("ZeroDivisionError")
    assert [event.name for event in step.events] == ["exception"]
    (link,) = step.links
    assert link.span_id == (0xDEF).to_bytes(8, "big")
    attributes = {kv.key: kv.value for kv in step.attributes}
    assert "too.big" not in attributes  # the SDK's encoder refuses it
    assert attributes["int64.min"].int_value == -(2**63)
    assert attributes["numpy.float"].double_value == 2.5
    assert [e.name for e in spans[0x2222].events] == ["gen_ai.evaluation.result"]
    sample = {kv.key for kv in spans[0x101].attributes}  # its NaN cell has no attribute
    assert "rl.sample.generate_sequences_s" not in sample and "x" in sample
    assert spans[2**64 - 1].parent_span_id == (0x2222).to_bytes(8, "big")

    read = read_file(tmp_path / "spans.jsonl")  # hex ids, as OTLP/JSON files have them
    assert read.skipped_lines == 0
    by_id = {record.span_id: record for record in read.spans}
    record = by_id["0000000000001111"]
    assert record.trace_id == f"{TRACE:032x}" and record.parent_span_id == "0000000000009999"
    assert record.links[0].trace_id == f"{0xABC:032x}" and record.status_code == 2
    assert record.attributes["ints"] == [1, 2, 3] and record.attributes["map"] == {"a": 1, "b": "x"}
    assert by_id["ffffffffffffffff"].attributes["gen_ai.usage.output_tokens"] == 127
    assert by_id["0000000000000200"].resource["service.name"] == "direct"


def assert_same_spans(got: list, want: list) -> None:
    """Span by span (by id), field by field, naming the first field that differs."""
    got_by_id = {span.span_id: span for span in got}
    want_by_id = {span.span_id: span for span in want}
    assert len(got_by_id) == len(got) and set(got_by_id) == set(want_by_id)
    for span_id, want_span in want_by_id.items():
        got_span = got_by_id[span_id]
        for field in want_span.DESCRIPTOR.fields:
            name = field.name
            assert getattr(got_span, name) == getattr(want_span, name), (
                f"span {want_span.name!r} {span_id.hex()}: field {name} differs"
            )


def received(receiver) -> tuple[list, list[ExportTraceServiceRequest]]:
    with receiver.lock:
        requests = list(receiver.requests)
    spans = [span for r in requests for ss in r.resource_spans[0].scope_spans for span in ss.spans]
    return spans, requests


def run_everything(tel: rlotel.Telemetry) -> None:
    """Steps with phases, tokens, a failure, sample spans with turns, tools, rewards and
    a link to their generating step; a loose phase; a phase under a remote parent."""
    for number in (1, 2):
        with tel.step(number) as step:
            with tel.phase("gen"):
                now = time.time_ns()
                tel.record_samples(
                    generate_sequences=[2.0, 0.1, 3.0],
                    tool_calls=[0.5, 0.0, 0.0],
                    compute_score=[0.1, np.nan, 0.2],
                    prompt_length=[10, 11, 12],
                    response_length=[20, 21, 22],
                    uid=["p0", "p1", "p2"],
                    reward=[0.25, 1.0, -0.75],
                    generated_step=[1, 1, 1],
                    turn_times_ns=[[(now - 900, now - 700)], [], [(now - 800, now - 200)]],
                    tool_times_ns=[[("calculator", now - 650, now - 550)], [], []],
                )
                tel.record_samples(generate_sequences=np.linspace(0.1, 1, 50))
            with tel.phase("update_actor"):
                pass
            step.set_tokens(prompt=[10, 12], response=[20, 5])
            step.set_mfu(actor=0.4)
    with pytest.raises(ValueError), tel.step(3), tel.phase("update_actor"):
        raise ValueError("bad batch")
    with tel.phase("testing"):
        pass
    with tel.phase("serve", context=traceparent(TRACE, 0x5555)):
        pass


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_real_receiver_gets_what_an_sdk_exporter_of_your_own_gets(protocol, monkeypatch):
    direct, sdk = (
        (HttpReceiver(), HttpReceiver())
        if protocol == "http/protobuf"
        else (GrpcReceiver(), GrpcReceiver())
    )
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", direct.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "direct-test")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
        sdk_exporter = OTLPSpanExporter(endpoint=sdk.endpoint, insecure=True)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        sdk_exporter = OTLPSpanExporter(endpoint=f"{sdk.endpoint}/v1/traces")
    tel = rlotel.init(
        run="direct", prometheus_port=None, max_sample_spans=40, span_exporters=[sdk_exporter]
    )
    try:
        run_everything(tel)
        assert tel.flush(10)
    finally:
        tel.shutdown()
        direct.stop()
        sdk.stop()
    got, got_requests = received(direct)
    want, want_requests = received(sdk)
    names = {span.name for span in want}
    assert {"step", "gen", "sample", "chat", "execute_tool calculator", "serve"} <= names
    assert any(span.events for span in want) and any(span.links for span in want)
    assert any(span.status.code == 2 for span in want)
    assert len(want) > 80
    ids = {span.span_id for span in want}
    remote = (0x5555).to_bytes(8, "big")
    assert all(not s.parent_span_id or s.parent_span_id in ids | {remote} for s in want)
    for got_request in got_requests:  # one resource and scope in every request
        request = ExportTraceServiceRequest()
        request.resource_spans.add().CopyFrom(want_requests[0].resource_spans[0])
        del request.resource_spans[0].scope_spans[0].spans[:]
        del got_request.resource_spans[0].scope_spans[0].spans[:]
        assert got_request == request
    assert_same_spans(got, want)


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_signal_endpoint_headers_and_compression_come_from_the_environment(protocol, monkeypatch):
    receiver = HttpReceiver() if protocol == "http/protobuf" else GrpcReceiver()
    endpoint = receiver.endpoint + ("/v1/traces" if protocol == "http/protobuf" else "")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # not this one
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-tenant=team-a,x-other=2")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "5")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "true")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    tel = rlotel.init(run="env", prometheus_port=None)
    try:
        with tel.step(1), tel.phase("gen"):
            pass
        assert tel.flush(10)
    finally:
        tel.shutdown()
        receiver.stop()
    spans, _ = received(receiver)
    assert sorted(span.name for span in spans) == ["gen", "step"]
    headers = receiver.headers[0]
    assert headers["x-tenant"] == "team-a" and headers["x-other"] == "2"
    if protocol == "http/protobuf":
        assert headers["content-encoding"] == "gzip"
        assert headers["content-type"] == "application/x-protobuf"
