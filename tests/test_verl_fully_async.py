"""verl 0.9.1's fully async trainer, its queue side on real verl objects: `RolloutSample`s
shaped as the rollouter puts them in the MessageQueue (one DataProto a prompt, a row a
sample, the agent loop's per-sample metrics in `meta_info`, its weight versions and
rlotel's stamp in `non_tensor_batch`), assembled by verl's own
`assemble_batch_from_rollout_samples` through the plugin's patch inside a step's `gen`. The
actors themselves (Ray, vLLM, FSDP) run in `tests/e2e/test_fully_async.py`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlotel
from rlotel.base.drops import HOOK_FAILURES
from rlotel.integrations import guard, verl_v1
from rlotel.integrations import verl_fully_async as fully_async
from rlotel.integrations.hooks import actor_class
from rlotel.integrations.registered import (
    FULLY_ASYNC_FIT,
    FULLY_ASYNC_INIT,
    FULLY_ASYNC_LOG,
    FULLY_ASYNC_PARAM_SYNC,
    FULLY_ASYNC_SAMPLES,
)
from rlotel.schema import vocabulary as voc
from tests.helpers import (
    attach_hooks,
    detach_hooks,
    hooks_attached,
    parse_exposition,
    scrape,
)

# the hooks on the trainer's actor class and its module
TRAINER_HOOKS = tuple(
    hook.name
    for hook in (
        FULLY_ASYNC_INIT,
        FULLY_ASYNC_FIT,
        FULLY_ASYNC_LOG,
        FULLY_ASYNC_PARAM_SYNC,
        FULLY_ASYNC_SAMPLES,
    )
)

pytestmark = pytest.mark.slow  # verl's real classes: its import and torch's, ~5 s

T0, S = 1_700_000_000_000_000_000, 1_000_000_000
# per prompt: (generate_sequences of its 2 samples, min_global_steps, max_global_steps)
PROMPTS = [((0.5, 2.0), (0, 0), (0, 1)), ((0.25, 0.75), (1, 1), (1, 1))]


def test_versions_are_rebased_so_staleness_counts_syncs() -> None:
    # a sync every step: versions are steps already
    assert fully_async.rebased_versions([0, 1], [1, 1], 3, 2) == ([0, 1], [1, 1])
    # a sync every 2 steps: step 4 trains at version 1; newest 0 is one sync stale, as verl says
    low, high = fully_async.rebased_versions([0, 1], [0, 1], 4, 1)
    assert [(4 - 1) - newest for newest in high] == [1 - 0, 1 - 1]
    assert low == [2, 3]
    assert fully_async.rebased_versions([0, None], [0, 1], 4, 1) is None
    assert fully_async.rebased_versions([0], [2], None, 1) == ([0], [2])


def rollout_samples() -> list:
    from verl import DataProto
    from verl.experimental.fully_async_policy.detach_utils import RolloutSample

    samples = []
    for index, (seconds, low, high) in enumerate(PROMPTS):
        stamps = np.empty(2, dtype=object)  # as verl's `_postprocess` builds the column
        stamps[:] = [[T0, T0 + s * S, 1, None, None, 1.0] for s in (1, 2)]
        output = DataProto.from_dict(
            tensors={
                "prompts": torch.zeros(2, 3, dtype=torch.int64),
                "responses": torch.zeros(2, 4, dtype=torch.int64),
                "attention_mask": torch.tensor([[0, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]]),
            },
            non_tensors={
                "uid": np.array([f"uid_sample_0_{index}"] * 2, dtype=object),
                "min_global_steps": np.array(low, dtype=object),
                "max_global_steps": np.array(high, dtype=object),
                verl_v1.STAMP_KEY: stamps,
            },
            meta_info={
                "metrics": [
                    {
                        "generate_sequences": s,
                        "tool_calls": 0.0,
                        "compute_score": 0.01,
                        "num_preempted": 0,
                    }
                    for s in seconds
                ]
            },
        )
        samples.append(RolloutSample(output, f"sample_0_{index}", 0, {"count/x": 1}))
    return samples


class Trainer:
    """What the patch reads of its caller, `FullyAsyncTrainer._get_samples_from_queue`."""

    def __init__(self, current_param_version: int) -> None:
        self.current_param_version = current_param_version

    def _get_samples_from_queue(self, module, samples):
        return module.assemble_batch_from_rollout_samples(samples, None, None, None)


@pytest.fixture
def patched_module():
    from verl.experimental.fully_async_policy import fully_async_trainer as module

    with hooks_attached(*TRAINER_HOOKS):
        yield module


def test_queue_samples_are_recorded_and_verls_batch_stays_verls(make_tel, patched_module):
    tel = make_tel(run="fa")
    trainer = Trainer(current_param_version=1)  # step 2, after one sync
    with tel.step(2) as step, tel.phase(voc.GEN):
        batch = trainer._get_samples_from_queue(patched_module, rollout_samples())

    assert verl_v1.STAMP_KEY not in batch.non_tensor_batch
    assert batch.meta_info["fully_async/processing_time/max"] == 2.0  # verl's own reduction
    assert batch.meta_info["fully_async/partial/max_partial_span"] == 1
    metrics = step.metrics
    assert metrics["agent_loop/generate_sequences/max"] == 2.0
    assert metrics["agent_loop/generate_sequences/min"] == 0.25
    assert metrics["agent_loop/num_preempted/max"] == 0
    # verl's fully async staleness: current_param_version − newest version, per sample
    verl_stale = [1 - newest for _, _, high in PROMPTS for newest in high]
    assert metrics[voc.TRAJECTORY_STALENESS + "max"] == max(verl_stale)
    assert metrics[voc.TRAJECTORY_STALENESS + "mean"] == pytest.approx(np.mean(verl_stale))
    assert metrics[voc.OFF_POLICY + "trajectory_spans/max"] == 2  # verl's max_partial_span + 1
    assert len(step.trace.samples) == 1  # one batch of four samples


def test_a_failing_hook_leaves_verls_batch_and_is_counted(make_tel, patched_module):
    tel = make_tel(run="fa-fault")
    before = HOOK_FAILURES.snapshot().get(FULLY_ASYNC_SAMPLES.name, 0)
    guard.inject([FULLY_ASYNC_SAMPLES.name])
    try:
        with tel.step(1) as step, tel.phase(voc.GEN):
            batch = Trainer(0)._get_samples_from_queue(patched_module, rollout_samples())
    finally:
        guard.inject([])
    assert HOOK_FAILURES.snapshot()[FULLY_ASYNC_SAMPLES.name] == before + 1
    assert batch.meta_info["fully_async/processing_time/max"] == 2.0
    assert verl_v1.STAMP_KEY in batch.non_tensor_batch  # verl's batch as the queue gave it
    assert not step.trace.samples


def test_the_class_ray_hosts_is_patched_and_pickles_by_reference(patched_module) -> None:
    """`@ray.remote` copied verl's methods into the class it hosts when the module was
    imported; that class is the one exported by value to the trainer's actor: rlotel's
    replacements must be on it and travel by reference, with the module's timer and assembly
    in its methods' globals."""
    import inspect

    from ray import cloudpickle

    hosted = patched_module.FullyAsyncTrainer.__ray_metadata__.modified_class
    assert hosted.__init__ is fully_async.trainer_init
    restored = cloudpickle.loads(cloudpickle.dumps(hosted))
    assert restored.fit is fully_async.trainer_fit
    assert restored._fit_postprocess_step is fully_async.postprocess_step
    step = inspect.unwrap(restored.fit_step)  # under Ray's tracing wrapper
    assert step.__globals__["marked_timer"] is fully_async.marked_timer
    assembly = inspect.unwrap(restored._get_samples_from_queue).__globals__
    assert assembly["assemble_batch_from_rollout_samples"] is fully_async.assemble_batch


def test_the_rollouter_hears_the_run_from_its_config(monkeypatch) -> None:
    """The rollouter's hosted class gets rlotel's `__init__` (by reference, as Ray exports
    it): it hears the experiment before verl's own `__init__` runs, so the worker
    telemetry it starts, and the calls it makes, are the experiment's."""
    from omegaconf import OmegaConf
    from ray import cloudpickle
    from verl.experimental.fully_async_policy import fully_async_rollouter as module

    from rlotel.integrations import verl_workers

    attach_hooks(FULLY_ASYNC_INIT.name)
    monkeypatch.setattr(verl_workers, "HOSTED", verl_workers.Hosted())
    try:
        hosted = actor_class(module.FullyAsyncRollouter)
        assert cloudpickle.loads(cloudpickle.dumps(hosted)).__init__ is fully_async.rollouter_init
        config = OmegaConf.create({"trainer": {"experiment_name": "fa-run"}})
        with pytest.raises(TypeError, match="tokenizer"):  # verl's own __init__, called
            hosted(config)
        assert verl_workers.HOSTED.run == "fa-run"
        started = rlotel.current()  # before verl's own __init__ made any worker
        assert started is not None and started.config.run == "fa-run"
    finally:
        if rlotel.current() is not None:
            rlotel.current().shutdown()
        detach_hooks(FULLY_ASYNC_INIT.name)


def test_each_step_is_logged_once_under_its_step(make_tel) -> None:
    """verl's fully async trainer logs a cycle's steps aggregated, keyed by the parameter
    version, a cycle late: the aggregate of step 1 comes at step 2's end, keyed 2 (a sync
    every step), while step 2 waits for its log. rlotel's logger drops it and logs each
    step's own dict under its step, with verl's other logs of the fit (the rollouter's at
    each sync); before `fit`, verl's logs pass as they are."""
    from rlotel.integrations.verl import RlotelBackend

    tel = make_tel(run="fa-logs")
    logs = fully_async.StepLogs(RlotelBackend("p", "fa-logs"))
    logs.log(data={"fully_async/rollouter/idle_ratio": 0.25}, step=0)  # the sync before fit
    logs.fitting(True)
    with tel.step(1) as first:
        logs.log(data={"fully_async/rollouter/idle_ratio": 0.5}, step=1)  # the step's sync
    logs.step({"training/global_step": 1, "perf/mfu/actor": 0.1}, 1)
    with tel.step(2) as second:
        logs.log(data={"fully_async/rollouter/idle_ratio": 0.75}, step=2)
    aggregate = {"training/global_step": 1, "dynamic_resource/resource_utilization": 0.3}
    logs.log(data=aggregate, step=2)  # step 1 again, with what only verl's aggregator adds
    logs.step({"training/global_step": 2, "perf/mfu/actor": 0.2}, 2)
    logs.fitting(False)
    tel.flush()

    assert first.logged == {
        "fully_async/rollouter/idle_ratio": 0.5,
        "training/global_step": 1,
        "perf/mfu/actor": 0.1,
    }
    assert second.logged == {
        "fully_async/rollouter/idle_ratio": 0.75,
        "training/global_step": 2,
        "perf/mfu/actor": 0.2,
    }
    series = parse_exposition(scrape(tel.metrics_url))
    key = frozenset({("run", "fa-logs"), ("key", "fully_async/rollouter/idle_ratio")})
    assert series[("rlotel_train_metric", key)] == 0.75
