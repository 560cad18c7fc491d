"""Hangs answered, slow runs left alone, on verl 0.9.1's real `python -m
verl.trainer.main_ppo` (V1 trainer, GRPO, vLLM rollout, CPU, loopback only), the plugin on,
`RLOTEL_STALL_AFTER_S=30`. The user's reward is where it goes wrong — a stand-in of the
test's own (`verl_cpu/rlotel_test_slow_reward.py`, like a reward calling a sandbox or a
judge): in the trainer `gen` stays open while the trajectories and their reward calls run
in the agent-loop and reward worker processes, so the trainer's stall flag depends on
their progress reaching it.

One run holds both (a run is minutes of the suite): each reward call takes 6 s, one at a
time (8 a step), and from step 2 on the reward blocks forever.

- slow, step 1: `gen` runs twice the stall limit and more, and no scrape of the trainer's
  /metrics shows a stall flag before the block, nor does any process judge one.
- hung, step 2: within 60 s of the block a scrape shows `gen` stalled, and `rlotel hangs`
  on the traces directory names it — step 2 only — and prints the reward process's stack
  with the reward's `compute_score` frame; then the harness kills the run.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e import ahead
from tests.e2e.ahead import figure
from tests.e2e.main_ppo import ROOT, STALL_FLAG, STAND_INS, TIMEOUT_S, isolated
from tests.helpers import parse_exposition

pytestmark = pytest.mark.slow

STALL_AFTER_S = 30  # 20 s: a hogged CPU's first vLLM generation alone outlasted it
CALLS_PER_STEP = 4 * 2  # data.train_batch_size × rollout.n: one reward call each
SLEEP_S = 6  # a slow reward call: 8 a step, one at a time, is 48 s of `gen` (and ~8 s generating)
GRACE_S = 10  # the hung run is killed this long after its first flagged scrape
REWARD = "reward.custom_reward_function"
KWARGS = f"+{REWARD}.reward_kwargs"


def declare_real_run(key: str, steps: int, *argv: str) -> None:
    """main_ppo with the stand-in reward and a 30 s stall limit in every process; `WORK` in
    `argv` is the run's directory."""
    ahead.declare(
        key,
        "rl-hang-",
        lambda work, assets: isolated(
            [
                *(str(work), "--steps", str(steps), "--assets", str(assets)),
                *("--env", f"RLOTEL_STALL_AFTER_S={STALL_AFTER_S}"),
                f"{REWARD}.path={STAND_INS / 'rlotel_test_slow_reward.py'}",
                *(arg.replace("WORK", str(work)) for arg in argv),
            ]
        ),
        TIMEOUT_S + 60,
        quiet=True,  # its stall limits judge time: not beside the rest of the suite
    )


def outcome(work: Path) -> dict:
    """run.json, with the console's tail to explain a failure."""
    result = json.loads((work / "run.json").read_text())
    log = work / "console.log"
    result["console"] = log.read_text(errors="replace")[-6000:] if log.exists() else ""
    return result


declare_real_run(
    "slow_then_hung",
    2,
    *("--until-stalled", str(GRACE_S)),
    f"{KWARGS}.sleep_s={SLEEP_S}",
    f"{KWARGS}.block_after={CALLS_PER_STEP}",  # step 1's calls answer, step 2's block
    f"{KWARGS}.mark=WORK/blocked.json",
)


@pytest.fixture(scope="module")
def slow_then_hung() -> Iterator[Path]:
    for work in ahead.work_of("slow_then_hung"):
        assert (work / "run.json").exists(), ahead.finished("slow_then_hung").result.stderr[-3000:]
        yield work


def scrapes(work: Path) -> list[tuple[float, str]]:
    """Every scrape of the trainer's /metrics: (when it was written, its text)."""
    return [(path.stat().st_mtime, path.read_text()) for path in sorted(work.glob("scrapes/*.txt"))]


def flagged(text: str) -> set[str]:
    """The phases a scrape shows stalled."""
    return {
        dict(labels)["phase"]
        for (name, labels), value in parse_exposition(text).items()
        if name == "rlotel_phase_stalled" and value == 1
    }


def hangs(work: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "rlotel.cli", "hangs", str(work / "traces")]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_slow_reward_that_keeps_progressing_is_never_stalled(slow_then_hung: Path) -> None:
    result = outcome(slow_then_hung)
    steps = [json.loads(line) for line in (slow_then_hung / "verl.jsonl").read_text().splitlines()]
    gens = [record["data"]["timing_s/gen"] for record in steps]
    figure(f"slow step: gen seconds {gens}")
    assert len(gens) == 1 and gens[0] > 1.5 * STALL_AFTER_S, gens  # step 1, well past the limit
    blocked_at = json.loads((slow_then_hung / "blocked.json").read_text())["blocked_unix_s"]
    before = [text for when, text in scrapes(slow_then_hung) if when < blocked_at]
    open_gen = [
        value
        for text in before
        for (name, labels), value in parse_exposition(text).items()
        if name == "rlotel_phase_open_seconds" and dict(labels)["phase"] == "gen"
    ]
    assert max(open_gen) > STALL_AFTER_S, result["console"]  # gen seen open past the limit,
    assert not [text for text in before if STALL_FLAG.search(text)]  # never flagged before
    stacks = (slow_then_hung / "traces").glob("*.stacks")  # nor judged by any other process
    assert not [path for path in stacks if path.stat().st_mtime < blocked_at]


def test_a_blocked_reward_is_flagged_within_a_minute_and_its_frame_printed(
    slow_then_hung: Path,
) -> None:
    hung = slow_then_hung
    result = outcome(hung)
    assert result["returncode"] == -9 and "stalled_scrape" in result, result["console"]
    block = json.loads((hung / "blocked.json").read_text())
    assert block["call"] == CALLS_PER_STEP + 1  # step 2's first call
    blocked_at = block["blocked_unix_s"]
    seen = scrapes(hung)
    assert not [when for when, text in seen if when < blocked_at and flagged(text)]
    first = next((when, flagged(text)) for when, text in seen if flagged(text))
    figure(f"hung run: gen flagged {first[0] - blocked_at:.1f} s after the block, wall "
          f"{result['wall_s']:.0f} s")  # fmt: skip
    assert first[0] - blocked_at <= 60
    assert "gen" in first[1]  # the phase step 2 is stuck in (and the step holding it)

    report = hangs(hung)
    print(report.stdout)
    assert report.returncode == 1, report.stdout + report.stderr
    named = re.findall(r"^HANG: phase '(\w+)' in step (\d+) ", report.stdout, re.MULTILINE)
    assert ("gen", "2") in named and ("gen", "1") not in named  # the slow step 1 is no hang
    reward = next(
        (block for block in report.stdout.split("HANG: ") if "process role=reward" in block),
        "",
    )
    assert reward, report.stdout  # the process running the reward, with the reward's frame
    assert re.search(r"\[user\] \S+/rlotel_test_slow_reward\.py:\d+ in compute_score", reward)
