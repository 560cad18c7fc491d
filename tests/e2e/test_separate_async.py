"""verl 0.9.1's `separate_async` trainer through the real `main_ppo`, plugin on: the trainer
and a rollout pool of its own (`hybrid_engine=False`: one vLLM replica on a fake GPU of its
own), new weights sent after every step by a checkpoint engine. verl ships GPU transports
only (NCCL, NIXL, HCCL, Mooncake); the engine here is a stand-in over Ray's object store
(`verl_cpu/rlotel_test_checkpoint_engine.py`, loaded through verl's `custom_backend_module`).
verl's logged windows equal rlotel's, and each `update_weights` of a step is broken into the
checkpoint engine's stages, in verl's order, back to back inside it.

`VERL_LOGGING_LEVEL=WARN`: with `hybrid_engine=False` verl 0.9.1's separate_async set-up calls
`logger.info(..., flush=True)` (trainer_separate_async.py:181), which raises at INFO.
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
from tests.e2e.test_main_ppo import declare_main_ppo, main_ppo, spans_by_role, verl_log

pytestmark = pytest.mark.slow

STEPS = 2
ENGINE = "actor_rollout_ref.rollout.checkpoint_engine"
declare_main_ppo(
    "separate_async",
    *("--env", "VERL_LOGGING_LEVEL=WARN"),
    "trainer.v1.trainer_mode=separate_async",
    "actor_rollout_ref.hybrid_engine=False",
    "trainer.v1.separate_async.parameter_sync_step=1",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    f"{ENGINE}.backend=rlotel_test_object_store",
    f"{ENGINE}.custom_backend_module=rlotel_test_checkpoint_engine",
    "+ray_kwargs.ray_init.num_gpus=2",  # the trainer's and the rollout pool's
    steps=STEPS,
)


@pytest.fixture(scope="module")
def separate_async() -> Iterator[Path]:
    yield from main_ppo("separate_async")


def test_windows_equal_verl_and_weight_sync_stages_nest_in_update_weights(
    separate_async: Path,
) -> None:
    logged = {n: d for n, d in verl_log(separate_async).items() if voc.TIMING_S + "step" in d}
    assert len(logged) == STEPS, sorted(logged)
    ours = {step.number: step for step in analyze.load_steps(separate_async / "traces")}
    for number, data in logged.items():
        timing = voc.timing_from_metrics(data)
        assert {"step", "gen", "update_actor", voc.UPDATE_WEIGHTS} <= set(timing), sorted(timing)
        figure(f"step {number}: {len(timing)} windows equal to verl's timing_s")
        for name, seconds in timing.items():
            assert math.isclose(ours[number].timing_raw[name], seconds, rel_tol=1e-6), name

    spans = spans_by_role(separate_async)["trainer"]
    by_id = {span["id"]: span for span in spans}
    children: dict[str, list[dict]] = {}
    for span in sorted(spans, key=lambda s: s["start"]):
        children.setdefault(span["parent"], []).append(span)
    updates = [  # each step's (the sync before training is a root span of its own)
        span
        for span in spans
        if span["name"] == voc.UPDATE_WEIGHTS
        and by_id.get(span["parent"], {}).get("name") == "step"
    ]
    assert len(updates) == STEPS, [span["parent"] for span in updates]
    for update in updates:
        stages = children.get(update["id"], [])
        figure(
            f"update_weights {(update['end'] - update['start']) / 1e6:.1f} ms: "
            + ", ".join(f"{s['name']} {(s['end'] - s['start']) / 1e6:.1f}" for s in stages)
        )
        assert [stage["name"] for stage in stages] == list(voc.CKPT_STAGES)
        assert update["start"] <= stages[0]["start"] and stages[-1]["end"] <= update["end"]
        assert all(a["end"] <= b["start"] for a, b in pairwise(stages))  # one after another
        (group,) = [stage for stage in stages if stage["name"] == voc.CKPT_BUILD_PROCESS_GROUP]
        inner = [span["name"] for span in children.get(group["id"], [])]
        assert inner[:2] == [voc.CKPT_PREPARE, voc.CKPT_INIT_PROCESS_GROUP], inner
        transfer = next(s for s in stages if s["name"] == voc.CKPT_TRANSFER)
        assert transfer["end"] > transfer["start"]  # the weights took time to move
