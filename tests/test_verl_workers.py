"""verl 0.9.1's real RayWorkerGroup on a local Ray cluster: one trace per step across
processes with no carrier in user code, a file per process, straggler ranks, faults."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import torch
from ray.util import remove_placement_group
from verl import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
)
from verl.utils.profiler import marked_timer

import rlotel
from rlotel.cli import commands as cli
from rlotel.integrations import verl as plugin
from rlotel.integrations import verl_workers
from rlotel.offline import analyze
from rlotel.offline.otlp_json import STATUS_ERROR, SpanRecord
from rlotel.record.propagation import run_of
from rlotel.schema.data_moves import MOVING
from tests.helpers import parse_exposition, scrape

pytestmark = pytest.mark.slow  # a Ray cluster and verl worker processes

SLOW_RANK = 1


class TimedWorker(Worker):
    """A verl worker whose methods time themselves with verl's own `marked_timer`."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_policy(self, seconds: float) -> int:
        timing_raw: dict[str, float] = {}
        with marked_timer("forward_backward", timing_raw):
            time.sleep(seconds * (8 if self.rank == SLOW_RANK else 1))
        with marked_timer("optimizer_step", timing_raw):
            sum(range(10000))
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def crash(self) -> None:
        if self.rank == SLOW_RANK:
            os._exit(1)
        time.sleep(0.2)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def hang(self) -> None:
        time.sleep(3600)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def hang_one(self) -> None:
        time.sleep(3600 if self.rank == SLOW_RANK else 0.05)

    def pid(self) -> int:
        return os.getpid()


class MovingWorker(Worker):
    """A verl worker whose method does almost nothing with a large batch: a call of it is
    moving data. A rank of a gloo process group, as verl's FSDP workers are after
    `init_model`, so its calls report their own seconds."""

    def __init__(self) -> None:
        super().__init__()
        torch.distributed.init_process_group("gloo")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return data

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def time_pickling(self) -> None:
        """From now on this rank's `DataProto.__getstate__` is timed around rlotel's hook:
        the test's own timing of the rank pickling its results."""
        self.pickling = {"__getstate__": 0.0}
        self.timing = timed_around_rlotel(self.pickling)
        self.timing.__enter__()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pickled_s(self) -> float:
        return self.pickling["__getstate__"]


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster for the module, its workers running rlotel (RLOTEL_ENABLE in
    the job's environment). Each test's worker group gets its own files through verl's
    `worker_env` (merged over the job's); the tests that crash or hang workers kill them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        plugin.install()
        ray.init(
            address="local",
            num_cpus=32,
            include_dashboard=False,
            log_to_driver=False,
            # no RLOTEL_RUN: the workers hear the driver's run (baggage)
            runtime_env={"env_vars": {"RLOTEL_ENABLE": "1"}},
        )
        try:
            yield
        finally:
            ray.shutdown()
            plugin.uninstall()


@pytest.fixture
def cluster(ray_cluster, tmp_path, monkeypatch):
    """This test's traces directory (the driver's and its workers'); after the test, the
    driver's telemetry shut down and its worker groups' actors and CPUs given back (each
    group holds a placement group of 20 logical CPUs: two would not fit at once)."""
    traces = tmp_path / "traces"
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RLOTEL_TRACES_DIR", str(traces))
    try:
        yield traces
    finally:
        tel = rlotel.current()
        if tel is not None:
            tel.shutdown()
        while _GROUPS:
            group, pool = _GROUPS.pop()
            for worker in group.workers:
                ray.kill(worker)
            for pg in pool.pgs or []:
                remove_placement_group(pg)


_GROUPS: list[tuple[RayWorkerGroup, RayResourcePool]] = []  # made in the current test


def worker_group(files: Path | None = None, cls: type = TimedWorker) -> RayWorkerGroup:
    """Two TimedWorker ranks; with `files` (a test's `cluster`), they write their traces to
    `files` and their discovery files to `files.parent / "sd"`, and go when the test ends."""
    env = None
    if files is not None:
        env = {
            "RLOTEL_TRACES_DIR": str(files),
            "RLOTEL_PROMETHEUS_SD_DIR": str(files.parent / "sd"),
        }
    pool = RayResourcePool([2], use_gpu=False)
    group = RayWorkerGroup(
        resource_pool=pool,
        ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(cls)),
        device_name="cpu",
        worker_env=env,
    )
    if files is not None:
        _GROUPS.append((group, pool))
    return group


def wait_for_spans(
    directory: Path, counts: dict[str, int], timeout_s: float = 60
) -> list[SpanRecord]:
    """Spans the processes wrote so far, once at least `counts[name]` of each are there."""
    deadline = time.monotonic() + timeout_s
    while True:
        spans = analyze.load_run(directory).spans if directory.is_dir() else []
        found = {name: len(by_name(spans, name)) for name in counts}
        if all(found[name] >= n for name, n in counts.items()) or time.monotonic() > deadline:
            assert found == counts, f"spans in {directory} after {timeout_s}s: {found}"
            return spans
        time.sleep(0.2)


def by_name(spans: list[SpanRecord], name: str) -> list[SpanRecord]:
    return [span for span in spans if span.name == name]


def test_worker_group_calls_join_the_driver_phase_across_processes(cluster):
    tel = rlotel.init(run="wg", prometheus_port=0, resource_attributes={"rl.role": "driver"})
    group = worker_group(cluster)
    with tel.phase("init_model"):  # the workers start their telemetry (not timed below)
        group.update_policy(0.0)
    with tel.step(1) as step:
        with tel.phase("update_actor"):
            assert group.update_policy(0.2) == [0, 1]
    assert tel.flush(10)

    spans = wait_for_spans(cluster, {"update_actor": 1, "update_policy": 4, "optimizer_step": 4})
    files = sorted(path.name for path in cluster.glob("*.jsonl"))
    assert len(files) == 3, files  # the driver and each worker: a file per process
    assert f"driver-0-{os.getpid()}.jsonl" in files
    assert {name.rsplit("-", 1)[0] for name in files} == {
        "driver-0",
        "TimedWorker-0",
        "TimedWorker-1",
    }

    (phase,) = by_name(spans, "update_actor")
    methods = [s for s in by_name(spans, "update_policy") if s.trace_id == phase.trace_id]
    assert len(methods) == 2
    for method in methods:  # each rank's method: a child of the driver's phase
        assert method.trace_id == phase.trace_id
        assert method.parent_span_id == phase.span_id
        assert method.resource["rl.role"] == "TimedWorker"
        assert method.resource["rl.node"] == ray.get_runtime_context().worker.node_ip_address
        assert method.resource["process.pid"] != phase.resource["process.pid"]
    assert sorted(m.resource["rl.rank"] for m in methods) == [0, 1]
    method_of_rank = {m.resource["rl.rank"]: m for m in methods}
    for timer in ("forward_backward", "optimizer_step"):  # verl's timers in the worker
        timed = [s for s in by_name(spans, timer) if s.trace_id == phase.trace_id]
        assert sorted(t.parent_span_id for t in timed) == sorted(m.span_id for m in methods)
    slow = next(
        t
        for t in by_name(spans, "forward_backward")
        if t.parent_span_id == method_of_rank[SLOW_RANK].span_id
    )
    assert slow.seconds >= 1.6

    # The driver's phase names the straggler: the slowest rank, its seconds, the spread.
    assert phase.attributes["rl.ranks"] == 2
    assert phase.attributes["rl.rank.slowest"] == SLOW_RANK
    assert phase.attributes["rl.rank.slowest_s"] >= 1.6
    assert phase.attributes["rl.rank.slowest_s"] <= phase.seconds
    assert phase.attributes["rl.rank.spread"] > 1.5
    series = parse_exposition(scrape(tel.metrics_url))
    spread = series[
        ("rlotel_phase_rank_spread_ratio", frozenset({("run", "wg"), ("phase", "update_actor")}))
    ]
    assert spread == pytest.approx(phase.attributes["rl.rank.spread"])
    verdict = step.verdict
    assert verdict is not None and verdict.evidence["straggler_rank"] == SLOW_RANK
    assert verdict.evidence["straggler_phase"] == "update_actor"

    # `rlotel analyze DIR` reassembles the step across files: worker spans sit in the tree
    # but the step's timing_raw is the driver's own.
    (record,) = analyze.load_run(cluster).steps
    assert record.timing_raw.keys() == step.timing_raw.keys()
    assert record.timing_raw["update_actor"] == pytest.approx(
        step.timing_raw["update_actor"], abs=1e-3
    )
    tel.shutdown()


def test_calls_outside_a_phase_carry_only_the_run_once(cluster):
    tel = rlotel.init(run="wg", prometheus_port=None, resource_attributes={"rl.role": "driver"})
    group = worker_group(cluster)
    for _ in range(2):  # no phase open: the run only, on the first call to each actor
        assert group.update_policy(0.0) == [0, 1]
    carriers = verl_workers.CARRIERS  # each actor was told the run: it is not sent again
    assert [carriers.of_run("wg", worker._ray_actor_id) for worker in group.workers] == [None] * 2
    assert run_of(carriers.of_run("wg", "an actor not called yet")) == "wg"
    with tel.step(1), tel.phase("update_actor"):
        group.update_policy(0.0)
    spans = wait_for_spans(cluster, {"update_actor": 1, "update_policy": 2, "forward_backward": 6})
    loose = [s for s in spans if s.name == "forward_backward" and not s.parent_span_id]
    assert len(loose) == 4  # the uncarried calls' timers: root traces in each worker
    assert {s.attributes["rl.run"] for s in loose} == {"wg"}  # heard from the first call


def test_a_worker_dying_mid_phase_closes_the_phase_with_the_error(cluster):
    tel = rlotel.init(run="wg", prometheus_port=None, resource_attributes={"rl.role": "driver"})
    group = worker_group(cluster)
    with pytest.raises(ray.exceptions.RayActorError):
        with tel.step(1), tel.phase("update_actor"):
            group.crash()
    assert tel.flush(10)
    spans = wait_for_spans(cluster, {"update_actor": 1, "crash": 1})
    (phase,) = by_name(spans, "update_actor")
    assert phase.status_code == STATUS_ERROR  # the worker-group call's own error
    (step,) = by_name(spans, "step")
    assert step.attributes.get("rl.incomplete") is True
    survivors = by_name(spans, "crash")
    assert [s.resource["rl.rank"] for s in survivors] == [0]  # the dead rank's span is absent
    assert survivors[0].parent_span_id == phase.span_id


def test_a_hung_worker_never_hangs_the_driver_telemetry(cluster):
    tel = rlotel.init(run="wg", prometheus_port=None, resource_attributes={"rl.role": "driver"})
    group = worker_group(cluster)
    with tel.step(1), tel.phase("gen"):
        pass

    def train() -> None:
        with tel.step(2), tel.phase("update_actor"):
            group.hang()

    threading.Thread(target=train, daemon=True).start()
    time.sleep(1.0)
    started = time.monotonic()
    tel.shutdown(timeout_s=2)  # exits mid-step: what closed is written, the rest marked
    assert time.monotonic() - started < 4
    spans = wait_for_spans(cluster, {"gen": 1, "update_actor": 1})
    (phase,) = by_name(spans, "update_actor")
    assert phase.status_code == STATUS_ERROR
    assert [s.attributes["rl.step"] for s in by_name(spans, "step")] == [1, 2]
    for worker in group.workers:
        ray.kill(worker)


def test_a_rank_hung_in_update_actor_is_named_by_the_driver_and_its_own_metrics(cluster):
    tel = rlotel.init(
        run="wg",
        prometheus_port=None,
        resource_attributes={"rl.role": "driver"},
        stall_after_s=2.0,
    )
    group = worker_group(cluster)
    with tel.phase("init_model"):  # the workers start their telemetry (not timed below)
        group.update_policy(0.0)
    with tel.step(1), tel.phase("update_actor"):
        group.update_policy(0.0)  # update_actor's history: well under the floor

    pid = ray.get(group.workers[SLOW_RANK].pid.remote())  # before it hangs

    def train() -> None:
        with tel.step(2), tel.phase("update_actor"):
            group.hang_one()

    threading.Thread(target=train, daemon=True).start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stalled = [v for v in tel.stalled if v.evidence.get("step") == 2]
        if stalled:
            break
        time.sleep(0.1)
    (verdict,) = stalled
    assert verdict.detail == "update_actor"
    assert verdict.evidence["pending_ranks"] == str(SLOW_RANK)  # the rank that never replied
    assert verdict.evidence["role"] == "driver"
    assert f"rank(s) {SLOW_RANK}" in verdict.next_read
    # ... and its process: the actor its reply waits on, from Ray's actor table.
    (process,) = verdict.evidence["pending_processes"].split("; ")
    assert process.startswith(f"rank {SLOW_RANK}: ") and f" pid {pid} on 127.0.0.1" in process
    assert process in verdict.next_read

    # The hung rank's own /metrics: its traced method has been open since the call.
    targets = [
        entry
        for path in (cluster.parent / "sd").glob("*.json")
        for entry in json.loads(path.read_text())
    ]
    ages = {}
    for entry in targets:
        samples = parse_exposition(scrape(f"http://{entry['targets'][0]}/metrics"))
        for (name, labels), value in samples.items():
            if name == "rlotel_phase_open_seconds" and ("phase", "hang_one") in labels:
                ages[entry["labels"]["rank"]] = value
    assert ages[str(SLOW_RANK)] > 1.0  # still open, seen from the worker itself (1 s ticks)
    assert ages.get(str(1 - SLOW_RANK), 0.0) == 0.0  # the other rank replied: closed
    for worker in group.workers:
        ray.kill(worker)


def test_reply_timing_grows_linearly_with_the_ranks(ray_cluster):
    """The driver times each rank's reply of a worker-group call: with every reply already
    in, 16x the ranks cost about 16-25x here, Ray's own wait included (it was a wait per rank
    over every pending one: quadratic, 100x and more).
    A ratio of two sizes in one run, not an absolute time: the sizes timed in turns, the best
    of seven each, so a stretch of load (a real run beside the suite) slows both alike (once
    4,096 ranks took 95 ms in each of three tries in a row, 256 ranks 0.64 ms)."""

    class Ranks:
        def waiting_on_ranks(self, ranks: set[int], refs: list) -> None:
            return None

        def done_waiting(self, wait: None) -> None:
            pass

        def record_rank_seconds(self, seconds: dict[int, float]) -> None:
            self.seconds = seconds

    def timed(refs: list) -> float:
        """As `timeit` times: the collector off, so a full collection the suite's heap owes
        is not charged to one size."""
        gc.disable()
        try:
            ranks, started = Ranks(), time.perf_counter()
            verl_workers._time_replies(ranks, refs, started)
            seconds = time.perf_counter() - started
        finally:
            gc.enable()
        assert sorted(ranks.seconds) == list(range(len(refs)))
        return seconds

    replies = {n: [ray.put(rank) for rank in range(n)] for n in (256, 4096)}  # all in
    turns = [(timed(replies[256]), timed(replies[4096])) for _ in range(7)]
    small, large = (min(sizes) for sizes in zip(*turns, strict=True))
    ratio = large / small
    print(f"reply timing: 256 ranks {small * 1e3:.2f} ms, 4,096 ranks {large * 1e3:.2f} ms")
    assert ratio < 60, f"16x the ranks cost {ratio:.0f}x: quadratic again"


def heavy_batch(rows: int, width: int, columns: int) -> DataProto:
    """A batch as verl passes them: a tensor and non-tensor (object) columns."""
    texts = np.array([f"sample {i} " + "x" * 200 for i in range(rows)], dtype=object)
    return DataProto.from_dict(
        tensors={"hidden": torch.randn(rows, width)},
        non_tensors={f"column_{c}": texts.copy() for c in range(columns)},
    )


@contextlib.contextmanager
def timed_around_rlotel(seconds: dict[str, float]) -> Iterator[None]:
    """The driver's `DataProto.__getstate__` / `__setstate__`, each call timed into `seconds`
    around whatever is there (rlotel's hook): the test's own timing of verl's pickling."""

    def timed(name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        def around(self: DataProto, *args: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(self, *args)
            finally:
                seconds[name] += time.perf_counter() - started

        return around

    originals = {name: DataProto.__dict__[name] for name in seconds}
    for name, inner in originals.items():
        setattr(DataProto, name, timed(name, inner))
    try:
        yield
    finally:
        for name, inner in originals.items():
            setattr(DataProto, name, inner)


def test_a_call_moving_a_large_batch_says_data_movement_with_each_stage(cluster, capsys):
    """verl's real worker group, DataProto and dispatch: a method that does nothing with a
    64 MB batch. The call's stages add up to its wall time, its bytes are the batch's (an
    independent count), the pickling stages agree with the test's own timing of the same
    pickling, and the step's verdict is data movement, naming the stage that took longest.
    The test times verl's `DataProto.__getstate__` / `__setstate__` on the driver around
    rlotel's hook, during the very call, and each rank's `__getstate__` of its result.
    Serialize is the driver's pickling (rlotel's wrapper is inside the test's: within 5 % +
    5 ms below it) and the slowest rank's of its result (at least that rank's __getstate__,
    at most 4x it + 50 ms: pickle's own work beside it). Deserialize is at least the driver's
    unpickling of the replies (it adds the slowest rank's of its share) and at most 4x it +
    50 ms. Separate direct timings (`__getstate__`, `ray.put`, `pickle.loads` of the shares)
    are printed beside them, not
    asserted: on a loaded machine one call and a later timing differ by more than 2x."""
    tel = rlotel.init(run="moves", prometheus_port=0, resource_attributes={"rl.role": "driver"})
    group = worker_group(cluster, MovingWorker)
    with tel.phase("init_model"):  # the workers start their telemetry (not measured below)
        group.echo(heavy_batch(2, 4, 1))
    group.time_pickling()
    batch = heavy_batch(rows=512, width=32768, columns=8)
    pickling: dict[str, float] = {"__getstate__": 0.0, "__setstate__": 0.0}  # on the driver
    with tel.step(1) as step, timed_around_rlotel(pickling):
        with tel.phase("update_actor"):
            returned = group.echo(batch)
    assert tel.flush(10)
    assert torch.equal(returned.batch["hidden"], batch.batch["hidden"])  # verl's result intact

    (moves,) = step.data_moves.values()
    assert moves.phase == "update_actor" and moves.calls == 1
    parts = sum(moves.seconds.values())
    figures = (
        "data movement of one call: "
        + ", ".join(f"{stage} {seconds * 1e3:.1f} ms" for stage, seconds in moves.seconds.items())
        + f"; wall {moves.wall_s * 1e3:.1f} ms, parts {parts * 1e3:.1f} ms; bytes {moves.bytes}"
    )
    assert parts == pytest.approx(moves.wall_s, abs=1e-6)  # contiguous marks: exactly the wall
    assert moves.seconds["other"] < 0.05 * moves.wall_s  # what no stage names stays small
    assert moves.seconds["wait"] == 0 and moves.seconds["work"] > 0  # the ranks reported theirs

    # bytes: the batch's tensor and array sizes, counted here independently
    expected = batch.batch["hidden"].nbytes + sum(a.nbytes for a in batch.non_tensor_batch.values())
    assert moves.bytes["sent"] == expected and moves.bytes["returned"] == expected

    # serialize is verl pickling the ranks' shares (DataProto.__getstate__) inside submit,
    # and the slowest rank pickling its result as Ray sent it (its __getstate__ and the rest
    # of pickle's work on it); deserialize the driver unpickling the two replies and the
    # slowest rank its share
    seconds = moves.seconds
    outer = pickling["__getstate__"]
    on_ranks = group.pickled_s()  # each rank's __getstate__ of its result, timed by the test
    least = (outer - 0.005) / 1.05 + min(on_ranks)
    most = outer + 4 * max(on_ranks) + 0.05
    assert least <= seconds["serialize"] <= most, (seconds["serialize"], outer, on_ranks)
    replies = pickling["__setstate__"]
    assert replies <= seconds["deserialize"] <= 4 * replies + 0.05, (
        seconds["deserialize"],
        replies,
    )
    shares = batch.chunk(2)  # the same, timed apart from the call: printed only
    started = time.perf_counter()
    states = [share.__getstate__() for share in shares]
    getstate_s = time.perf_counter() - started
    started = time.perf_counter()
    refs = [ray.put(share) for share in shares]
    put_s = time.perf_counter() - started
    pickled = [pickle.dumps(share) for share in shares]
    started = time.perf_counter()
    for blob in pickled:
        pickle.loads(blob)
    loads_s = time.perf_counter() - started
    del refs, states
    figures += (
        f"\nin the call, around rlotel's hook: __getstate__ {outer * 1e3:.1f} ms, on the "
        f"ranks {', '.join(f'{s * 1e3:.1f}' for s in on_ranks)} ms, the replies' "
        f"__setstate__ {replies * 1e3:.1f} ms; apart: __getstate__ of the shares "
        f"{getstate_s * 1e3:.1f} ms, ray.put {put_s * 1e3:.1f} ms, pickle.loads "
        f"{loads_s * 1e3:.1f} ms"
    )

    verdict = step.verdict
    stage = max(MOVING, key=moves.seconds.__getitem__)
    figures += f"\nverdict: {verdict.label}: {verdict.next_read}"
    assert verdict.kind == "data-movement-bound" and verdict.detail == stage
    assert verdict.evidence["data_stage_s"] == pytest.approx(moves.seconds[stage], abs=1e-6)
    assert verdict.evidence["data_sent_bytes"] == expected

    # the phase's span carries the stages and bytes; Prometheus has them by phase and stage
    spans = wait_for_spans(cluster, {"update_actor": 1})
    (phase,) = by_name(spans, "update_actor")
    assert phase.attributes["rl.data.submit_s"] == pytest.approx(moves.seconds["submit"])
    assert phase.attributes["rl.data.sent_bytes"] == expected
    series = parse_exposition(scrape(tel.metrics_url))
    labels = frozenset({("run", "moves"), ("phase", "update_actor"), ("stage", stage)})
    assert series[("rlotel_data_movement_seconds_total", labels)] == pytest.approx(
        moves.seconds[stage]
    )
    tel.shutdown()
    # `rlotel analyze` reads the same verdict and names the stage in its ledger
    assert cli.main(["analyze", str(cluster)]) == 0
    printed = capsys.readouterr().out
    assert f"data-movement-bound/{stage}" in printed and f"({stage} " in printed
    with capsys.disabled():  # the figures, in `make test`'s output
        print("\n" + figures)
