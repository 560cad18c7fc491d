"""What each thread is blocked in, as far as rlotel's wrappers know (a torch.distributed
collective): the stall watch prints it beside the thread's stack, so a hang in a collective
names the operation, its group and when this rank entered it.

A wrapper registers a zero-argument describer on entry and removes it on exit; the
description is built only when a stall is judged (never on the hot path).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_waiting: dict[int, Callable[[], str]] = {}  # thread ident → its describer


def enter(describe: Callable[[], str]) -> int:
    """This thread is now blocked in what `describe()` names; returns the thread's ident."""
    ident = threading.get_ident()
    _waiting[ident] = describe
    return ident


def leave(ident: int) -> None:
    _waiting.pop(ident, None)


def of(ident: int) -> str | None:
    """What thread `ident` is blocked in, if a wrapper said so (never raises)."""
    describe = _waiting.get(ident)
    if describe is None:
        return None
    try:
        return describe()
    except Exception as error:  # a describer must not cost the stacks
        return f"(not described: {error!r})"
