"""Cost of one instrumented phase: rlotel vs verl's own timers vs an eager OTel span.

Everything is measured side by side in one run and printed as ratios (absolute times on
these machines are noisy). Goals: rlotel's training-thread cost ≤ 0.4x verl's
`marked_timer`; the whole cost of a published phase (training thread plus publisher, traces
file and /metrics on) ≤ 6x.

rlotel rows time what the training thread pays: steps of `--phases-per-step` phases
including step open and close (verl's formulas). The publisher's work (spans, series, the
traces file) runs on its own thread; it is drained untimed between steps so it does not
compete for the GIL with the timed loop, and its cost is shown in the last row.

    python benchmarks/phase_overhead.py [--phases N] [--phases-per-step K] [--rounds R]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from rich.console import Console
from rich.table import Table

import rlotel
from rlotel import nvtx

PHASE_NAMES = ["gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"]
BARE = "bare loop (no timer)"
VERL_CPU = "verl marked_timer (CPU, codetiming)"
OTEL = "OTel SDK eager span (BatchSpanProcessor)"
RLOTEL = "rlotel tel.phase (training thread)"
PUBLISHED = "rlotel incl. publishing spans+series+file"


class OtlpFileExporter(SpanExporter):
    """The SDK way to a traces file: encode each batch as an OTLP protobuf request."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("ab")

    def export(self, spans) -> SpanExportResult:
        self._file.write(encode_spans(spans).SerializeToString())
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._file.close()


def build_cases(tel: rlotel.Telemetry, tracer, per_step: int) -> dict[str, Callable[[int], int]]:
    """Each case runs `n` phases and returns the nanoseconds to count."""
    from verl.utils.profiler.nvtx_profile import marked_timer as verl_nvtx_timer
    from verl.utils.profiler.performance import marked_timer as verl_cpu_timer

    def timed(loop: Callable[[int], None]) -> Callable[[int], int]:
        def run(n: int) -> int:
            start = time.perf_counter_ns()
            loop(n)
            return time.perf_counter_ns() - start

        return run

    def bare(n: int) -> None:
        for i in range(n):
            PHASE_NAMES[i % 7]

    def verl_cpu(n: int) -> None:
        timing: dict[str, float] = {}
        for i in range(n):
            with verl_cpu_timer(PHASE_NAMES[i % 7], timing):
                pass

    def verl_nvtx(n: int) -> None:
        timing: dict[str, float] = {}
        for i in range(n):
            with verl_nvtx_timer(PHASE_NAMES[i % 7], timing):
                pass

    def otel_span(n: int) -> None:
        for i in range(n):
            with tracer.start_as_current_span(PHASE_NAMES[i % 7]):
                pass

    def in_steps(use_marked_timer: bool) -> Callable[[int], int]:
        def run(n: int) -> int:
            spent = 0
            for number in range(max(1, n // per_step)):
                timing: dict[str, float] = {}
                start = time.perf_counter_ns()
                with tel.step(number):
                    for i in range(per_step):
                        name = PHASE_NAMES[i % 7]
                        with (
                            rlotel.marked_timer(name, timing)
                            if use_marked_timer
                            else tel.phase(name)
                        ):
                            pass
                spent += time.perf_counter_ns() - start
                tel.flush(60)  # untimed: the publisher's share is the last row
            return spent

        return run

    def published(n: int) -> int:
        start = time.perf_counter_ns()
        for number in range(max(1, n // per_step)):
            with tel.step(number) as step:
                for i in range(per_step):
                    with tel.phase(PHASE_NAMES[i % 7]):
                        pass
                step.set_tokens(prompt=[100] * 8, response=[300] * 8)
        tel.flush(120)
        return time.perf_counter_ns() - start

    return {
        BARE: timed(bare),
        VERL_CPU: timed(verl_cpu),
        "verl marked_timer (NVTX variant)": timed(verl_nvtx),
        OTEL: timed(otel_span),
        RLOTEL: in_steps(False),
        "rlotel.marked_timer (training thread)": in_steps(True),
        PUBLISHED: published,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", type=int, default=20000, help="phases per measurement")
    parser.add_argument("--phases-per-step", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (best kept)")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="rlotel-bench-"))
    tel = rlotel.init(
        run="bench", prometheus_port=0, traces_file=workdir / "traces.jsonl", queue_size=1 << 16
    )
    provider = TracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(OtlpFileExporter(workdir / "otel.pb"), max_queue_size=1 << 17)
    )
    cases = build_cases(tel, provider.get_tracer("bench"), args.phases_per_step)
    best: dict[str, float] = {}
    for _ in range(args.rounds):  # interleaved, so machine drift hits every case alike
        for name, run in cases.items():
            us = run(args.phases) / args.phases / 1e3
            best[name] = min(best.get(name, us), us)
        provider.force_flush()
    tel.shutdown()
    provider.shutdown()

    base = best[BARE]
    net = {name: (value - base if name != BARE else value) for name, value in best.items()}
    table = Table(
        title=f"Per-phase cost: {args.phases} phases, {args.phases_per_step} per step, "
        f"best of {args.rounds} rounds"
    )
    for column in ("timer", "µs / phase", "× verl CPU timer", "× OTel eager span"):
        table.add_column(column, justify="left" if column == "timer" else "right")
    for name, value in net.items():
        ratios = (
            ("", "")
            if name == BARE
            else (
                f"{value / net[VERL_CPU]:.2f}",
                f"{value / net[OTEL]:.3f}",
            )
        )
        table.add_row(name, f"{value:.3f}", *ratios)
    console = Console(width=110)
    console.print(table)
    backend = nvtx.backend()
    console.print(
        f"NVTX backend: {type(backend).__name__ if backend else 'none (no tool attached)'}"
    )
    ratio = net[RLOTEL] / net[VERL_CPU]
    verdict = "met" if ratio <= 0.4 else "NOT met"
    console.print(f"goal: training-thread cost ≤ 0.4× verl marked_timer → {ratio:.2f}× ({verdict})")
    whole = net[PUBLISHED] / net[VERL_CPU]
    verdict = "met" if whole <= 6 else "NOT met"
    console.print(
        f"goal: whole cost of a published phase ≤ 6× marked_timer → {whole:.2f}× ({verdict})"
    )


if __name__ == "__main__":
    main()
