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
(the registry's `COLLECTIVES`), and `Work.wait` — an `async_op=True` call counts its issue, and its
handle's `.wait()` counts until it returns. A collective that calls another (the
deprecated `all_gather_into_tensor` → `all_gather_single`, a sync call → its own
`work.wait()`) is counted once, as the outermost. Time goes to every account open in the
process (nested worker phases each include their inner one's; autograd threads that run
FSDP's hooks are seen).

Host clock: right for CPU tensors (gloo blocks the caller until the peers arrive). A
collective on device tensors (CUDA/NCCL, and other accelerators' backends) returns to the
host before it ran, so the host clock does not see a rank wait there: such calls are
counted (`Tally.device_calls`) but not timed, and a worker call that made any reports no
compute/collective split rather than a wrong one (timing them on the device's streams is
future work). DDP's gradient all-reduce runs inside its C++ reducer and is not seen: use
FSDP (1 or 2) or Megatron, whose collectives are Python calls. Functions imported by name
before `install` (`from torch.distributed import all_reduce`) keep the original.

rlotel's errors here are counted (`rlotel_integration_failures_total{hook="torch_collective"}`,
one log line) and never change what the collective returns or raises.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from time import perf_counter_ns
from typing import Any

from rlotel.base import waits
from rlotel.integrations.registered import TORCH_COLLECTIVE


class Tally:
    """One traced worker phase's host time inside collectives, how many it issued (waits
    on their handles add time, not calls) and how many of those ran on device tensors
    (not timed: asynchronous to the host)."""

    __slots__ = ("calls", "device_calls", "ns")

    def __init__(self) -> None:
        self.ns = 0
        self.calls = 0
        self.device_calls = 0

    @property
    def seconds(self) -> float:
        return self.ns / 1e9


# the accounts open now, in any thread, by id: the hook's state, forgotten when it is detached
_open: dict[int, Tally] = TORCH_COLLECTIVE.state
_lock = threading.Lock()
_depth = threading.local()  # > 0 while this thread is inside a timed collective


def installed() -> bool:
    from rlotel.integrations.hooks import State
    from rlotel.integrations.registered import REGISTRY

    return REGISTRY.status(TORCH_COLLECTIVE.name).state == State.ATTACHED


def install() -> bool:
    """Wrap torch.distributed's collectives in this process (once): the registry's on-demand
    hook. False, and nothing wrapped, while torch.distributed is not imported (or not
    available in this build)."""
    from rlotel.integrations.registered import REGISTRY

    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available():
        return False
    return REGISTRY.attach(TORCH_COLLECTIVE.name)


def uninstall() -> None:
    """torch.distributed as it was; no account stays open."""
    from rlotel.integrations.registered import REGISTRY

    REGISTRY.detach_hook(TORCH_COLLECTIVE.name)


def open_tally() -> Tally:
    tally = Tally()
    with _lock:
        _open[id(tally)] = tally
    return tally


def close_tally(tally: Tally) -> Tally:
    """Stop counting into `tally`. Never raises."""
    with _lock:
        _open.pop(id(tally), None)
    return tally


def timed(original: Any) -> Any:
    name = getattr(original, "__name__", "collective")

    def collective(*args: Any, **kwargs: Any) -> Any:
        if not _open or getattr(_depth, "n", 0):
            return original(*args, **kwargs)
        began = _begin(args, kwargs)
        waiting = waits.enter(functools.partial(_describe, name, args, kwargs, time.time()))
        _depth.n = 1
        try:
            return original(*args, **kwargs)
        finally:
            _depth.n = 0
            waits.leave(waiting)
            _end(began)

    functools.update_wrapper(collective, original)
    return collective


def timed_wait(original: Any) -> Any:
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _open or getattr(_depth, "n", 0):
            return original(self, *args, **kwargs)
        began = perf_counter_ns(), False
        _depth.n = 1
        try:
            return original(self, *args, **kwargs)
        finally:
            _depth.n = 0
            _end(began, calls=0)

    functools.update_wrapper(wait, original)
    return wait


def _begin(args: tuple, kwargs: dict) -> tuple[int, bool]:
    """(host ns, whether the call's tensors are on a device)."""
    on_device = False
    try:
        TORCH_COLLECTIVE.fault()
        on_device = _on_device(args, kwargs)
    except Exception as error:
        _error("collective's device unknown", error)
    return perf_counter_ns(), on_device


def _end(began: tuple[int, bool], calls: int = 1) -> None:
    """Count one call (a wait: none) into every account open now."""
    try:
        TORCH_COLLECTIVE.fault()
        host, on_device = began
        ns = perf_counter_ns() - host
        with _lock:
            for tally in _open.values():
                tally.calls += calls
                if on_device:
                    tally.device_calls += calls
                else:
                    tally.ns += ns
    except Exception as error:
        _error("collective not counted", error)


def _describe(name: str, args: tuple, kwargs: dict, entered_unix_s: float) -> str:
    """`all_reduce on group [0, 1] as rank 0, entered 12.3 s ago`: built by the stall watch
    when it captures stacks, from the group the call names (else the default one)."""
    dist = sys.modules["torch.distributed"]
    group = kwargs.get("group")
    if group is None:
        group = next((a for a in args if isinstance(a, dist.ProcessGroup)), None)
    try:
        members, rank = (
            str(dist.get_process_group_ranks(group or dist.group.WORLD)),
            dist.get_rank(),
        )
    except Exception:  # a group torch.distributed did not register (built by hand)
        members, rank = f"of {group.size()}", group.rank()
    ago = time.time() - entered_unix_s
    return f"{name} on group {members} as rank {rank}, entered {ago:.1f} s ago"


def _on_device(args: tuple, kwargs: dict) -> bool:
    """The call's first tensor (or first of a list of tensors) is not on the CPU."""
    tensor_type = sys.modules["torch"].Tensor  # loaded: torch.distributed is wrapped
    first = args[0] if args else None
    if isinstance(first, tensor_type):  # most calls: the tensor first
        return not first.is_cpu
    for value in (*args[:2], *kwargs.values()):
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        if isinstance(value, tensor_type):
            return not value.is_cpu
    return False


def _error(what: str, error: BaseException) -> None:
    """Counted as a failure of this hook (logged once)."""
    TORCH_COLLECTIVE.failed(RuntimeError(f"{what}: {error!r}"))
