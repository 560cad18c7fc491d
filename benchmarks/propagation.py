"""Propagation cost: what rlotel adds to a verl worker-group call on each side, and the
W3C traceparent codec (rlotel's vs OpenTelemetry's TraceContextTextMapPropagator).

Worker-group part: verl 0.9.1's real RayWorkerGroup with 2 CPU workers on a local Ray
cluster (loopback). Timed on their own: the driver's added code (the phase's carrier, once
per call, and the context slot on each worker's submit) and the worker's (its traced method
wrapper: read the carrier, open and close one span under the driver's phase; the span is
built and exported later, on the publisher). Then the whole call, Ray's submit and the
worker's wrapper included, with the plugin on and off, interleaved.
"""

from __future__ import annotations

import os
import statistics
import time
import timeit
from types import SimpleNamespace

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import ray
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    TraceFlags,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

import rlotel
from rlotel.integrations import verl as plugin
from rlotel.integrations import verl_workers
from rlotel.record import propagation

ROUNDS, CALLS, N = 7, 200, 20000


class NoopWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def noop(self) -> None:
        return None


def per_call_us(function, number: int) -> float:
    return min(timeit.repeat(function, number=number, repeat=ROUNDS)) / number * 1e6


def codec() -> None:
    trace_id, span_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7
    ids = (trace_id, span_id)
    carrier = propagation.traceparent(*ids)
    otel = TraceContextTextMapPropagator()
    context = set_span_in_context(
        NonRecordingSpan(SpanContext(trace_id, span_id, True, TraceFlags(TraceFlags.SAMPLED)))
    )

    def otel_inject() -> dict:
        out: dict = {}
        otel.inject(out, context)
        return out

    def otel_extract() -> tuple[int, int]:
        span = get_current_span(otel.extract(carrier)).get_span_context()
        return span.trace_id, span.span_id

    assert otel_inject() == carrier and otel_extract() == propagation.parse(carrier)
    print("traceparent codec, µs per call (min of rounds):")
    print(
        f"  format  rlotel {per_call_us(lambda: propagation.traceparent(*ids), N):6.2f}"
        f"   OTel propagator {per_call_us(otel_inject, 20000):6.2f}"
    )
    print(
        f"  parse   rlotel {per_call_us(lambda: propagation.parse(carrier), 20000):6.2f}"
        f"   OTel propagator {per_call_us(otel_extract, 20000):6.2f}"
    )


def worker_group(tel: rlotel.Telemetry) -> None:
    ray.init(address="local", num_cpus=32, include_dashboard=False, log_to_driver=False)
    try:
        pool = RayResourcePool([2], use_gpu=False)
        cls = RayClassWithInitArgs(cls=ray.remote(NoopWorker))
        group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls, device_name="cpu")
        ray.get(group.noop())
        # verl looks the actor method up on each handle either way; rlotel's code is what
        # runs around that lookup: the carrier once, a stand-in handle and the slot per worker.
        handles = [
            SimpleNamespace(noop=worker.noop, actor=worker._ray_actor_id)
            for worker in group.workers
        ]
        slot = verl_workers.RAY_CONTEXT_KWARG
        clock_done = verl_workers._clock_done  # each worker's clock exchange: done by now

        def added_code() -> None:
            carrier = verl_workers._carrier(tel)
            for handle in handles:
                handle.actor not in clock_done  # noqa: B015 — the per-submit clock check
                kwargs = {**{}, slot: carrier}
                handle.noop  # noqa: B018 — the per-worker lookup verl does either way
                kwargs.clear()

        def calls() -> None:
            ray.get([ref for _ in range(CALLS) for ref in group.noop()])

        with tel.step(1), tel.phase("update_actor"):
            added = per_call_us(added_code, 20000)
            carrier = verl_workers._carrier(tel)
        worker = worker_side(tel, carrier)
        with tel.step(2), tel.phase("update_actor"):
            on, off = [], []
            for _ in range(ROUNDS):  # interleaved: the same drift on both
                started = time.perf_counter()
                calls()
                on.append((time.perf_counter() - started) / CALLS * 1e6)
                plugin.uninstall()
                started = time.perf_counter()
                calls()
                off.append((time.perf_counter() - started) / CALLS * 1e6)
                plugin.install()
        print("worker-group call on 2 workers, inside a phase, µs per call:")
        print(
            f"  driver: rlotel's added code (carrier + context slot on 2 submits): {added:6.2f}"
            "  (goal ≤ 5)"
        )
        print(
            f"  worker: traced method with a carrier {worker['traced']:6.2f}, untraced "
            f"{worker['raw']:6.2f}: +{worker['traced'] - worker['raw']:.2f} per call and rank"
        )
        print(
            f"  whole call with Ray's submit: plugin on {statistics.median(on):8.1f}, "
            f"off {statistics.median(off):8.1f}  (median of {ROUNDS} rounds; Ray's own noise)"
        )
    finally:
        ray.shutdown()


def worker_side(tel: rlotel.Telemetry, carrier: dict[str, str]) -> dict[str, float]:
    """µs per call of a worker method with rlotel's wrapper (the call carries the driver's
    phase, as from a worker group) and without; run outside any local step, as a worker.
    Rounds of 500 calls, each followed by a flush, so no span is dropped for a full queue."""

    class Actor:
        def noop(self, _ray_trace_ctx: dict | None = None) -> None:  # Ray strips the slot
            return None

    traced = verl_workers._traced(Actor.noop, "noop")
    actor = Actor()

    def best(call) -> float:
        rounds = []
        for _ in range(ROUNDS):
            rounds.append(timeit.timeit(call, number=500) / 500 * 1e6)
            tel.flush(10)
        return min(rounds)

    return {
        "traced": best(lambda: traced(actor, _ray_trace_ctx=carrier)),
        "raw": best(lambda: Actor.noop(actor, _ray_trace_ctx=carrier)),
    }


def main() -> None:
    codec()
    plugin.install()
    tel = rlotel.init(run="bench", prometheus_port=None)
    try:
        worker_group(tel)
    finally:
        tel.shutdown()
        plugin.uninstall()


if __name__ == "__main__":
    main()
