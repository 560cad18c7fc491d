"""Hangs answered, slow runs left alone, on verl 0.9.1's real `python -m
verl.trainer.main_ppo` (V1 trainer, GRPO, vLLM rollout, CPU, loopback only), the plugin on,
`RLOTEL_STALL_AFTER_S=20`. The user's reward is where it goes wrong — a stand-in of the
test's own (`verl_cpu/rlotel_test_slow_reward.py`, like a reward calling a sandbox or a
judge): in the trainer `gen` stays open while the trajectories and their reward calls run
in the agent-loop and reward worker processes, so the trainer's stall flag depends on
their progress reaching it.

- slow: each reward call takes 5 s, one at a time (8 a step): `gen` runs twice the stall
  limit and more, and no scrape of the trainer's /metrics ever shows a stall flag, nor
  does any process judge one.
- hung: from step 2 on the reward blocks forever: within 60 s of the block a scrape shows
  `gen` stalled, and `rlotel hangs` on the traces directory names it and prints the reward
  process's stack with the reward's `compute_score` frame; then the harness kills the run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.main_ppo import ROOT, STALL_FLAG, STAND_INS, run_isolated
from tests.helpers import parse_exposition

pytestmark = pytest.mark.slow

STALL_AFTER_S = 20
CALLS_PER_STEP = 4 * 2  # data.train_batch_size × rollout.n: one reward call each
SLEEP_S = 5  # a slow reward call: 8 a step, one at a time, is 40 s of `gen`
GRACE_S = 10  # the hung run is killed this long after its first flagged scrape
REWARD = "reward.custom_reward_function"
KWARGS = f"+{REWARD}.reward_kwargs"


def real_run(assets: Path, steps: int, *argv: str) -> Iterator[Path]:
    """main_ppo with the stand-in reward and a 20 s stall limit in every process."""
    work = Path(tempfile.mkdtemp(prefix="rl-hang-", dir="/tmp"))  # short: Ray's socket paths
    try:
        result = run_isolated(
            [
                *(str(work), "--steps", str(steps), "--assets", str(assets)),
                *("--env", f"RLOTEL_STALL_AFTER_S={STALL_AFTER_S}"),
                f"{REWARD}.path={STAND_INS / 'rlotel_test_slow_reward.py'}",
                *(arg.replace("WORK", str(work)) for arg in argv),
            ]
        )
        assert (work / "run.json").exists(), result.stderr[-3000:]
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def outcome(work: Path) -> dict:
    """run.json, with the console's tail to explain a failure."""
    result = json.loads((work / "run.json").read_text())
    log = work / "console.log"
    result["console"] = log.read_text(errors="replace")[-6000:] if log.exists() else ""
    return result


@pytest.fixture(scope="module")
def slow(e2e_assets: Path) -> Iterator[Path]:
    yield from real_run(e2e_assets, 2, f"{KWARGS}.sleep_s={SLEEP_S}")


@pytest.fixture(scope="module")
def hung(e2e_assets: Path) -> Iterator[Path]:
    yield from real_run(
        e2e_assets,
        2,
        *("--until-stalled", str(GRACE_S)),
        f"{KWARGS}.block_after={CALLS_PER_STEP}",  # step 1's calls answer, step 2's block
        f"{KWARGS}.mark=WORK/blocked.json",
    )


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


def test_a_slow_reward_that_keeps_progressing_is_never_stalled(slow: Path) -> None:
    result = outcome(slow)
    assert result["returncode"] == 0, result["console"]
    steps = [json.loads(line) for line in (slow / "verl.jsonl").read_text().splitlines()]
    gens = [record["data"]["timing_s/gen"] for record in steps]
    print(f"slow run: gen seconds {gens}, wall {result['wall_s']:.0f} s")
    assert len(gens) == 2 and min(gens) > 1.5 * STALL_AFTER_S, gens  # well past the limit
    seen = scrapes(slow)
    open_gen = [
        value
        for _, text in seen
        for (name, labels), value in parse_exposition(text).items()
        if name == "rlotel_phase_open_seconds" and dict(labels)["phase"] == "gen"
    ]
    assert max(open_gen) > STALL_AFTER_S  # the watch saw gen open past the limit, and
    assert not [text for _, text in seen if STALL_FLAG.search(text)]  # never flagged it
    assert not list((slow / "traces").glob("*.stacks"))  # nor did any other process
    report = hangs(slow)
    assert report.returncode == 0 and "no hang" in report.stdout.lower(), report.stdout


def test_a_blocked_reward_is_flagged_within_a_minute_and_its_frame_printed(hung: Path) -> None:
    result = outcome(hung)
    assert result["returncode"] == -9 and "stalled_scrape" in result, result["console"]
    block = json.loads((hung / "blocked.json").read_text())
    assert block["call"] == CALLS_PER_STEP + 1  # step 2's first call
    blocked_at = block["blocked_unix_s"]
    seen = scrapes(hung)
    assert not [when for when, text in seen if when < blocked_at and flagged(text)]
    first = next((when, flagged(text)) for when, text in seen if flagged(text))
    print(f"hung run: gen flagged {first[0] - blocked_at:.1f} s after the block, wall "
          f"{result['wall_s']:.0f} s")  # fmt: skip
    assert first[0] - blocked_at <= 60
    assert "gen" in first[1]  # the phase step 2 is stuck in (and the step holding it)

    report = hangs(hung)
    print(report.stdout)
    assert report.returncode == 1, report.stdout + report.stderr
    assert re.search(r"^HANG: phase 'gen' in step 2 ", report.stdout, re.MULTILINE)
    reward = next(
        (block for block in report.stdout.split("HANG: ") if "process role=reward" in block),
        "",
    )
    assert reward, report.stdout  # the process running the reward, with the reward's frame
    assert re.search(r"\[user\] \S+/rlotel_test_slow_reward\.py:\d+ in compute_score", reward)
