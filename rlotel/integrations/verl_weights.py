"""verl's weight sync, stage by stage: `update_weights` as the checkpoint engine runs it.

A high `update_weights` is read in the stages of verl's
`CheckpointEngineManager.update_weights` (`verl/checkpoint_engine/base.py`), which every
backend but the colocated `naive` one runs, in order: abort the replicas' requests,
release their KV cache, build the process group (each worker's `prepare`, then its
`init_process_group` with the topology the backend computed in between), transfer the
weights (the actor ranks send, the rollout workers receive), `finalize`, resume the KV
cache, resume generation. Each becomes a window of its own, nested in whatever is open in
the caller's context (the trainer's `update_weights` timer; fully async's `param_sync`;
one-step-off's `sync_rollout_weights`), the process-group ones under `build_process_group`.

Three stages are manager methods, wrapped on the class; the others are worker-group calls
made inside `update_weights` (`execute_checkpoint_engine("prepare" | "init_process_group" |
"finalize")`, the actor's `update_weights`), seen where every worker-group call is
dispatched (`RayWorkerGroup.execute_all`) while an update is running in the same context;
a stage lasts until the next one starts. The wrappers keep verl's calling convention
(`auto_await`: awaitable from async code, blocking from sync code); an update `auto_await`
runs in a thread of its own (sync code called while an event loop runs) carries the
caller's context there. An update with no window open around it gets an
`update_weights` window of its own, a root span; one before this process's telemetry started
(verl's first sync, before `fit`) is not timed.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable
from typing import Any

import rlotel
from rlotel.integrations import service
from rlotel.integrations.registered import CHECKPOINT_ENGINE
from rlotel.schema import vocabulary as voc

COLOCATED_BACKEND = "naive"  # one actor call, no stages
# worker-group calls inside an update: (verl's method, the engine method) → (window, nested)
ENGINE_METHOD = "execute_checkpoint_engine"
DISPATCHED = {
    (ENGINE_METHOD, voc.CKPT_PREPARE): (voc.CKPT_PREPARE, True),
    (ENGINE_METHOD, voc.CKPT_INIT_PROCESS_GROUP): (voc.CKPT_INIT_PROCESS_GROUP, True),
    (voc.UPDATE_WEIGHTS, None): (voc.CKPT_TRANSFER, False),
    (ENGINE_METHOD, voc.CKPT_FINALIZE): (voc.CKPT_FINALIZE, False),
}


class _Stages:
    """One update's windows: a stage at a time, and a stage within it (the process group's)."""

    def __init__(self, tel: Any) -> None:
        self.tel = tel
        self.stage: Any = None
        self.inner: Any = None
        self.own: Any = None  # an update outside any window (before training): its own
        if service.of(tel).idle():
            self.own = tel.phase(voc.UPDATE_WEIGHTS)
            self.own.__enter__()

    def enter(self, name: str, nested: bool = False) -> None:
        current = self.inner if nested else self.stage
        if current is not None and current.name == name:
            return  # the rollout group's half of the call the actor group's opened
        self.close(nested)
        if nested and self.stage is None:
            return
        phase = self.tel.phase(name)
        phase.__enter__()
        if nested:
            self.inner = phase
        else:
            self.stage = phase

    def close(self, inner_only: bool = False, raised: BaseException | None = None) -> None:
        inner, self.inner = self.inner, None
        if inner is not None:
            CHECKPOINT_ENGINE.exit_context(inner, raised)
        if not inner_only:
            stage, self.stage = self.stage, None
            if stage is not None:
                CHECKPOINT_ENGINE.exit_context(stage, raised)

    def end(self, raised: BaseException | None) -> None:
        self.close(False, raised)
        own, self.own = self.own, None
        if own is not None:
            CHECKPOINT_ENGINE.exit_context(own, raised)

    def dispatched(self, method_name: str, args: tuple, kwargs: dict) -> None:
        CHECKPOINT_ENGINE.fault()
        for (method, engine_method), (name, nested) in DISPATCHED.items():
            if method_name.endswith(method) and (
                engine_method is None or _engine_method(args, kwargs) == engine_method
            ):
                self.enter(name, nested)
                return


def _engine_method(args: tuple, kwargs: dict) -> Any:
    """The engine method of a dispatched `execute_checkpoint_engine` (one per rank)."""
    methods = args[0] if args else kwargs.get("method")
    return methods[0] if isinstance(methods, list) and methods else methods


_current: contextvars.ContextVar[_Stages | None] = contextvars.ContextVar(
    "rlotel_weight_sync", default=None
)


def _begin() -> _Stages | None:
    """The update's stages, where this process's telemetry runs: an update before it started
    (verl's first sync, before `fit` declares the driver) must not start a worker's."""
    with CHECKPOINT_ENGINE.guarded():
        tel = rlotel.current()
        if tel is None:
            return None
        CHECKPOINT_ENGINE.fault()
        CHECKPOINT_ENGINE.fired()
        return _Stages(tel)
    return None


def traced_update(original: Callable[..., Any]) -> Callable[..., Any]:
    """`update_weights`' coroutine function, its stages timed (not for `naive`). Called in
    the caller's thread (by verl's `auto_await`), it returns the coroutine, which carries the
    caller's context: where `auto_await` runs it in a thread of its own (sync code called
    while an event loop runs, as one-step-off's trainer does), its windows still nest in the
    caller's."""

    @functools.wraps(original)
    def update_weights(self, *args, **kwargs):
        return _update(contextvars.copy_context(), original, self, args, kwargs)

    return update_weights


async def _update(
    caller: contextvars.Context, original: Callable[..., Any], self: Any, args: tuple, kwargs: dict
) -> Any:
    for variable, value in caller.items():  # a no-op where it runs in the caller's context
        variable.set(value)
    stages = None if getattr(self, "backend", None) == COLOCATED_BACKEND else _begin()
    if stages is None:
        return await original(self, *args, **kwargs)
    token = _current.set(stages)
    raised = None
    try:
        return await original(self, *args, **kwargs)
    except BaseException as error:
        raised = error
        raise
    finally:
        _current.reset(token)
        CHECKPOINT_ENGINE.attempt(stages.end, raised)


def _stage_call(stages: _Stages, name: str) -> bool:
    with CHECKPOINT_ENGINE.guarded():
        CHECKPOINT_ENGINE.fault()
        stages.enter(name)
        return True
    return False


def traced_stage(original: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A manager stage method (a coroutine function, or sync `build_process_group`), a
    window while it runs inside an update."""
    if not inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        def stage(self, *args, **kwargs):
            stages = _current.get()
            if stages is None or not _stage_call(stages, name):
                return original(self, *args, **kwargs)
            try:
                result = original(self, *args, **kwargs)
            except BaseException as error:
                CHECKPOINT_ENGINE.attempt(stages.close, False, error)
                raise
            CHECKPOINT_ENGINE.attempt(stages.close)
            return result

        return stage

    @functools.wraps(original)
    async def async_stage(self, *args, **kwargs):
        stages = _current.get()
        if stages is None or not _stage_call(stages, name):
            return await original(self, *args, **kwargs)
        try:
            result = await original(self, *args, **kwargs)
        except BaseException as error:
            CHECKPOINT_ENGINE.attempt(stages.close, False, error)
            raise
        CHECKPOINT_ENGINE.attempt(stages.close)
        return result

    return async_stage


def traced_execute_all(original: Callable[..., Any]) -> Callable[..., Any]:
    """`RayWorkerGroup.execute_all`: a dispatch inside an update may start its next stage."""

    @functools.wraps(original)
    def execute_all(self, method_name, *args, **kwargs):
        stages = _current.get()
        if stages is not None:
            CHECKPOINT_ENGINE.attempt(stages.dispatched, method_name, args, kwargs)
        return original(self, method_name, *args, **kwargs)

    return execute_all


def update(original: Callable[..., Any]) -> Callable[..., Any]:
    """`CheckpointEngineManager.update_weights` (verl's `auto_await` over a coroutine
    function): the update, its stages timed."""
    from verl.utils.ray_utils import auto_await

    return auto_await(traced_update(original.__wrapped__))


def stage(original: Callable[..., Any]) -> Callable[..., Any]:
    """A manager stage method (`auto_await` over a coroutine function, or sync), by its name."""
    from verl.utils.ray_utils import auto_await

    awaited = getattr(original, "__wrapped__", None)  # `auto_await`'s coroutine function
    if awaited is not None:
        return auto_await(traced_stage(awaited, awaited.__name__))
    return traced_stage(original, original.__name__)
