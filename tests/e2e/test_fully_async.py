"""verl 0.9.1's fully async policy (`verl.experimental.fully_async_policy.fully_async_main`)
submitted to a running Ray cluster the cluster way, plugin on: `ray start --head`, then `ray job
submit --runtime-env-json '{"env_vars": {"RLOTEL_ENABLE": "1", ...}}' -- python -m
verl.experimental.fully_async_policy.fully_async_main ...` (`tests/e2e/job_submit.py
--fully-async`, CPU, loopback only). The cluster is started without any RLOTEL_*/OTEL_*
variable: what the plugin gets, it gets from the job's runtime env, which Ray merges with the
one verl passes to `ray.init` inside the job (an `OTEL_EXPORTER_PROMETHEUS_PORT` that is not
rlotel's default, so a scrape there proves an OTEL_* variable arrived).

The run: a `FullyAsyncRollouter` and a `FullyAsyncTrainer` as Ray actors of their own on fake
GPUs, the MessageQueue between them, a parameter sync after every trainer step through the CPU
checkpoint engine stand-in. Staleness threshold 1: the rollouter runs a step ahead, so the
second step trains samples of the weights before the first sync (stale by one version).

Read from the run's own outputs: the job's status, verl's file logger (its per-cycle
aggregates, keyed by the parameter version, name the step they hold: `training/global_step`),
the traces of every process, and the trainer's `/metrics` scraped while it trained.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlotel.offline import analyze
from rlotel.schema import attributes as attr
from rlotel.schema import vocabulary as voc
from tests.e2e import ahead
from tests.e2e.ahead import figure
from tests.e2e.job_submit import METRICS_PORT, isolated
from tests.e2e.main_ppo import EXPERIMENT, FULLY_ASYNC_PROMPTS, TIMEOUT_S
from tests.helpers import file_spans, parse_exposition

pytestmark = pytest.mark.slow

STEPS = 2
SAMPLES = STEPS * FULLY_ASYNC_PROMPTS * 2  # prompts a step × rollout.n
VERL_PARAM_SYNC = "timing_s/timing_s/param_sync"  # verl's `timing_s/param_sync` timer, logged
SYNC_KEY = "fully_async/rollouter/idle_ratio"  # in the rollouter's dict verl logs at each sync
STALE = "fully_async/count/stale_trajectory_processed"  # verl's running count
WORKER_ROLES = {"actor", "rollout", "agent_loop"}  # Ray actors the job's raylet started
ARGV = ("--steps", str(STEPS), "--fully-async", "async_training.staleness_threshold=1")
ahead.declare(
    "fully_async",
    "rl-fa-",
    lambda work, assets: isolated([str(work), "--assets", str(assets), *ARGV]),
    TIMEOUT_S + 180,
)


@pytest.fixture(scope="module")
def fully_async() -> Iterator[Path]:
    for work in ahead.work_of("fully_async"):
        result = ahead.finished("fully_async").result
        (work / "harness.log").write_text(result.stdout + result.stderr)
        yield work


def outcome(work: Path) -> str:
    run = json.loads((work / "run.json").read_text()) if (work / "run.json").exists() else {}
    logs = [work / "harness.log", work / "console.log"]
    tails = [log.read_text(errors="replace")[-4000:] for log in logs if log.exists()]
    return "\n".join([str(run), *tails])


def test_the_submitted_job_trains_with_the_plugin_in_the_trainer_and_the_workers(
    fully_async: Path,
) -> None:
    run = json.loads((fully_async / "run.json").read_text())
    assert run["status"] == "SUCCEEDED", outcome(fully_async)
    files = sorted((fully_async / "traces").glob("*.jsonl"))
    roles = {path.name.split("-", 1)[0] for path in files if path.stat().st_size}
    assert roles >= {"trainer", *WORKER_ROLES}, (roles, outcome(fully_async))
    runs = {}  # every process is the experiment's: the rollouter's workers too
    for path in files:
        lines = path.read_text().splitlines()
        for resource in (
            r["resource"] for line in lines for r in json.loads(line)["resourceSpans"]
        ):
            attributes = {
                a["key"]: a["value"]["stringValue"]
                for a in resource["attributes"]
                if a["key"] == "rl.run"
            }
            runs.setdefault(path.name.split("-", 1)[0], set()).add(attributes.get("rl.run"))
    assert all(seen == {EXPERIMENT} for seen in runs.values()), runs


def trainer_spans(work: Path) -> list[dict]:
    """The trainer's spans, each file's resource checked: run = the experiment."""
    files = sorted((work / "traces").glob("trainer-*.jsonl"))
    assert files, sorted(path.name for path in (work / "traces").glob("*.jsonl"))
    return [span for path in files for span in file_spans(path, EXPERIMENT)]


def verl_records(work: Path) -> list[dict]:
    """Every dict verl logged, in order (several share a step: the parameter version)."""
    lines = (work / "verl.jsonl").read_text().splitlines()
    return [json.loads(line)["data"] for line in lines]


def verl_steps(work: Path) -> dict[int, dict]:
    """verl's aggregates by the trainer step they hold (one a cycle: a sync every step)."""
    aggregates = [data for data in verl_records(work) if "training/global_step" in data]
    return {int(data["training/global_step"]): data for data in aggregates}


def test_windows_equal_verl_with_a_param_sync_per_sync(fully_async: Path) -> None:
    logged = verl_steps(fully_async)
    assert sorted(logged) == list(range(1, STEPS + 1)), sorted(logged)
    ours = {step.number: step for step in analyze.load_steps(fully_async / "traces")}
    for number, data in logged.items():
        timing = voc.timing_from_metrics(data)
        assert {"step", "gen", "update_actor"} <= set(timing), sorted(timing)
        for name in (voc.START_PROFILE, voc.STOP_PROFILE):  # verl times them outside `step`
            timing.pop(name, None)
        for name, seconds in timing.items():
            assert math.isclose(ours[number].timing_raw[name], seconds, rel_tol=1e-6), name
        assert math.isclose(
            ours[number].timing_raw[voc.PARAM_SYNC], data[VERL_PARAM_SYNC], rel_tol=1e-6
        )
        figure(f"step {number}: {len(timing)} windows and param_sync",
               f"({data[VERL_PARAM_SYNC]:.3f} s) equal to verl's")  # fmt: skip

    syncs = [data for data in verl_records(fully_async) if SYNC_KEY in data]
    assert len(syncs) >= STEPS + 1  # before fit, after each step (and fit's last, if any)
    spans = trainer_spans(fully_async)
    assert sum(span["name"] == voc.PARAM_SYNC for span in spans) == len(syncs)


def test_trainer_is_the_driver(fully_async: Path) -> None:
    trainer = trainer_spans(fully_async)  # role trainer, run = the experiment
    assert not list((fully_async / "traces").glob("FullyAsyncTrainer-*"))
    # verl's last `fit_step` opens its step timer around a queue that has ended: a step of
    # its own, in error (status 2), exported or not depending on how the actor ends
    assert sum(span["name"] == "step" and span["status"] != 2 for span in trainer) == STEPS

    scrapes = sorted((fully_async / "scrapes").glob("*.txt"))
    assert scrapes, (
        f"nothing answered at the OTEL_EXPORTER_PROMETHEUS_PORT the job named, {METRICS_PORT}"
    )
    series = parse_exposition(scrapes[-1].read_text())
    assert series[("rlotel_step", frozenset({("run", EXPERIMENT)}))] == STEPS
    stage = frozenset({("run", EXPERIMENT), ("stage", voc.GENERATE_SEQUENCES)})
    assert series[("rlotel_agent_loop_duration_seconds_count", stage)] == SAMPLES
    # each step's own metrics reached it, keyed by the step (verl logs them a cycle late)
    key = frozenset({("run", EXPERIMENT), ("key", STALE)})
    assert series[("rlotel_train_metric", key)] == verl_steps(fully_async)[STEPS][STALE]
    # the MessageQueue hop: the trainer's gets, their seconds (waiting included) and bytes
    queue = frozenset({("run", EXPERIMENT), ("queue", "verl_message_queue"), ("op", "get")})
    gets = series[("rlotel_queue_operations_total", queue)]
    got = series[("rlotel_queue_bytes_total", queue)]
    waited = series[("rlotel_queue_seconds_total", queue)]
    figure(f"MessageQueue gets on the trainer: {gets:.0f}, {got / 1e3:.1f} kB, {waited:.3f} s")
    assert gets >= STEPS * FULLY_ASYNC_PROMPTS and got > 0 and waited > 0


def test_sample_spans_and_staleness_equal_verl(fully_async: Path) -> None:
    logged = verl_steps(fully_async)
    trainer = trainer_spans(fully_async)
    step_of = {
        span["trace"]: span["attrs"][attr.STEP] for span in trainer if span["name"] == "step"
    }
    samples = [span for span in trainer if span["name"] == attr.SAMPLE_SPAN]
    assert len(samples) == SAMPLES
    stale = 0
    for number in range(1, STEPS + 1):
        consumed = [span for span in samples if step_of[span["trace"]] == number]
        assert len(consumed) == SAMPLES // STEPS
        stale += sum(span["attrs"][attr.SAMPLE_STALENESS] >= 1 for span in consumed)
        assert logged[number][STALE] == stale, number  # verl's count, running over steps
        figure(f"step {number}: {len(consumed)} samples, verl's stale count {stale}")
    assert stale > 0  # the second step trained samples of the weights before the first sync
