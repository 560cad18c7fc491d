"""10,000 sample spans in one step: rlotel's export CPU per span vs an eager OTel SDK span.

Users who trace every trajectory (agentic debugging) pay per sample span. rlotel builds
span data for the whole step in one pass on its publisher; each exporter's thread makes
`ReadableSpan`s of it for the OTLP exporter (or the SDK's encoder and protobuf's JSON
mapping, for the traces file). The SDK way starts and ends a span per sample through a
tracer and a BatchSpanProcessor, each with the attributes rlotel's span of that sample
carries (the same spans on both sides), into the same destination: a traces file (OTLP
protobuf), or the SDK's own OTLP/HTTP or OTLP/gRPC exporter. The OTLP receiver runs in a
process of its own (it decodes and counts every span there), so the process CPU time
measured here (all threads) is the sender's alone. Rounds are interleaved; medians.
Goal: over OTLP/HTTP, rlotel ≤ 1/2 of the eager span. Then one step of `--trajectories`
sample spans over OTLP/HTTP: the publisher thread's CPU for it (goal ≤ 300 ms) and the
exporter thread's.

    python -m benchmarks.span_export [--samples N] [--rounds R] [--trajectories N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

import rlotel
from benchmarks.phase_overhead import OtlpFileExporter
from rlotel.schema import attributes as attr

ENDPOINT_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
)


def receive() -> None:
    """The receiver process: OTLP/HTTP and OTLP/gRPC on loopback; prints both ports, then
    answers each `count` line on stdin with the spans received so far (HTTP, gRPC)."""
    import threading
    from concurrent import futures
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    counts = {"http": 0, "grpc": 0}
    lock = threading.Lock()

    def count(kind: str, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        spans = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with lock:
            counts[kind] += spans

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            count("http", self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()

    def export(body: bytes, context) -> bytes:
        count("grpc", body)
        return b""  # an empty ExportTraceServiceResponse

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        options=[("grpc.max_receive_message_length", 256 << 20)],
    )
    service = "opentelemetry.proto.collector.trace.v1.TraceService"
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                service, {"Export": grpc.unary_unary_rpc_method_handler(export)}
            )
        ]
    )
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(http.server_port, grpc_port, flush=True)
    for line in sys.stdin:
        if line.strip() == "count":
            with lock:
                print(counts["http"], counts["grpc"], flush=True)


class Receiver:
    """The receiver process, seen from here."""

    def __init__(self) -> None:
        root = Path(__file__).resolve().parent.parent
        self._process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.span_export", "--receiver"],
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        http_port, grpc_port = self._process.stdout.readline().split()
        self.http = f"http://127.0.0.1:{http_port}"
        self.grpc = f"http://127.0.0.1:{grpc_port}"

    def counts(self) -> tuple[int, int]:
        self._process.stdin.write("count\n")
        self._process.stdin.flush()
        http, grpc = self._process.stdout.readline().split()
        return int(http), int(grpc)

    def stop(self) -> None:
        self._process.stdin.close()
        self._process.wait(10)


@contextlib.contextmanager
def otlp_environment(endpoint: str | None, protocol: str | None) -> Iterator[None]:
    """rlotel's OTLP span export switched on (traces only) for the block, or off."""
    saved = {name: os.environ.pop(name, None) for name in ENDPOINT_VARIABLES}
    if endpoint is not None:
        os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = endpoint
        os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = protocol
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def columns(samples: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "generate_sequences": rng.lognormal(size=samples),
        "tool_calls": rng.lognormal(size=samples) / 10,
        "compute_score": rng.lognormal(size=samples) / 100,
        "prompt_length": rng.integers(10, 500, size=samples),
        "response_length": rng.integers(10, 4000, size=samples),
    }


def rlotel_cpu_s(samples: int, rng: np.random.Generator, **init) -> float:
    """One step of `samples` sample spans, recorded, published and exported."""
    tel = rlotel.init(run="bench", prometheus_port=None, max_sample_spans=samples, **init)
    data = columns(samples, rng)
    start = time.process_time()
    with tel.step(1):
        with tel.phase("gen"):
            spans = tel.record_samples(**data)
    assert tel.flush(120)
    spent = time.process_time() - start
    assert len(spans) == samples
    tel.shutdown()
    return spent


def thread_cpu_s(name: str) -> float:
    """CPU seconds (user + system) of this process's thread called `name` so far."""
    (thread,) = [thread for thread in threading.enumerate() if thread.name == name]
    fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1]
    user, system = fields.split()[11:13]
    return (int(user) + int(system)) / os.sysconf("SC_CLK_TCK")


def trajectories_cpu_s(samples: int) -> tuple[float, float]:
    """One step with `samples` trajectories, every one a sample span, over OTLP/HTTP to a
    receiver: the CPU of the publisher thread and of the OTLP exporter's thread."""
    receiver = Receiver()
    try:
        with otlp_environment(receiver.http, "http/protobuf"):
            tel = rlotel.init(run="bench", prometheus_port=None, max_sample_spans=samples)
            data = columns(samples, np.random.default_rng(1))
            publisher = thread_cpu_s("rlotel-publisher")
            exporter = thread_cpu_s("rlotel-export-otlp")
            with tel.step(1), tel.phase("gen"):
                tel.record_samples(**data)
            assert tel.flush(120)
            publisher = thread_cpu_s("rlotel-publisher") - publisher
            exporter = thread_cpu_s("rlotel-export-otlp") - exporter
            tel.shutdown()
    finally:
        receiver.stop()
    return publisher, exporter


def sample_span_attributes(samples: int) -> list[dict]:
    """The attributes of the sample spans rlotel exports for one step of `samples`
    trajectories (untimed): the eager SDK spans carry exactly these, so both sides send
    the same spans."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    tel = rlotel.init(
        run="bench", prometheus_port=None, max_sample_spans=samples, span_exporters=[memory]
    )
    with tel.step(1), tel.phase("gen"):
        tel.record_samples(**columns(samples, np.random.default_rng(0)))
    assert tel.flush(120)
    tel.shutdown()
    spans = [span for span in memory.get_finished_spans() if span.name == attr.SAMPLE_SPAN]
    assert len(spans) == samples
    return [dict(span.attributes) for span in spans]


def eager_cpu_s(attributes: list[dict], exporter: SpanExporter) -> float:
    """One eager SDK span per sample (started, ended, batched, exported), each carrying
    the attributes rlotel's sample span of that sample carries."""
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=len(attributes) * 2))
    tracer = provider.get_tracer("bench")
    start = time.process_time()
    with tracer.start_as_current_span("gen"):
        for sample in attributes:
            tracer.start_span(attr.SAMPLE_SPAN, attributes=sample).end()
    provider.force_flush()
    spent = time.process_time() - start
    provider.shutdown()
    return spent


def sdk_exporter(protocol: str, endpoint: str) -> SpanExporter:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint, insecure=True)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")


def cases(
    samples: int, workdir: Path, receiver: Receiver, rng: np.random.Generator
) -> dict[str, Callable[[], float]]:
    def file() -> Path:
        return workdir / f"{time.monotonic_ns()}.out"

    def rlotel_otlp(protocol: str, endpoint: str) -> Callable[[], float]:
        def run() -> float:
            with otlp_environment(endpoint, protocol):
                return rlotel_cpu_s(samples, rng)

        return run

    attributes = sample_span_attributes(samples)

    def eager(make: Callable[[], SpanExporter]) -> Callable[[], float]:
        return lambda: eager_cpu_s(attributes, make())

    def rlotel_file() -> float:
        with otlp_environment(None, None):
            return rlotel_cpu_s(samples, rng, traces_file=file())

    return {
        "file/rlotel": rlotel_file,
        "file/eager": eager(lambda: OtlpFileExporter(file())),
        "http/rlotel": rlotel_otlp("http/protobuf", receiver.http),
        "http/eager": eager(lambda: sdk_exporter("http/protobuf", receiver.http)),
        "grpc/rlotel": rlotel_otlp("grpc", receiver.grpc),
        "grpc/eager": eager(lambda: sdk_exporter("grpc", receiver.grpc)),
    }


DESTINATIONS = {
    "file": "traces file",
    "http": "OTLP/HTTP to a local receiver",
    "grpc": "OTLP/gRPC to a local receiver",
}
ROWS = {
    "rlotel": "rlotel (span data → ReadableSpan)",
    "eager": "OTel SDK eager span (BSP)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trajectories", type=int, default=16_000)
    parser.add_argument("--receiver", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receiver:
        receive()
        return
    workdir = Path(tempfile.mkdtemp(prefix="rlotel-spans-"))
    rng = np.random.default_rng(0)
    receiver = Receiver()
    try:
        runs = cases(args.samples, workdir, receiver, rng)
        spent: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):  # interleaved: drift hits every case alike
            for name, run in runs.items():
                spent[name].append(run())
        http, grpc = receiver.counts()
    finally:
        receiver.stop()
    per = {name: statistics.median(values) / args.samples * 1e6 for name, values in spent.items()}
    print(
        f"{args.samples} sample spans in one step, median of {args.rounds} interleaved rounds "
        "(process CPU, µs per span)"
    )
    # per round and protocol: rlotel once (samples + step + phase), eager once (+ phase)
    sent = args.rounds * (args.samples + 2 + args.samples + 1)
    print(f"  received: OTLP/HTTP {http} of {sent} spans sent, OTLP/gRPC {grpc} of {sent}")
    for destination, title in DESTINATIONS.items():
        print(f"{title}:")
        eager = per[f"{destination}/eager"]
        for row, label in ROWS.items():
            key = f"{destination}/{row}"
            print(f"  {label:40s} {per[key]:7.2f}   {per[key] / eager:6.3f} of eager")
    ratio = per["http/rlotel"] / per["http/eager"]
    verdict = "met" if ratio <= 1 / 2 else "NOT met"
    print(f"goal: over OTLP/HTTP rlotel ≤ 1/2 of the eager span → {ratio:.3f} ({verdict})")
    publisher, exporter = trajectories_cpu_s(args.trajectories)
    verdict = "met" if publisher <= 0.3 else "NOT met"
    print(
        f"one step of {args.trajectories} sample spans over OTLP/HTTP: publisher thread "
        f"{publisher * 1e3:.0f} ms CPU (goal ≤ 300 ms, {verdict}); exporter thread "
        f"{exporter * 1e3:.0f} ms"
    )


if __name__ == "__main__":
    main()
