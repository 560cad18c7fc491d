"""Propagation cost on the driver: what rlotel adds to a verl worker-group call, and the
W3C traceparent codec (rlotel's vs OpenTelemetry's TraceContextTextMapPropagator).

Worker-group part: verl 0.9.1's real RayWorkerGroup with 2 CPU workers on a local Ray
cluster (loopback). The added code — the phase's carrier, once per call, and the context
slot on each worker's submit — is timed on its own with the group's real actor handles,
and the whole call (Ray's submit included) with the plugin on and off, interleaved.
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
from rlotel import propagation
from rlotel.integrations import verl as plugin
from rlotel.integrations import verl_workers

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
        handles = [SimpleNamespace(noop=worker.noop) for worker in group.workers]
        slot = verl_workers.RAY_CONTEXT_KWARG

        def added_code() -> None:
            carrier = verl_workers._carrier(tel)
            for handle in handles:
                method = verl_workers._ContextSubmitter(handle, carrier).noop
                kwargs: dict = {}
                kwargs[slot] = method._carrier

        def calls() -> None:
            ray.get([ref for _ in range(CALLS) for ref in group.noop()])

        with tel.step(1), tel.phase("update_actor"):
            added = per_call_us(added_code, 20000)
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
            f"  rlotel's added code (carrier + context slot on 2 submits): {added:6.2f}  (goal ≤ 5)"
        )
        print(
            f"  whole call with Ray's submit: plugin on {statistics.median(on):8.1f}, "
            f"off {statistics.median(off):8.1f}  (median of {ROUNDS} rounds; Ray's own noise)"
        )
    finally:
        ray.shutdown()


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
