"""Test stand-in, not part of rlotel: a CPU checkpoint engine for verl 0.9.1, which ships
GPU transports only (nccl, nixl, hccl, mooncake, kimi). Disaggregated modes
(`trainer.v1.trainer_mode=separate_async`, fully async) move weights from the trainer to
the rollout replicas through a checkpoint engine; this one goes through Ray's object store.

verl imports it where it builds an engine (`actor_rollout_ref.rollout.checkpoint_engine.
custom_backend_module=rlotel_test_checkpoint_engine`, `...backend=rlotel_test_object_store`),
and `CheckpointEngineManager.update_weights` runs its stages as with any non-colocated
backend: prepare (the master actor rank opens a mailbox actor), build_topology (every worker
is told the mailbox), init_process_group, send/receive (the master puts the whole state dict
into the object store and posts its reference; each rollout worker takes it), finalize (the
mailbox goes).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Iterable
from typing import Any

import ray
import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

BACKEND = "rlotel_test_object_store"


@ray.remote(num_cpus=0)
class _Mailbox:
    """Holds one update's object reference until every receiver took it."""

    def __init__(self) -> None:
        self._posted = asyncio.Event()
        self._refs: list[ray.ObjectRef] = []

    async def post(self, refs: list[ray.ObjectRef]) -> None:
        self._refs = refs
        self._posted.set()

    async def take(self) -> list[ray.ObjectRef]:
        await self._posted.wait()
        return self._refs


@CheckpointEngineRegistry.register(BACKEND)
class ObjectStoreCheckpointEngine(CheckpointEngine):
    """The master actor rank sends, every rollout worker receives; other actor ranks only
    run their weight generator (FSDP gathers full tensors collectively)."""

    def __init__(self, bucket_size: int, is_master: bool = False, **_: Any) -> None:
        self.bucket_size = bucket_size
        self.is_master = is_master
        self._mailbox_name: str | None = None
        self._mailbox: Any = None
        self._sent: ray.ObjectRef | None = None

    def prepare(self) -> dict[str, Any]:
        if not self.is_master:
            return {}
        name = f"rlotel-test-ckpt-{uuid.uuid4().hex}"
        self._mailbox = _Mailbox.options(name=name).remote()
        return {"mailbox": name}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        mailbox = metadata[0]["mailbox"]
        return (
            {"mailbox": [mailbox] * actor_wg_world_size},
            {"mailbox": [mailbox] * rollout_world_size},
        )

    def init_process_group(self, mailbox: str, **_: Any) -> None:
        self._mailbox_name = mailbox

    def finalize(self) -> None:
        if self._mailbox is not None:
            ray.kill(self._mailbox)
        self._mailbox, self._mailbox_name, self._sent = None, None, None

    async def send_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], global_steps: int | None = None
    ) -> dict:
        state = [
            (name, tensor.detach().cpu().clone())
            async for name, tensor in ensure_async_iterator(weights)
        ]
        if self.is_master:
            self._sent = ray.put(state)  # owned here until finalize
            await self._mailbox.post.remote([self._sent])
        return {}

    async def receive_weights(
        self, global_steps: int | None = None
    ) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        mailbox = ray.get_actor(self._mailbox_name)
        (ref,) = await mailbox.take.remote()
        for name, tensor in await ref:
            yield name, tensor
