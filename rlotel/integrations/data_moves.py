"""The data half of the ledger, where data moves: a worker-group call's stages on the
driver, and the data queues (TransferQueue, fully async's MessageQueue) wherever they run.

A blocking worker-group call inside a phase is watched whole (`watched`, applied by
`verl_workers.traced_func_generator` to the call verl builds): the driver's marks between
verl's own steps give dispatch, submit, the wait, fetch, collect and other, which add up to
the call's wall time; the slowest rank's own account, sent with its reply, splits the wait
into transfer, TransferQueue reads, work and TransferQueue writes (`rlotel.schema.data_moves`).
The batches verl passed give the bytes sent and returned. Sizes are what the batches hold
(tensor and array `nbytes`): nothing is pickled a second time. verl's own pickling of its
batches (`DataProto.__getstate__` / `__setstate__`, timed where it runs: inside a watched
call on the driver, before a rank's call for its arguments) is serialize and deserialize, with
the rank's pickling of its result, which its reply measures as Ray pickles it (`RankReply`).
"""

from __future__ import annotations

import contextvars
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from rlotel.base.queue_moves import QUEUE_MOVES
from rlotel.integrations.hooks import Hook
from rlotel.integrations.registered import DATA_PROTO, MESSAGE_QUEUE, TRANSFER_QUEUE, WORKER_GROUP
from rlotel.schema import data_moves as dm

PUT, GET = "put", "get"


REFERENCE = 8  # bytes: an item of an object column, as numpy's `nbytes` counts it


def nbytes(value: Any, depth: int = 0) -> int:
    """What a batch holds in memory: tensor and array `nbytes` of a `DataProto` or a
    TensorDict, non-tensor columns included (an object column, or a TensorDict's
    `NonTensorStack`, counts its references), a tensor, an array, or a list or tuple of them
    (per-rank shares); 0 for anything else (metadata, futures, scalars)."""
    if isinstance(value, (list, tuple)) and depth < 2:
        return sum(nbytes(item, depth + 1) for item in value)
    size = getattr(value, "nbytes", None)
    if isinstance(size, int):  # torch.Tensor, numpy.ndarray
        return size
    tensordict = sys.modules.get("tensordict")
    if tensordict is not None and isinstance(value, tensordict.TensorDictBase):
        leaves = value.values(True, True, is_leaf=tensordict.is_leaf_nontensor)
        return sum(_leaf_bytes(leaf, tensordict.NonTensorStack) for leaf in leaves)
    protocol = sys.modules.get("verl.protocol")
    if protocol is not None and isinstance(value, protocol.DataProto):
        arrays = sum(column.nbytes for column in (value.non_tensor_batch or {}).values())
        return (0 if value.batch is None else nbytes(value.batch, depth)) + arrays
    return 0


def _leaf_bytes(leaf: Any, stack: type) -> int:
    if isinstance(leaf, stack):  # a column of Python objects, one a sample
        return REFERENCE * leaf.batch_size.numel()
    size = getattr(leaf, "nbytes", None)
    return size if isinstance(size, int) else 0  # NonTensorData: one value for the batch


# --- a worker-group call on the driver ---------------------------------------------------


class RankReply:
    """A rank's reply to a worker-group call that asked for its account: the method's
    value, its compute and collective seconds, its TransferQueue moves and its arguments'
    unpickling (`moved`), and, once the driver has it, the seconds the rank took to pickle
    the value (`serialized_s`). verl's driver sees only the value (`verl_workers`)."""

    __slots__ = ("collective_s", "compute_s", "moved", "serialized_s", "value")

    def __init__(
        self,
        value: object,
        compute_s: float,
        collective_s: float,
        moved: tuple[float, ...] | None = None,
        serialized_s: float = 0.0,
    ) -> None:
        self.value = value
        self.compute_s = compute_s
        self.collective_s = collective_s
        self.moved = moved  # TQ read s, write s, read bytes, written bytes; unpickled s
        self.serialized_s = serialized_s

    def __reduce__(self) -> tuple:
        # pickle saves these in order, so `value` is pickled (by Ray, as it sends the reply)
        # between now and `_Since`'s own reduce: the rank's serialization of its result
        since = _Since(time.perf_counter())
        return RankReply, (self.value, self.compute_s, self.collective_s, self.moved, since)


class _Since:
    """Pickled as the seconds from its making to its own pickling."""

    __slots__ = ("started",)

    def __init__(self, started: float) -> None:
        self.started = started

    def __reduce__(self) -> tuple:
        return float, (time.perf_counter() - self.started,)


class CallMoves:
    """One blocking worker-group call's stages, marked as verl's steps end."""

    __slots__ = ("_last", "call", "pickled", "slowest", "started")

    def __init__(self) -> None:
        self.started = self._last = time.perf_counter()
        self.call: dict[str, float] = {}
        self.pickled = {dm.SERIALIZE: 0.0, dm.DESERIALIZE: 0.0}  # since the last mark
        self.slowest: RankReply | None = None

    def mark(self, stage: str) -> None:
        """`stage` ended now: it took the time since the previous mark, less the batches'
        pickling inside it (submit's serialize, fetch's deserialize)."""
        now = time.perf_counter()
        took, pickled = now - self._last, self.pickled
        part = _PICKLED_IN.get(stage)
        if part is not None and pickled[part]:
            carved = min(took, pickled[part])
            self.call[part] = self.call.get(part, 0.0) + carved
            took -= carved
        pickled[dm.SERIALIZE] = pickled[dm.DESERIALIZE] = 0.0
        self.call[stage] = self.call.get(stage, 0.0) + took
        self._last = now

    def add(self, key: str, amount: float) -> None:
        self.call[key] = self.call.get(key, 0.0) + amount

    def replied(self, replies: list[RankReply]) -> None:
        """The ranks' own account of their calls: every rank's TransferQueue bytes, and the
        slowest rank's seconds, which split the wait (`rlotel.schema.data_moves`)."""
        if not replies:
            return
        slowest = max(replies, key=lambda reply: reply.compute_s + reply.collective_s)
        self.slowest = slowest
        for reply in replies:
            if reply.moved:
                self.add(f"{dm.READ}_bytes", reply.moved[2])
                self.add(f"{dm.WRITE}_bytes", reply.moved[3])

    def end(self, tel: Any) -> None:
        self.mark(dm.OTHER)
        call = self.call
        call["wall_s"] = self._last - self.started  # the last mark: stages sum to it
        slowest = self.slowest
        if slowest is not None and dm.WAIT in call:
            wait = call.pop(dm.WAIT)
            wall = slowest.compute_s + slowest.collective_s
            read, write = slowest.moved[:2] if slowest.moved else (0.0, 0.0)
            unpickled = slowest.moved[4] if slowest.moved and len(slowest.moved) > 4 else 0.0
            inside = min(1.0, wait / wall) if wall > 0 else 0.0  # clocks of two processes
            carried = call.get(f"{dm.SENT}_bytes", 0) + call.get(f"{dm.RETURNED}_bytes", 0)
            outside = max(0.0, wait - wall)  # its arguments unpickled, its result pickled
            unpickled = min(unpickled, outside)
            pickled = min(slowest.serialized_s, outside - unpickled)
            call[dm.DESERIALIZE] = call.get(dm.DESERIALIZE, 0.0) + unpickled
            call[dm.SERIALIZE] = call.get(dm.SERIALIZE, 0.0) + pickled
            # with no batch carried, what the ranks do not account for is Ray's scheduling
            call[dm.TRANSFER if carried else dm.WAIT] = outside - unpickled - pickled
            call[dm.READ] = read * inside
            call[dm.WRITE] = write * inside
            call[dm.WORK] = max(0.0, wall - read - write) * inside
        tel.record_data_moves(call)


_PICKLED_IN = {dm.SUBMIT: dm.SERIALIZE, dm.FETCH: dm.DESERIALIZE}  # where the driver pickles

CALL: contextvars.ContextVar[CallMoves | None] = contextvars.ContextVar(
    "rlotel_call_moves", default=None
)


def mark(stage: str) -> None:
    """The watched call of this context (if any): `stage` ended now."""
    moves = CALL.get()
    if moves is not None:
        moves.mark(stage)


def watched(functor: Any, watching: Callable[[], Any]) -> Any:
    """verl's worker-group call (`func_generator`'s `Functor`, named after the method) as
    an instance of a subclass of the same name whose call is timed whole when
    `watching()` gives a telemetry: a blocking call made inside a phase."""
    cls = type(functor)
    if not callable(functor) or cls.__init__ is not object.__init__:
        return functor  # not verl's Functor: left as it is
    call = cls.__call__

    def __call__(this: Any, *args: Any, **kwargs: Any) -> Any:
        tel = None
        with WORKER_GROUP.guarded():
            WORKER_GROUP.fault()
            tel = watching()
        if tel is None:
            return call(this, *args, **kwargs)
        moves = CallMoves()
        token = CALL.set(moves)
        try:
            return call(this, *args, **kwargs)
        finally:
            CALL.reset(token)
            WORKER_GROUP.attempt(moves.end, tel)

    return type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__})()


def traced_dispatch(dispatch_fn: Callable[..., Any]) -> Callable[..., Any]:
    """verl's dispatch function: the split batch's bytes are what the call sends."""

    def dispatch(*args: Any, **kwargs: Any) -> Any:
        result = dispatch_fn(*args, **kwargs)
        moves = CALL.get()
        with WORKER_GROUP.guarded():
            WORKER_GROUP.fault()
            if moves is not None:
                moves.mark(dm.DISPATCH)
                sent_args, sent_kwargs = result  # each a rank's share, or one for every rank
                sent = sum(nbytes(arg) for arg in (*sent_args, *sent_kwargs.values()))
                moves.add(f"{dm.SENT}_bytes", sent)
        return result

    return dispatch


# --- a rank's queue reads and writes inside its call -------------------------------------


class RankMoves:
    """What one worker process read from and wrote to TransferQueue during its open call
    (one at a time: verl's ranks run one call after another). The client's coroutines run
    on its own event loop, so this is per process, not per context."""

    __slots__ = ("read_bytes", "read_s", "unpickled_s", "write_bytes", "write_s")

    def __init__(self, unpickled_s: float = 0.0) -> None:
        self.read_s = self.write_s = 0.0
        self.read_bytes = self.write_bytes = 0
        self.unpickled_s = unpickled_s  # its arguments' batches, unpickled before it ran

    def totals(self) -> tuple[float, float, int, int, float]:
        return (self.read_s, self.write_s, self.read_bytes, self.write_bytes, self.unpickled_s)


_open: list[RankMoves] = []  # the worker call open in this process, if any
_open_lock = threading.Lock()
_unpickled = [0.0]  # batches unpickled in this process outside a call: the next one's arguments


def open_rank_call() -> RankMoves:
    with _open_lock:
        moves = RankMoves(_unpickled[0])
        _unpickled[0] = 0.0
        _open[:] = [moves]
    return moves


def close_rank_call(moves: RankMoves) -> tuple[float, float, int, int, float] | None:
    """The call's TransferQueue totals and its arguments' unpickling (None when it moved
    nothing)."""
    with _open_lock:
        if _open and _open[0] is moves:
            _open.clear()
    totals = moves.totals()
    return totals if any(totals) else None


def _queue_moved(in_call: bool, queue: str, op: str, seconds: float, size: int) -> None:
    QUEUE_MOVES.moved(queue, op, seconds, size)
    if not in_call:  # only TransferQueue moves a rank's data inside its call
        return
    with _open_lock:
        moves = _open[0] if _open else None
    if moves is not None:
        if op == GET:
            moves.read_s += seconds
            moves.read_bytes += size
        else:
            moves.write_s += seconds
            moves.write_bytes += size


# --- verl's batches, pickled and unpickled -----------------------------------------------


def _pickled(stage: str, seconds: float) -> None:
    """A batch pickled (serialize) or unpickled (deserialize) in this context: part of the
    watched call's submit or fetch on the driver; on a rank, outside its calls, the next
    call's arguments."""
    with DATA_PROTO.guarded():
        DATA_PROTO.fault()
        DATA_PROTO.fired()  # it ran, whether or not a call is there to take the seconds
        moves = CALL.get()
        if moves is not None:
            moves.pickled[stage] += seconds
        elif stage == dm.DESERIALIZE and not _open:
            with _open_lock:
                _unpickled[0] += seconds


def traced_getstate(original: Callable[..., Any]) -> Callable[..., Any]:
    """verl's `DataProto.__getstate__`: the seconds it pickles a batch."""

    def __getstate__(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        state = original(self, *args, **kwargs)
        _pickled(dm.SERIALIZE, time.perf_counter() - started)
        return state

    __getstate__.__wrapped__ = original  # type: ignore[attr-defined]
    return __getstate__


def traced_setstate(original: Callable[..., Any]) -> Callable[..., Any]:
    """verl's `DataProto.__setstate__`: the seconds it unpickles a batch."""

    def __setstate__(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = original(self, *args, **kwargs)
        _pickled(dm.DESERIALIZE, time.perf_counter() - started)
        return result

    __setstate__.__wrapped__ = original  # type: ignore[attr-defined]
    return __setstate__


# --- the queues --------------------------------------------------------------------------


def _timed_queue(
    original: Callable[..., Any], hook: Hook, op: str, size_of: Callable[[Any, Any], int]
) -> Callable[..., Any]:
    """An async queue method, its seconds and bytes counted (`size_of(arguments, result)`)
    under the queue's name (its hook's)."""

    async def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = await original(self, *args, **kwargs)
        seconds = time.perf_counter() - started
        with hook.guarded():
            hook.fault()
            hook.fired()
            size = size_of((args, kwargs), result)
            _queue_moved(hook is TRANSFER_QUEUE, hook.name, op, seconds, size)
        return result

    timed.__wrapped__ = original  # type: ignore[attr-defined]
    return timed


def _put_data(given: tuple[tuple, dict], _: Any) -> int:
    args, kwargs = given
    return nbytes(kwargs.get("data", args[0] if args else None))


def _got(_: tuple[tuple, dict], result: Any) -> int:
    return nbytes(result)


def _put_sample(given: tuple[tuple, dict], _: Any) -> int:
    args, kwargs = given
    sample = kwargs.get("sample", args[0] if args else None)
    return len(sample) if isinstance(sample, (bytes, bytearray)) else 0


def _got_sample(_: tuple[tuple, dict], result: Any) -> int:
    sample = result[0] if isinstance(result, tuple) and result else result
    return len(sample) if isinstance(sample, (bytes, bytearray)) else 0


def traced_tq_put(original: Callable[..., Any]) -> Callable[..., Any]:
    """TransferQueue's `AsyncTransferQueueClient.async_put` (its sync `put` runs it too)."""
    return _timed_queue(original, TRANSFER_QUEUE, PUT, _put_data)


def traced_tq_get(original: Callable[..., Any]) -> Callable[..., Any]:
    """TransferQueue's `AsyncTransferQueueClient.async_get_data`."""
    return _timed_queue(original, TRANSFER_QUEUE, GET, _got)


def traced_mq_put(original: Callable[..., Any]) -> Callable[..., Any]:
    """fully async's `MessageQueueClient.put_sample` (a pickled sample: its length)."""
    return _timed_queue(original, MESSAGE_QUEUE, PUT, _put_sample)


def traced_mq_get(original: Callable[..., Any]) -> Callable[..., Any]:
    """fully async's `MessageQueueClient.get_sample` (waiting until one is there included)."""
    return _timed_queue(original, MESSAGE_QUEUE, GET, _got_sample)
