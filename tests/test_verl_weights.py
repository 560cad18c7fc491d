"""verl 0.9.1's real `CheckpointEngineManager.update_weights` with a non-colocated backend:
each of its stages is a window under the caller's `update_weights`, in verl's order, while
the weights really move.

Real: the manager (its stages, `auto_await`, the temporary rollout worker group it builds),
verl's `RayWorkerGroup` dispatch on a local Ray cluster, and the CPU checkpoint engine
stand-in of the e2e runs (`tests/e2e/verl_cpu/rlotel_test_checkpoint_engine.py`, through
Ray's object store). Stood in: the actor ranks (a state dict instead of an FSDP model) and
the rollout replicas (their workers receive the weights into a dict instead of vLLM; the
replicas' abort / KV-cache / resume calls record when they ran), which need GPUs and vLLM.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from ray.util import remove_placement_group
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

from rlotel.integrations import guard
from rlotel.integrations import verl as plugin
from rlotel.integrations.registered import CHECKPOINT_ENGINE
from rlotel.schema import vocabulary as voc

pytestmark = pytest.mark.slow  # a Ray cluster and worker processes

STAND_INS = Path(__file__).parent / "e2e" / "verl_cpu"
sys.path.insert(0, str(STAND_INS))
from rlotel_test_checkpoint_engine import BACKEND, ObjectStoreCheckpointEngine  # noqa: E402

BUCKET = 1 << 20
ACTOR_RANKS, ROLLOUT_WORKERS = 2, 2


def state_dict() -> dict[str, torch.Tensor]:
    return {"embed.weight": torch.arange(12.0).reshape(3, 4), "head.bias": torch.ones(3)}


class ActorStandIn(Worker):
    """The sending side of verl's actor worker (`engine_workers.ActorRolloutRefWorker`):
    its checkpoint-engine calls, as verl registers them."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = ObjectStoreCheckpointEngine(BUCKET, is_master=self.rank == 0)

    @register(dispatch_mode=Dispatch.DP_COMPUTE, blocking=False)
    def execute_checkpoint_engine(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.engine, method)(*args, **kwargs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def update_weights(self, global_steps: int | None = None, mode: str = "auto") -> dict:
        return await self.engine.send_weights(iter(state_dict().items()), global_steps)


class RolloutStandIn(Worker):
    """A rollout replica's worker (`CheckpointEngineWorker`'s calls): the weights it
    receives land in a dict instead of vLLM."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = ObjectStoreCheckpointEngine(BUCKET)
        self.received: dict[str, torch.Tensor] = {}

    @register(dispatch_mode=Dispatch.DP_COMPUTE, blocking=False)
    def execute_checkpoint_engine(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.engine, method)(*args, **kwargs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def update_weights(self, global_steps: int | None = None) -> None:
        self.received = {name: tensor async for name, tensor in self.engine.receive_weights()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def take_received(self) -> dict[str, torch.Tensor]:
        received, self.received = self.received, {}
        return received


class ReplicaStandIn:
    """What the manager calls on a `RolloutReplica` around the transfer, in call order."""

    def __init__(self, workers: list[Any]) -> None:
        self.workers = workers
        self.calls: list[str] = []

    async def _note(self, name: str) -> None:
        await asyncio.sleep(0.01)
        self.calls.append(name)

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        await self._note("abort_all_requests")

    async def release_kv_cache(self) -> None:
        await self._note("release_kv_cache")

    async def resume_kv_cache(self) -> None:
        await self._note("resume_kv_cache")

    async def resume_generation(self) -> None:
        await self._note("resume_generation")


@pytest.fixture(scope="module")
def groups():
    """The actor's two ranks and one rollout replica's two workers, on a local cluster
    whose workers import the stand-in engine."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        patch.delenv("RAY_ADDRESS", raising=False)
        plugin.install()
        path = os.pathsep.join(filter(None, [str(STAND_INS), os.environ.get("PYTHONPATH")]))
        ray.init(
            address="local",
            num_cpus=48,  # each group holds a placement group of 20 logical CPUs
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": path}},
        )
        pools = []
        try:
            made = []
            for cls, size in ((ActorStandIn, ACTOR_RANKS), (RolloutStandIn, ROLLOUT_WORKERS)):
                pools.append(RayResourcePool([size], use_gpu=False))
                made.append(
                    RayWorkerGroup(
                        resource_pool=pools[-1],
                        ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(cls)),
                        device_name="cpu",
                    )
                )
            yield made
        finally:
            for pool in pools:
                for pg in pool.pgs or []:
                    remove_placement_group(pg)
            ray.shutdown()
            plugin.uninstall()


def manager(groups, backend: str = BACKEND) -> tuple[Any, ReplicaStandIn]:
    from verl.checkpoint_engine import CheckpointEngineManager
    from verl.workers.config import CheckpointEngineConfig

    actor, rollout = groups
    replica = ReplicaStandIn(rollout.workers)
    config = CheckpointEngineConfig(backend=backend)
    return CheckpointEngineManager(config=config, actor_wg=actor, replicas=[replica]), replica


def children(spans: list[Any], parent: Any) -> list[Any]:
    return sorted(
        (s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id),
        key=lambda s: s.start_time,
    )


def assert_received(rollout: RayWorkerGroup) -> None:
    for received in rollout.take_received():
        assert sorted(received) == sorted(state_dict())
        for name, tensor in state_dict().items():
            assert torch.equal(received[name], tensor), name


def test_each_stage_is_a_window_of_update_weights_in_verls_order(groups, make_tel, span_exporter):
    """Called from sync code (a trainer's `update_weights` timer), awaited from async code
    (fully async's trainer), with no window open (it gets one of its own) and from sync code
    inside an event loop (one-step-off: `auto_await` runs it in a thread): the same
    stages, in order, back to back inside the `update_weights` window; the process group's
    two calls inside `build_process_group`; the weights arrive."""
    sync_weights, replica = manager(groups)
    tel = make_tel()

    async def awaited() -> None:
        with tel.phase(voc.UPDATE_WEIGHTS):
            assert await sync_weights.update_weights(2) == {}

    with tel.step(1):
        with tel.phase(voc.UPDATE_WEIGHTS):
            assert sync_weights.update_weights(1) == {}  # verl's auto_await runs it
    assert_received(groups[1])
    with tel.step(2):
        asyncio.run(awaited())
    assert_received(groups[1])
    sync_weights.update_weights(3)  # between steps: no window open around it
    assert_received(groups[1])

    async def sync_inside_a_loop() -> None:  # one-step-off: its sync update, from async fit
        def fit_update_weights() -> None:
            with tel.phase(voc.UPDATE_WEIGHTS):
                assert sync_weights.update_weights(4) == {}  # auto_await: a thread of its own

        fit_update_weights()

    with tel.step(3):
        asyncio.run(sync_inside_a_loop())
    assert_received(groups[1])
    tel.flush()
    assert replica.calls == 4 * [
        "abort_all_requests",
        "release_kv_cache",
        "resume_kv_cache",
        "resume_generation",
    ]
    spans = span_exporter.get_finished_spans()
    updates = sorted((s for s in spans if s.name == voc.UPDATE_WEIGHTS), key=lambda s: s.start_time)
    assert len(updates) == 4
    assert updates[2].parent is None  # its own window, a root span
    for update in updates:
        stages = children(spans, update)
        assert [s.name for s in stages] == list(voc.CKPT_STAGES)
        for before, after in itertools.pairwise(stages):
            assert before.end_time <= after.start_time
        assert update.start_time <= stages[0].start_time
        assert stages[-1].end_time <= update.end_time
        group = stages[voc.CKPT_STAGES.index(voc.CKPT_BUILD_PROCESS_GROUP)]
        inner = children(spans, group)
        assert [s.name for s in inner] == [voc.CKPT_PREPARE, voc.CKPT_INIT_PROCESS_GROUP]
        assert group.start_time <= inner[0].start_time and inner[-1].end_time <= group.end_time
        waits = {s.name: (s.end_time - s.start_time) / 1e9 for s in stages}
        for stage in (voc.CKPT_ABORT, voc.CKPT_RELEASE_KV_CACHE, voc.CKPT_RESUME_GENERATION):
            assert waits[stage] >= 0.01, (stage, waits)  # the replicas' own 10 ms


def test_a_failing_hook_leaves_the_update_to_verl(groups, make_tel, span_exporter):
    """rlotel's part raising at every stage: verl's update runs as without rlotel (the
    weights arrive, the replicas are resumed) and no stage window is left behind."""
    sync_weights, replica = manager(groups)
    tel = make_tel()
    guard.inject([CHECKPOINT_ENGINE.name])
    try:
        with tel.step(1):
            with tel.phase(voc.UPDATE_WEIGHTS):
                sync_weights.update_weights(1)
    finally:
        guard.inject([])
    assert_received(groups[1])
    tel.flush()
    assert replica.calls[-1] == "resume_generation"
    names = {s.name for s in span_exporter.get_finished_spans()}
    assert voc.UPDATE_WEIGHTS in names and not names & set(voc.CKPT_STAGES), names


def test_a_sync_before_telemetry_starts_leaves_it_unstarted(groups):
    """verl's first sync runs before `fit` declares the trainer the driver: timing it would
    start a worker's telemetry in the trainer's process (another run name, no /metrics at
    the documented address). The weights arrive; rlotel stays unstarted."""
    import rlotel

    assert rlotel.current() is None
    sync_weights, replica = manager(groups)
    sync_weights.update_weights(0)
    assert_received(groups[1])
    assert replica.calls[-1] == "resume_generation"
    assert rlotel.current() is None
