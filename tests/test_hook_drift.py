"""Every wrapper of the hook registry survives a signature change: called with one extra
positional and one extra keyword argument (what a patch release of the wrapped library may
add), it runs the wrapped function with exactly those arguments and returns its result —
with rlotel's own part working (no failure counted: it read the call and did its work), and
with that hook's fault point made to raise (`guard.inject([hook])`), where the failure is
counted under the hook's own name before its work starts.

The cases come from the registry: a wrapper without a case here fails
`test_every_registered_wrapper_has_a_case`."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import ray  # noqa: F401  (the global verl's Prometheus writer reads; rlotel relabels through it)
import torch

import rlotel
from rlotel.base.drops import HOOK_FAILURES
from rlotel.integrations import (
    collectives,
    data_moves,
    guard,
    process,
    verl,
    verl_captures,
    verl_cluster,
    verl_engines,
    verl_fully_async,
    verl_v1,
    verl_weights,
    verl_workers,
    vllm_engine,
)
from rlotel.integrations.clock_exchange import ClockExchange
from rlotel.integrations.hooks import actor_class
from rlotel.integrations.registered import HOOKS, ROLLOUT_REPLICA
from rlotel.schema import vocabulary as voc

EXTRA = ("added positionally",)
EXTRA_KW = {"added_by_name": 1}
RESULT = "the wrapped function's result"
NO_RESULT = "a context or timer wrapper: nothing returned to compare"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
WRAPPERS = {target.wrapper: hook.name for hook in HOOKS for target in hook.targets}
# wrappers of a constructor: Python wants None back, whatever the original returns
INITS = {t.wrapper for hook in HOOKS for t in hook.targets if t.attribute.endswith(".__init__")}


def _w(module: str, name: str) -> str:
    return f"rlotel.integrations.{module}:{name}"


class Recorder:
    """A stand-in of the wrapped function: what it was called with, and a result."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        self.calls.append((args, kwargs))
        return RESULT


class Instance:
    """The `self` a wrapped method gets: no attribute rlotel could read."""


Case = tuple[Any, tuple, Recorder]


def method(wrap: Callable, *given: Any, instance: Any = None) -> Case:
    """A wrapped method called on an instance with `given`, then the extras."""
    recorder = Recorder()
    arguments = (instance if instance is not None else Instance(), *given, *EXTRA)
    return wrap(recorder)(*arguments, **EXTRA_KW), arguments, recorder


def function(wrap: Callable, *given: Any) -> Case:
    recorder = Recorder()
    arguments = (*given, *EXTRA)
    return wrap(recorder)(*arguments, **EXTRA_KW), arguments, recorder


def awaited(wrapper: Callable, *given: Any, instance: Any = None) -> Case:
    """A wrapped coroutine method, run to its end."""
    recorder = Recorder()

    async def original(*args: Any, **kwargs: Any) -> str:
        return recorder(*args, **kwargs)

    arguments = (instance if instance is not None else Instance(), *given, *EXTRA)
    return asyncio.run(wrapper(original)(*arguments, **EXTRA_KW)), arguments, recorder


def timer() -> Case:
    recorder = Recorder()

    def verl_timer(*args: Any, **kwargs: Any) -> Iterator[None]:
        recorder(*args, **kwargs)
        yield

    arguments = ("gen", {}, *EXTRA)
    generator = verl.traced_timer(verl_timer)(*arguments, **EXTRA_KW)
    next(generator)
    with pytest.raises(StopIteration):
        next(generator)
    return NO_RESULT, arguments, recorder


def agent_loop_method(name: str, mp: pytest.MonkeyPatch) -> Case:
    """V1's agent-loop methods find verl's original by name (Ray pickles them by value)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    recorder = Recorder()

    async def original(*args: Any, **kwargs: Any) -> str:
        return recorder(*args, **kwargs)

    mp.setattr(AgentLoopWorker, name, original)  # verl's, as rlotel finds it
    wrapper = {"_run_agent_loop": verl_v1.run_agent_loop, "_compute_score": verl_v1.compute_score}
    arguments = (AgentLoopWorkerTQ(), [], *EXTRA)
    token = verl_workers._call_carrier.set({"traceparent": TRACEPARENT})  # a traced dispatch
    try:
        return asyncio.run(wrapper[name](*arguments, **EXTRA_KW)), arguments, recorder
    finally:
        verl_workers._call_carrier.reset(token)


class AgentLoopWorkerTQ:
    """An instance of V1's agent-loop worker class, by name."""


def model_turn() -> Case:
    """`LLMServerClient.generate` awaited inside a trajectory: the turn's times are taken."""
    token = verl_v1._trajectory.set(verl_v1.Trajectory(0))
    try:
        return awaited(verl_v1.traced_server_generate, "request-id")
    finally:
        verl_v1._trajectory.reset(token)


def server_release() -> Case:
    token = verl_v1._trajectory.set(verl_v1.Trajectory(0))
    try:
        return method(verl_v1.traced_server_release, "server-1")
    finally:
        verl_v1._trajectory.reset(token)


def tool_call() -> Case:
    token = verl_v1._trajectory.set(verl_v1.Trajectory(0))
    try:
        return awaited(verl_v1.traced_tool_call, types.SimpleNamespace(name="search"))
    finally:
        verl_v1._trajectory.reset(token)


class Partitioned:
    """V1's replay buffer, as rlotel reads it: a partition with no group to record."""

    def __init__(self) -> None:
        self.partitions = {verl_v1.TRAIN_PARTITION: types.SimpleNamespace(groups={})}


class FullyAsyncTrainer:
    """The fully async trainer, as rlotel reads it: verl's Tracking without rlotel's logger."""

    def __init__(self) -> None:
        self.logger = types.SimpleNamespace(logger={})
        self.metrics: dict[str, float] = {}
        self.global_steps = 2


def tracking_init() -> Case:
    """`Tracking.__init__` of a newer verl (its signature gained arguments), naming rlotel's
    logger: rlotel reads the options it knows by their names in that signature."""
    recorder = Recorder()

    def __init__(
        self, project_name, experiment_name, default_backend="console", config=None, *a, **k
    ):
        recorder(self, project_name, experiment_name, default_backend, config, *a, **k)

    tracking = Instance()
    tracking.logger = {}  # type: ignore[attr-defined]
    arguments = (tracking, "project", "run", ["console", verl.BACKEND], None, *EXTRA)
    return verl.tracking_init(__init__)(*arguments, **EXTRA_KW), arguments, recorder


def tracking_finish() -> Case:
    """`Tracking.finish` of a Tracking whose loggers include rlotel's."""
    recorder = Recorder()
    tracking = Instance()
    backend = verl.RlotelBackend.__new__(verl.RlotelBackend)
    backend.tel = types.SimpleNamespace(shutdown=lambda: None)
    tracking.logger = {verl.BACKEND: backend}  # type: ignore[attr-defined]
    arguments = (tracking, *EXTRA)
    return verl.tracking_finish(recorder)(*arguments, **EXTRA_KW), arguments, recorder


def trainer_fit(wrap: Callable, mp: pytest.MonkeyPatch) -> Case:
    """A trainer's `fit`: its process declared the driver (recorded here, not started)."""
    declared: list[Any] = []
    mp.setattr(process, "declare_verl_driver", lambda config, n: declared.append(config))
    mp.setattr(process, "flush_driver", lambda: None)
    mp.setattr(verl_v1, "set_mode", lambda mode: None)
    trainer = types.SimpleNamespace(
        config="the config",
        resource_pool_manager=types.SimpleNamespace(get_n_gpus=lambda: 1),
        _get_n_gpus_for_throughput=lambda: 1,
    )
    case = method(wrap, instance=trainer)
    assert declared in ([], ["the config"])  # [] only where the fault point came first
    return case


def func_generator() -> Case:
    """verl's `func_generator` of a newer verl (one more parameter): rlotel's dispatch,
    execute and collect functions go in around verl's; everything else reaches verl as given."""
    recorder = Recorder()

    def original(self, method_name, dispatch_fn, collect_fn, execute_fn, blocking, *a, **k):
        return recorder(self, method_name, dispatch_fn, collect_fn, execute_fn, blocking, *a, **k)

    dispatch, collect, execute = (lambda *a: None), (lambda *a: None), (lambda *a: None)
    arguments = (Instance(), "update_actor", dispatch, collect, execute, True, *EXTRA)
    result = verl_workers.traced_func_generator(original)(*arguments, **EXTRA_KW)
    for call, _ in recorder.calls:  # by design: verl's two functions inside rlotel's
        call_list = list(call)
        for position, given in ((2, dispatch), (3, collect), (4, execute)):
            if call_list[position] is not given:
                assert call_list[position].__closure__, "not a wrapper of verl's function"
                call_list[position] = given
        recorder.calls[0] = (tuple(call_list), recorder.calls[0][1])
    return result, arguments, recorder


def watched_call() -> Case:
    """verl's Functor (`func_generator`'s, one per method) watched whole by rlotel."""
    recorder = Recorder()
    functor = type("update_actor", (), {"__call__": lambda this, *a, **k: recorder(*a, **k)})()
    watched = data_moves.watched(functor, rlotel.current)
    assert type(watched).__name__ == "update_actor" and isinstance(watched, type(functor))
    return watched(*EXTRA, **EXTRA_KW), EXTRA, recorder


def actor_class_loader() -> Case:
    class Worker:
        def update_actor(self) -> None:
            pass

    return function(verl_workers.traced_class_loader, Worker)


def ray_remote(mp: pytest.MonkeyPatch) -> Case:
    """`ActorMethod._remote(args, kwargs, ...)`: by design the call's kwargs gain Ray's
    trace-context slot inside a phase; everything else reaches Ray as given."""
    mp.setattr(verl_workers, "CLOCK", ClockExchange(lambda: False))  # no clock exchange
    recorder = Recorder()
    actor_method = types.SimpleNamespace(_actor=types.SimpleNamespace(_ray_actor_id="a1"))
    arguments = (actor_method, (1,), {"a": 1}, *EXTRA)
    result = verl_workers.traced_actor_remote(recorder)(*arguments, **EXTRA_KW)
    mp.setattr(verl_workers.CARRIERS, "ray_tracing_on", lambda: False)
    for (_, _, kwargs, *_), _ in recorder.calls:
        kwargs.pop(verl_workers.RAY_CONTEXT_KWARG, None)
    return result, arguments, recorder


def prometheus_writer() -> Case:
    recorder = Recorder()

    def update_prometheus_config(*args: Any, **kwargs: Any) -> str:  # verl's: uses `ray`
        return recorder(*args, **kwargs)

    arguments = ({"rollout": []}, "/tmp/prometheus.yml", *EXTRA)
    wrapped = verl_engines.labelling_writer(update_prometheus_config)
    return wrapped(*arguments, **EXTRA_KW), arguments, recorder


def replica_init() -> Case:
    case = method(verl_engines.traced_replica_init)
    ROLLOUT_REPLICA.state.clear()  # the stand-in replica is forgotten
    return case


def vllm_generate() -> Case:
    """`AsyncLLM.generate`: by design a request made inside a phase gains its context as
    `trace_headers`; everything else reaches vLLM as given."""
    result, arguments, recorder = method(vllm_engine.traced_generate, "prompt")
    for _, kwargs in recorder.calls:
        kwargs.pop("trace_headers", None)
    return result, arguments, recorder


def weights_update() -> Case:
    """`CheckpointEngineManager.update_weights` (verl's `auto_await` over a coroutine)."""
    from verl.utils.ray_utils import auto_await

    recorder = Recorder()

    async def update_weights(*args: Any, **kwargs: Any) -> str:
        return recorder(*args, **kwargs)

    arguments = (Instance(), *EXTRA)
    return (
        verl_weights.update(auto_await(update_weights))(*arguments, **EXTRA_KW),
        arguments,
        recorder,
    )


def weights_stage() -> Case:
    """A manager stage inside an update (its window opened)."""
    from verl.utils.ray_utils import auto_await

    recorder = Recorder()

    async def abort(*args: Any, **kwargs: Any) -> str:
        return recorder(*args, **kwargs)

    stages = verl_weights._begin()
    token = verl_weights._current.set(stages)
    try:
        arguments = (Instance(), *EXTRA)
        return verl_weights.stage(auto_await(abort))(*arguments, **EXTRA_KW), arguments, recorder
    finally:
        verl_weights._current.reset(token)
        if stages is not None:
            stages.close()


def execute_all() -> Case:
    stages = verl_weights._begin()
    token = verl_weights._current.set(stages)
    try:
        return method(verl_weights.traced_execute_all, "execute_checkpoint_engine")
    finally:
        verl_weights._current.reset(token)
        if stages is not None:
            stages.close()


def fully_async(attribute: str, mp: pytest.MonkeyPatch, *given: Any) -> Case:
    """fully async's replacements find verl's original by name on the actor's class (or the
    trainer's module); verl's is the recorder here."""
    from verl.experimental.fully_async_policy import fully_async_rollouter as rollouter
    from verl.experimental.fully_async_policy import fully_async_trainer as trainer

    recorder = Recorder()
    mp.setattr(process, "declare_verl_driver", lambda config, n: None)
    mp.setattr(process, "flush_driver", lambda: None)
    mp.setattr(verl_workers, "worker_telemetry", lambda: None)
    replacement_of_method = attribute.startswith(("trainer.", "rollouter."))
    replacement = {
        "trainer.__init__": verl_fully_async.trainer_init,
        "trainer.fit": verl_fully_async.trainer_fit,
        "trainer._fit_postprocess_step": verl_fully_async.postprocess_step,
        "rollouter.__init__": verl_fully_async.rollouter_init,
    }.get(attribute)
    if replacement is not None:
        where, name = attribute.split(".", 1)
        module = trainer if where == "trainer" else rollouter
        owner = actor_class(
            module.FullyAsyncTrainer if where == "trainer" else module.FullyAsyncRollouter
        )
        if name == "fit":

            async def original(*args: Any, **kwargs: Any) -> str:
                return recorder(*args, **kwargs)

            mp.setattr(owner, name, original)
            arguments = (FullyAsyncTrainer(), *given, *EXTRA)
            return asyncio.run(replacement(*arguments, **EXTRA_KW)), arguments, recorder
        mp.setattr(owner, name, recorder)
    else:
        replacement = {
            "marked_timer": verl_fully_async.marked_timer,
            "assemble_batch_from_rollout_samples": verl_fully_async.assemble_batch,
        }[attribute]
        mp.setattr(trainer, attribute, recorder)
    if not replacement_of_method:
        arguments = (*given, *EXTRA)
        return replacement(*arguments, **EXTRA_KW), arguments, recorder
    arguments = (FullyAsyncTrainer(), *given, *EXTRA)
    return replacement(*arguments, **EXTRA_KW), arguments, recorder


def param_sync(mp: pytest.MonkeyPatch) -> Case:
    """fully async's `marked_timer("timing_s/param_sync", timing_raw, ...)`: by design verl's
    timer runs under rlotel's window name with a dict of its own (the seconds land in verl's
    `timing_raw` under verl's key); every other argument reaches verl as given."""
    import contextlib

    from verl.experimental.fully_async_policy import fully_async_trainer as trainer

    recorder = Recorder()

    @contextlib.contextmanager
    def marked_timer(*args: Any, **kwargs: Any) -> Iterator[None]:
        recorder(*args, **kwargs)
        yield

    mp.setattr(trainer, "marked_timer", marked_timer)
    timing_raw: dict[str, float] = {}
    arguments = (verl_fully_async.VERL_PARAM_SYNC, timing_raw, *EXTRA)
    with verl_fully_async.marked_timer(*arguments, **EXTRA_KW):
        pass
    (call, kwargs), *_ = recorder.calls
    if call[0] == voc.PARAM_SYNC:  # rlotel's part ran
        assert verl_fully_async.VERL_PARAM_SYNC in timing_raw
        recorder.calls[0] = ((*arguments[:2], *call[2:]), kwargs)
    return NO_RESULT, arguments, recorder


def finish_command() -> Case:
    return method(verl_captures.finish_command, "upload --key=x")


def oom_snapshot() -> Case:
    """verl's OOM callback on a profiler that saves nowhere yet (no snapshot to link)."""
    profiler = types.SimpleNamespace(config=types.SimpleNamespace(save_path="/nonexistent"))
    return method(verl_captures.traced_oom, 0, 1 << 30, 1 << 34, 0, instance=profiler)


def subprocess_spy() -> Case:
    recorder = Recorder()
    spy = verl_captures.SubprocessSpy(types.SimpleNamespace(Popen=recorder))
    arguments = (["upload"], *EXTRA)
    return spy.Popen(*arguments, **EXTRA_KW), arguments, recorder


CONFIG = types.SimpleNamespace(trainer=types.SimpleNamespace(experiment_name="drift"))
CASES: dict[str, Callable[[pytest.MonkeyPatch], Case]] = {
    _w("verl_cluster", "forwarding_runtime_env"): lambda mp: function(
        verl_cluster.forwarding_runtime_env, None
    ),
    _w("verl", "traced_timer"): lambda mp: timer(),
    _w("verl_captures", "SubprocessSpy"): lambda mp: subprocess_spy(),
    _w("verl_captures", "finish_command"): lambda mp: finish_command(),
    _w("verl_captures", "traced_oom"): lambda mp: oom_snapshot(),
    _w("verl", "tracking_init"): lambda mp: tracking_init(),
    _w("verl", "tracking_finish"): lambda mp: tracking_finish(),
    _w("verl", "performance_metrics"): lambda mp: method(
        verl.performance_metrics, {"m": [1.0]}, None
    ),
    _w("verl", "v0_fit"): lambda mp: trainer_fit(verl.v0_fit, mp),
    _w("verl_v1", "traced_fit"): lambda mp: trainer_fit(verl_v1.traced_fit, mp),
    _w("verl_v1", "run_agent_loop"): lambda mp: agent_loop_method("_run_agent_loop", mp),
    _w("verl_v1", "compute_score"): lambda mp: agent_loop_method("_compute_score", mp),
    _w("verl_v1", "traced_server_generate"): lambda mp: model_turn(),
    _w("verl_v1", "traced_server_release"): lambda mp: server_release(),
    _w("verl_v1", "traced_tool_call"): lambda mp: tool_call(),
    _w("verl_v1", "traced_materialize"): lambda mp: method(verl_v1.traced_materialize, "val"),
    _w("verl_v1", "traced_evict"): lambda mp: method(
        verl_v1.traced_evict, 3, "val", [set(), set(), set()], instance=Partitioned()
    ),
    _w("verl_v1", "traced_clear"): lambda mp: method(
        verl_v1.traced_clear, "val", ["uid"], instance=Partitioned()
    ),
    _w("verl_workers", "traced_func_generator"): lambda mp: func_generator(),
    _w("verl_weights", "update"): lambda mp: weights_update(),
    _w("verl_weights", "stage"): lambda mp: weights_stage(),
    _w("verl_weights", "traced_execute_all"): lambda mp: execute_all(),
    _w("verl_engines", "labelling_writer"): lambda mp: prometheus_writer(),
    _w("verl_engines", "traced_replica_init"): lambda mp: replica_init(),
    _w("verl_fully_async", "trainer_init"): lambda mp: fully_async(
        "trainer.__init__", mp, CONFIG, None, None, types.SimpleNamespace(get_n_gpus=lambda: 1)
    ),
    _w("verl_fully_async", "rollouter_init"): lambda mp: fully_async(
        "rollouter.__init__", mp, CONFIG
    ),
    _w("verl_fully_async", "trainer_fit"): lambda mp: fully_async("trainer.fit", mp),
    _w("verl_fully_async", "postprocess_step"): lambda mp: fully_async(
        "trainer._fit_postprocess_step", mp
    ),
    _w("verl_fully_async", "marked_timer"): param_sync,
    _w("verl_fully_async", "assemble_batch"): lambda mp: fully_async(
        "assemble_batch_from_rollout_samples", mp, []
    ),
    _w("verl_workers", "traced_actor_remote"): ray_remote,
    _w("verl_workers", "traced_class_loader"): lambda mp: actor_class_loader(),
    _w("vllm_engine", "traced_engine_init"): lambda mp: method(
        vllm_engine.traced_engine_init,
        types.SimpleNamespace(
            observability_config=types.SimpleNamespace(otlp_traces_endpoint="http://own:4318")
        ),
    ),
    _w("vllm_engine", "traced_generate"): lambda mp: vllm_generate(),
    _w("vllm_engine", "checked_exporter"): lambda mp: function(
        vllm_engine.checked_exporter, "http://c:4318"
    ),
    _w("collectives", "timed"): lambda mp: function(collectives.timed, torch.zeros(1)),
    _w("data_moves", "traced_tq_put"): lambda mp: awaited(data_moves.traced_tq_put, torch.ones(2)),
    _w("data_moves", "traced_tq_get"): lambda mp: awaited(data_moves.traced_tq_get, None),
    _w("data_moves", "traced_getstate"): lambda mp: method(data_moves.traced_getstate),
    _w("data_moves", "traced_setstate"): lambda mp: method(data_moves.traced_setstate, {"b": 1}),
    _w("data_moves", "traced_mq_put"): lambda mp: awaited(data_moves.traced_mq_put, b"sample"),
    _w("data_moves", "traced_mq_get"): lambda mp: awaited(data_moves.traced_mq_get),
    _w("collectives", "timed_wait"): lambda mp: method(collectives.timed_wait),
}
# Wrappers with no rlotel work of their own to fail: what their hook does happens elsewhere.
PLUMBING = {
    _w("verl_captures", "SubprocessSpy"): "keeps the finish hook's process for finish_command",
}
# Targets that are data, not calls (checked in their own test below).
DATA = {_w("verl", "with_rlotel_backend")}
# Wrappers rlotel puts in at run time, inside a registered hook (named by that hook).
INNER: dict[str, tuple[str, Callable[[pytest.MonkeyPatch], Case]]] = {
    "worker-group execute": (
        "verl_worker_group",
        lambda mp: function(lambda fn: verl_workers.traced_execute(fn, True), "update_actor"),
    ),
    "worker-group collect": (
        "verl_worker_group",
        lambda mp: function(verl_workers.traced_collect, None, [1, 2]),
    ),
    "worker-group dispatch": (
        "verl_worker_group",
        lambda mp: function(data_moves.traced_dispatch, None, "update_actor"),
    ),
    "worker-group call": ("verl_worker_group", lambda mp: watched_call()),
}


def test_every_registered_wrapper_has_a_case() -> None:
    assert set(WRAPPERS) == set(CASES) | DATA


@pytest.fixture(params=["rlotel working", "rlotel failing"])
def failing(request: pytest.FixtureRequest) -> Iterator[bool]:
    yield request.param == "rlotel failing"
    guard.inject([])


def _run(
    hook: str, case: Callable, failing: bool, make_tel, mp: pytest.MonkeyPatch, init: bool = False
) -> None:
    tel = make_tel()
    mp.setattr(verl_workers.CARRIERS, "ray_tracing_on", lambda: False)
    guard.inject([hook] if failing else [])
    collective_tally = collectives.open_tally()  # the collective wrappers time this call
    before = HOOK_FAILURES.snapshot().get(hook, 0)
    try:
        with tel.step(1), tel.phase("gen"):  # rlotel's part has a phase to work in
            result, arguments, recorder = case(mp)
    finally:
        guard.inject([])
        collectives.close_tally(collective_tally)
    assert recorder.calls == [(arguments, EXTRA_KW)]
    if isinstance(result, vllm_engine.DeliveryCheck):  # vLLM's exporter, checked on delivery
        assert result._exporter == RESULT
    elif init:
        assert result is None, result
    elif result is not NO_RESULT:  # a wrapper that drops `return` fails here
        assert result == RESULT, result
    failures = HOOK_FAILURES.snapshot().get(hook, 0) - before
    if failing:  # its fault point was reached (before its own work: the call ran as verl's)
        assert failures >= 1, f"the {hook} hook's fault point was not reached"
    else:  # rlotel's part read the call and did its work
        assert failures == 0, f"{failures} failures of {hook} counted"


@pytest.mark.parametrize("wrapper", sorted(set(CASES) - set(PLUMBING)))
def test_the_wrapped_function_gets_exactly_the_new_arguments(
    wrapper: str, failing: bool, make_tel, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(WRAPPERS[wrapper], CASES[wrapper], failing, make_tel, monkeypatch, wrapper in INITS)


@pytest.mark.parametrize("inner", sorted(INNER))
def test_wrappers_made_at_run_time_get_exactly_the_new_arguments(
    inner: str, failing: bool, make_tel, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook, case = INNER[inner]
    _run(hook, case, failing, make_tel, monkeypatch)


@pytest.mark.parametrize("wrapper", sorted(PLUMBING))
def test_plumbing_passes_the_new_arguments_through(
    wrapper: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, arguments, recorder = CASES[wrapper](monkeypatch)
    assert recorder.calls == [(arguments, EXTRA_KW)]


def test_rlotels_logger_joins_verls_without_changing_verls_list() -> None:
    supported = ["console", "wandb"]
    assert verl.with_rlotel_backend(supported) == ["console", "wandb", verl.BACKEND]
    assert supported == ["console", "wandb"]


def test_a_worker_method_with_a_trace_context_gets_exactly_its_arguments(make_tel) -> None:
    """`wrap_actor_methods`' wrappers (inside `ray_actor_class`): Ray strips its trace-context
    slot before the method runs; this stand-in keeps it."""
    tel = make_tel()
    recorder = Recorder()
    arguments = (Instance(), *EXTRA)
    given = {**EXTRA_KW, verl_workers.RAY_CONTEXT_KWARG: {"traceparent": TRACEPARENT}}
    with tel.step(1), tel.phase("gen"):
        result = verl_workers._traced(recorder, "update_actor")(*arguments, **given)
    (call,) = recorder.calls
    assert call[1].pop(verl_workers.RAY_CONTEXT_KWARG) == given[verl_workers.RAY_CONTEXT_KWARG]
    assert call == (arguments, EXTRA_KW) and result == RESULT


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
