"""Collector faults never reach training: counted drops, bounded shutdown, recovery."""

from __future__ import annotations

import logging
import socket
import time

import pytest

import rlotel
from tests.helpers import parse_exposition, scrape
from tests.otlp_receiver import FaultyReceiver

pytestmark = pytest.mark.slow  # real receivers that fail, time out or stall

PHASES = ("gen", "reward", "update_actor")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket is closed


def train(tel: rlotel.Telemetry, first: int, steps: int) -> list[float]:
    """Steps of real work; returns each step's wall time as the loop saw it."""
    durations = []
    for number in range(first, first + steps):
        started = time.perf_counter()
        with tel.step(number) as step:
            for phase in PHASES:
                with tel.phase(phase):
                    sum(range(30_000))
            step.set_tokens(prompt=[8, 8], response=[16, 4])
        durations.append(time.perf_counter() - started)
    return durations


def export_drops(tel: rlotel.Telemetry, signal: str | None = None) -> float:
    series = parse_exposition(scrape(tel.metrics_url))
    return sum(
        value
        for (name, labels), value in series.items()
        if name == "rlotel_telemetry_dropped_total"
        and ("reason", "export_failed") in labels
        and signal in (None, dict(labels)["signal"])
    )


def received_steps(receiver: FaultyReceiver) -> float | None:
    metric = receiver.last_metrics().get("rlotel_steps")
    return metric.sum.data_points[0].as_double if metric is not None else None


@pytest.fixture
def otlp_env(monkeypatch):
    def point_at(endpoint: str) -> None:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # seconds, per request
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "300")  # ms: pushes during the run

    return point_at


@pytest.mark.timing  # a step's and shutdown's wall time against fixed bounds (1 s, 5 s)
@pytest.mark.parametrize("mode", ["refused", "blackhole", "unavailable"])
def test_failing_collector_is_counted_and_never_blocks(mode, otlp_env):
    receiver = FaultyReceiver(mode)
    otlp_env(f"http://127.0.0.1:{closed_port()}" if mode == "refused" else receiver.endpoint)
    tel = rlotel.init(run=f"fault-{mode}", prometheus_port=0, shutdown_timeout_s=3.0)
    try:
        durations = train(tel, 1, 6)
        assert max(durations) < 1.0  # the loop never waits for the collector
        tel.flush(6)  # bounded even against a blackhole
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not (
            export_drops(tel, "spans") and export_drops(tel, "metrics")
        ):
            time.sleep(0.2)
        assert export_drops(tel, "spans") > 0 and export_drops(tel, "metrics") > 0
    finally:
        started = time.monotonic()
        tel.shutdown()
        elapsed = time.monotonic() - started
        receiver.stop()
    assert elapsed < 5.0, f"shutdown took {elapsed:.1f}s with a 3s budget"
    assert receiver.spans() == []


@pytest.mark.timing  # a step's wall time against a fixed bound (1 s)
def test_slow_collector_gets_everything(otlp_env):
    receiver = FaultyReceiver("slow", slow_s=0.3)
    otlp_env(receiver.endpoint)
    tel = rlotel.init(run="fault-slow", prometheus_port=0)
    try:
        durations = train(tel, 1, 5)
        assert max(durations) < 1.0
        assert tel.flush(10)
        roots = [s for s, _ in receiver.spans() if s.name == "step"]
        assert len(roots) == 5 and export_drops(tel) == 0
    finally:
        tel.shutdown()
        receiver.stop()


def test_data_after_recovery_arrives(otlp_env):
    receiver = FaultyReceiver("unavailable")
    otlp_env(receiver.endpoint)
    tel = rlotel.init(run="fault-recover", prometheus_port=0)
    try:
        train(tel, 1, 3)
        tel.flush(6)
        receiver.mode = "ok"  # the collector comes back
        train(tel, 4, 3)
        assert tel.flush(10)
        steps = sorted(
            attribute.value.int_value
            for span, _ in receiver.spans()
            if span.name == "step"
            for attribute in span.attributes
            if attribute.key == "rl.step"
        )
        assert {4, 5, 6} <= set(steps)
        deadline = time.monotonic() + 10  # the next metric push after recovery
        while time.monotonic() < deadline and received_steps(receiver) != 6.0:
            time.sleep(0.1)
        assert received_steps(receiver) == 6.0
    finally:
        tel.shutdown()
        receiver.stop()


def test_exporter_retries_do_not_flood_the_log(otlp_env, caplog):
    """One rate-limited rlotel line per reason, not the OTLP exporters' line per attempt;
    an exporter the application runs on its own thread still logs as usual."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    receiver = FaultyReceiver("unavailable")
    otlp_env(receiver.endpoint)
    caplog.set_level(logging.WARNING)
    tel = rlotel.init(run="fault-quiet", prometheus_port=0, shutdown_timeout_s=3.0)
    try:
        for first in range(1, 16, 5):  # several export batches, each failing
            train(tel, first, 5)
            tel.flush(3)
        assert export_drops(tel, "spans") >= 15 and export_drops(tel, "metrics") >= 1
        exporter_lines = [r for r in caplog.records if r.name.startswith("opentelemetry")]
        assert exporter_lines == []
        rlotel_lines = [r.getMessage() for r in caplog.records if r.name == "rlotel"]
        assert len(rlotel_lines) == 2, rlotel_lines  # spans and metrics, once each
        assert all("export_failed" in line and "otlp" in line.lower() for line in rlotel_lines)
        OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces", timeout=1).export([])
        assert any(r.name.startswith("opentelemetry.exporter") for r in caplog.records)
    finally:
        tel.shutdown()
        receiver.stop()
