"""A 10,000-step run's report: render time, HTML size, time to interactive in Chromium.

The run is real: rlotel writes the traces file (seven phases, samples every step, tokens,
MFU), then `rlotel.offline.report.write_report` renders it. The page is opened from `file://` in
headless Chromium (every host resolving to nowhere) twice: a fresh browser (cold, no code
cache) and the same page again (warm); "interactive" is the page's own ready mark
(`window.rlotelReadyMs`, every chart drawn), measured from navigation start. The cold
load's main-thread CPU (DevTools' ThreadTime) is printed beside it, and the render's process
CPU beside the render: on shared cores the wall times also count whatever else runs, the CPU
times are the work's own.
Goals (issue 34): render ≤ 5 s, HTML ≤ 4 MB with plotly.js, interactive ≤ 1 s, cold and warm.

    python benchmarks/report_size.py [--steps N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.chromium, the driver
sys.path.insert(0, str(Path(__file__).resolve().parent))  # synthetic_run, also under -m

from synthetic_run import write_traces

from rlotel.offline.report import write_report
from tests.chromium import Chromium, file_url

RENDER_BUDGET_S = 5.0
SIZE_BUDGET_BYTES = 4_000_000
INTERACTIVE_BUDGET_S = 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=32, help="per-sample timings a step")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        traces = Path(tmp) / "traces.jsonl"
        started = time.perf_counter()
        write_traces(traces, args.steps, args.samples)
        print(
            f"run: {args.steps} steps, {args.samples} samples a step, traces "
            f"{traces.stat().st_size / 1e6:.1f} MB, written in {time.perf_counter() - started:.1f}s"
        )
        started, started_cpu = time.perf_counter(), time.process_time()
        result = write_report(traces, Path(tmp) / "report.html")
        render_s = time.perf_counter() - started
        render_cpu_s = time.process_time() - started_cpu
        print(f"report: {result.steps} steps read, {result.skipped_lines} lines skipped")
        with Chromium() as browser:
            ready = "document.body.dataset.ready === '1'"
            browser.call("Performance.enable", session=True)
            cold = browser.open(file_url(result.path), ready)
            cold_s = browser.evaluate("window.rlotelReadyMs") / 1000
            metrics = browser.call("Performance.getMetrics", session=True)["metrics"]
            cold_cpu_s = next(m["value"] for m in metrics if m["name"] == "ThreadTime")
            warm = browser.open(file_url(result.path), ready)
            warm_s = browser.evaluate("window.rlotelReadyMs") / 1000
            points = browser.evaluate("document.querySelectorAll('.js-plotly-plot').length")
        clean = not (cold.console_errors or cold.requests or warm.console_errors)
    checks = [
        ("render", render_s, RENDER_BUDGET_S, "s"),
        ("HTML size", result.size_bytes / 1e6, SIZE_BUDGET_BYTES / 1e6, "MB"),
        ("interactive, cold browser", cold_s, INTERACTIVE_BUDGET_S, "s"),
        ("interactive, warm", warm_s, INTERACTIVE_BUDGET_S, "s"),
    ]
    for name, value, budget, unit in checks:
        verdict = "ok" if value <= budget else "OVER"
        print(f"{name:27s} {value:7.2f} {unit}  (goal ≤ {budget:g} {unit}) {verdict}")
    print(f"{'render CPU':27s} {render_cpu_s:7.2f} s  (the render's own work, no goal)")
    print(f"{'main-thread CPU, cold':27s} {cold_cpu_s:7.2f} s  (the page's own work, no goal)")
    print(
        f"charts drawn: {points}; console errors or network requests: {'none' if clean else 'SOME'}"
    )
    return 0 if clean and all(value <= budget for _, value, budget, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
