"""Shared fixtures: a telemetry with an in-memory span exporter, a recording NVTX backend, a
real Prometheus. Helper functions and classes live in tests/helpers.py: import them from there."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

# Every Ray cluster a test starts listens on loopback only. Ray reads this switch once, when
# it is imported, so it is set before any test module imports ray.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import rlotel
from rlotel.record import nvtx
from tests.fuzzing import RUN
from tests.helpers import RecordingNvtx


@pytest.fixture
def recording_nvtx() -> Iterator[RecordingNvtx]:
    recorder = RecordingNvtx()
    previous = nvtx.set_backend(recorder)
    yield recorder
    nvtx.set_backend(previous)


@pytest.fixture
def span_exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def make_tel(span_exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch):
    """Factory for telemetry on an ephemeral port, shut down after the test."""
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    made: list[rlotel.Telemetry] = []

    def make(**kwargs) -> rlotel.Telemetry:
        kwargs.setdefault("run", "test")
        kwargs.setdefault("prometheus_port", 0)
        kwargs.setdefault("span_exporters", [span_exporter])
        tel = rlotel.init(**kwargs)
        made.append(tel)
        return tel

    yield make
    for tel in made:
        tel.shutdown()


@pytest.fixture
def tel(make_tel) -> rlotel.Telemetry:
    return make_tel()


@pytest.fixture
def fuzz_tel(make_tel) -> rlotel.Telemetry:
    """One telemetry per test function, reused by every example; the key cap out of reach."""
    return make_tel(
        run=RUN, max_metric_keys=100_000, max_log_keys=100_000, max_val_log_keys=100_000
    )


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OTLP exporter or SDK switch from the environment."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


@pytest.fixture
def prometheus_for(tmp_path):
    """Start a real Prometheus scraping a metrics URL; stopped by PID after the test."""
    from tests.promserver import Prometheus

    started: list[Prometheus] = []

    def start(metrics_url: str, **kwargs) -> Prometheus:
        target = urllib.parse.urlsplit(metrics_url).netloc
        server = Prometheus(tmp_path, [target], **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Path:
    """`rlotel demo`, run once for real with a profiled step: runs/rep/ holds its report.html,
    summary.json and traces; its stdout is in runs/rep.stdout (tests/test_report.py,
    tests/test_occupancy.py read it)."""
    runs = tmp_path_factory.mktemp("runs")
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlotel.cli",
            "demo",
            "--steps",
            "4",
            "--port",
            "0",
            "--runs-dir",
            str(runs),
            "--run",
            "rep",
            "--profile-steps",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert process.returncode == 0, process.stderr
    (runs / "rep.stdout").write_text(process.stdout)
    report = runs / "rep" / "report.html"
    assert f"report: {report}" in process.stdout
    assert "metrics: http" not in process.stdout  # not served after training: not printed
    return runs / "rep"
