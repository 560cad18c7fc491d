"""Open phases watched while open: a phase past its stall threshold shows on /metrics, in a
live verdict naming the process and in a partial span, and clears when it closes."""

from __future__ import annotations

import threading
import time

import pytest

import rlotel
from rlotel.errors import ConfigError
from rlotel.offline import analyze
from rlotel.publish.stall import STALLED, StallWatch
from rlotel.schema import attributes as attr
from tests.helpers import finished_spans, parse_exposition, scrape

THRESHOLDS = rlotel.Thresholds(stall_factor=6.0, stall_floor_s=0.5)


def series(tel: rlotel.Telemetry, name: str, phase: str) -> float | None:
    samples = parse_exposition(scrape(tel.metrics_url))
    return samples.get((name, frozenset({("run", "test"), ("phase", phase)})))


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_phase_past_its_threshold_is_stalled_while_open_and_clears_after(make_tel, span_exporter):
    tel = make_tel(
        bottleneck_thresholds=THRESHOLDS,
        resource_attributes={attr.ROLE: "trainer", attr.RANK: 0},
    )
    with tel.step(1), tel.phase("gen"):
        time.sleep(0.05)  # the history: gen takes ~50 ms
    release = threading.Event()

    def train() -> None:
        with tel.step(2), tel.phase("gen"):
            release.wait(30)

    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        wait_for(lambda: series(tel, "rlotel_phase_stalled", "gen") == 1)
        assert series(tel, "rlotel_phase_open_seconds", "gen") > 0.5
        assert series(tel, "rlotel_phase_stalled", "step") == 1  # it holds gen open

        (verdict,) = tel.stalled  # one verdict: the innermost stalled phase, not the step
        assert verdict.kind == STALLED
        assert verdict.evidence["role"] == "trainer" and verdict.evidence["rank"] == 0
        assert verdict.evidence["median_s"] == pytest.approx(0.05, abs=0.04)
        assert verdict.evidence["open_s"] > 0.5 and verdict.evidence["times_median"] > 6
        assert "rollout" in verdict.next_read

        partial = {
            s.name: s
            for s in finished_spans(tel, span_exporter)
            if s.attributes.get(attr.STEP) == 2
        }
        assert set(partial) == {"step", "gen"}  # the open chain, exported before it closes
        gen = partial["gen"]
        assert gen.attributes[attr.STALLED] is True and gen.attributes[attr.INCOMPLETE] is True
        assert gen.attributes[attr.OPEN_S] > 0.5
        assert attr.STALLED not in partial["step"].attributes
        assert partial["step"].attributes[attr.OPEN_S] >= gen.attributes[attr.OPEN_S]
        assert gen.parent.span_id == partial["step"].context.span_id
    finally:
        release.set()
        trainer.join(10)
    wait_for(lambda: series(tel, "rlotel_phase_stalled", "gen") == 0)
    assert series(tel, "rlotel_phase_open_seconds", "gen") == 0
    assert tel.stalled == []
    final = [
        s
        for s in finished_spans(tel, span_exporter)
        if s.attributes.get(attr.STEP) == 2 and s.name == "gen"
    ]
    assert len(final) == 2 and final[0].context.span_id == final[1].context.span_id
    assert attr.INCOMPLETE not in final[-1].attributes  # the complete one came after


def test_readers_keep_the_complete_span_over_its_partial(make_tel, tmp_path):
    traces = tmp_path / "traces.jsonl"
    tel = make_tel(bottleneck_thresholds=THRESHOLDS, traces_file=traces, span_exporters=[])
    with tel.step(1), tel.phase("gen"):
        wait_for(lambda: tel.stalled, 5)  # the partial is exported while gen hangs
        assert tel.flush(10)
        assert '"rl.stalled"' in traces.read_text()
    tel.flush(10)
    run = analyze.load_run(traces)
    names = sorted(s.name for s in run.spans)
    assert names == ["gen", "step"]  # each once: the complete versions
    assert not any(attr.OPEN_S in s.attributes for s in run.spans)
    (step,) = run.steps
    assert step.timing_raw["gen"] > 0.5


def test_without_history_the_floor_alone_applies(make_tel):
    tel = make_tel(bottleneck_thresholds=THRESHOLDS)
    watch: StallWatch = tel.stalls
    with tel.phase("checkpoint"):  # a loose phase, never seen closed
        wait_for(lambda: any(p.name == "checkpoint" and p.stalled for p in watch.check()), 5)
        (phase,) = [p for p in watch.check() if p.name == "checkpoint"]
        assert phase.median_s is None and phase.threshold_s == 0.5


def test_a_clock_running_backwards_never_gives_a_negative_age():
    from rlotel.record.ledger import Ledger, Trace, new_phase

    now = [10_000_000_000]
    watch = StallWatch(THRESHOLDS, {}, clock=lambda: now[0])
    ledger = Ledger(lambda s: None, lambda t: None, rlotel.record.drops.Drops(), lambda s: None)
    root = new_phase(None, "generate")
    root.start_ns = now[0] + 5_000_000_000  # started "after" now: the clock stepped back
    ledger.open_remote[1] = Trace(root, None)
    watch.ledger = ledger
    (phase,) = watch.check()
    assert phase.age_s == 0.0 and not phase.stalled


@pytest.mark.parametrize(
    "thresholds",
    [
        {"stall_factor": -1.0},
        {"stall_floor_s": float("nan")},
        {"stall_floor_s": float("inf")},
        {"stall_factor": "6"},
    ],
)
def test_bad_stall_thresholds_fail_at_init(thresholds):
    with pytest.raises(ConfigError):
        rlotel.init(
            run="bad", prometheus_port=None, bottleneck_thresholds=rlotel.Thresholds(**thresholds)
        )


@pytest.mark.slow
def test_an_actor_that_cannot_be_placed_is_named_as_pending_creation(make_tel, monkeypatch):
    """verl#7381: a call to an actor asking for a resource no node has waits forever."""
    import ray

    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:

        @ray.remote(resources={"no_such_accelerator": 1})
        class RolloutServer:
            def ping(self) -> int:
                return 1

        tel = make_tel(bottleneck_thresholds=rlotel.Thresholds(stall_floor_s=1.0))
        server = RolloutServer.options(name="rollout-0").remote()

        def create() -> None:
            with tel.phase("init_workers"):
                ray.get(server.ping.remote(), timeout=20)

        creator = threading.Thread(target=create, daemon=True)
        creator.start()
        wait_for(lambda: tel.stalled, 15)
        (verdict,) = tel.stalled
        assert verdict.detail == "init_workers"
        assert "RolloutServer(rollout-0)" in verdict.evidence["pending_actors"]
        assert "PENDING_CREATION" in verdict.evidence["pending_actors"]
        assert "never started" in verdict.next_read
        ray.kill(server)
        creator.join(25)
    finally:
        ray.shutdown()
