"""RLOTEL_TRACES_DIR: a file per process, on disk soon after a phase ends; an unwritable
directory is a ConfigError at init, and in a worker a logged, counted drop."""

from __future__ import annotations

import os
import time

import pytest

import rlotel
from rlotel.integrations import verl_workers
from rlotel.offline import analyze
from tests.helpers import parse_exposition, scrape


@pytest.fixture(autouse=True)
def no_otlp(monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "RANK"):
        monkeypatch.delenv(name, raising=False)


def test_each_process_writes_its_own_file_within_seconds(tmp_path, monkeypatch):
    monkeypatch.setenv("RLOTEL_TRACES_DIR", str(tmp_path / "traces"))
    monkeypatch.setenv("RANK", "3")
    tel = rlotel.init(run="dir", prometheus_port=None, resource_attributes={"rl.role": "actor"})
    try:
        with tel.step(1), tel.phase("update_actor"):
            pass
        path = tmp_path / "traces" / f"actor-3-{os.getpid()}.jsonl"
        deadline = time.monotonic() + 5  # no flush: the exporter's own pace
        while not (path.exists() and path.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.05)
        spans = analyze.load_run(tmp_path / "traces").spans
        assert {span.name for span in spans} == {"step", "update_actor"}
        assert spans[0].resource["rl.role"] == "actor"
        assert spans[0].resource["process.pid"] == os.getpid()
    finally:
        tel.shutdown()


def test_an_unwritable_directory_is_a_config_error_at_init(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("RLOTEL_TRACES_DIR", str(blocker / "traces"))
    with pytest.raises(rlotel.ConfigError, match="RLOTEL_TRACES_DIR"):
        rlotel.init(run="dir", prometheus_port=None)


def test_a_worker_with_an_unwritable_directory_trains_and_counts_the_drop(
    tmp_path, monkeypatch, caplog
):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("RLOTEL_TRACES_DIR", str(blocker / "traces"))
    monkeypatch.setenv("RLOTEL_PROMETHEUS_SD_DIR", str(tmp_path / "sd"))
    tel = verl_workers.worker_telemetry()  # what a verl worker's first traced call does
    try:
        assert any("RLOTEL_TRACES_DIR" in r.getMessage() for r in caplog.records)
        with tel.phase("update_policy"):
            pass
        assert tel.flush(5) is True
        series = parse_exposition(scrape(tel.metrics_url))
        dropped = {
            dict(labels)["reason"]: value
            for (name, labels), value in series.items()
            if name == "rlotel_telemetry_dropped_total" and dict(labels)["signal"] == "spans"
        }
        assert dropped.get("export_failed", 0) >= 1
        assert list((tmp_path / "sd").glob("*.json"))  # still registered for scraping
    finally:
        tel.shutdown()
