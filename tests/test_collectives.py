"""Stragglers that survive collectives: each rank's time inside torch.distributed's
collectives (waiting for the others) and outside them (its compute), per traced worker call.

Wrapper semantics on two real gloo ranks in one process (rank 1 is a thread that joins each
collective late, through the process group's own methods, which are not wrapped), then
verl 0.9.1's real RayWorkerGroup training a small FSDP2 model on gloo with one rank slowed
by extra matmuls before its backward: every rank replies together (reply spread ≈ 1), the
compute spread names the slow rank.
"""

from __future__ import annotations

import datetime
import logging
import pickle
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

import rlotel
from rlotel.base.drops import HOOK_FAILURES
from rlotel.derive.diagnose import StepFacts, diagnose
from rlotel.integrations import collectives, verl_workers
from rlotel.integrations.data_moves import RankReply
from rlotel.integrations.registered import REGISTRY, TORCH_COLLECTIVE
from rlotel.schema import attributes as attr
from tests.helpers import parse_exposition, scrape

LATE_S = 0.3  # how late rank 1 joins a collective


@pytest.fixture(scope="module")
def groups() -> Iterator[list]:
    """Two gloo ranks of one group in this process; collectives wrapped."""
    assert dist.is_available(), "this torch build has no torch.distributed"
    store = dist.HashStore()
    pgs: list = [None, None]

    def make(rank: int) -> None:  # what init_process_group builds, for a rank per thread
        prefix = dist.PrefixStore("collectives", store)
        backend = dist.ProcessGroupGloo(prefix, rank, 2, datetime.timedelta(seconds=10))
        group = dist.ProcessGroup(prefix, rank, 2)
        group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
        pgs[rank] = group

    threads = [threading.Thread(target=make, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert collectives.install()
    yield pgs
    collectives.uninstall()


@pytest.fixture
def late_peer(groups) -> Iterator[Callable[..., None]]:
    """Run rank 1's side of the next collective in a thread, `delay` seconds late."""
    threads = []

    def join(issue: Callable, delay: float = LATE_S) -> None:
        def run() -> None:
            time.sleep(delay)
            issue(groups[1]).get_future().wait()  # neither call is a wrapped one

        thread = threading.Thread(target=run)
        thread.start()
        threads.append(thread)

    yield join
    for thread in threads:
        thread.join(30)


@pytest.fixture
def timed_begins(monkeypatch) -> threading.Event:
    """Set once a timed collective has begun its count: a peer that waits for it and then
    sleeps joins at least that long after the count began, however loaded the host."""
    begun = threading.Event()
    begin = collectives._begin

    def counted(args: tuple, kwargs: dict) -> tuple[int, bool]:
        began = begin(args, kwargs)
        begun.set()
        return began

    monkeypatch.setattr(collectives, "_begin", counted)
    return begun


def allreduce(pg):
    return pg.allreduce([torch.ones(4)])


@pytest.fixture
def a_rank(monkeypatch) -> None:
    """This process counts as a rank of a process group (the threads' group is not the
    default one, which is what a worker's `init_process_group` makes)."""
    monkeypatch.setattr(verl_workers, "_in_process_group", lambda: True)


def test_without_an_open_account_a_collective_is_passed_straight_through(
    groups, late_peer, monkeypatch
):
    def never(*args, **kwargs):
        raise AssertionError("timed with no account open")

    monkeypatch.setattr(collectives, "_begin", never)
    monkeypatch.setattr(collectives, "_end", never)
    late_peer(allreduce, 0.0)
    tensor = torch.ones(4)
    assert dist.all_reduce(tensor, group=groups[0]) is None
    assert tensor.tolist() == [2.0] * 4
    late_peer(allreduce, 0.0)
    tensor = torch.ones(4)
    dist.all_reduce(tensor, group=groups[0], async_op=True).wait()
    assert tensor.tolist() == [2.0] * 4


def test_a_sync_collective_counts_once_with_its_wait_for_the_late_rank(groups, late_peer):
    late_peer(allreduce)
    tally = collectives.open_tally()
    tensor = torch.ones(4)
    started = time.perf_counter()
    result = dist.all_reduce(tensor, group=groups[0])
    elapsed = time.perf_counter() - started
    collectives.close_tally(tally)
    assert result is None and tensor.tolist() == [2.0] * 4  # unchanged
    assert tally.calls == 1  # its internal work.wait() is not a second call
    assert LATE_S * 0.8 <= tally.seconds <= elapsed


def test_an_async_handle_counts_until_its_wait_returns(groups, late_peer):
    late_peer(allreduce)
    tally = collectives.open_tally()
    tensor = torch.ones(4)
    started = time.perf_counter()
    work = dist.all_reduce(tensor, group=groups[0], async_op=True)
    issued = time.perf_counter()
    assert isinstance(work, dist.Work)  # the handle itself, not a proxy
    issue_counted = tally.seconds
    assert work.wait() is True
    waited = time.perf_counter()
    collectives.close_tally(tally)
    assert tensor.tolist() == [2.0] * 4
    assert issue_counted <= issued - started < LATE_S / 2
    assert tally.calls == 1  # the wait adds time, not a call
    assert LATE_S * 0.8 <= tally.seconds <= waited - started


def test_a_collective_that_calls_another_counts_once(groups, late_peer):
    def gather(pg):
        options = dist.distributed_c10d.AllgatherOptions()
        return pg.all_gather_single(torch.zeros(8), torch.ones(4), options)

    late_peer(gather)
    tally = collectives.open_tally()
    output = torch.zeros(8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated → all_gather_single
        dist.all_gather_into_tensor(output, torch.ones(4), group=groups[0])
    collectives.close_tally(tally)
    assert output.tolist() == [1.0] * 8
    assert tally.calls == 1
    assert tally.seconds >= LATE_S * 0.8


def test_nested_accounts_each_count_what_ran_while_they_were_open(groups, late_peer):
    outer = collectives.open_tally()
    inner = collectives.open_tally()
    late_peer(allreduce, 0.1)
    dist.all_reduce(torch.ones(4), group=groups[0])
    collectives.close_tally(inner)
    late_peer(allreduce, 0.1)
    dist.all_reduce(torch.ones(4), group=groups[0])
    collectives.close_tally(outer)
    assert (inner.calls, outer.calls) == (1, 2)
    assert outer.seconds > inner.seconds > 0.05


def test_a_collective_from_another_thread_counts(groups, late_peer):
    """FSDP's backward hooks run collectives on autograd's threads."""
    tally = collectives.open_tally()
    late_peer(allreduce, 0.1)
    thread = threading.Thread(target=lambda: dist.all_reduce(torch.ones(4), group=groups[0]))
    thread.start()
    thread.join(30)
    collectives.close_tally(tally)
    assert tally.calls == 1 and tally.seconds >= 0.05


def test_a_failing_collective_raises_what_it_raises_without_rlotel(groups):
    original = REGISTRY.original(dist.distributed_c10d, "all_reduce")
    with pytest.raises(Exception) as plain:
        original("not a tensor", group=groups[0])
    tally = collectives.open_tally()
    with pytest.raises(type(plain.value)) as wrapped:
        dist.all_reduce("not a tensor", group=groups[0])
    collectives.close_tally(tally)
    assert str(wrapped.value) == str(plain.value)
    assert collectives._depth.n == 0  # the next call is timed again


def test_a_telemetry_error_is_counted_and_logged_and_the_collective_still_runs(
    groups, late_peer, make_tel, monkeypatch, caplog
):
    tel = make_tel()

    def broken(*args, **kwargs):
        raise RuntimeError("telemetry bug")

    monkeypatch.setattr(collectives, "_on_device", broken)
    before = HOOK_FAILURES.snapshot().get(TORCH_COLLECTIVE.name, 0)
    tally = collectives.open_tally()
    with caplog.at_level(logging.WARNING, logger="rlotel"):
        for _ in range(2):
            late_peer(allreduce, 0.0)
            tensor = torch.ones(4)
            dist.all_reduce(tensor, group=groups[0])
            assert tensor.tolist() == [2.0] * 4
    collectives.close_tally(tally)
    assert tally.calls == 2  # still timed on the host clock
    assert HOOK_FAILURES.snapshot()[TORCH_COLLECTIVE.name] == before + 2
    assert "rlotel_integration_failures_total" in scrape(tel.metrics_url)
    logged = [r for r in caplog.records if "telemetry bug" in r.getMessage()]
    assert len(logged) == (1 if before == 0 else 0)  # once per hook and process


def worker_call(name: str, carrier: dict[str, str]) -> Any:
    """A traced worker call of method `name`, begun as Ray's call path begins it."""
    call = verl_workers._begin_call(None, name, (), {verl_workers.RAY_CONTEXT_KWARG: carrier})
    assert call is not None
    return call


def test_a_worker_call_records_compute_and_collective_seconds_and_replies_with_them(
    groups, late_peer, timed_begins, make_tel, span_exporter, a_rank
):
    tel = make_tel(resource_attributes={attr.ROLE: "actor", attr.RANK: 1})
    carrier = {
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        verl_workers.REPLY_KEY: "1",
    }

    def late_rank(pg):
        timed_begins.wait(30)  # rank 0 is in the collective: LATE_S more before rank 1 joins
        time.sleep(LATE_S)
        return allreduce(pg)

    late_peer(late_rank, 0.0)
    call = worker_call("update_actor", carrier)
    time.sleep(0.1)  # stands for this rank's compute (a sleep: only the split is tested)
    started = time.perf_counter()
    dist.all_reduce(torch.ones(4), group=groups[0])
    in_collective = time.perf_counter() - started
    reply = call.end(None, "result")
    assert type(reply) is RankReply and reply.value == "result"
    # the split, by construction: the wait for the late rank is collective, the sleep before
    # it compute; neither bound depends on how long a sleep took
    assert LATE_S <= reply.collective_s <= in_collective
    assert reply.compute_s >= 0.1
    assert worker_call("_plumbing", carrier).end(None, 3) == 3
    assert tel.flush(10)
    (span,) = [s for s in span_exporter.get_finished_spans() if s.name == "update_actor"]
    assert span.attributes[attr.COLLECTIVE_CALLS] == 1
    # the two parts of the call's wall, measured before its span closed: neither holds the other
    assert reply.compute_s + reply.collective_s <= (span.end_time - span.start_time) / 1e9
    assert span.attributes[attr.COMPUTE_S] == pytest.approx(reply.compute_s)
    assert span.attributes[attr.COLLECTIVE_S] == pytest.approx(reply.collective_s)
    series = parse_exposition(scrape(tel.metrics_url))
    labels = frozenset(
        {("run", "test"), ("phase", "update_actor"), ("role", "actor"), ("rank", "1")}
    )
    assert series[("rlotel_rank_compute_seconds", labels)] == pytest.approx(reply.compute_s)
    assert series[("rlotel_rank_collective_seconds", labels)] == pytest.approx(reply.collective_s)


def test_a_worker_call_with_device_collectives_reports_no_split(
    groups, late_peer, make_tel, monkeypatch, caplog, a_rank
):
    """NCCL returns to the host before the collective ran: the host clock cannot split."""
    assert collectives._on_device((torch.empty(4, device="meta"),), {})
    assert not collectives._on_device(([torch.ones(1)],), {})
    make_tel()
    monkeypatch.setattr(collectives, "_on_device", lambda args, kwargs: True)
    carrier = {
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        verl_workers.REPLY_KEY: "1",
    }
    late_peer(allreduce, 0.0)
    with caplog.at_level(logging.WARNING, logger="rlotel"):
        call = worker_call("update_actor", carrier)
        dist.all_reduce(torch.ones(4), group=groups[0])
        assert call.end(None, "result") == "result"
    assert call.timing.tally.device_calls == 1 and call.timing.tally.ns == 0
    assert call.timing.rank_time is None
    assert any("device tensors" in r.getMessage() for r in caplog.records)


def test_a_call_not_asking_for_compute_gets_the_plain_result(groups, make_tel, a_rank):
    make_tel()
    carrier = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    call = worker_call("update_actor", carrier)
    assert call.end(None, "result") == "result"  # not sent back unasked...
    assert call.timing.rank_time is not None  # ...but measured (no collectives: all compute)
    assert call.timing.rank_time.collective_s == 0 and call.timing.rank_time.calls == 0


def test_a_process_that_is_no_rank_times_nothing(groups, make_tel):
    make_tel()
    carrier = {
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        verl_workers.REPLY_KEY: "1",
    }
    assert not dist.is_initialized()
    call = worker_call("update_actor", carrier)
    assert call.timing is verl_workers._UNTIMED and call.end(None, "result") == "result"


class TimedPickling:
    """A result whose own pickling does real work (joining a list of strings) and times it."""

    def __init__(self, parts: int) -> None:
        self.parts = [f"row {i}" for i in range(parts)]
        self.seconds = 0.0

    def __reduce__(self) -> tuple:
        started = time.perf_counter()
        joined = "\n".join(self.parts)
        self.seconds = time.perf_counter() - started
        return str, (joined,)


def test_a_reply_carries_the_seconds_its_rank_took_to_pickle_its_result():
    """The rank pickles its result as Ray sends the reply, after its call has returned: the
    reply measures that pickling as it happens and the driver unpickles the seconds with it.
    By construction they lie between the result's own pickling work and the whole dumps."""
    result = TimedPickling(200_000)
    reply = RankReply(result, 0.2, 0.0, (0.0, 0.0, 0, 0, 0.01))
    started = time.perf_counter()
    blob = pickle.dumps(reply, protocol=5)
    dumps_s = time.perf_counter() - started
    received = pickle.loads(blob)
    assert type(received) is RankReply and received.value == "\n".join(result.parts)
    assert (received.compute_s, received.moved) == (0.2, (0.0, 0.0, 0, 0, 0.01))
    assert result.seconds <= received.serialized_s <= dumps_s, (result.seconds, dumps_s)
    started = time.perf_counter()  # a reply of nothing: the same bounds
    blob = pickle.dumps(RankReply(None, 0.0, 0.0))
    assert 0 < pickle.loads(blob).serialized_s <= time.perf_counter() - started


def test_the_driver_unwraps_replies_and_names_the_rank_that_computed_longest(
    make_tel, span_exporter
):
    tel = make_tel()
    with tel.step(1) as step:
        with tel.phase("update_actor"):
            time.sleep(0.05)
            replies = [RankReply(f"r{rank}", 0.2, 1.0) for rank in range(4)]
            replies[2] = RankReply("r2", 1.2, 0.0)
            assert verl_workers.open_replies(replies) == ["r0", "r1", "r2", "r3"]
            assert verl_workers.open_replies(RankReply("one", 1.0, 0.0)) == "one"
            assert verl_workers.open_replies(["plain", 1]) == ["plain", 1]
            tel.record_rank_seconds({0: 1.2, 1: 1.2, 2: 1.2, 3: 1.21})  # replied together
    verdict = step.verdict
    assert verdict.evidence["straggler_rank"] == 2
    assert verdict.evidence["straggler_measure"] == "compute"
    assert verdict.evidence["straggler_spread"] == pytest.approx(6.0)
    assert "rank 2 computed 6.0x the median rank in update_actor" in verdict.next_read
    assert tel.flush(10)
    (span,) = [s for s in span_exporter.get_finished_spans() if s.name == "update_actor"]
    assert span.attributes[attr.RANK_COMPUTE_SLOWEST] == 2
    assert span.attributes[attr.RANK_COMPUTE_SPREAD] == pytest.approx(6.0)
    assert span.attributes[attr.RANK_COLLECTIVE_MAX_S] == pytest.approx(1.0)
    assert span.attributes[attr.RANK_SPREAD] == pytest.approx(1.0, abs=0.01)
    series = parse_exposition(scrape(tel.metrics_url))
    labels = frozenset({("run", "test"), ("phase", "update_actor")})
    key = ("rlotel_phase_rank_compute_spread_ratio", labels)
    assert series[key] == pytest.approx(6.0)


def test_the_verdict_names_whichever_spread_is_larger():
    facts = StepFacts(
        1,
        {"step": 10.0, "update_actor": 9.0},
        stragglers={"update_actor": (0, 1.6)},
        compute_stragglers={"update_actor": (3, 4.0)},
    )
    evidence = diagnose(facts).evidence
    assert (evidence["straggler_rank"], evidence["straggler_measure"]) == (3, "compute")
    facts = StepFacts(
        1, {"step": 10.0, "update_actor": 9.0}, compute_stragglers={"update_actor": (3, 1.2)}
    )
    assert "straggler_rank" not in diagnose(facts).evidence  # below the threshold


# --- verl's RayWorkerGroup, FSDP2 on gloo, one rank slowed before its backward -----------

SLOW_RANK = 1
EXTRA_MATMULS = 60  # 512×512 matmuls the slow rank adds before its backward (~0.5–1.5 s)


def fsdp_worker_class() -> type:
    """A verl worker training a small MLP sharded with FSDP2 over gloo (a local class:
    Ray ships it by value, so this module needs no verl to import)."""
    from verl.single_controller.base import Worker
    from verl.single_controller.base.decorator import Dispatch, register

    class FsdpWorker(Worker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def init_model(self) -> int:
            import torch
            import torch.distributed as dist
            from torch.distributed.fsdp import fully_shard

            torch.set_num_threads(1)
            dist.init_process_group("gloo")  # verl's env: RANK, WORLD_SIZE, MASTER_*
            torch.manual_seed(0)
            model = torch.nn.Sequential(
                torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
            )
            for layer in model:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer)
            fully_shard(model)
            self.model = model
            self.optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            return dist.get_rank()

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def update_policy(self, extra_matmuls: int) -> float:
            import torch

            batch = torch.randn(64, 256, generator=torch.Generator().manual_seed(self.rank))
            loss = self.model(batch).pow(2).mean()
            if self.rank == SLOW_RANK:  # a slow device: real extra compute, before backward
                a = torch.randn(512, 512)
                for _ in range(extra_matmuls):
                    a = torch.tanh(a @ a)
            loss.backward()  # FSDP2: all-gather and reduce-scatter wait for the slow rank
            self.optimizer.step()
            self.optimizer.zero_grad()
            return loss.item()

    return FsdpWorker


@pytest.mark.slow  # a Ray cluster and two verl worker processes importing torch
def test_under_fsdp2_every_rank_replies_together_and_compute_names_the_slow_rank(
    tmp_path, monkeypatch
):
    import ray
    from verl.single_controller.ray import (
        RayClassWithInitArgs,
        RayResourcePool,
        RayWorkerGroup,
    )

    from rlotel.integrations import verl as plugin
    from rlotel.offline import analyze

    traces = tmp_path / "traces"
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RLOTEL_TRACES_DIR", str(traces))
    env_vars = {
        "RLOTEL_ENABLE": "1",
        "RLOTEL_TRACES_DIR": str(traces),
        "RLOTEL_PROMETHEUS_SD_DIR": str(tmp_path / "sd"),
        "OMP_NUM_THREADS": "1",
    }
    plugin.install()
    ray.init(
        address="local",
        num_cpus=32,  # logical: verl asks each worker bundle for several
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": env_vars},
    )
    tel = None
    try:
        tel = rlotel.init(run="fsdp", prometheus_port=0, resource_attributes={attr.ROLE: "driver"})
        group = RayWorkerGroup(
            resource_pool=RayResourcePool([2], use_gpu=False),
            ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(fsdp_worker_class())),
            device_name="cpu",
        )
        with tel.phase("init_model"):  # outside the step: start-up and warm-up
            assert group.init_model() == [0, 1]
            group.update_policy(0)
        with tel.step(1) as step:
            with tel.phase("update_actor"):
                losses = group.update_policy(EXTRA_MATMULS)
        assert len(losses) == 2 and all(isinstance(loss, float) for loss in losses)
        assert tel.flush(10)

        spans = _wait_for(analyze, traces, "update_policy", 4)
        (phase,) = [s for s in spans if s.name == "update_actor"]
        # Every rank replied together: the slow rank held the other in the collectives.
        assert phase.attributes[attr.RANKS] == 2
        assert phase.attributes[attr.RANK_SPREAD] < 1.2
        # Its compute (outside collectives) tells it apart.
        assert phase.attributes[attr.RANK_COMPUTE_SLOWEST] == SLOW_RANK
        assert phase.attributes[attr.RANK_COMPUTE_SPREAD] >= 1.5  # the verdict's threshold
        verdict = step.verdict
        assert verdict.evidence["straggler_rank"] == SLOW_RANK
        assert verdict.evidence["straggler_measure"] == "compute"
        workers = {
            s.resource[attr.RANK]: s
            for s in spans
            if s.name == "update_policy" and s.parent_span_id == phase.span_id
        }
        print(
            "reply spread",
            round(phase.attributes[attr.RANK_SPREAD], 3),
            "compute spread",
            round(phase.attributes[attr.RANK_COMPUTE_SPREAD], 2),
            {
                rank: (
                    round(s.attributes[attr.COMPUTE_S], 3),
                    round(s.attributes[attr.COLLECTIVE_S], 3),
                )
                for rank, s in workers.items()
            },
        )
        slow, fast = workers[SLOW_RANK], workers[1 - SLOW_RANK]
        for span in (slow, fast):  # FSDP2's all-gathers and reduce-scatters, timed
            assert span.attributes[attr.COLLECTIVE_CALLS] >= 3
            total = span.attributes[attr.COMPUTE_S] + span.attributes[attr.COLLECTIVE_S]
            # measured inside the span, just before it closes: a little less than the span,
            # by what a loaded machine's scheduler takes between (38 ms beside two CPU hogs)
            assert total <= span.seconds
            assert total == pytest.approx(span.seconds, rel=0.02, abs=0.01)
        assert fast.attributes[attr.COLLECTIVE_S] > slow.attributes[attr.COLLECTIVE_S]
        assert slow.attributes[attr.COMPUTE_S] > 2 * fast.attributes[attr.COMPUTE_S]
        # `rlotel analyze` reads the same verdict back from the traces.
        (record,) = analyze.load_run(traces).steps
        assert record.facts.compute_stragglers["update_actor"][0] == SLOW_RANK
        assert diagnose(record.facts).evidence["straggler_rank"] == SLOW_RANK
        # What the driver recorded is what the workers' spans say.
        assert phase.attributes[attr.RANK_COMPUTE_SLOWEST_S] == pytest.approx(
            slow.attributes[attr.COMPUTE_S], rel=0.01
        )
    finally:
        ray.shutdown()
        plugin.uninstall()
        if tel is not None:
            tel.shutdown()


def _wait_for(analyze, directory, name: str, count: int, timeout_s: float = 60) -> list:
    deadline = time.monotonic() + timeout_s
    while True:
        spans = analyze.load_run(directory).spans if directory.is_dir() else []
        found = [s for s in spans if s.name == name]
        if len(found) >= count or time.monotonic() > deadline:
            assert len(found) == count, f"{len(found)} {name} spans in {directory}"
            return spans
        time.sleep(0.2)


def test_a_rank_stuck_in_a_collective_names_it_in_its_stacks_and_rlotel_hangs(
    groups, make_tel, tmp_path, monkeypatch, capsys
):
    """A worker call stuck in a collective its peer has not joined: the stall's stacks say
    which collective, on which group, as which rank, and `rlotel hangs` which ranks entered
    it; the peer joins, the call returns what it returns without rlotel."""
    from rlotel.cli import commands as cli
    from tests.test_hangs import wait_for

    assert collectives.install()  # again: a test above ends with the verl plugin uninstalled
    monkeypatch.setenv("RLOTEL_TRACES_DIR", str(tmp_path))
    tel = make_tel(stall_after_s=0.3, resource_attributes={attr.ROLE: "actor", attr.RANK: 0})
    caller = {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"}  # the driver's update_actor
    tensor, joined = torch.ones(4), threading.Event()

    def update() -> None:
        with tel.phase("update_actor", context=caller):
            tally = collectives.open_tally()
            try:
                dist.all_reduce(tensor, group=groups[0])
            finally:
                collectives.close_tally(tally)

    def peer() -> None:  # rank 1 joins only once the stall was seen
        joined.wait(8)
        allreduce(groups[1]).get_future().wait()

    threads = [threading.Thread(target=update, name="update"), threading.Thread(target=peer)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: tel.stalled)
        capsys.readouterr()
        assert cli.main(["hangs", str(tmp_path)]) == 1
        out = capsys.readouterr().out
        assert re.search(r"waiting in all_reduce on group of 2 as rank 0, entered \d", out), out
        assert "COLLECTIVE: all_reduce on group of 2: entered by rank(s) [0]" in out
    finally:
        joined.set()
        for thread in threads:
            thread.join(20)
    assert tensor.tolist() == [2.0] * 4
