"""Phases opened concurrently from threads and asyncio tasks nest by their own context.

An async rollout next to the trainer (V1's async modes) opens phases while the training
thread has its own open: each must nest under what its own context has open, never under
the other's innermost phase, and `timing_raw` still sums every window like verl.
"""

from __future__ import annotations

import asyncio
import threading

from tests.helpers import finished_spans


def parents(spans) -> dict[str, str]:
    """span name → parent span name (names are unique in these tests)."""
    by_id = {span.context.span_id: span.name for span in spans}
    return {span.name: by_id.get(span.parent.span_id, "?") if span.parent else "" for span in spans}


def test_a_thread_nests_under_its_own_phases_not_the_trainers(tel, span_exporter):
    inside_update = threading.Event()
    rollout_done = threading.Event()

    def rollout() -> None:
        inside_update.wait(10)
        with tel.phase("rollout_gen"):
            with tel.phase("rollout_tool"):
                pass
        rollout_done.set()

    worker = threading.Thread(target=rollout)
    worker.start()
    with tel.step(1) as step:
        with tel.phase("update_actor"):
            with tel.phase("mini_batch"):
                inside_update.set()
                assert rollout_done.wait(10)
    worker.join(10)
    tree = parents(finished_spans(tel, span_exporter))
    assert tree["mini_batch"] == "update_actor"
    assert tree["rollout_gen"] == "step"  # top level of the step, not under update_actor
    assert tree["rollout_tool"] == "rollout_gen"
    assert {"update_actor", "mini_batch", "rollout_gen", "rollout_tool"} <= set(step.timing_raw)


def test_asyncio_tasks_nest_under_the_phase_they_were_created_in(tel, span_exporter):
    async def sample(index: int) -> None:
        with tel.phase(f"sample_{index}"):
            await asyncio.sleep(0)  # interleave the tasks inside their phases
            with tel.phase(f"tool_{index}"):
                await asyncio.sleep(0)

    async def generate() -> None:
        with tel.phase("gen"):
            await asyncio.gather(*(sample(i) for i in range(3)))
        with tel.phase("reward"):
            pass

    with tel.step(2) as step:
        asyncio.run(generate())
    tree = parents(finished_spans(tel, span_exporter))
    for index in range(3):
        assert tree[f"sample_{index}"] == "gen"
        assert tree[f"tool_{index}"] == f"sample_{index}"  # not another task's sample
    assert tree["reward"] == "step"
    assert step.timing_raw["gen"] >= max(step.timing_raw[f"sample_{i}"] for i in range(3))


def test_a_phase_left_open_by_an_earlier_step_is_no_parent(tel, span_exporter):
    """A context that still holds a phase of an earlier trace starts fresh in the next."""
    with tel.step(1):
        outer = tel.phase("gen")
        outer.__enter__()
        # the step closes around a phase that never exits (a generator that was dropped)
    with tel.step(2):
        with tel.phase("reward"):
            pass
    spans = finished_spans(tel, span_exporter)
    step_two = next(s for s in spans if s.name == "step" and s.attributes["rl.step"] == 2)
    reward = next(s for s in spans if s.name == "reward")
    assert reward.parent.span_id == step_two.context.span_id
