"""The cluster way: `ray start --head`, then `ray job submit --runtime-env-json
'{"env_vars": {"RLOTEL_ENABLE": "1", ...}}' -- python -m verl.trainer.main_ppo ...` (verl
0.9.1's real run, 2 steps, CPU, loopback only, `tests/e2e/job_submit.py`). The cluster is
started without any RLOTEL_*/OTEL_* variable: what the plugin gets, it gets from the job's
runtime env, which Ray merges with the one verl's `main_ppo` passes to `ray.init` inside
the job. Asserted from the run's outputs: the job succeeded, the trainer (verl's TaskRunner
actor) and the worker roles each wrote their traces file, every step verl logged is in
the traces, and the trainer's `/metrics` answered at the port an OTEL_* variable named."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlotel.offline import analyze
from tests.e2e import ahead
from tests.e2e.job_submit import isolated
from tests.e2e.main_ppo import EXPERIMENT, TIMEOUT_S
from tests.helpers import parse_exposition

pytestmark = pytest.mark.slow

STEPS = 2
WORKER_ROLES = {"actor", "rollout", "agent_loop"}  # Ray actors the job's raylet started


ahead.declare(
    "submitted",
    "rl-js-",
    lambda work, assets: isolated([str(work), "--steps", str(STEPS), "--assets", str(assets)]),
    TIMEOUT_S + 180,
)


@pytest.fixture(scope="module")
def submitted() -> Iterator[Path]:
    for work in ahead.work_of("submitted"):
        result = ahead.finished("submitted").result
        (work / "harness.log").write_text(result.stdout + result.stderr)
        yield work


def outcome(work: Path) -> str:
    run = json.loads((work / "run.json").read_text()) if (work / "run.json").exists() else {}
    logs = [work / "harness.log", work / "console.log"]
    tails = [log.read_text(errors="replace")[-4000:] for log in logs if log.exists()]
    return "\n".join([str(run), *tails])


def test_the_submitted_job_trains_with_the_plugin_in_the_trainer_and_the_workers(
    submitted: Path,
) -> None:
    run = json.loads((submitted / "run.json").read_text())
    assert run["status"] == "SUCCEEDED", outcome(submitted)
    lines = (submitted / "verl.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, STEPS + 1))
    files = (
        sorted((submitted / "traces").glob("*.jsonl")) if (submitted / "traces").exists() else []
    )
    roles = {path.name.split("-", 1)[0] for path in files if path.stat().st_size}
    assert "trainer" in roles, (roles, outcome(submitted))
    assert roles >= WORKER_ROLES, (roles, outcome(submitted))
    steps = [step.number for step in analyze.load_steps(submitted / "traces")]
    assert steps == list(range(1, STEPS + 1))


def test_an_otel_variable_of_the_runtime_env_reached_the_trainer(submitted: Path) -> None:
    scrapes = sorted((submitted / "scrapes").glob("*.txt"))
    assert scrapes, "nothing answered at the OTEL_EXPORTER_PROMETHEUS_PORT the job named"
    series = parse_exposition(scrapes[-1].read_text())
    assert ("rlotel_step", frozenset({("run", EXPERIMENT)})) in series
