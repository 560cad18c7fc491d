"""torch.distributed's collectives, timed while a traced worker method runs: compute vs wait.

Under FSDP, Megatron or any data-parallel update every rank replies together (the slowest
one holds the others in the gradient collective), so timing the replies cannot see which
rank was slow. Each rank can: the time it spent inside collectives (waiting for the others,
plus the transfer) and outside them (its own compute). The slow rank computes longest and
waits least.

`open_tally()` starts an account for one traced worker phase and `close_tally()` ends it.
Only while at least one is open do the wrapped functions time anything; otherwise each
call costs one list check. Wrapped (once per process, `install`): the collectives and
point-to-point functions of `torch.distributed` and `torch.distributed.distributed_c10d`
(`COLLECTIVES`), and `Work.wait` — an `async_op=True` call counts its issue, and its
handle's `.wait()` counts until it returns. A collective that calls another (the
deprecated `all_gather_into_tensor` → `all_gather_single`, a sync call → its own
`work.wait()`) is counted once, as the outermost. Time goes to every account open in the
process (nested worker phases each include their inner one's; autograd threads that run
FSDP's hooks are seen).

Host clock for CPU tensors (gloo: the call blocks until the peers arrive). On CUDA tensors
a collective returns before it ran (NCCL is asynchronous to the host), so CUDA events on
the current stream time how long the stream stood in the collective (or, for an async
handle, in its `.wait()`); they are read when the account closes, synchronizing on the last
one (the worker method's result is usually on the host by then). DDP's gradient
all-reduce runs inside its C++ reducer and is not seen: use FSDP (1 or 2) or Megatron,
whose collectives are Python calls. Functions imported by name before `install`
(`from torch.distributed import all_reduce`) keep the original.

Telemetry errors are counted (`rlotel_telemetry_dropped_total{signal="spans",
reason="internal_error"}`, one log line per interval) and never change what the
collective returns or raises.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from time import perf_counter_ns
from typing import Any

from rlotel.integrations.patches import Patches

log = logging.getLogger("rlotel")

COLLECTIVES = (
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "broadcast",
    "all_gather",
    "all_gather_single",
    "all_gather_into_tensor",
    "_all_gather_base",
    "all_gather_coalesced",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "all_gather_object",
    "gather_object",
    "broadcast_object_list",
    "scatter_object_list",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
)
MAX_PENDING_WORKS = 4096  # async CUDA handles remembered until their wait (per process)


class Tally:
    """One traced worker phase's time inside collectives (host ns, plus CUDA event pairs
    read at close) and how many it issued (waits on their handles add time, not calls)."""

    __slots__ = ("calls", "events", "ns")

    def __init__(self) -> None:
        self.ns = 0
        self.calls = 0
        self.events: list[tuple[Any, Any]] = []

    @property
    def seconds(self) -> float:
        return self.ns / 1e9


_open: list[Tally] = []  # the accounts open now, in any thread
_lock = threading.Lock()
_depth = threading.local()  # > 0 while this thread is inside a timed collective
_cuda_works: dict[int, Any] = {}  # id → async work issued on CUDA tensors, until its wait
_patches = Patches()
_state = {"installed": False}


def installed() -> bool:
    return _state["installed"]


def install() -> bool:
    """Wrap torch.distributed's collectives in this process (once). False, and nothing
    wrapped, while torch.distributed is not imported (or not available in this build)."""
    if _state["installed"]:
        return True
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return False
    try:
        if not dist.is_available():
            return False
        c10d = dist.distributed_c10d
        for name in COLLECTIVES:
            original = getattr(c10d, name, None)
            if original is None or not callable(original):
                continue
            timed = _timed(original)
            _patches.replace(c10d, name, timed)
            if getattr(dist, name, None) is original:
                _patches.replace(dist, name, timed)
        _patches.replace(c10d.Work, "wait", _timed_wait(c10d.Work.wait))
    except Exception as error:  # a torch without these names: nothing is timed
        _patches.undo()
        _error("collectives not timed", error)
        return False
    _state["installed"] = True
    return True


def uninstall() -> None:
    _patches.undo()
    _state["installed"] = False
    _open.clear()
    _cuda_works.clear()


def open_tally() -> Tally:
    tally = Tally()
    with _lock:
        _open.append(tally)
    return tally


def close_tally(tally: Tally) -> Tally:
    """Stop counting into `tally`; its CUDA events are read now. Never raises."""
    with _lock:
        if tally in _open:
            _open.remove(tally)
        if not _open:
            _cuda_works.clear()
        events, tally.events = tally.events, []
    if events:
        try:
            events[-1][1].synchronize()
            tally.ns += int(sum(start.elapsed_time(end) for start, end in events) * 1e6)
        except Exception as error:
            _error("CUDA collective events unreadable", error)
    return tally


def _timed(original: Any) -> Any:
    def collective(*args: Any, **kwargs: Any) -> Any:
        if not _open or getattr(_depth, "n", 0):
            return original(*args, **kwargs)
        began = _begin(args, kwargs)
        _depth.n = 1
        try:
            result = original(*args, **kwargs)
        except BaseException:
            _depth.n = 0
            _end(began, None)
            raise
        _depth.n = 0
        _end(began, result)
        return result

    functools.update_wrapper(collective, original)
    return collective


def _timed_wait(original: Any) -> Any:
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _open or getattr(_depth, "n", 0):
            return original(self, *args, **kwargs)
        began = _begin_wait(self)
        _depth.n = 1
        try:
            return original(self, *args, **kwargs)
        finally:
            _depth.n = 0
            _end(began, None, calls=0)

    functools.update_wrapper(wait, original)
    return wait


# A start: (host ns, CUDA start event or None).
def _begin(args: tuple, kwargs: dict) -> tuple[int, Any]:
    start = None
    try:
        if _on_cuda(args, kwargs):
            start = _record_event()
    except Exception as error:
        _error("collective not timed on its CUDA stream", error)
    return perf_counter_ns(), start


def _begin_wait(work: Any) -> tuple[int, Any]:
    start = None
    try:
        if _cuda_works and _cuda_works.pop(id(work), None) is not None:
            start = _record_event()
    except Exception as error:
        _error("collective wait not timed on its CUDA stream", error)
    return perf_counter_ns(), start


def _end(began: tuple[int, Any], result: Any, calls: int = 1) -> None:
    """Count one call (a wait: none) into every open account: host ns, or a CUDA event
    pair; an async handle of a CUDA call is remembered, so that its wait is timed on the
    stream too."""
    try:
        host, start = began
        end = _record_event() if start is not None else None
        ns = perf_counter_ns() - host
        with _lock:
            for tally in _open:
                tally.calls += calls
                if end is not None:
                    tally.events.append((start, end))
                else:
                    tally.ns += ns
            if end is not None and result is not None:
                works = result if isinstance(result, list) else (result,)
                for work in works:
                    if hasattr(work, "wait") and len(_cuda_works) < MAX_PENDING_WORKS:
                        _cuda_works[id(work)] = work
    except Exception as error:
        _error("collective not counted", error)


def _on_cuda(args: tuple, kwargs: dict) -> bool:
    """The call's first tensor (or first of a list of tensors) lives on a CUDA device."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return False
    for value in (*args[:2], *kwargs.values()):
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        if isinstance(value, torch.Tensor):
            return value.is_cuda
    return False


def _record_event() -> Any:
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _error(what: str, error: BaseException) -> None:
    """Counted on this process's telemetry (logged once per interval), else logged."""
    import rlotel

    tel = rlotel.current()
    if tel is not None:
        tel.drops.add("spans", "internal_error", f"{what}: {error!r}")
    else:
        log.warning("rlotel: %s: %r", what, error)
