"""verl 0.9.1's one-step-off policy, for real: `python -m verl.experimental.one_step_off_policy.
main_ppo` on CPU (`tests/e2e/main_ppo.py --one-step-off`), plugin on. Its `OneStepOffRayTrainer`
overrides `RayPPOTrainer.fit` with an async `fit` of its own: the trainer (one actor rank) and a
rollout pool (one vLLM replica) on fake GPUs of their own, the next batch generated
(`generate_async`, an asyncio task) while a step trains, the weights sent to the rollout
after each step's `gen` (`sync_rollout_weights` around verl's `update_weights`) through the
CPU checkpoint engine stand-in.

Read from the run's own outputs: verl's file logger, the traces of every process, the
trainer's `/metrics` scraped at the documented address while it trained.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from rlotel.offline import analyze
from rlotel.schema import vocabulary as voc
from tests.e2e.ahead import figure
from tests.e2e.main_ppo import EXPERIMENT, METRICS_PORT, STALL_FLAG
from tests.e2e.test_main_ppo import (
    TRAJECTORIES,
    VERL_ROLES,
    declare_main_ppo,
    last_scrape,
    main_ppo,
    spans_by_role,
    verl_log,
)
from tests.helpers import parse_exposition

pytestmark = pytest.mark.slow

STEPS = 3
RUN = ("run", EXPERIMENT)
# verl times these around its `step` timer (`fit_step`: `_fit_start_profile` before it,
# `_fit_stop_profile` after it): rlotel's are windows outside the step's trace
OUTSIDE = (voc.START_PROFILE, voc.STOP_PROFILE)
NAMED = {voc.STEP, voc.GEN, voc.GENERATE_ASYNC, voc.SYNC_ROLLOUT_WEIGHTS, voc.UPDATE_WEIGHTS}
declare_main_ppo("one_step_off", "--one-step-off", steps=STEPS)


@pytest.fixture(scope="module")
def one_step_off() -> Iterator[Path]:
    yield from main_ppo("one_step_off")


def scrapes(work: Path) -> list[dict]:
    """Every scrape of the trainer's /metrics, in order."""
    paths = sorted((work / "scrapes").glob("*.txt"))
    assert paths, f"nothing answered at 127.0.0.1:{METRICS_PORT}/metrics during the run"
    return [parse_exposition(path.read_text()) for path in paths]


def test_windows_equal_verl_every_step(one_step_off: Path) -> None:
    """Every window verl times for a step holds verl's seconds for it in rlotel's step, on any
    machine load, `generate_async` too: verl times each batch's in the task that generates it
    (beside the step before) into a dict of its own, and merges that dict into the step that
    consumes the batch; rlotel's step takes the window whose seconds are in its dict. verl
    also times `start_profile` and `stop_profile` into the step's dict, before and after its
    `step` timer: each is a trace of its own (`rl.step` the step it follows), its seconds
    verl's."""
    logged = verl_log(one_step_off)
    assert sorted(logged) == list(range(1, STEPS + 1)), sorted(logged)
    ours = {step.number: step for step in analyze.load_steps(one_step_off / "traces")}
    assert sorted(ours) == sorted(logged)
    outside: dict[tuple[str, int | None], list[float]] = {}  # (window, rl.step) → seconds
    for span in spans_by_role(one_step_off)["trainer"]:
        if not span["parent"] and span["name"] in OUTSIDE:
            key = (span["name"], span["attrs"].get("rl.step"))
            outside.setdefault(key, []).append((span["end"] - span["start"]) / 1e9)
    unequal = []
    for number, data in logged.items():
        timing = voc.timing_from_metrics(data)
        assert NAMED | {voc.UPDATE_ACTOR, *OUTSIDE} <= set(timing), sorted(timing)
        for name in OUTSIDE:  # the step each follows: start_profile's is the one before
            follows = number - 1 if name == voc.START_PROFILE else number
            theirs = outside.get((name, follows or None), [])
            if len(theirs) != 1 or not math.isclose(theirs[0], timing[name], rel_tol=1e-6):
                unequal.append((number, name, timing[name], theirs))
            timing.pop(name)
        mine = ours[number].timing_raw
        for name, seconds in timing.items():
            if name not in mine or not math.isclose(mine[name], seconds, rel_tol=1e-6):
                unequal.append((number, name, seconds, mine.get(name)))
        figure(
            f"step {number}: {len(timing) + len(OUTSIDE)} windows;",
            *(f"{name} verl {timing[name]:.3f} rlotel {mine.get(name, math.nan):.3f}"
              for name in sorted(NAMED)),
        )  # fmt: skip
    assert not unequal, unequal  # (step, window, verl's seconds, rlotel's)


def test_samples_of_every_step(one_step_off: Path) -> None:
    """Every batch's samples are recorded (none taken for validation): the first batch
    arrives inside step 1's `gen`, each later one beside a step, between two or in the next
    one's `gen`. Their sample spans need a step's trace open when they are recorded; those
    recorded under a batch's `generate_async` go with it to the step that consumes the batch
    (none of a batch that finished between two steps)."""
    number, last = last_scrape(one_step_off)  # taken while it trained: some step ≥ 2
    count = last[
        (
            "rlotel_agent_loop_duration_seconds_count",
            frozenset({RUN, ("stage", "generate_sequences")}),
        )
    ]
    trainer = spans_by_role(one_step_off)["trainer"]
    step_of = {s["trace"]: s["attrs"]["rl.step"] for s in trainer if s["name"] == voc.STEP}
    spans = {number: 0 for number in range(1, STEPS + 1)}
    for span in trainer:
        if span["name"] == "sample":
            spans[step_of[span["trace"]]] += 1
    figure(
        f"samples recorded {count:.0f} by step {number} ({TRAJECTORIES} a step);",
        f"sample spans by step {spans}",
    )
    # by the end of step `number` its batch is in, and the next one may be (generated beside
    # it); no validation batch among them (val_before_train off, test_freq -1)
    batches = {number, min(number + 1, STEPS)}
    assert count in {batch * TRAJECTORIES for batch in batches}, (number, count)
    assert spans[1], spans


def test_roles_the_trainer_and_the_rollout_on_their_own(one_step_off: Path) -> None:
    """The trainer pool (one actor rank) and the rollout pool (one replica) are processes of
    their own on fake GPUs of their own: verl's throughput divides by the trainer's one GPU of
    the cluster's two, and so does rlotel's."""
    files = sorted((one_step_off / "traces").glob("*.jsonl"))
    pids = {path.name.split("-", 1)[0]: path.stem.rsplit("-", 1)[1] for path in files}
    figure("processes by role:", pids)
    assert {"trainer", "actor", "rollout"} <= set(pids), pids
    assert len({pids["trainer"], pids["actor"], pids["rollout"]}) == 3, pids
    number, last = last_scrape(one_step_off)
    throughput = last[("rlotel_throughput_tokens_per_second_per_gpu", frozenset({RUN}))]
    data = verl_log(one_step_off)[number]
    gpus = data[voc.TOTAL_NUM_TOKENS] / (data[voc.TIME_PER_STEP] * data[voc.THROUGHPUT])
    figure(f"step {number}: throughput {throughput:.2f} tokens/s/GPU,",
           f"verl's {data[voc.THROUGHPUT]:.2f} (over {gpus:.2f} GPU: the trainer's)")  # fmt: skip
    assert math.isclose(throughput, data[voc.THROUGHPUT], rel_tol=1e-6)
    assert math.isclose(gpus, 1.0)
    assert set(pids) - {"trainer"} <= VERL_ROLES, sorted(set(pids) - VERL_ROLES)


def test_weight_sync_stages_nest_in_update_weights(one_step_off: Path) -> None:
    """Each step's `sync_rollout_weights` wraps verl's `update_weights`, which the
    checkpoint engine's stages fill, in verl's order, back to back; the sync before training
    is one `update_weights` of its own."""
    spans = spans_by_role(one_step_off)["trainer"]
    by_id = {span["id"]: span for span in spans}
    children: dict[str, list[dict]] = {}
    for span in sorted(spans, key=lambda s: s["start"]):
        children.setdefault(span["parent"], []).append(span)
    syncs = [
        span
        for span in spans
        if span["name"] == voc.SYNC_ROLLOUT_WEIGHTS
        and by_id.get(span["parent"], {}).get("name") == voc.STEP
    ]
    assert len(syncs) == STEPS
    misplaced = []
    for sync in syncs:
        (update,) = children[sync["id"]]
        assert update["name"] == voc.UPDATE_WEIGHTS
        stages = children.get(update["id"], [])
        loose = [
            s["name"] for s in children.get(sync["parent"], []) if s["name"] in voc.CKPT_STAGES
        ]
        figure(
            f"sync_rollout_weights {(sync['end'] - sync['start']) / 1e6:.1f} ms; stages in",
            f"update_weights {[s['name'] for s in stages]}; directly in the step {loose}",
        )
        if [stage["name"] for stage in stages] != list(voc.CKPT_STAGES):
            misplaced.append((sync["attrs"].get("rl.step"), loose))
            continue
        assert update["start"] <= stages[0]["start"] and stages[-1]["end"] <= update["end"]
        assert all(a["end"] <= b["start"] for a, b in pairwise(stages))
    before = [s for s in spans if s["name"] == voc.UPDATE_WEIGHTS and "rl.step" not in s["attrs"]]
    figure(f"update_weights windows before training: {len(before)}")
    assert not misplaced, misplaced  # (step, the stages found directly under the step)
    assert len(before) == 1, [(s["id"], s["parent"]) for s in before]


def test_no_stall_flag_on_the_healthy_run(one_step_off: Path) -> None:
    seen = scrapes(one_step_off)
    flagged = [
        number
        for number, path in enumerate(sorted((one_step_off / "scrapes").glob("*.txt")), 1)
        if STALL_FLAG.search(path.read_text())
    ]
    phases = {
        dict(labels)["phase"]
        for scrape in seen
        for (name, labels) in scrape
        if name == "rlotel_phase_stalled"
    }
    figure(f"{len(seen)} scrapes, stall flags on {len(flagged)}; phases watched {len(phases)}")
    assert {voc.GENERATE_ASYNC, voc.SYNC_ROLLOUT_WEIGHTS} <= phases, phases
    assert not flagged, flagged


def test_trainer_is_the_driver(one_step_off: Path) -> None:
    """The process running the async `fit` is the driver: the run's name on its traces and
    every series, /metrics at the documented address while it trained, the step ledger."""
    trainer = spans_by_role(one_step_off)["trainer"]  # each file's rl.run = the experiment
    steps = sorted(s["attrs"]["rl.step"] for s in trainer if s["name"] == voc.STEP)
    assert steps == list(range(1, STEPS + 1)), steps
    seen = scrapes(one_step_off)
    shown = [scrape.get(("rlotel_step", frozenset({RUN}))) for scrape in seen]
    during = [number for number in shown if number is not None and number < STEPS]
    figure(f"{len(seen)} scrapes of :{METRICS_PORT}/metrics, {len(during)} before the last step;",
           f"steps shown {sorted({n for n in shown if n is not None})}")  # fmt: skip
    assert during, shown
    # the last step's series are there only if a scrape falls between its end and the exit
    number, _ = last_scrape(one_step_off)
    assert shown[-1] == number and all(a <= b for a, b in pairwise(n for n in shown if n)), shown
    for path in sorted((one_step_off / "scrapes").glob("*.txt")):
        series = [line for line in path.read_text().splitlines() if line[:1] not in ("", "#")]
        unlabelled = [line for line in series if f'run="{EXPERIMENT}"' not in line]
        assert series and not unlabelled, (path.name, unlabelled[:5])
