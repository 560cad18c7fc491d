"""`rlotel analyze` reads back a traces file and verl's own FileLogger output."""

from __future__ import annotations

import json
import math
import time

import pytest

import rlotel
from rlotel.cli import commands as cli
from rlotel.offline.analyze import load_steps

PHASES = ["gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"]


def test_traces_file_round_trip(tmp_path, capsys):
    path = tmp_path / "traces.jsonl"
    tel = rlotel.init(run="an", prometheus_port=None, traces_file=path)
    closed = []
    for number in range(1, 5):
        with tel.step(number) as step:
            for phase in PHASES:
                with tel.phase(phase):
                    sum(range(2000 * (1 + PHASES.index(phase))))
            step.set_tokens(prompt=[10, 20], response=[30, 40 + number])
            tel.record_samples(generate_sequences=[0.1, 0.2])  # sample spans are skipped
        closed.append(step)
    with tel.phase("testing"):  # outside any step: not a ledger row
        pass
    tel.shutdown()

    steps = load_steps(path)
    assert [s.number for s in steps] == [1, 2, 3, 4]
    for loaded, original in zip(steps, closed, strict=True):
        assert list(loaded.timing_raw) == [*PHASES, "step"]
        for name, seconds in original.timing_raw.items():
            assert loaded.timing_raw[name] == pytest.approx(seconds, abs=1e-6)
        for key in ("timing_per_token_ms/gen", "timing_per_token_ms/update_actor"):
            assert loaded.metrics[key] == pytest.approx(original.metrics[key], rel=1e-6)

    assert cli.main(["analyze", str(path), "--every", "2"]) == 0
    out = capsys.readouterr().out
    assert "steps 1–2" in out and "steps 3–4" in out and "update_weights" in out


def test_verl_file_logger_output(tmp_path, monkeypatch, capsys):
    from verl.utils import tracking

    target = tmp_path / "exp.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(target))
    logger = tracking.FileLogger("proj", "exp")
    for number in range(1, 4):
        logger.log(
            {
                "timing_s/gen": 2.0 + number,
                "timing_s/update_actor": 1.5,
                "timing_s/step": 4.0 + number,
                "timing_per_token_ms/gen": 0.25,
                "actor/pg_loss": -0.1,
            },
            step=number,
        )
    logger.finish()
    steps = load_steps(target)
    assert [s.timing_raw for s in steps] == [
        {"gen": 2.0 + n, "update_actor": 1.5, "step": 4.0 + n} for n in range(1, 4)
    ]
    assert cli.main(["analyze", str(target)]) == 0
    assert "4.0000" in capsys.readouterr().out  # mean gen seconds: (3 + 4 + 5) / 3


def test_log_line_with_a_bare_nan_is_read(tmp_path):
    """Python's json.dumps writes a NaN metric as a bare `NaN`, which orjson refuses: such a
    line (verl's log shape, written by json) is still read, not skipped."""
    target = tmp_path / "exp.jsonl"
    lines = [
        json.dumps({"step": n, "data": {"timing_s/step": 1.0 + n, "actor/grad_norm": math.nan}})
        for n in (1, 2)
    ]
    target.write_text("\n".join(lines) + "\n")
    assert "NaN" in target.read_text()
    steps = load_steps(target)
    assert [s.timing_raw for s in steps] == [{"step": 2.0}, {"step": 3.0}]
    assert all(math.isnan(s.metrics["actor/grad_norm"]) for s in steps)


def test_analyze_reports_missing_and_empty(tmp_path, capsys):
    assert cli.main(["analyze", str(tmp_path / "nope.jsonl")]) == 2
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert cli.main(["analyze", str(empty)]) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert cli.main(["analyze", str(bad)]) == 2


def test_analyze_prints_bottleneck_section(tmp_path, capsys):
    path = tmp_path / "traces.jsonl"
    tel = rlotel.init(run="an", prometheus_port=None, traces_file=path)
    for number in range(1, 4):
        with tel.step(number) as step:
            with tel.phase("gen"):
                sum(range(400_000))
            with tel.phase("update_actor"):
                sum(range(20_000))
            step.set_tokens(prompt=[10], response=[30])
    tel.shutdown()
    steps = load_steps(path)
    assert steps[-1].facts.response_tokens == 30 and steps[-1].facts.sequences == 1
    assert cli.main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert "bottleneck: rollout-bound ×3" in out and "read next" in out


def test_only_the_steps_own_windows_compete_in_the_verdict_from_traces(tmp_path):
    """A phase nested in another (an unknown timer inside `update_actor`) is a window of the
    ledger but not one of the step's own: the verdict read back from traces weighs only the
    step's direct children, as the live one does."""
    path = tmp_path / "traces.jsonl"
    tel = rlotel.init(run="nested", prometheus_port=None, traces_file=path)
    with tel.step(1):
        with tel.phase("gen"):
            sum(range(20_000))
        with tel.phase("update_actor"), tel.phase("my_inner_timer"):
            sum(range(20_000))
    tel.shutdown()
    (step,) = load_steps(path)
    assert "my_inner_timer" in step.timing_raw
    assert step.facts.top_level == {"gen", "update_actor"}


def _tailed_run(path, strip_facts: bool = False, **options) -> list:
    """3 steps whose gen holds 10 samples, one of them 8x as slow; 2 sample spans a step
    (the slowest): the live verdict read all 10, the spans hold 2. `strip_facts`: the file
    as an rlotel that recorded no facts wrote it."""
    tel = rlotel.init(
        run="facts", prometheus_port=None, traces_file=path, max_sample_spans=2, **options
    )
    closed = []
    for number in range(1, 4):
        with tel.step(number) as step:
            with tel.phase("gen"):
                time.sleep(0.03)  # gen holds the step whatever else runs beside
                tel.record_samples(
                    generate_sequences=[0.01] * 9 + [0.08], response_length=[30] * 9 + [32]
                )
            with tel.phase("update_actor"):
                sum(range(20_000))
            step.set_tokens(prompt=[4] * 10, response=[30] * 9 + [32])
        closed.append(step)
    tel.shutdown()
    if strip_facts:
        lines = path.read_text().splitlines()
        path.write_text("\n".join(line.replace('"rl.bottleneck.facts"', '"x"') for line in lines))
    return closed


def test_offline_verdict_reads_the_facts_the_live_one_read(tmp_path, capsys):
    """The step span records what the live verdict read (every sample's distribution):
    `rlotel analyze` reads the same facts and says the same, label and confidence; a trace
    without them (an older rlotel's) has its facts rebuilt from the 2 spans a step."""
    from rlotel.derive.diagnose import Diagnoser

    path = tmp_path / "traces.jsonl"
    closed = _tailed_run(path)
    steps = load_steps(path)
    assert [s.facts for s in steps] == [step.summary.facts for step in closed]
    assert all(s.recorded for s in steps)
    diagnoser = Diagnoser()
    live = [(s.verdict.label, s.verdict.confidence, s.verdict.evidence) for s in closed]
    read = [diagnoser.observe(s.facts) for s in steps]
    assert [(v.label, v.confidence, v.evidence) for v in read] == live
    assert live[-1][:2] == ("rollout-bound/generation-tail", "medium")  # max/mean 5.3
    assert cli.main(["analyze", str(path)]) == 0
    assert "last step: rollout-bound/generation-tail (medium confidence" in capsys.readouterr().out

    older = tmp_path / "older.jsonl"
    _tailed_run(older, strip_facts=True)
    rebuilt = load_steps(older)
    assert not any(s.recorded for s in rebuilt)
    assert all("agent_loop/generate_sequences/max" not in s.facts.agent_loop for s in rebuilt)
    assert diagnoser.observe(rebuilt[-1].facts).label == "rollout-bound/uniform-generation"


def test_offline_verdicts_use_the_thresholds_the_run_was_diagnosed_with(tmp_path, capsys):
    """A run with its own thresholds (a tail only at 10x the mean): analyze and the report
    read its verdicts with them, as live did, not with the defaults."""
    from rlotel.derive.diagnose import Diagnoser
    from rlotel.offline.analyze import load_run, thresholds
    from rlotel.offline.report import report_data

    own = rlotel.Thresholds(tail_ratio=10.0)
    path = tmp_path / "traces.jsonl"
    closed = _tailed_run(path, bottleneck_thresholds=own)
    live = [(s.verdict.label, s.verdict.confidence) for s in closed]
    assert live[-1][0] != "rollout-bound/generation-tail"  # the defaults would say it is
    run = load_run(path)
    assert thresholds(run) == own
    default = Diagnoser().observe(run.steps[-1].facts)
    assert default.label == "rollout-bound/generation-tail"
    assert cli.main(["analyze", str(path)]) == 0
    assert f"last step: {live[-1][0]} ({live[-1][1]} confidence" in capsys.readouterr().out
    trees = report_data(run, tmp_path, "t")["trees"]
    assert [(trees[str(n)]["verdict"]["label"], trees[str(n)]["verdict"]["confidence"])
            for n in (1, 2, 3)] == live  # fmt: skip
