"""A scraper at 50 requests/s during a run: every scrape well-formed and consistent; stalled
clients neither block other scrapes nor hold their threads forever."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rlotel.sinks.metrics import endpoint
from tests.helpers import scrape

pytestmark = pytest.mark.slow  # scrape load from a subprocess


def scraper(url: str, stop: threading.Event, bodies: list[str], rate_hz: float = 50.0) -> None:
    """Bounded: stops on `stop`, after 600 requests or 30 s, whichever comes first."""
    deadline = time.monotonic() + 30
    interval = 1.0 / rate_hz
    while not stop.is_set() and len(bodies) < 600 and time.monotonic() < deadline:
        started = time.monotonic()
        with urllib.request.urlopen(url, timeout=5) as response:
            bodies.append(response.read().decode())
        stop.wait(max(0.0, interval - (time.monotonic() - started)))


def check_consistent(body: str, previous: dict) -> dict:
    counters: dict = {}
    for family in text_string_to_metric_families(body):  # raises on malformed text
        if family.type == "histogram":
            buckets: dict = {}
            counts: dict = {}
            for sample in family.samples:
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
                if sample.name.endswith("_bucket"):
                    buckets.setdefault(labels, []).append(
                        (float(sample.labels["le"]), sample.value)
                    )
                elif sample.name.endswith("_count"):
                    counts[labels] = sample.value
            for labels, series in buckets.items():
                values = [v for _, v in sorted(series)]
                assert values == sorted(values), f"{family.name} buckets not cumulative"
                assert values[-1] == counts[labels], f"{family.name} _count != +Inf bucket"
        if family.type == "counter":
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                counters[key] = sample.value
                assert sample.value >= previous.get(key, 0.0), f"{key} went backwards"
    return counters


SCRAPER = """
import pathlib, sys, time, urllib.request
url, out, stop = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
deadline, count = time.monotonic() + 30, 0
while not stop.exists() and count < 600 and time.monotonic() < deadline:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=5) as response:
        (out / f"{count:04d}.txt").write_bytes(response.read())
    count += 1
    time.sleep(max(0.0, 0.02 - (time.monotonic() - started)))
"""


MAX_S = 30.0


def test_scrapes_under_load_are_consistent(make_tel, tmp_path):
    """The scraper is another process, like Prometheus: 50 requests/s, bounded."""
    tel = make_tel(run="load")
    stop_file = tmp_path / "stop"
    scrapes = tmp_path / "scrapes"
    scrapes.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-c", SCRAPER, tel.metrics_url, str(scrapes), str(stop_file)]
    )
    rng = np.random.default_rng(0)
    work, weights = rng.normal(size=(384, 384)), rng.normal(size=(384, 384))
    try:
        started = time.monotonic()
        number = 0
        # 3 s of steps, longer until 50 scrapes landed when the machine is busy (bounded)
        while time.monotonic() - started < MAX_S and number < 50_000:
            if time.monotonic() - started > 3.0 and len(list(scrapes.iterdir())) >= 50:
                break
            number += 1
            with tel.step(number) as step:
                with tel.phase("gen"):
                    tel.record_samples(
                        generate_sequences=rng.lognormal(size=64),
                        response_length=rng.integers(1, 512, size=64),
                    )
                with tel.phase("update_actor"):
                    work = work @ weights  # ~ms of real math; it releases the GIL, as torch does
                    work /= np.abs(work).max()
                step.set_tokens(prompt=[4] * 64, response=[64] * 64)
            tel.log({"actor/pg_loss": float(rng.normal())}, step=number)
    finally:
        stop_file.touch()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    bodies = [path.read_text() for path in sorted(scrapes.iterdir())]
    assert len(bodies) >= 50, f"only {len(bodies)} scrapes in the run"
    previous: dict = {}
    for body in bodies:
        previous = check_consistent(body, previous)
    assert previous[("rlotel_steps_total", (("run", "load"),))] > 0


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_stalled_clients_neither_block_scrapes_nor_hold_threads(make_tel, monkeypatch):
    monkeypatch.setattr(endpoint.QuietHandler, "timeout", 2.0)  # 10 s in a run
    tel = make_tel(run="stall")
    address = ("127.0.0.1", urllib.parse.urlsplit(tel.metrics_url).port)
    tel.log({"x": 1.0}, step=1)
    assert tel.flush(10)
    baseline = threading.active_count()
    stalled = [socket.create_connection(address) for _ in range(20)]  # connect, send nothing
    try:
        started = time.monotonic()
        assert 'rlotel_train_metric{key="x",run="stall"} 1.0' in scrape(tel.metrics_url)
        assert time.monotonic() - started < 3  # not queued behind them (10 s timeouts)
        # Clients that never send a request lose their threads to the read timeout.
        assert wait_until(lambda: threading.active_count() <= baseline, 30)
    finally:
        for sock in stalled:
            sock.close()
    assert "rlotel_train_metric" in scrape(tel.metrics_url)
