"""Open phases watched while open: a phase whose work stops progressing for stall_after_s
shows on /metrics, in a live verdict naming the process, with every thread's stack, and in
a partial span, and clears when it closes; a slow phase that keeps progressing never does."""

from __future__ import annotations

import json
import threading
import time

import pytest

import rlotel
from rlotel.base.errors import ConfigError
from rlotel.derive.stall import STALLED, StallWatch
from rlotel.offline import analyze
from rlotel.schema import attributes as attr
from tests.helpers import finished_spans, parse_exposition, scrape

STALL_AFTER_S = 0.5


def series(tel: rlotel.Telemetry, name: str, phase: str) -> float | None:
    samples = parse_exposition(scrape(tel.metrics_url))
    return samples.get((name, frozenset({("run", "test"), ("phase", phase)})))


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_phase_without_progress_is_stalled_while_open_and_clears_after(make_tel, span_exporter):
    tel = make_tel(
        stall_after_s=STALL_AFTER_S,
        resource_attributes={attr.ROLE: "trainer", attr.RANK: 0},
    )
    with tel.step(1), tel.phase("gen"):
        time.sleep(0.05)  # the history: gen takes ~50 ms
    release = threading.Event()

    def train() -> None:
        with tel.step(2), tel.phase("gen"):
            blocked_in_the_reward(release)

    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        wait_for(lambda: series(tel, "rlotel_phase_stalled", "gen") == 1)
        assert series(tel, "rlotel_phase_open_seconds", "gen") > 0.5
        assert series(tel, "rlotel_phase_stalled", "step") == 1  # it holds gen open

        (verdict,) = tel.stalled  # one verdict: the innermost stalled phase, not the step
        assert verdict.kind == STALLED
        assert verdict.evidence["role"] == "trainer" and verdict.evidence["rank"] == 0
        (history,) = [  # the median of one closed gen is that gen's own seconds
            (s.end_time - s.start_time) / 1e9
            for s in finished_spans(tel, span_exporter)
            if s.name == "gen" and s.attributes.get(attr.STEP) == 1
        ]
        assert verdict.evidence["median_s"] == pytest.approx(history, abs=1e-6)  # evidence only
        assert verdict.evidence["quiet_s"] > STALL_AFTER_S
        assert verdict.evidence["threshold_s"] == STALL_AFTER_S
        assert "blocked_in_the_reward" in verdict.evidence["stuck_at"]  # the user's frame
        assert "rollout" in verdict.next_read
        (stalled,) = [p for p in tel.stalls.check() if p.name == "gen"]
        (stack,) = [s for s in stalled.stacks if s.thread == trainer.name]
        assert stack.frames[0].kind == "stdlib"  # innermost first: threading's wait, marked
        assert stack.innermost_user().endswith("in blocked_in_the_reward")

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
        stacks = {e.attributes["thread.name"]: e for e in gen.events if e.name == attr.STALL_STACK}
        trace = stacks[trainer.name].attributes["code.stacktrace"]
        assert "in blocked_in_the_reward [user]" in trace
        assert not partial["step"].events  # the stacks go with the stalled span only
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


def blocked_in_the_reward(release: threading.Event) -> None:
    """A stand-in for the user's code that hangs (a reward calling a sandbox)."""
    release.wait(30)


@pytest.mark.timing  # progress every 0.2x stall_after_s in wall time: a late wake-up stalls it
def test_a_slow_phase_that_keeps_progressing_is_never_stalled(make_tel):
    tel = make_tel(stall_after_s=STALL_AFTER_S)
    watch: StallWatch = tel.stalls
    flags = []
    with tel.step(1), tel.phase("gen"):
        started = time.monotonic()
        while time.monotonic() - started < 3 * STALL_AFTER_S:  # open 3x stall_after_s
            time.sleep(STALL_AFTER_S / 5)  # one slow trajectory after another
            tel.record_samples(generate_sequences=[STALL_AFTER_S / 5])
            with tel.phase("reward"):  # and a child phase: both are progress
                pass
            flags.extend(p.stalled for p in watch.check())
            assert tel.stalled == []  # nor on the publisher's own ticks
    assert len(flags) >= 10 and not any(flags)


@pytest.mark.timing  # a reply every 0.6x stall_after_s in wall time: a late wake-up stalls it
def test_rank_replies_are_progress_and_their_silence_a_stall(make_tel):
    tel = make_tel(stall_after_s=STALL_AFTER_S)
    watch: StallWatch = tel.stalls
    with tel.step(1), tel.phase("update_actor"):
        wait = tel.waiting_on_ranks({0, 1, 2})
        for rank in (0, 1):
            time.sleep(STALL_AFTER_S * 0.6)
            wait.replied([rank])
            assert not any(p.stalled for p in watch.check())  # a reply each 0.6 x the limit
        wait_for(lambda: any(p.stalled for p in watch.check()), 5)  # rank 2 never replies
        (verdict,) = tel.stalled
        assert verdict.evidence["pending_ranks"] == "2"
        tel.done_waiting(wait)


def test_the_stall_and_its_stacks_go_to_the_traces_directory(make_tel, tmp_path, monkeypatch):
    monkeypatch.setenv("RLOTEL_TRACES_DIR", str(tmp_path))
    monkeypatch.setenv("RLOTEL_STALL_AFTER_S", str(STALL_AFTER_S))
    tel = make_tel(resource_attributes={attr.ROLE: "trainer", attr.RANK: 0})
    assert tel.config.stall_after_s == STALL_AFTER_S
    with tel.phase("save_checkpoint"):  # a loose phase, never seen closed: no floor
        wait_for(lambda: tel.stalled, 5)
    (path,) = tmp_path.glob("trainer-0-*.stacks")
    (line,) = [json.loads(text) for text in path.read_text().splitlines()]
    assert line["phase"] == "save_checkpoint" and line["quiet_s"] > STALL_AFTER_S
    (main,) = [t for t in line["threads"] if t["thread"] == threading.main_thread().name]
    assert any("test_the_stall_and_its_stacks" in f["where"] for f in main["frames"])


def test_readers_keep_the_complete_span_over_its_partial(make_tel, tmp_path):
    traces = tmp_path / "traces.jsonl"
    tel = make_tel(stall_after_s=STALL_AFTER_S, traces_file=traces, span_exporters=[])
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


def test_a_clock_running_backwards_never_gives_a_negative_age():
    from rlotel.record.ledger import Ledger, Phase, Trace

    now = [10_000_000_000]
    watch = StallWatch(STALL_AFTER_S, {}, clock=lambda: now[0])
    ledger = Ledger(lambda s: None, lambda t: None, rlotel.base.drops.Drops(), lambda s: None)
    root = Phase(None, "generate")
    root.start_ns = now[0] + 5_000_000_000  # started "after" now: the clock stepped back
    ledger.open_remote[1] = Trace(root, None)
    watch.ledger = ledger
    (phase,) = watch.check()
    assert phase.age_s == 0.0 and not phase.stalled


@pytest.mark.parametrize("stall_after_s", [0, -1.0, float("nan"), float("inf"), "300", True])
def test_a_bad_stall_after_fails_at_init(stall_after_s):
    with pytest.raises(ConfigError, match="stall_after_s"):
        rlotel.init(run="bad", prometheus_port=None, stall_after_s=stall_after_s)


def test_a_bad_stall_after_variable_fails_at_init(monkeypatch):
    monkeypatch.setenv("RLOTEL_STALL_AFTER_S", "soon")
    with pytest.raises(ConfigError, match="RLOTEL_STALL_AFTER_S"):
        rlotel.init(run="bad", prometheus_port=None)


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

        tel = make_tel(stall_after_s=1.0)
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
