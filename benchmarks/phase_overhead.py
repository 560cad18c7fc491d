"""Cost of one instrumented phase: rlotel vs verl's own timers vs an eager OTel span.

Everything is measured side by side in one run and printed as ratios (absolute times on
these machines are noisy). Goal: rlotel's training-thread cost ≤ 1x verl's own
`marked_timer` (the code is plain: a normal `__init__`, the context variable reset with its
token). The whole cost of a published phase (training thread plus publisher, traces file and
/metrics on) is printed beside it; it is paid off the training thread.

The cases are interleaved finely: a round times one chunk of every case in turn (a step's
worth of `--phases-per-step` phases each, the order rotating), so a change in the
machine's speed hits every case alike; each case's figure is the median over all chunks.
Time is this process's CPU time (all threads): other jobs taking a core of the machine
stretch wall time, not this; the publisher's threads are counted in the last row.
Before each chunk the publisher and the SDK's span processor are drained untimed, so no
case competes for the GIL with another's leftovers and every chunk starts alike.
rlotel's training-thread rows time whole steps (step open and close, verl's formulas);
the publisher's work (spans, series, the traces file) is timed in the last row.

    python benchmarks/phase_overhead.py [--phases N] [--phases-per-step K] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
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
from rlotel.record import nvtx

PHASE_NAMES = ["gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"]
BARE = "bare loop (no timer)"
VERL_CPU = "verl marked_timer (CPU, codetiming)"
OTEL = "OTel SDK eager span (BatchSpanProcessor)"
RLOTEL = "rlotel tel.phase (training thread)"
PUBLISHED = "rlotel incl. publishing spans+series+file"
PUBLISHED_STEPS = 20  # steps per chunk of the published case (then one flush)


class OtlpFileExporter(SpanExporter):
    """The SDK way to a traces file: encode each batch as an OTLP protobuf request."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("ab")

    def export(self, spans) -> SpanExportResult:
        self._file.write(encode_spans(spans).SerializeToString())
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._file.close()


def build_cases(tel: rlotel.Telemetry, tracer, per_step: int) -> dict[str, Callable[[], int]]:
    """Each case times a chunk and returns its nanoseconds per `per_step` phases."""
    from verl.utils.profiler.nvtx_profile import marked_timer as verl_nvtx_timer
    from verl.utils.profiler.performance import marked_timer as verl_cpu_timer

    clock = time.process_time_ns  # this process's CPU, all threads (see the docstring)

    def bare() -> int:
        start = clock()
        for i in range(per_step):
            PHASE_NAMES[i % 7]
        return clock() - start

    def verl_cpu() -> int:
        timing: dict[str, float] = {}
        start = clock()
        for i in range(per_step):
            with verl_cpu_timer(PHASE_NAMES[i % 7], timing):
                pass
        return clock() - start

    def verl_nvtx() -> int:
        timing: dict[str, float] = {}
        start = clock()
        for i in range(per_step):
            with verl_nvtx_timer(PHASE_NAMES[i % 7], timing):
                pass
        return clock() - start

    def otel_span() -> int:
        start = clock()
        for i in range(per_step):
            with tracer.start_as_current_span(PHASE_NAMES[i % 7]):
                pass
        return clock() - start

    numbers = iter(range(1 << 62))

    def in_step(use_marked_timer: bool) -> Callable[[], int]:
        def run() -> int:
            timing: dict[str, float] = {}
            start = clock()
            with tel.step(next(numbers)):
                for i in range(per_step):
                    name = PHASE_NAMES[i % 7]
                    with rlotel.marked_timer(name, timing) if use_marked_timer else tel.phase(name):
                        pass
            return clock() - start

        return run

    def published() -> int:
        """`PUBLISHED_STEPS` steps, then everything published and written: a flush per
        step would write the traces file per step, which the 1 s export delay never does."""
        start = clock()
        for _ in range(PUBLISHED_STEPS):
            with tel.step(next(numbers)) as step:
                for i in range(per_step):
                    with tel.phase(PHASE_NAMES[i % 7]):
                        pass
                step.set_tokens(prompt=[100] * 8, response=[300] * 8)
        tel.flush(120)
        return (clock() - start) // PUBLISHED_STEPS

    return {
        BARE: bare,
        VERL_CPU: verl_cpu,
        "verl marked_timer (NVTX variant)": verl_nvtx,
        OTEL: otel_span,
        RLOTEL: in_step(False),
        "rlotel.marked_timer (training thread)": in_step(True),
        PUBLISHED: published,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", type=int, default=20000, help="phases per case and round")
    parser.add_argument("--phases-per-step", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of --phases each")
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
    names = list(cases)
    chunks: dict[str, list[int]] = {name: [] for name in names}
    for round_number in range(args.rounds * max(1, args.phases // args.phases_per_step)):
        shift = round_number % len(names)  # rotate, so no case always follows another
        for name in names[shift:] + names[:shift]:
            if name == PUBLISHED and round_number % PUBLISHED_STEPS:
                continue  # as many phases as the other cases, in chunks of 20 steps
            tel.flush(60)  # untimed: the last chunk's publishing and exports done
            provider.force_flush()
            chunks[name].append(cases[name]())
    tel.shutdown()
    provider.shutdown()
    median_us = {
        name: statistics.median(values) / args.phases_per_step / 1e3
        for name, values in chunks.items()
    }

    base = median_us[BARE]
    net = {name: (value - base if name != BARE else value) for name, value in median_us.items()}
    table = Table(
        title=f"Per-phase cost: {args.rounds} × {args.phases} phases, {args.phases_per_step} "
        "per step, median over interleaved chunks"
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
    verdict = "met" if ratio <= 1 else "NOT met"
    console.print(f"goal: training-thread cost ≤ 1× verl marked_timer → {ratio:.2f}× ({verdict})")
    whole = net[PUBLISHED] / net[VERL_CPU]
    console.print(f"whole cost of a published phase (off the training thread): {whole:.2f}×")


if __name__ == "__main__":
    main()
