"""OTLP spans encoded straight from span data are the SDK path's, field by field.

rlotel's OTLP export writes protobuf bytes itself (no `ReadableSpan`, no SDK encoder) and
sends them over the OTLP exporter package's own transport. Here the same spans go both
ways: the encoder's bytes next to the SDK encoder's, and a real run exporting over HTTP
and gRPC to one receiver directly and to another through the SDK's own exporter.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource

import rlotel
from rlotel.record.propagation import traceparent
from rlotel.sinks.traces import otlp
from rlotel.sinks.traces.otlp_proto import RequestEncoder, varint
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


def sdk_request(spans: list, resource: Resource) -> ExportTraceServiceRequest:
    expanded = [
        s for item in spans for s in (item.spans() if type(item) is SampleBlock else [item])
    ]
    return encode_spans([otlp.readable_span(span, resource) for span in expanded])


def test_the_encoder_writes_the_sdk_encoders_bytes():
    resource = Resource.create({"service.name": "direct", "rl.run": "r", "process.pid": 7})
    spans = every_kind_of_span()
    expected = sdk_request(spans, resource)
    payload = RequestEncoder(resource.attributes).request(spans)
    decoded = ExportTraceServiceRequest.FromString(payload)
    assert_same_requests(decoded, expected)
    assert payload == expected.SerializeToString()  # even the bytes


def test_varints_match_protobuf():
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

    for value in (0, 1, 127, 128, 300, 16383, 16384, 2**35, 2**63 - 1, -1, -(2**63)):
        assert b"\x18" + varint(value) == AnyValue(int_value=value).SerializeToString()


def assert_same_requests(got: ExportTraceServiceRequest, want: ExportTraceServiceRequest):
    assert len(got.resource_spans) == len(want.resource_spans) == 1
    got_rs, want_rs = got.resource_spans[0], want.resource_spans[0]
    assert got_rs.resource == want_rs.resource and got_rs.schema_url == want_rs.schema_url
    assert len(got_rs.scope_spans) == len(want_rs.scope_spans) == 1
    got_ss, want_ss = got_rs.scope_spans[0], want_rs.scope_spans[0]
    assert got_ss.scope == want_ss.scope and got_ss.schema_url == want_ss.schema_url
    assert_same_spans(list(got_ss.spans), list(want_ss.spans))


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
        assert got_span == want_span


def span_exporters(tel: rlotel.Telemetry) -> dict:
    """The span exporters of a telemetry by name (its span sink's export queues)."""
    from rlotel.sinks.traces.spans import SpanSink

    (sink,) = [sink for sink in tel._sink.sinks if isinstance(sink, SpanSink)]
    return {queue.name: queue._exporter for queue in sink._queues}


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
def test_a_real_receiver_gets_what_the_sdk_exporter_sends(protocol, monkeypatch):
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
    assert type(span_exporters(tel)["otlp"]) is otlp.OtlpExporter
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
    transport = span_exporters(tel)["otlp"]._transport
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
        assert transport._client._timeout == 5
    else:  # a channel setting: the receiver's runtime decompresses before the handler
        import grpc

        assert transport._exporter._compression is grpc.Compression.Gzip
        assert transport._exporter._timeout == 5


def test_an_exporter_without_the_transport_pieces_gets_readable_spans(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(otlp._HttpTransport, "create", classmethod(lambda cls: None))
    exporter = otlp.otlp_exporter("http/protobuf", {"service.name": "x"})
    assert type(exporter) is otlp.SdkSpanExporter
    exporter.shutdown()


def block_with_arrays(rng: np.random.Generator, count: int, remote: bool) -> SampleBlock:
    """A sample block as the span builder makes it (rows and the same columns as arrays):
    varints of every length, invalid (NaN) cells, infinities, ints in a column not known
    to be whole, span ids across the full 64 bits."""
    index = np.arange(count, dtype=np.int64) * 997
    seconds = rng.lognormal(size=count)
    seconds[rng.random(count) < 0.1] = np.nan
    seconds[count // 2] = np.inf
    tokens = np.floor(rng.lognormal(mean=8, sigma=4, size=count)).clip(0, 2**62)
    tokens[rng.random(count) < 0.1] = np.nan
    versions = rng.integers(0, 2**40, size=count)  # an int64 column, not whole
    arrays = (index, seconds, tokens, versions)
    rows = list(zip(*(array.tolist() for array in arrays), strict=True))
    return SampleBlock(
        TRACE,
        0x7777,
        remote,
        1_700_000_009_000_000_000,
        (1_700_000_000_000_000_000 + rng.integers(0, 10**9, size=count)).tolist(),
        rng.integers(1, 2**64 - 1, size=count, dtype=np.uint64).tolist(),
        {"rl.run": "r", "rl.step": 4},
        ("rl.sample.index", "rl.sample.generate_sequences_s", "gen_ai.usage.output_tokens", "v"),
        (True, False, True, False),
        rows,
        arrays,
    )


@pytest.mark.parametrize(("count", "remote"), [(500, False), (500, True), (1, False)])
def test_sample_blocks_encoded_from_arrays_are_the_rows_bytes(count, remote):
    """The column-wise path (numpy, a record layout per group of samples) writes exactly
    what the row path and the SDK encoder write, samples in their order."""
    resource = Resource.create({"service.name": "direct"})
    block = block_with_arrays(np.random.default_rng(3), count, remote)
    encoder = RequestEncoder(resource.attributes)
    from_arrays = encoder.request([block])
    from_rows = encoder.request([block._replace(arrays=None)])
    assert from_arrays == from_rows
    assert from_arrays == sdk_request([block], resource).SerializeToString()


def test_sample_blocks_with_cells_arrays_cannot_hold_take_the_row_path():
    from rlotel.sinks.traces import otlp_proto

    block = block_with_arrays(np.random.default_rng(4), 20, False)
    tokens = block.arrays[2].copy()
    tokens[5] = -3.0  # a negative whole number: a ten-byte varint, written by the row path
    rows = [(*row[:2], -3.0 if i == 5 else row[2], *row[3:]) for i, row in enumerate(block.rows)]
    odd = block._replace(arrays=(*block.arrays[:2], tokens, block.arrays[3]), rows=rows)
    assert otlp_proto._array_columns(odd) is None
    resource = Resource.create({"service.name": "direct"})
    payload = RequestEncoder(resource.attributes).request([odd])
    assert payload == sdk_request([odd], resource).SerializeToString()
