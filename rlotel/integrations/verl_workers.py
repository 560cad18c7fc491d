"""verl's Ray actors across processes: one trace per step, no carrier in user code.

Caller: every Ray actor call made inside an rlotel phase (verl's worker groups, agent-loop
and reward workers, rollout servers) sends that phase's W3C trace context, plus the run as
W3C baggage, in Ray's own per-call trace-context slot: every Ray actor method accepts a
`_ray_trace_ctx` keyword (Ray adds it to each method's signature) and Ray strips it before
the method runs. Ray fills it only when its own tracing is on (then this module stays out
of the way); otherwise rlotel submits the call with the slot filled. A blocking
worker-group call also times each rank's reply, so the caller's phase span names the
slowest rank and the spread.

Worker: when Ray loads an actor class in a worker process it injects its tracing wrappers
(`_inject_tracing_into_class`); rlotel wraps the wrapped methods once more, so a call that
arrives with a context runs as a phase whose parent is the driver's phase, and verl's timers
inside nest under it. The worker's telemetry starts on first use, with `rl.role`, `rl.rank`,
`rl.node` (and `rl.replica` for rollout) as resource attributes; its `/metrics` is
registered for Prometheus file discovery and `RLOTEL_TRACES_DIR` gives it a file of its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import rlotel
from rlotel.base import clock, env
from rlotel.integrations import collectives, data_moves, guard, service, verl_captures
from rlotel.integrations.clock_exchange import CLOCK_KEY, ClockExchange
from rlotel.integrations.data_moves import RankReply
from rlotel.integrations.registered import (
    RAY_ACTOR_CLASS,
    RAY_ACTOR_SUBMIT,
    TORCH_COLLECTIVE,
    WORKER_GROUP,
)
from rlotel.record.propagation import run_of, traceparent, with_run
from rlotel.record.ranks import RankTime
from rlotel.schema import attributes as attr
from rlotel.schema import data_moves as dm
from rlotel.schema import vocabulary

log = logging.getLogger("rlotel")

RAY_CONTEXT_KWARG = "_ray_trace_ctx"  # Ray's per-call trace-context slot
TRACEPARENT = "traceparent"
REPLY_KEY = "rlotel-reply"  # the caller unwraps a `RankReply`: send compute seconds with it
FUSED_METHOD_SEPARATOR = "_fwmn_"  # verl's fused-worker method names: "{cls}_fwmn_{method}"
_TRACED_MARK = "__rlotel_traced__"

_init_lock = threading.Lock()
_call_carrier: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "rlotel_call_carrier", default=None
)
# Set while a blocking worker-group call submits: its calls ask for `RankReply`s, which
# the same call's collect step unwraps (`traced_collect`) before verl sees the results.
_replies_wanted: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "rlotel_replies_wanted", default=False
)


# --- driver ------------------------------------------------------------------------------


# the driver's clock is the reference: a Ray driver outside actors, or the process that
# declares it (verl's TaskRunner runs the trainer loop inside an actor)
CLOCK = ClockExchange(lambda: not in_ray_actor())


class Carriers:
    """What the driver sends with actor calls: inside a phase its context (calls from one
    phase share one carrier); outside phases only the run, on the first call to each actor."""

    def __init__(self) -> None:
        self._phase: tuple[tuple[int, int] | None, dict[str, str] | None] = (None, None)
        self._run: tuple[str | None, dict[str, str]] = (None, {})
        self._told: set[tuple[str, Any]] = set()  # (run, actor) sent the run's carrier
        self.ray_tracing_on: Callable[[], bool] = lambda: False  # Ray's own fills the slot

    def of_phase(self, ids: tuple[int, int], run: str) -> dict[str, str]:
        last_ids, carrier = self._phase
        if ids != last_ids or carrier is None:
            carrier = with_run(traceparent(*ids), run)
            self._phase = (ids, carrier)
        return carrier

    def of_run(self, run: str, actor: Any) -> dict[str, str] | None:
        """The run's baggage-only carrier, unless `actor` got it already."""
        if actor is not None:
            if (run, actor) in self._told:
                return None
            self._told.add((run, actor))
        if self._run[0] != run:
            self._run = (run, with_run({}, run))
        return self._run[1]


class Hosted:
    """What a worker process knows before its telemetry starts: the actor class it hosts
    (the first Ray loads in it) and the run a caller named (baggage)."""

    def __init__(self) -> None:
        self.actor_class: type | None = None
        self.run: str | None = None


CARRIERS = Carriers()
HOSTED = Hosted()


def _carrier(tel: Any, actor: Any = None) -> dict[str, str] | None:
    """The context to send: the driver's innermost open phase, if there is one (and Ray's
    own tracing, which fills the slot itself, is off). Calls from one phase share one.
    Outside phases only the run travels, on the first call to each actor: every filled
    slot costs Ray's submit ~40 µs (one more argument to serialize)."""
    if tel is None or CARRIERS.ray_tracing_on():
        return None
    try:
        ids = service.of(tel).context_ids()
    except Exception as error:
        service.of(tel).dropped("spans", "internal_error", f"worker-group context: {error!r}")
        return None
    if ids is None:  # outside any phase: the run still travels (a worker's first call)
        return CARRIERS.of_run(service.of(tel).run, actor)
    return CARRIERS.of_phase(ids, service.of(tel).run)


def traced_execute(execute_fn: Callable[..., Any], blocking: bool) -> Callable[..., Any]:
    """verl's execute function (execute_all, execute_rank_zero): a blocking call on several
    ranks made inside a phase times each rank's reply (the context travels with every
    actor call anyway: `_remote`)."""

    def execute(*args: Any, **kwargs: Any) -> Any:
        tel = None
        with WORKER_GROUP.guarded():
            WORKER_GROUP.fault()
            current = rlotel.current() if blocking else None
            if current is not None and service.of(current).in_trace():
                tel = current
                WORKER_GROUP.fired()
        if tel is None:
            return execute_fn(*args, **kwargs)
        started = time.perf_counter()
        token = _replies_wanted.set(True)
        try:
            output = execute_fn(*args, **kwargs)
        finally:
            _replies_wanted.reset(token)
        data_moves.mark(dm.SUBMIT)
        if isinstance(output, list) and (len(output) > 1 or (CLOCK.awaiting and output)):
            _time_replies(tel, output, started)
        elif data_moves.CALL.get() is not None:
            WORKER_GROUP.attempt(_wait_all, output)  # what follows is fetching, not waiting
        data_moves.mark(dm.WAIT)
        return output

    return execute


def traced_collect(collect_fn: Callable[..., Any]) -> Callable[..., Any]:
    """verl's collect function, given the replies of a blocking call: ranks that sent
    their compute seconds (`RankReply`) are unwrapped first, so verl collects exactly what
    the worker methods returned; the innermost open phase records them."""

    def collect(worker_group: Any, output: Any, *args: Any, **kwargs: Any) -> Any:
        moves = data_moves.CALL.get()
        try:
            WORKER_GROUP.fault()
            if moves is not None:
                moves.mark(dm.FETCH)  # verl's `ray.get` since the last reply was in
                replies = output if isinstance(output, list) else [output]
                moves.replied([item for item in replies if type(item) is RankReply])
            opened = open_replies(output)
            if moves is not None:
                moves.add(f"{dm.RETURNED}_bytes", data_moves.nbytes(opened))
        except Exception as error:
            WORKER_GROUP.failed(error)
            opened = unwrapped(output)
        result = collect_fn(worker_group, opened, *args, **kwargs)
        if moves is not None:
            moves.mark(dm.COLLECT)
        return result

    return collect


def unwrapped(output: Any) -> Any:
    """`output` with every `RankReply` replaced by its value, nothing recorded: what verl
    must collect even when rlotel's part failed."""
    if type(output) is RankReply:
        return output.value
    if isinstance(output, list):
        return [item.value if type(item) is RankReply else item for item in output]
    return output


def _wait_all(output: Any) -> None:
    """Until every reply of a call is in (a call whose replies are not timed)."""
    import ray

    given = output if isinstance(output, list) else [output]
    refs = [ref for ref in given if isinstance(ref, ray.ObjectRef)]
    if refs:
        ray.wait(refs, num_returns=len(refs))


def open_replies(output: Any) -> Any:
    """`output` with every `RankReply` replaced by its value (rank = position in the list);
    two or more of them are recorded as the ranks' compute of the innermost open phase."""
    if type(output) is RankReply:
        return output.value
    if not isinstance(output, list) or not any(type(item) is RankReply for item in output):
        return output
    replies = {rank: item for rank, item in enumerate(output) if type(item) is RankReply}
    tel = rlotel.current()
    if tel is not None and len(replies) > 1:
        tel.record_rank_compute(replies)  # never raises
    return unwrapped(output)


def _time_replies(tel: Any, refs: list[Any], started: float) -> None:
    """Seconds until each rank's reply, waited for here instead of in verl's `ray.get`
    (which then returns at once): the driver is blocked on them either way. Meanwhile the
    ranks not yet replied are known, so a stall of the phase names them. Every reply in at
    once is taken in one wait; only when none is in does it block, until the next 1/32 of
    the pending ones are (the last 32 one by one): replies that arrive together cost
    O(ranks), replies that trickle in O(ranks) a wake and a few dozen wakes, not a wait per
    rank over every pending one (quadratic: 1,024 ready replies took 0.8 s). A reply's time
    is exact for the last ranks, the stragglers, and within the time 1/32 of the others take
    to arrive for the rest."""
    wait = None
    try:
        import ray

        seconds: dict[int, float] = {}
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        pending = list(refs)
        wait = tel.waiting_on_ranks(set(rank_of.values()), refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
            if not ready:  # none in yet: blocked until the next few are, no polling
                ready, pending = ray.wait(pending, num_returns=max(1, len(pending) // 32))
            now = time.perf_counter()
            if CLOCK.awaiting:
                CLOCK.replied(ready)
            ranks = [rank_of[ref] for ref in ready]
            for rank in ranks:
                seconds[rank] = now - started
            if wait is not None:
                wait.replied(ranks)
        if len(refs) > 1:
            tel.record_rank_seconds(seconds)
    except Exception as error:  # timing is never worth failing the call for
        service.of(tel).dropped("spans", "internal_error", f"worker-group reply timing: {error!r}")
    finally:
        tel.done_waiting(wait)


def traced_remote(original: Callable[..., Any], raw: Callable[..., Any]) -> Callable[..., Any]:
    """`ActorMethod._remote` that fills Ray's context slot with the innermost open phase:
    every actor call made inside a phase (worker groups, agent-loop and reward workers,
    rollout servers) carries it. Submitted past Ray's tracing wrapper, which rejects a
    filled slot while Ray's own tracing is off."""

    def _remote(self, args=None, kwargs=None, *rest, **options):
        try:
            carrier, stamped, actor = _submit_carrier(self, kwargs)
        except Exception as error:
            RAY_ACTOR_SUBMIT.failed(error)
            carrier = None
        if carrier is not None:
            try:
                ref = raw(
                    self, args, {**(kwargs or {}), RAY_CONTEXT_KWARG: carrier}, *rest, **options
                )
            except TypeError as error:  # a method whose signature lacks Ray's slot
                guard.warn_once(
                    "no_slot", "rlotel: actor call sent without trace context: %r", error
                )
            else:
                if stamped:
                    RAY_ACTOR_SUBMIT.attempt(CLOCK.sent, ref, actor)
                return ref
        return original(self, args, kwargs, *rest, **options)

    return _remote


def _submit_carrier(method: Any, kwargs: Any) -> tuple[dict[str, str] | None, bool, Any]:
    """(the carrier to send with this actor call or None, whether it carries a clock stamp,
    the actor)."""
    tel = rlotel.current()
    if tel is None or (kwargs and RAY_CONTEXT_KWARG in kwargs):
        return None, False, None
    RAY_ACTOR_SUBMIT.fault()
    actor = getattr(method._actor, "_ray_actor_id", None)
    carrier = _carrier(tel, actor)
    stamped = False
    if carrier is not None:
        RAY_ACTOR_SUBMIT.fired()
        if actor not in CLOCK.done and TRACEPARENT in carrier:
            carrier, stamped = CLOCK.stamp(actor, carrier)
        if _replies_wanted.get() and TRACEPARENT in carrier:
            carrier = {**carrier, REPLY_KEY: "1"}
    return carrier, stamped, actor


def traced_actor_remote(original: Callable[..., Any]) -> Callable[..., Any]:
    """`ActorMethod._remote`: every Ray actor call made inside a phase carries its context."""
    from ray.util.tracing import tracing_helper

    CARRIERS.ray_tracing_on = tracing_helper._is_tracing_enabled
    return traced_remote(original, inspect.unwrap(original))


def traced_func_generator(original: Callable[..., Any]) -> Callable[..., Any]:
    """verl's `func_generator(self, method_name, dispatch_fn, collect_fn, execute_fn,
    blocking)` (worker groups bound from now on), given rlotel's execute and collect
    functions around verl's: each rank's reply time and compute seconds."""
    parameters = inspect.signature(original)

    def func_generator(*args: Any, **kwargs: Any) -> Any:
        try:
            WORKER_GROUP.fault()
            given = parameters.bind(*args, **kwargs)
            options = given.arguments
            options["execute_fn"] = traced_execute(options["execute_fn"], options["blocking"])
            options["collect_fn"] = traced_collect(options["collect_fn"])
            options["dispatch_fn"] = data_moves.traced_dispatch(options["dispatch_fn"])
            blocking = options["blocking"]
        except Exception as error:
            WORKER_GROUP.failed(error)
            return original(*args, **kwargs)
        functor = original(*given.args, **given.kwargs)
        if not blocking:
            return functor
        try:
            return data_moves.watched(functor, _watching)
        except Exception as error:
            WORKER_GROUP.failed(error)
            return functor

    return func_generator


def _watching() -> Any:
    """The telemetry a blocking worker-group call made now is recorded in: inside a phase."""
    current = rlotel.current()
    return current if current is not None and service.of(current).in_trace() else None


# --- worker ------------------------------------------------------------------------------


def traced_class_loader(original: Callable[..., Any]) -> Callable[..., Any]:
    """Ray's `_inject_tracing_into_class(cls)`, then rlotel's wrappers on `cls`'s methods:
    every actor class Ray loads in this process from now on."""

    def _inject_tracing_into_class(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        with RAY_ACTOR_CLASS.guarded():  # the actor must start even if tracing cannot
            RAY_ACTOR_CLASS.fault()
            cls = args[0] if args else kwargs["_cls"]
            if HOSTED.actor_class is None:  # later loads: classes of handles it receives
                HOSTED.actor_class = cls
            wrap_actor_methods(cls)
        return result

    return _inject_tracing_into_class


def wrap_actor_methods(cls: type) -> None:
    """Each public or verl-internal method of an actor class opens a phase when its call
    carries a trace context (static and class methods, generators and dunders excepted,
    as Ray's own tracing does)."""
    for name, method in inspect.getmembers(cls, inspect.isfunction):
        if name.startswith("__") or getattr(method, _TRACED_MARK, False):
            continue
        if isinstance(inspect.getattr_static(cls, name), (staticmethod, classmethod)):
            continue
        if inspect.isgeneratorfunction(method) or inspect.isasyncgenfunction(method):
            continue
        RAY_ACTOR_CLASS.patch(cls, name, _traced(method, name))  # undone by detach


def _traced(method: Callable[..., Any], name: str) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(method):

        async def traced(self, *args, **kwargs):
            call = _begin_call(self, name, args, kwargs)
            if call is None:
                return await method(self, *args, **kwargs)
            try:
                result = await method(self, *args, **kwargs)
            except BaseException as raised:
                call.end(raised)
                raise
            return call.end(None, result)

    else:

        def traced(self, *args, **kwargs):
            call = _begin_call(self, name, args, kwargs)
            if call is None:
                return method(self, *args, **kwargs)
            try:
                result = method(self, *args, **kwargs)
            except BaseException as raised:
                call.end(raised)
                raise
            return call.end(None, result)

    functools.update_wrapper(traced, method)
    setattr(traced, _TRACED_MARK, True)
    return traced


def _begin_call(instance: Any, name: str, args: tuple, kwargs: dict) -> _WorkerCall | None:
    """The call as a phase under the caller's, begun; None (the method runs untraced)
    when the call carries no trace context or rlotel's part fails. Never raises."""
    carrier = kwargs.get(RAY_CONTEXT_KWARG)
    try:
        if not isinstance(carrier, dict) or TRACEPARENT not in carrier:
            _hear_run(carrier)
            return None
        call = _WorkerCall(instance, name, args, carrier)
        call.begin()
        return call
    except Exception as error:
        RAY_ACTOR_CLASS.failed(error)
        return None


def _hear_run(carrier: Any) -> None:
    """A call outside the caller's phases still names the run (baggage): kept for this
    worker's telemetry, which may start later without a carrier (its own timers)."""
    if carrier:
        hear_run(run_of(carrier))


def hear_run(run: str | None) -> None:
    """This worker's run, known before any call names it (an actor built from the run's
    config, whose own calls then carry the run to the workers it starts)."""
    if run and HOSTED.run is None:
        HOSTED.run = run


class _Call:
    """One traced worker call's time inside and outside torch.distributed's collectives
    (`rlotel.integrations.collectives`): on its span, in this rank's series and, when the
    caller asked, sent back with the reply."""

    __slots__ = ("carrier", "moves", "name", "rank_time", "role", "tally", "tel")

    def __init__(self, tel: Any, name: str, carrier: Any, role: str | None = None) -> None:
        self.tel = tel
        self.name = name
        self.carrier = carrier
        self.role = role  # the call's own role; None: this process's
        self.tally: collectives.Tally | None = None
        self.rank_time: RankTime | None = None
        self.moves: data_moves.RankMoves | None = None

    def open(self) -> None:
        self.tally = collectives.open_tally()
        self.moves = data_moves.open_rank_call()

    def close(self, phase: Any) -> None:
        """Before the phase closes (its span is built from the trace once it has)."""
        tally = self.tally
        if tally is None:
            return
        try:
            collectives.close_tally(tally)
            if tally.calls:  # the collectives of this call were timed
                TORCH_COLLECTIVE.fired()
            if tally.device_calls:  # asynchronous to the host: its clock cannot split them
                guard.warn_once(
                    "device_collectives",
                    "rlotel: %s made collectives on device tensors; compute vs collective "
                    "time is measured for CPU (gloo) collectives only, not reported here",
                    self.name,
                )
                return
            wall = (time.perf_counter_ns() - phase.start_ns) / 1e9
            collective = min(tally.seconds, wall)
            role, rank = _rank_labels(self.tel)
            role = self.role or role
            self.rank_time = rank_time = RankTime(
                self.name,
                role,
                rank,
                wall - collective,
                collective,
                tally.calls,
            )
            trace = getattr(phase, "trace", None)  # a RemotePhase: the root of its own trace
            if trace is not None:
                trace.rank_time = rank_time
        except Exception as error:
            service.of(self.tel).dropped("spans", "internal_error", f"collective time: {error!r}")

    def reply(self, result: Any) -> Any:
        """The method's result, wrapped with this rank's seconds when the caller asked."""
        rank_time = self.rank_time
        moved = None if self.moves is None else data_moves.close_rank_call(self.moves)
        if rank_time is None or REPLY_KEY not in self.carrier:
            return result
        return RankReply(result, rank_time.compute_s, rank_time.collective_s, moved)


@functools.lru_cache(maxsize=1)
def _rank_labels(tel: Any) -> tuple[str, int]:
    """This worker's role and rank, as its resource attributes say (read once per
    telemetry)."""
    identity = service.of(tel).resource
    return str(identity.get(attr.ROLE, "")), int(identity.get(attr.RANK, env.rank()))


class _Untimed:
    """A call whose collectives are not timed: verl's plumbing, or a process that is no
    rank of a torch.distributed process group (yet: `init_model` usually makes it one)."""

    def open(self) -> None:
        pass

    def close(self, phase: Any) -> None:
        pass

    def reply(self, result: Any) -> Any:
        return result


_UNTIMED = _Untimed()


def _in_process_group() -> bool:
    """This process is a rank of torch.distributed's default group (without importing it)."""
    dist = sys.modules.get("torch.distributed")
    try:
        return dist is not None and dist.is_initialized()
    except Exception:  # a build without torch.distributed
        return False


class _WorkerCall:
    """One traced worker call: a phase under the caller's (verl's own plumbing, `_...`,
    only passes the carrier on), its collectives timed on a rank, its clock stamp heard."""

    def __init__(self, instance: Any, name: str, args: tuple, carrier: dict[str, str]) -> None:
        self.carrier = carrier
        self.received = clock.unix_ns() if CLOCK_KEY in carrier else 0  # once or twice
        self.phase: Any = contextlib.nullcontext()
        self.timing: _Call | _Untimed = _UNTIMED
        self.captures: Any = None  # verl's profiler is on: what this call wrote gets linked
        name, self.role = _verl_method(instance, name, args)
        if not name.startswith("_"):  # verl's own plumbing (`_query_dispatch_info`, ...)
            tel = worker_telemetry(instance, carrier)
            RAY_ACTOR_CLASS.fault()
            RAY_ACTOR_CLASS.fired()
            self.phase = tel.phase(name, context=carrier)
            self.captures = verl_captures.watch_call(instance, name)
            if _in_process_group() and (collectives.installed() or collectives.install()):
                self.timing = _Call(tel, name, carrier, self.role)  # a rank: collectives timed

    def begin(self) -> None:
        self.phase.__enter__()
        trace = getattr(self.phase, "trace", None)  # a RemotePhase: the root of its own trace
        if trace is not None and self.role is not None:
            trace.role = self.role
        self.token = _call_carrier.set(self.carrier)  # tasks the call spawns keep it
        self.timing.open()

    def end(self, raised: BaseException | None, result: Any = None) -> Any:
        """The method's result (with this rank's seconds when the caller asked for them);
        never raises: the method's own exception is the one that propagates."""
        if self.captures is not None:
            RAY_ACTOR_CLASS.attempt(self.captures.end, self.phase)
        RAY_ACTOR_CLASS.attempt(self.timing.close, self.phase)
        RAY_ACTOR_CLASS.exit_context(self.phase, raised)
        RAY_ACTOR_CLASS.attempt(_call_carrier.reset, self.token)
        if self.received:
            stamp = self.carrier[CLOCK_KEY]
            RAY_ACTOR_CLASS.attempt(CLOCK.heard, stamp, self.received, clock.unix_ns())
        if raised is not None:
            return None
        with RAY_ACTOR_CLASS.guarded():
            return self.timing.reply(result)
        return result


def call_carrier() -> dict[str, str] | None:
    """The carrier of the traced call this context serves (or spawned it: asyncio tasks
    copy it), even after that call returned."""
    return _call_carrier.get()


def _verl_method(instance: Any, name: str, args: tuple) -> tuple[str, str | None]:
    """The worker method verl means and the role of the worker it belongs to (None: the
    process's): `update_actor` of `actor` for the colocated `WorkerDict`'s
    `actor_rollout_update_actor`, `compute_values` of `critic` for its `critic_compute_values`;
    `update_actor` for a fused call naming `{cls}_fwmn_update_actor`."""
    if args and isinstance(args[0], str) and FUSED_METHOD_SEPARATOR in args[0]:
        return args[0].split(FUSED_METHOD_SEPARATOR, 1)[1], None
    for prefix in _fused_roles(instance):
        if name.startswith(prefix + "_"):
            method = name[len(prefix) + 1 :]
            return method, vocabulary.verl_call_role(prefix, method)
    return name, None


def _fused_roles(instance: Any) -> list[str]:
    """verl's colocated `WorkerDict` holds one worker per role key (`actor_rollout`, ...);
    the longest first, so that a method name's prefix is matched whole."""
    workers = getattr(instance, "worker_dict", None)
    return sorted(workers, key=len, reverse=True) if isinstance(workers, dict) else []


def _verl_role(instance: Any) -> str | None:
    """verl's role name for this worker process: its main role when it hosts several
    (`vocabulary.verl_main_role`: never one it only co-hosts), else its own or its actor
    class's."""
    roles = _fused_roles(instance)
    own = getattr(instance, "role", None)
    if roles:
        return vocabulary.verl_main_role(roles)
    if isinstance(own, str) and own:
        return vocabulary.verl_worker_role(own)
    cls = type(instance) if instance is not None else HOSTED.actor_class
    return vocabulary.verl_class_role(c.__name__ for c in cls.__mro__) if cls else None


def in_ray_actor() -> bool:
    """This process is a Ray actor (a verl worker, a rollout server, an agent-loop worker)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    try:
        return ray.get_runtime_context().get_actor_id() is not None
    except Exception:
        return False


def process_identity(instance: Any = None) -> dict[str, str | int]:
    """`rl.role`, `rl.rank`, `rl.node` and, for rollout, `rl.replica` of this worker."""
    role = env.Environment.read().role or _verl_role(instance)
    if not role:
        cls = HOSTED.actor_class or type(instance)
        role = cls.__name__
    identity: dict[str, str | int] = {attr.ROLE: role, attr.RANK: env.rank()}
    if in_ray_actor():
        import ray

        identity[attr.NODE] = ray.get_runtime_context().worker.node_ip_address  # Ray's node
    else:
        import socket

        identity[attr.NODE] = socket.gethostname()
    replica = getattr(instance, "replica_rank", None)
    if replica is None:
        replica = getattr(getattr(instance, "rollout", None), "replica_rank", None)
    if isinstance(replica, int) and not isinstance(replica, bool):
        identity[attr.REPLICA] = replica
    return identity


def worker_telemetry(instance: Any = None, carrier: Any = None) -> Any:
    """This worker process's telemetry, started on first use: `/metrics` on an ephemeral
    port registered for file discovery, spans over OTLP and/or to `RLOTEL_TRACES_DIR`;
    the run is the one the driver's carrier names (W3C baggage) unless RLOTEL_RUN says."""
    tel = rlotel.current()
    if tel is not None:
        return tel
    with _init_lock:
        tel = rlotel.current()
        if tel is None:
            heard = run_of(carrier) or HOSTED.run
            tel = _start_worker(process_identity(instance), heard)
    return tel


def _start_worker(identity: dict[str, str | int], run: str | None = None) -> Any:
    from rlotel.integrations import ray as ray_integration
    from rlotel.integrations import startup

    environment = env.Environment.read()
    if environment.span_export_delay_s is None:  # Ray ends workers without exit handlers
        delay_s = env.WORKER_SPAN_EXPORT_DELAY_MS / 1000
        environment = replace(environment, span_export_delay_s=delay_s)
    tel = startup.start(
        environment=environment,
        run=environment.run or run or "verl",
        prometheus_addr=environment.metrics_addr,
        prometheus_port=0,
        resource_attributes=identity,
    )
    labels = {key.removeprefix(attr.NAMESPACE): str(value) for key, value in identity.items()}
    ray_integration.register(tel.metrics_url, labels)
    return tel


# --- lifecycle ---------------------------------------------------------------------------
