"""verl 0.9.1's one-step-off loop, in miniature (no run): verl's own timers, rlotel's plugin on,
the loop of `experimental/one_step_off_policy/ray_trainer.py` (`fit`, `fit_step`,
`_fit_generate`, `_async_gen_next_batch`) on asyncio. Each batch's `generate_async` is timed
into a dict of the task that generates it, beside the step, and verl merges that dict into
the dict of the step that consumes the batch: rlotel's step holds the very windows verl's
does, however late the generation finishes — inside the step it opened in (an idle machine),
between two steps, or while the next step's `gen` awaits it (a loaded one)."""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict

import pytest

from rlotel.schema import vocabulary as voc
from tests.helpers import finished_spans

STEPS = 3
FINISHED = ("in_the_step_it_opened_in", "between_steps", "in_the_next_gen")


async def one_step_off(tel, finished: str) -> dict[int, dict[str, float]]:
    """verl's loop; verl's `timing_raw` of each step (its `timing_s/*`)."""
    from verl.utils.debug import marked_timer

    generated = {batch: asyncio.Event() for batch in range(1, STEPS + 1)}

    async def gen_next_batch(batch: int) -> dict[str, float]:  # `_async_gen_next_batch`
        timing_raw: dict[str, float] = {}
        with marked_timer("generate_async", timing_raw, color="purple"):
            await generated[batch].wait()
            tel.record_samples(generate_sequences=[0.5, 1.5])  # verl's agent-loop hook
        return timing_raw

    logged = {}
    future = asyncio.create_task(gen_next_batch(1))
    for number in range(1, STEPS + 1):
        timing_raw: dict[str, float] = {}
        with marked_timer("start_profile", timing_raw):
            pass
        with marked_timer("step", timing_raw):
            with marked_timer("gen", timing_raw, color="red"):  # `_fit_generate`
                generated[number].set()  # a batch still generating finishes now
                timing_raw.update(await future)
            if number < STEPS:  # the next batch, generated while this step trains
                future = asyncio.create_task(gen_next_batch(number + 1))
                await asyncio.sleep(0)
            with marked_timer("update_actor", timing_raw, color="red"):
                await asyncio.sleep(0.01)
                if number < STEPS and finished == FINISHED[0]:
                    generated[number + 1].set()
                    await asyncio.sleep(0.01)
        if number < STEPS and finished == FINISHED[1]:
            generated[number + 1].set()
            await asyncio.sleep(0.01)
        with marked_timer("stop_profile", timing_raw):
            pass
        logged[number] = timing_raw
    return logged


@pytest.mark.parametrize("finished", FINISHED)
def test_each_batch_generation_in_the_step_that_consumes_it(make_tel, span_exporter, finished):
    from rlotel.integrations import verl as plugin

    tel = make_tel(run="one-step-off")
    plugin.install()
    try:
        logged = asyncio.run(one_step_off(tel, finished))
    finally:
        plugin.uninstall()
    spans = finished_spans(tel, span_exporter)
    roots = {s.context.trace_id: s for s in spans if s.parent is None}
    ours: dict[int, dict[str, float]] = defaultdict(dict)  # rl.step → window → seconds
    outside: dict[tuple[str, int | None], float] = {}  # (window, rl.step) → seconds
    for span in spans:
        root, seconds = roots[span.context.trace_id], (span.end_time - span.start_time) / 1e9
        if span.parent is None and span.name != voc.STEP:
            outside[span.name, span.attributes.get("rl.step")] = seconds
        elif root.name == voc.STEP and span.parent is not None and span.name != "sample":
            number, timing = root.attributes["rl.step"], ours[root.attributes["rl.step"]]
            timing[span.name] = timing.get(span.name, 0.0) + seconds
        if span.parent is not None:  # no span hangs from one of another trace
            assert span.parent.span_id in {
                s.context.span_id for s in spans if s.context.trace_id == span.context.trace_id
            }, span.name
    for number, timing in logged.items():
        start, stop = timing.pop(voc.START_PROFILE), timing.pop(voc.STOP_PROFILE)
        step = timing.pop(voc.STEP)
        assert set(ours[number]) == set(timing), (number, ours[number], timing)
        for name, seconds in timing.items():
            assert math.isclose(ours[number][name], seconds, rel_tol=1e-9), (number, name)
        root = next(s for s in roots.values() if s.attributes.get("rl.step") == number)
        assert root.name == voc.STEP
        assert math.isclose((root.end_time - root.start_time) / 1e9, step, rel_tol=1e-9)
        # verl times these around its step timer: windows of their own, `rl.step` the step
        # each follows
        before = number - 1 if number > 1 else None
        assert math.isclose(outside[voc.START_PROFILE, before], start, rel_tol=1e-9)
        assert math.isclose(outside[voc.STOP_PROFILE, number], stop, rel_tol=1e-9)
