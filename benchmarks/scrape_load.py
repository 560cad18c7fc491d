"""Step time with a scraper hitting /metrics at 50 requests/s vs no scraper, side by side,
and the CPU one scrape costs this process.

Goal: inflation ≤ 2% (ratio ≤ 1.02). Steps do a few ms of real torch work and record
samples, so the exposition is realistic (histograms, ~140 lines) and changes between
almost every two scrapes. The scraper is another process, as Prometheus is. As in the
demo, torch gets all cores but one; what a scrape costs the training thread is the GIL the
endpoint threads hold (the CPU per scrape printed last, and the hand-offs around it). 50/s
is 750 times Prometheus' default 15 s interval: a stress figure; the CPU per scrape times
the real scrape rate is the everyday one. Rounds rotate three runs: no scraper, no scraper
again (the A/A control: this machine's noise), scraper; single rounds vary by ±3% on a
quiet machine, hence 30 of them.

    python benchmarks/scrape_load.py [--steps N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import rlotel

# A lean scraper, as Prometheus (Go) is: raw HTTP/1.0 over a socket, so the scraper's own CPU
# on this 2-core box (urllib costs ~0.5 ms a request) does not pass for the endpoint's.
SCRAPER = """
import pathlib, socket, sys, time, urllib.parse
url, out, stop = urllib.parse.urlsplit(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
interval = float(sys.argv[4])
request = f"GET {url.path} HTTP/1.0\\r\\nHost: {url.netloc}\\r\\n\\r\\n".encode()
deadline, count = time.monotonic() + 30, 0
while not pathlib.Path(stop).exists() and count < 600 and time.monotonic() < deadline:
    started = time.monotonic()
    with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\\r\\n\\r\\n")
    assert head.startswith(b"HTTP/1.0 200") and body.startswith(b"# HELP"), head
    count += 1
    if count == 1:
        (out / "up").touch()
    time.sleep(max(0.0, interval - (time.monotonic() - started)))
(out / "count").write_text(str(count))
"""


def run_steps(tel: rlotel.Telemetry, steps: int, rng: np.random.Generator) -> float:
    work = torch.randn(384, 384)
    started = time.perf_counter()
    for number in range(steps):
        with tel.step(number) as step:
            with tel.phase("gen"):
                (work @ work).sum()
                tel.record_samples(generate_sequences=rng.lognormal(size=64))
            with tel.phase("update_actor"):
                (work @ work @ work).sum()
            step.set_tokens(prompt=[4] * 64, response=[64] * 64)
    elapsed = (time.perf_counter() - started) / steps
    tel.flush(30)
    return elapsed


def cpu_per_scrape(url: str, scratch: str) -> float:
    """This process's CPU per scrape in ms: 600 back-to-back scrapes with training idle,
    less the CPU the idle process spends over the same time."""
    started, cpu = time.perf_counter(), time.process_time()
    time.sleep(1.0)
    idle_rate = (time.process_time() - cpu) / (time.perf_counter() - started)
    out = Path(scratch, "burst")
    out.mkdir()
    started, cpu = time.perf_counter(), time.process_time()
    subprocess.run(
        [sys.executable, "-c", SCRAPER, url, str(out), str(out / "never"), "0"], check=True
    )
    spent = time.process_time() - cpu - idle_rate * (time.perf_counter() - started)
    return spent / int((out / "count").read_text()) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    tel = rlotel.init(run="scrape-bench", prometheus_port=0)
    rng = np.random.default_rng(0)
    run_steps(tel, 50, rng)
    conditions = ("quiet", "quiet again", "scraped")  # "quiet again": the A/A control
    ratios: dict[str, list[float]] = {"quiet again": [], "scraped": []}
    scrapes, step_s = 0, []
    with tempfile.TemporaryDirectory() as scratch:
        for index in range(args.rounds):
            times = {}
            for condition in conditions[index % 3 :] + conditions[: index % 3]:
                if condition != "scraped":
                    times[condition] = run_steps(tel, args.steps, rng)
                    continue
                out, stop = Path(scratch, str(index)), Path(scratch, f"stop{index}")
                out.mkdir()
                process = subprocess.Popen(
                    [sys.executable, "-c", SCRAPER, tel.metrics_url, str(out), str(stop), "0.02"]
                )
                deadline = time.monotonic() + 30
                while not any(out.iterdir()):  # until the scraper is up and scraping
                    if process.poll() is not None or time.monotonic() > deadline:
                        sys.exit("the scraper did not start")
                    time.sleep(0.01)
                times[condition] = run_steps(tel, args.steps, rng)
                stop.touch()
                process.wait(30)
                scrapes += int((out / "count").read_text())
            for condition, values in ratios.items():
                values.append(times[condition] / times["quiet"])
            step_s.append(times["quiet"])
        per_scrape_ms = cpu_per_scrape(tel.metrics_url, scratch)
    tel.shutdown()
    console = Console(width=100)
    control, ratio = (statistics.median(ratios[c]) for c in ("quiet again", "scraped"))
    console.print(
        f"step time with a 50/s scraper / without: median {ratio:.3f} over {args.rounds} "
        f"rotated rounds of {args.steps} steps of ~{statistics.median(step_s) * 1e3:.1f} ms "
        f"({scrapes} scrapes; rounds: {', '.join(f'{r:.3f}' for r in ratios['scraped'])}); "
        f"goal ≤ 1.02 → {'met' if ratio <= 1.02 else 'NOT met'}"
    )
    console.print(
        f"A/A control, no scraper / no scraper: median {control:.3f} (this machine's noise)"
    )
    console.print(f"CPU per scrape (text, training idle): {per_scrape_ms:.2f} ms")


if __name__ == "__main__":
    main()
