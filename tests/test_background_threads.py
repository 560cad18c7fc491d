"""rlotel's background threads: the one queue-and-thread (coalescing by delay and batch,
waking on demand) and the `/metrics` accept loop, each sleeping when idle instead of polling
(each wake of a thread in a training process takes a core and the GIL from torch)."""

from __future__ import annotations

import threading
import time

from rlotel.base.drops import Drops
from rlotel.publish.publisher import Worker
from rlotel.sinks.metrics import endpoint
from tests.helpers import scrape

WAIT_S = 5.0  # bound on waiting for the worker's thread


def wakes(thread: threading.Thread) -> int:
    """The thread's voluntary context switches so far (Linux)."""
    with open(f"/proc/self/task/{thread.native_id}/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches")


class Recorder:
    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.arrived = threading.Event()

    def __call__(self, items: list[int]) -> None:
        self.batches.append(items)
        self.arrived.set()


def test_an_idle_worker_sleeps_until_its_tick_or_a_put() -> None:
    ticked = threading.Condition()
    ticks: list[float] = []

    def tick() -> None:
        with ticked:
            ticks.append(time.monotonic())
            ticked.notify_all()

    def until_ticks(count: int) -> int:
        """Blocks (no polling: no wake of its own to take the GIL) until `count` ticks."""
        with ticked:
            assert ticked.wait_for(lambda: len(ticks) >= count, timeout=4 * WAIT_S), ticks
            return len(ticks)

    worker = Worker("idle", Recorder(), Drops(), 8, tick=tick, tick_s=0.5)
    untimed = Worker("untimed", Recorder(), Drops(), 8, batch=4, delay_s=0.05)
    try:
        # after the first tick both threads are in their waits; the window measured is the
        # next two ticks (however late a loaded machine makes them): two wakes of the first
        # thread, nothing for the second
        first = until_ticks(1)
        before = wakes(worker._thread), wakes(untimed._thread)
        last = until_ticks(first + 2)
        after = wakes(worker._thread), wakes(untimed._thread)
    finally:
        worker.stop(time.monotonic() + WAIT_S)
        untimed.stop(time.monotonic() + WAIT_S)
    # a thread that polled every 50 ms (as it did) would have woken ~20 times
    assert after[0] - before[0] <= (last - first) + 1, (before, after, ticks)
    assert after[1] - before[1] <= 1, (before, after)


def test_small_puts_wait_out_the_delay_and_leave_together() -> None:
    handle = Recorder()
    worker = Worker("delayed", handle, Drops(), 64, batch=16, delay_s=0.3)
    try:
        began = time.monotonic()
        for item in range(3):
            worker.put(item)
        assert handle.arrived.wait(WAIT_S)
        waited = time.monotonic() - began
    finally:
        worker.stop(time.monotonic() + WAIT_S)
    assert handle.batches == [[0, 1, 2]]
    assert waited >= 0.3, waited  # not before the oldest item's delay


def test_a_full_batch_a_flush_or_no_delay_goes_at_once() -> None:
    full, flushed, undelayed = Recorder(), Recorder(), Recorder()
    workers = (
        Worker("full", full, Drops(), 64, batch=2, delay_s=3600),
        Worker("flushed", flushed, Drops(), 64, batch=16, delay_s=3600),
        Worker("undelayed", undelayed, Drops(), 64, batch=16),
    )
    try:
        workers[0].put(1)
        workers[0].put(2)
        assert full.arrived.wait(WAIT_S)
        workers[1].put(1)
        assert workers[1].flush(time.monotonic() + WAIT_S)
        workers[2].put(1)
        assert undelayed.arrived.wait(WAIT_S)
    finally:
        for worker in workers:
            worker.stop(time.monotonic() + WAIT_S)
    assert (full.batches, flushed.batches, undelayed.batches) == ([[1, 2]], [[1]], [[1]])


def test_stop_hands_over_what_is_queued() -> None:
    handle = Recorder()
    worker = Worker("stopped", handle, Drops(), 64, batch=16, delay_s=3600)
    worker.put(7)
    assert worker.stop(time.monotonic() + WAIT_S)
    assert handle.batches == [[7]]


def serve() -> tuple[endpoint.Server, threading.Thread]:
    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"up 1\n"]

    running = set(threading.enumerate())
    server = endpoint.serve(app, "127.0.0.1", 0)
    (loop,) = [t for t in set(threading.enumerate()) - running if t.name == "rlotel-metrics"]
    assert "up 1" in scrape(f"http://127.0.0.1:{server.server_port}/metrics")
    return server, loop


def test_an_idle_metrics_endpoint_sleeps() -> None:
    server, loop = serve()
    try:
        before = wakes(loop)
        time.sleep(1.05)
        after = wakes(loop)
    finally:
        endpoint.stop(server, time.monotonic() + WAIT_S)
    # it looks for a shutdown request every 0.5 s (it did every 50 ms: ~20 wakes)
    assert after - before <= 3, (before, after)


def test_the_metrics_endpoint_stops_without_waiting_for_its_poll(monkeypatch) -> None:
    monkeypatch.setattr(endpoint, "SHUTDOWN_POLL_S", 60.0)  # a stop that waited would not end
    server, loop = serve()
    endpoint.stop(server, time.monotonic() + WAIT_S)
    assert not loop.is_alive()
