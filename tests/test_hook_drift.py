"""Every wrapper rlotel puts into verl's, Ray's, torch's or vLLM's call path survives a
signature change: called with one extra positional and one extra keyword argument (what a
patch release of the wrapped library may add), it runs the wrapped function with exactly
those arguments and returns its result — with rlotel's own part working, and with it made
to raise (`guard.inject`), where the failure is counted by hook."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from rlotel.base.drops import HOOK_FAILURES
from rlotel.integrations import (
    collectives,
    guard,
    verl,
    verl_engines,
    verl_v1,
    verl_workers,
    vllm_engine,
)

EXTRA = ("added positionally",)
EXTRA_KW = {"added_by_name": 1}
RESULT = "the wrapped function's result"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Recorder:
    """A stand-in of the wrapped function: what it was called with, and a result."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        self.calls.append((args, kwargs))
        return RESULT


class Instance:
    """The `self` a wrapped method gets: no attribute rlotel could read."""


def timer(wrap: Callable) -> tuple[Any, tuple, Recorder]:
    recorder = Recorder()

    def verl_timer(*args: Any, **kwargs: Any) -> Iterator[None]:
        recorder(*args, **kwargs)
        yield

    arguments = ("gen", {}, *EXTRA)
    generator = wrap(verl_timer)(*arguments, **EXTRA_KW)
    next(generator)
    with pytest.raises(StopIteration):
        next(generator)
    return None, arguments, recorder


def method(wrap: Callable, *given: Any) -> tuple[Any, tuple, Recorder]:
    """A wrapped method called on an instance with `given`, then the extras."""
    recorder = Recorder()
    arguments = (Instance(), *given, *EXTRA)
    return wrap(recorder)(*arguments, **EXTRA_KW), arguments, recorder


def function(wrap: Callable, *given: Any) -> tuple[Any, tuple, Recorder]:
    recorder = Recorder()
    arguments = (*given, *EXTRA)
    return wrap(recorder)(*arguments, **EXTRA_KW), arguments, recorder


def coroutine(name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, tuple, Recorder]:
    """V1's agent-loop methods find verl's original by name (Ray pickles them by value)."""
    recorder = Recorder()

    async def original(*args: Any, **kwargs: Any) -> str:
        return recorder(*args, **kwargs)

    monkeypatch.setattr(verl_v1, "_agent_loop_original", lambda wanted: original)
    wrapper = {"_run_agent_loop": verl_v1.run_agent_loop, "_compute_score": verl_v1.compute_score}
    arguments = (AgentLoopWorkerTQ(), [], *EXTRA)
    token = verl_workers._call_carrier.set({"traceparent": TRACEPARENT})  # a traced dispatch
    try:
        return asyncio.run(wrapper[name](*arguments, **EXTRA_KW)), arguments, recorder
    finally:
        verl_workers._call_carrier.reset(token)


def model_turn() -> tuple[Any, tuple, Recorder]:
    """`LLMServerClient.generate` awaited inside a trajectory: the turn's times are taken."""
    recorder = Recorder()

    async def generate(*args: Any, **kwargs: Any) -> str:
        return recorder(*args, **kwargs)

    arguments = (Instance(), "request-id", *EXTRA)
    token = verl_v1._trajectory_turns.set([])
    try:
        wrapped = verl_v1._server_generate(generate)
        return asyncio.run(wrapped(*arguments, **EXTRA_KW)), arguments, recorder
    finally:
        verl_v1._trajectory_turns.reset(token)


def actor_class(wrap: Callable) -> tuple[Any, tuple, Recorder]:
    class Worker:
        def update_actor(self) -> None:
            pass

    return function(wrap, Worker)


def actor_method(wrap: Callable) -> tuple[Any, tuple, Recorder]:
    """A worker method called with a trace context in Ray's slot (Ray strips the slot
    before the method runs; this stand-in keeps it)."""
    recorder = Recorder()
    arguments = (Instance(), *EXTRA)
    given = {**EXTRA_KW, verl_workers.RAY_CONTEXT_KWARG: {"traceparent": TRACEPARENT}}
    result = wrap(recorder, "update_actor")(*arguments, **given)
    for _, kwargs in recorder.calls:
        assert kwargs.pop(verl_workers.RAY_CONTEXT_KWARG) == given[verl_workers.RAY_CONTEXT_KWARG]
    return result, arguments, recorder


def tracking_init() -> tuple[Any, tuple, Recorder]:
    """`Tracking.__init__` of a newer verl (its signature gained arguments), naming rlotel's
    logger: rlotel reads the options it knows by their names in that signature."""
    recorder = Recorder()

    def __init__(
        self, project_name, experiment_name, default_backend="console", config=None, *a, **k
    ):
        recorder(self, project_name, experiment_name, default_backend, config, *a, **k)

    arguments = (Instance(), "project", "run", ["console", verl.BACKEND], None, *EXTRA)
    return verl.tracking_init(__init__)(*arguments, **EXTRA_KW), arguments, recorder


def tracking_finish() -> tuple[Any, tuple, Recorder]:
    """`Tracking.finish` of a Tracking whose loggers include rlotel's."""
    recorder = Recorder()
    tracking = Instance()
    backend = verl.RlotelBackend.__new__(verl.RlotelBackend)
    backend.tel = types.SimpleNamespace(shutdown=lambda: None)
    tracking.logger = {verl.BACKEND: backend}  # type: ignore[attr-defined]
    arguments = (tracking, *EXTRA)
    return verl.tracking_finish(recorder)(*arguments, **EXTRA_KW), arguments, recorder


class AgentLoopWorkerTQ:
    """An instance of V1's agent-loop worker class, by name."""


def replica(wrap: Callable) -> tuple[Any, tuple, Recorder]:
    recorder = Recorder()

    class RolloutReplica:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            recorder(self, *args, **kwargs)

    wrap(types.SimpleNamespace(RolloutReplica=RolloutReplica))
    instance = RolloutReplica(*EXTRA, **EXTRA_KW)
    verl_engines._patches.undo()
    return None, (instance, *EXTRA), recorder


def ray_remote(wrap: Callable, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, tuple, Recorder]:
    """`ActorMethod._remote(args, kwargs, ...)`: by design the call's kwargs gain Ray's
    trace-context slot inside a phase; everything else reaches Ray as given."""
    monkeypatch.setattr(verl_workers, "_clock_reference", [False])  # no clock exchange
    monkeypatch.setattr(verl_workers, "_clock_done", set())
    recorder = Recorder()
    actor_method = types.SimpleNamespace(_actor=types.SimpleNamespace(_ray_actor_id="a1"))
    arguments = (actor_method, (1,), {"a": 1}, *EXTRA)
    result = wrap(recorder, recorder)(*arguments, **EXTRA_KW)
    for (_, _, kwargs, *_), _ in recorder.calls:
        kwargs.pop(verl_workers.RAY_CONTEXT_KWARG, None)
    return result, arguments, recorder


def prometheus_writer(wrap: Callable) -> tuple[Any, tuple, Recorder]:
    recorder = Recorder()

    def update_prometheus_config(*args: Any, **kwargs: Any) -> str:  # verl's: uses `ray`
        return recorder(*args, **kwargs)

    arguments = ({"rollout": []}, "/tmp/prometheus.yml", *EXTRA)
    return wrap(update_prometheus_config)(*arguments, **EXTRA_KW), arguments, recorder


def vllm_generate() -> tuple[Any, tuple, Recorder]:
    """`AsyncLLM.generate`: by design a request made inside a phase gains its context as
    `trace_headers`; everything else reaches vLLM as given."""
    result, arguments, recorder = method(vllm_engine._generate, "prompt")
    for _, kwargs in recorder.calls:
        kwargs.pop("trace_headers", None)
    return result, arguments, recorder


WRAPPERS: dict[str, Callable[[pytest.MonkeyPatch], tuple[Any, tuple, Recorder]]] = {
    "verl timer": lambda mp: timer(verl.traced_timer),
    "Tracking.__init__": lambda mp: tracking_init(),
    "Tracking.finish": lambda mp: tracking_finish(),
    "agent-loop metrics": lambda mp: method(verl.performance_metrics, {"m": [1.0]}, None),
    "V0 fit": lambda mp: method(verl.v0_fit),
    "V1 fit": lambda mp: method(verl_v1._fit),
    "V1 replay batch": lambda mp: method(verl_v1._materialize_batch, "train"),
    "V1 trajectory": lambda mp: coroutine("_run_agent_loop", mp),
    "V1 score": lambda mp: coroutine("_compute_score", mp),
    "V1 model turn": lambda mp: model_turn(),
    "worker-group execute": lambda mp: function(
        lambda fn: verl_workers.traced_execute(fn, True), "update_actor"
    ),
    "worker-group collect": lambda mp: function(verl_workers.traced_collect, None, [1, 2]),
    "Ray actor submit": lambda mp: ray_remote(verl_workers.traced_remote, mp),
    "Ray actor class": lambda mp: actor_class(verl_workers.traced_class_loader),
    "Ray actor method": lambda mp: actor_method(verl_workers._traced),
    "verl Prometheus writer": lambda mp: prometheus_writer(verl_engines.labelling_writer),
    "verl rollout replica": lambda mp: replica(verl_engines.patch_replica),
    "torch collective": lambda mp: function(collectives._timed, "tensor"),
    "torch Work.wait": lambda mp: method(collectives._timed_wait),
    "vLLM engine": lambda mp: method(vllm_engine._engine_init, types.SimpleNamespace()),
    "vLLM generate": lambda mp: vllm_generate(),
    "vLLM span exporter": lambda mp: function(vllm_engine._checked_exporter, "http://c:4318"),
}


@pytest.fixture(params=["rlotel working", "rlotel failing"])
def faults(request: pytest.FixtureRequest) -> Iterator[bool]:
    failing = request.param == "rlotel failing"
    guard.inject([guard.ALL] if failing else [])
    yield failing
    guard.inject([])


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_the_wrapped_function_gets_exactly_the_new_arguments(
    wrapper: str, faults: bool, make_tel, monkeypatch: pytest.MonkeyPatch
) -> None:
    tel = make_tel()
    monkeypatch.setitem(verl_workers._installed, "ray_tracing_on", lambda: False)
    collective_tally = collectives.open_tally()  # the collective wrappers time this call
    before = sum(HOOK_FAILURES.snapshot().values())
    try:
        with tel.step(1), tel.phase("gen"):  # rlotel's part has a phase to work in
            result, arguments, recorder = WRAPPERS[wrapper](monkeypatch)
    finally:
        collectives.close_tally(collective_tally)
    assert recorder.calls == [(arguments, EXTRA_KW)], wrapper
    if result is not None and not isinstance(result, vllm_engine.DeliveryCheck):
        assert result == RESULT
    if faults:
        assert sum(HOOK_FAILURES.snapshot().values()) > before, "the failure was not counted"


def test_a_raising_wrapped_function_raises_through_unchanged(make_tel) -> None:
    """The wrapped code's own exception is the one the caller sees, with rlotel failing
    on the way out too."""
    make_tel()

    class VerlError(Exception):
        pass

    def verl_timer(name: str, timing_raw: dict) -> Iterator[None]:
        yield

    timing_raw: dict[str, float] = {}
    guard.inject([guard.ALL])
    try:
        with pytest.raises(VerlError):
            generator = verl.traced_timer(verl_timer)("update_actor", timing_raw)
            next(generator)
            generator.throw(VerlError("verl's own"))
    finally:
        guard.inject([])

    def failing_method(self: Any) -> None:
        raise VerlError("the worker method's own")

    traced = verl_workers._traced(failing_method, "update_actor")
    with pytest.raises(VerlError, match="worker method's own"):
        traced(Instance())
