"""10,000 sample spans in one step: rlotel's export CPU per span vs an eager OTel SDK span.

Users who trace every trajectory (agentic debugging) pay per sample span. rlotel builds
span data for the whole step in one pass and encodes it in batches; the SDK way starts
and ends a span per sample through a tracer and a BatchSpanProcessor. Both write a
traces file. Process CPU time (all threads) is measured side by side, best of rounds.
Goal: rlotel ≤ 1/6 of the eager span.

    python benchmarks/span_export.py [--samples N] [--rounds R]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import rlotel
from benchmarks.phase_overhead import OtlpFileExporter


def rlotel_cpu_s(samples: int, workdir: Path, rng: np.random.Generator) -> float:
    tel = rlotel.init(
        run="bench",
        prometheus_port=None,
        traces_file=workdir / f"rlotel-{time.monotonic_ns()}.jsonl",
        max_sample_spans=samples,
    )
    columns = {
        "generate_sequences": rng.lognormal(size=samples),
        "tool_calls": rng.lognormal(size=samples) / 10,
        "compute_score": rng.lognormal(size=samples) / 100,
        "prompt_length": rng.integers(10, 500, size=samples),
        "response_length": rng.integers(10, 4000, size=samples),
    }
    start = time.process_time()
    with tel.step(1):
        with tel.phase("gen"):
            spans = tel.record_samples(**columns)
    assert tel.flush(120)
    spent = time.process_time() - start
    assert len(spans) == samples
    tel.shutdown()
    return spent


def eager_cpu_s(samples: int, workdir: Path, rng: np.random.Generator) -> float:
    provider = TracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(
            OtlpFileExporter(workdir / f"otel-{time.monotonic_ns()}.pb"),
            max_queue_size=samples * 2,
        )
    )
    tracer = provider.get_tracer("bench")
    generate = rng.lognormal(size=samples).tolist()
    lengths = rng.integers(10, 4000, size=samples).tolist()
    start = time.process_time()
    with tracer.start_as_current_span("gen"):
        for index in range(samples):
            span = tracer.start_span(
                "sample",
                attributes={
                    "rl.sample.index": index,
                    "rl.sample.generate_sequences_s": generate[index],
                    "gen_ai.usage.output_tokens": lengths[index],
                },
            )
            span.end()
    provider.force_flush()
    spent = time.process_time() - start
    provider.shutdown()
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rlotel-spans-"))
    rng = np.random.default_rng(0)
    best = {"rlotel": float("inf"), "eager": float("inf")}
    for _ in range(args.rounds):  # interleaved: drift hits both alike
        best["rlotel"] = min(best["rlotel"], rlotel_cpu_s(args.samples, workdir, rng))
        best["eager"] = min(best["eager"], eager_cpu_s(args.samples, workdir, rng))
    per = {name: seconds / args.samples * 1e6 for name, seconds in best.items()}
    ratio = per["rlotel"] / per["eager"]
    print(f"{args.samples} sample spans in one step, best of {args.rounds} rounds (process CPU)")
    print(f"  rlotel (span data + batched OTLP/JSON)  {per['rlotel']:7.2f} µs/span")
    print(f"  OTel SDK eager span (BSP, OTLP proto)   {per['eager']:7.2f} µs/span")
    verdict = "met" if ratio <= 1 / 6 else "NOT met"
    print(f"goal: rlotel ≤ 1/6 of the eager span → {ratio:.3f} (1/{1 / ratio:.1f}, {verdict})")


if __name__ == "__main__":
    main()
