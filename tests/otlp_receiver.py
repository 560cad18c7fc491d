"""Throwaway OTLP receivers on loopback that decode requests with opentelemetry-proto."""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span


class Received:
    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metric_requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.headers: list[dict[str, str]] = []  # of each trace request, names lowercased
        self.lock = threading.Lock()

    def add(
        self,
        request: trace_service_pb2.ExportTraceServiceRequest,
        headers: dict[str, str] | None = None,
    ) -> None:
        with self.lock:
            self.requests.append(request)
            self.headers.append(headers or {})

    def add_metrics(self, request: metrics_service_pb2.ExportMetricsServiceRequest) -> None:
        with self.lock:
            self.metric_requests.append(request)

    def last_metrics(self) -> dict[str, object]:
        """Metrics of the newest export by name (protobuf Metric messages)."""
        with self.lock:
            if not self.metric_requests:
                return {}
            request = self.metric_requests[-1]
        return {
            metric.name: metric
            for resource_metrics in request.resource_metrics
            for scope_metrics in resource_metrics.scope_metrics
            for metric in scope_metrics.metrics
        }

    def spans(self) -> list[tuple[Span, dict]]:
        """Every span with its resource attributes."""
        with self.lock:
            requests = list(self.requests)
        out = []
        for request in requests:
            for resource_spans in request.resource_spans:
                resource = {
                    kv.key: kv.value.string_value for kv in resource_spans.resource.attributes
                }
                for scope_spans in resource_spans.scope_spans:
                    out.extend((span, resource) for span in scope_spans.spans)
        return out


class HttpReceiver(Received):
    def __init__(self) -> None:
        super().__init__()
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                encoding = self.headers.get("Content-Encoding")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path == "/v1/metrics":
                    metrics = metrics_service_pb2.ExportMetricsServiceRequest()
                    metrics.ParseFromString(body)
                    received.add_metrics(metrics)
                    reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                else:
                    request = trace_service_pb2.ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    received.add(request, {k.lower(): v for k, v in self.headers.items()})
                    reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class GrpcReceiver(Received):
    def __init__(self) -> None:
        super().__init__()
        received = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                metadata = {k.lower(): v for k, v in context.invocation_metadata()}
                received.add(request, metadata)
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):
                received.add_metrics(request)
                return metrics_service_pb2.ExportMetricsServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.stop(grace=None)


class FaultyReceiver(Received):
    """An OTLP/HTTP endpoint whose behaviour the test switches: ok, 503, slow, blackhole."""

    def __init__(self, mode: str = "ok", slow_s: float = 0.3) -> None:
        super().__init__()
        self.mode = mode
        self.slow_s = slow_s
        self.release = threading.Event()  # ends blackholed requests when the test is done
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                mode = received.mode
                if mode == "blackhole":
                    received.release.wait(30)
                    return
                if mode == "unavailable":
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if mode == "slow":
                    time.sleep(received.slow_s)
                if self.path == "/v1/traces":
                    request = trace_service_pb2.ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    received.add(request)
                elif self.path == "/v1/metrics":
                    metrics = metrics_service_pb2.ExportMetricsServiceRequest()
                    metrics.ParseFromString(body)
                    received.add_metrics(metrics)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
