"""A scraper at 50 requests/s during a run: every scrape well-formed and consistent."""

from __future__ import annotations

import threading
import time
import urllib.request

import numpy as np
from prometheus_client.parser import text_string_to_metric_families


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


def test_scrapes_under_load_are_consistent(make_tel):
    tel = make_tel(run="load")
    bodies: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(target=scraper, args=(tel.metrics_url, stop, bodies))
    thread.start()
    rng = np.random.default_rng(0)
    try:
        started = time.monotonic()
        number = 0
        while time.monotonic() - started < 3.0 and number < 5000:
            number += 1
            with tel.step(number) as step:
                with tel.phase("gen"):
                    tel.record_samples(
                        generate_sequences=rng.lognormal(size=64),
                        response_length=rng.integers(1, 512, size=64),
                    )
                with tel.phase("update_actor"):
                    sum(range(200_000))  # ~ms of real work per step
                step.set_tokens(prompt=[4] * 64, response=[64] * 64)
            tel.log({"actor/pg_loss": float(rng.normal())}, step=number)
    finally:
        stop.set()
        thread.join(10)
    assert len(bodies) >= 50, f"only {len(bodies)} scrapes in the run"
    previous: dict = {}
    for body in bodies:
        previous = check_consistent(body, previous)
    assert previous[("rlotel_steps_total", (("run", "load"),))] > 0
