"""A sink of your own: what the pipeline hands it, in what state, and what a failing one costs.

The pipeline finishes a step once (verl's numbers, the verdict) before any sink sees it;
a sink that raises is counted and the others still get every item; flush and shutdown
share one deadline.
"""

from __future__ import annotations

import time

import pytest

import rlotel
from rlotel.base.drops import Drops
from rlotel.publish.sink import CompositeSink, Sink


class Collecting(rlotel.Sink):
    def __init__(self) -> None:
        self.steps, self.traces, self.samples, self.logs = [], [], [], []
        self.flushed: list[float] = []
        self.closed: list[float] = []

    def on_step(self, step) -> None:
        # finished before fan-out: the verdict is there, the numbers are derived
        self.steps.append((step.number, step.summary.verdict, dict(step.metrics)))

    def on_trace(self, trace) -> None:
        self.traces.append(trace.root.name)

    def on_samples(self, batch) -> None:
        self.samples.append(batch.columns["generate_sequences"].size)

    def on_log(self, data, step) -> None:
        self.logs.append((dict(data), step))

    def force_flush(self, deadline: float) -> bool:
        self.flushed.append(deadline)
        return True

    def shutdown(self, deadline: float) -> None:
        self.closed.append(deadline)


class Failing(rlotel.Sink):
    def on_step(self, step) -> None:
        raise RuntimeError("a broken sink")


def test_a_user_sink_gets_finished_steps_logs_traces_and_samples():
    mine = Collecting()
    tel = rlotel.init(run="s", prometheus_port=None, sinks=[Failing(), mine])
    for number in (1, 2):
        with tel.step(number) as step:
            with tel.phase("gen"):
                tel.record_samples(generate_sequences=[1.0, 2.0, 3.0])
            with tel.phase("update_actor"):
                pass
        tel.log({"actor/pg_loss": 0.5}, step=number)
    with tel.phase("testing"):
        pass
    tel.record_samples(generate_sequences=[0.5])  # outside any trace
    started = time.monotonic()
    assert tel.flush(10)
    assert mine.flushed and mine.flushed[0] <= started + 10.5
    assert [number for number, _, _ in mine.steps] == [1, 2]
    for _, verdict, metrics in mine.steps:
        assert verdict is not None and verdict.kind
        assert metrics["timing_s/gen"] > 0 and "agent_loop/generate_sequences/max" in metrics
    assert step.verdict is mine.steps[-1][1]  # the same verdict the training thread reads
    assert mine.logs == [({"actor/pg_loss": 0.5}, 1), ({"actor/pg_loss": 0.5}, 2)]
    assert mine.traces == ["testing"]
    assert mine.samples == [1]
    assert tel.drops.snapshot()[("spans", "sink_error")] == 2  # counted, not raised
    tel.shutdown(3)
    assert len(mine.closed) == 1 and mine.closed[0] <= time.monotonic() + 3


class Summaries(rlotel.Sink):
    def __init__(self) -> None:
        self.seen = []

    def on_step(self, step) -> None:
        self.seen.append(step.summary)


def test_one_summary_per_step_read_the_same_way_by_every_sink_and_the_training_thread(
    monkeypatch,
):
    """The step's numbers are built once (`rlotel.derive.summary`): a reader that asks before the
    publisher gets the object the pipeline publishes, the verdict added; every sink then
    reads that one object."""
    import rlotel.derive.summary
    import rlotel.telemetry

    built = []

    def counting(step, n_gpus, buckets):
        built.append(step.number)
        return rlotel.derive.summary.summarize(step, n_gpus, buckets)

    monkeypatch.setattr(rlotel.telemetry, "summarize", counting)
    first, second = Summaries(), Summaries()
    tel = rlotel.init(run="s", prometheus_port=None, sinks=[first, second])
    with tel.step(1) as step:
        with tel.phase("gen"):
            tel.record_samples(generate_sequences=[1.0, 2.0])
    early = step.metrics  # the training thread, right after close
    assert tel.flush(10)
    (one,), (other,) = first.seen, second.seen
    assert one is other and one.metrics is early and one.verdict is step.verdict
    assert one.verdict is not None and one.facts.number == 1
    with tel.step(2) as step:
        with tel.phase("gen"):
            pass
    assert tel.flush(10)
    assert built == [1, 2]  # once each, whoever asked first
    tel.shutdown(3)


def test_set_mode_changes_the_goodput_buckets_of_later_steps():
    """Under an async mode the trainer's `gen` is waiting for rollout: idle, not productive."""
    tel = rlotel.init(run="s", prometheus_port=None)
    idle = {}
    for number, mode in ((1, "sync"), (2, "fully_async")):
        tel.set_mode(mode)
        with tel.step(number) as step:
            with tel.phase("gen"):
                time.sleep(0.005)  # the trainer waits: the window being classified
            with tel.phase("update_actor"):
                pass
        idle[mode] = step.metrics["rlotel/bucket_seconds/idle"]
        gen = step.timing_raw["gen"]
    assert idle["sync"] == 0.0
    assert idle["fully_async"] == pytest.approx(gen, rel=1e-6)
    tel.shutdown(3)


def test_sinks_must_be_sinks():
    with pytest.raises(rlotel.ConfigError, match="Sink"):
        rlotel.init(prometheus_port=None, sinks=[object()])


class Slow(Sink):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.done = False

    def shutdown(self, deadline: float) -> None:
        time.sleep(self.seconds)
        self.done = True


def test_composite_shutdown_shares_one_deadline():
    """A sink stuck past the deadline (a blackholed collector) does not stall the others
    or the caller beyond the deadline."""
    stuck, quick = Slow(60.0), Slow(0.0)  # the stuck one first: it must not take quick's share
    composite = CompositeSink([stuck, quick], Drops())
    started = time.monotonic()
    composite.shutdown(started + 2.0)  # ample for a sink that returns at once, on a busy host
    assert time.monotonic() - started < 4.0
    assert quick.done and not stuck.done


def test_shutdown_on_rlotel_s_own_thread_runs_on_one_of_its_own():
    """A shutdown the publisher thread itself calls (verl's `Tracking.__del__`, run by the
    garbage collector there, finishes the `rlotel` logger) neither joins the thread it runs
    on nor waits for its own flush: it completes on a thread of its own, nothing dropped."""
    import threading

    from rlotel.telemetry import SHUTDOWN_THREAD

    collecting = Collecting()
    called_on: list[str] = []

    class ShutsDown(Sink):
        def on_step(self, step) -> None:
            called_on.append(threading.current_thread().name)
            tel.shutdown()

    tel = rlotel.init(run="gc", prometheus_port=None, sinks=[ShutsDown(), collecting])
    with tel.step(1):
        pass
    deadline = time.monotonic() + 10
    while not collecting.closed and time.monotonic() < deadline:
        time.sleep(0.01)  # waiting for the shutdown's end, bounded
    assert called_on == ["rlotel-publisher"] and collecting.closed, called_on
    assert tel.drops.snapshot() == {}  # nothing raised in a sink
    assert [number for number, *_ in collecting.steps] == [1]
    for thread in [t for t in threading.enumerate() if t.name == SHUTDOWN_THREAD]:
        thread.join(10)  # ends, bounded
        assert not thread.is_alive()
