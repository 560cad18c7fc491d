"""Progress across processes: the driver's `gen` waits on work other processes run (V1's
trajectories and reward calls, under the trainer's step span); their progress reaches the
driver's stall watch with each process's target heartbeat, so a slow rollout that keeps
completing is never stalled and one that stopped is, within stall_after_s and a few
heartbeats. Calls a worker serves one at a time are judged by the queue, not the last in
line."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

import rlotel
from rlotel.derive.stall import MAX_HEARD, MAX_REPORTED, StallWatch
from rlotel.integrations import ray as ray_integration
from rlotel.record.propagation import traceparent
from tests.helpers import parse_exposition, scrape

STALL_AFTER_S = 2.0  # over a heartbeat, a poll and a tick (the transport's own delay)


def stalled(tel: rlotel.Telemetry, phase: str) -> float | None:
    samples = parse_exposition(scrape(tel.metrics_url))
    return samples.get(("rlotel_phase_stalled", frozenset({("run", "test"), ("phase", phase)})))


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_work_under_a_remote_span_is_reported_while_it_moves_and_only_then(make_tel):
    tel = make_tel(stall_after_s=STALL_AFTER_S)
    watch: StallWatch = tel.stalls
    parent = 0x1234_5678_9ABC_DEF0
    carrier = traceparent(0xABCD, parent)
    key = f"{parent:016x}"
    with tel.phase("trajectory", context=carrier):
        wait_for(lambda: key in watch.reported, 3)  # its start is progress
        first = watch.reported[key]
        with tel.phase("generate"):
            pass
        wait_for(lambda: watch.reported[key] > first, 3)  # a child closed: progress
        moved = watch.reported[key]
        time.sleep(2.5)  # two ticks without progress: the entry stays as it was
        assert watch.reported[key] == moved
    wait_for(lambda: watch.reported[key] > moved, 3)  # the call's end is progress too


def test_a_process_reports_only_its_latest_remote_parents(make_tel):
    tel = make_tel(stall_after_s=STALL_AFTER_S)
    for parent in range(1, MAX_REPORTED + 11):
        with tel.phase("compute_score", context=traceparent(0xABCD, parent)):
            pass
    wait_for(lambda: f"{MAX_REPORTED + 10:016x}" in tel.stalls.reported, 3)
    reported = tel.stalls.reported
    assert len(reported) == MAX_REPORTED
    assert f"{1:016x}" not in reported  # the oldest went first


def test_heard_is_bounded_and_counts_what_it_drops(make_tel):
    tel = make_tel(stall_after_s=STALL_AFTER_S)
    watch: StallWatch = tel.stalls
    dropped = watch.heard(range(1, MAX_HEARD + 6))
    assert 0 <= dropped <= 5  # a tick may have emptied the buffer meanwhile
    assert watch.heard_dropped == dropped


class FakeKv:
    """Ray's GCS key-value store as `ray.experimental.internal_kv` exposes it (one process)."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def _internal_kv_put(self, key: str, value: str, overwrite: bool, namespace: str) -> None:
        self.data[key.encode()] = value.encode()

    def _internal_kv_list(self, prefix: str, namespace: str) -> list[bytes]:
        return [key for key in self.data if key.startswith(prefix.encode())]

    def _internal_kv_get(self, key: bytes, namespace: str) -> bytes | None:
        return self.data.get(key)

    def _internal_kv_del(self, key: Any, namespace: str) -> None:
        self.data.pop(key if isinstance(key, bytes) else key.encode(), None)

    def internal_kv_get_gcs_client(self) -> object:
        return object()  # no multi-get: one get per key


class FakeRay:
    class Context:
        def get_job_id(self) -> str:
            return "01000000"

    def get_runtime_context(self) -> Context:
        return self.Context()


@pytest.fixture
def kv(monkeypatch) -> FakeKv:
    store = FakeKv()
    monkeypatch.setattr(ray_integration, "_kv", lambda: store)
    monkeypatch.setattr(ray_integration, "_ray", lambda: FakeRay())
    return store


WORKER = """
import json, sys, time
import rlotel

seconds = float(sys.argv[1])
tel = rlotel.init(run="test", prometheus_port=None, stall_after_s=seconds)
print("ready", flush=True)
carrier = json.loads(sys.stdin.readline())  # the call that dispatched the work
with tel.phase("trajectory", context=carrier):  # under the trainer's step span
    until = time.monotonic() + 3 * seconds
    while time.monotonic() < until:
        with tel.phase("compute_score"):
            time.sleep(0.3)  # a slow reward, one call at a time: progress each 0.3 s
        print(json.dumps(tel.stalls.reported), flush=True)  # what its heartbeat sends
    print("blocked", flush=True)
    time.sleep(60)  # a reward that blocks
"""


@pytest.mark.slow  # a second Python process
@pytest.mark.timing  # heartbeats and polls every 0.2 s against stall_after_s, in wall time
def test_the_driver_hears_remote_progress_under_its_step_and_gen_stalls_when_it_stops(
    make_tel, kv, monkeypatch
):
    """The trainer's step dispatches a trajectory to another process (V1's prepare_step,
    before `gen`); it moves, then blocks. Its stall watch's report goes out with its
    heartbeat, the driver's target directory reads it and hands the spans that moved to
    the driver's stall watch: `gen` is never stalled while the worker moves, and is
    within stall_after_s and a few heartbeats once it stops."""
    tel = make_tel(stall_after_s=STALL_AFTER_S)
    directory = ray_integration.TargetDirectory(
        poll_s=3600, on_progress=lambda spans: ray_integration._heard(tel, spans)
    )
    sent: dict[str, int] = {}
    monkeypatch.setattr(ray_integration, "_progress", lambda: sent)  # the worker's, below
    heartbeat = ray_integration._Heartbeat("targets/01000000/node/1", "127.0.0.1:1", {})
    release = threading.Event()
    lines: list[str] = []
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(STALL_AFTER_S)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    threading.Thread(target=lambda: lines.extend(worker.stdout), daemon=True).start()

    def trainer() -> None:
        with tel.step(1):
            carrier = tel.current_context()  # dispatched from the step, not from gen
            worker.stdin.write(json.dumps(carrier) + "\n")
            worker.stdin.flush()
            with tel.phase("gen"):
                release.wait(60)

    training = threading.Thread(target=trainer)
    try:
        wait_for(lambda: "ready\n" in lines, 30)
        training.start()
        flags = []
        while "blocked\n" not in lines:  # the worker moves: the driver hears it, gen is fine
            reports = [line for line in lines if line.startswith("{")]
            sent = json.loads(reports[-1]) if reports else {}
            heartbeat.beat()
            directory.poll()
            flags.append(stalled(tel, "gen"))
            time.sleep(0.2)
        assert sent and flags and set(flags) <= {0.0, None}, flags
        blocked_at = time.monotonic()
        while stalled(tel, "gen") != 1:  # it stopped: no entry moves, gen stalls
            heartbeat.beat()
            directory.poll()
            assert time.monotonic() - blocked_at < STALL_AFTER_S + 3, "gen never stalled"
            time.sleep(0.2)
        assert "gen" in {verdict.evidence["phase"] for verdict in tel.stalled}
        entry = json.loads(kv.data[b"targets/01000000/node/1"])
        assert entry[ray_integration.PROGRESS_KEY] == sent  # what the worker reported
        assert ray_integration.PROGRESS_KEY not in json.dumps(directory.targets())  # not served
    finally:
        release.set()
        if training.is_alive():
            training.join()
        worker.kill()
        worker.wait()
        directory.close()


def test_a_malformed_or_oversized_progress_entry_costs_nothing_but_a_count(make_tel, kv):
    tel = make_tel(stall_after_s=STALL_AFTER_S)
    heard: list[int] = []
    directory = ray_integration.TargetDirectory(poll_s=3600, on_progress=heard.extend)
    try:
        entries = {f"{span:016x}": span for span in range(ray_integration.MAX_PROGRESS + 3)}
        entries["not-hex"] = 1
        values = [
            {"targets": ["a:1"], "labels": {}, "beat": 1, "progress": entries},
            {"targets": ["b:1"], "labels": {}, "beat": 1, "progress": ["not", "a", "dict"]},
            {"targets": ["c:1"], "labels": {}, "beat": 1, "progress": {"00000000000000ff": 1}},
        ]
        for index, value in enumerate(values):
            kv._internal_kv_put(f"targets/01000000/n/{index}", json.dumps(value), True, "rlotel")
        directory.poll()
        assert len(heard) == ray_integration.MAX_PROGRESS + 1
        assert directory.progress_dropped == 4  # three past the bound, one not a span id
        assert len(directory.targets()) == 3  # every process is still discovered
        heard.clear()
        directory.poll()
        assert heard == []  # nothing moved since
        assert tel.stalled == []
    finally:
        directory.close()


@pytest.mark.timing  # a call done every 0.6x stall_after_s in wall time: a late wake-up stalls it
def test_calls_served_one_at_a_time_are_not_stalled_while_the_queue_moves(make_tel):
    """A reward worker serves every trajectory's call at once, one runs at a time: the
    last in line waits far past stall_after_s while calls keep completing."""
    tel = make_tel(stall_after_s=STALL_AFTER_S)
    one_at_a_time = threading.Lock()

    def call(index: int) -> None:
        with tel.phase("compute_score", context=traceparent(0xABCD, index + 1)):
            with one_at_a_time:
                time.sleep(0.6 * STALL_AFTER_S)

    calls = [threading.Thread(target=call, args=(i,)) for i in range(4)]  # the last waits 3.6 s
    flags = []
    for thread in calls:
        thread.start()
    while any(thread.is_alive() for thread in calls):
        flags.append(stalled(tel, "compute_score"))
        time.sleep(0.2)
    for thread in calls:
        thread.join()
    assert set(flags) <= {0.0, None} and 0.0 in flags, flags
