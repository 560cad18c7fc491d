"""Where rlotel runs inside another library's call path, its own failures stop there.

Every wrapper of a zero-code integration (verl's timers, Tracking, worker-group calls and
replies, the replay buffer and agent-loop hooks, Ray's actor call path, vLLM's engine
hooks, torch.distributed's collectives) follows one rule: when rlotel's part raises, the
call runs exactly as it would without rlotel — the original function, the original
arguments, the original result or exception. The failure is counted by hook
(`rlotel_integration_failures_total{hook}`) and logged once per hook, not per call. An
exception raised by the wrapped code itself propagates unchanged.

A call rlotel cannot interpret (arguments a newer verl or Ray passes that rlotel does not
know) is passed through untraced and counted the same way.

Wrappers reach this through their `Hook` (`rlotel.integrations.hooks`): `hook.guarded()`,
`hook.fault()`, `hook.attempt(...)`, so every failure is counted under a registered hook's
name; `fault` and `failed` here are what those call.

`RLOTEL_TEST_FAULTS` (test-only, off unless a test sets it) names hooks, or `all`, whose
rlotel part raises `InjectedFault` first thing, so a test can check the rule on the real
library.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from rlotel.base import env

log = logging.getLogger("rlotel")

ALL = "all"


class InjectedFault(RuntimeError):
    """Raised by `fault` where a test asked for it."""


class UnexpectedCall(TypeError):
    """A call whose arguments rlotel does not know how to read (the library moved)."""


_faults: frozenset[str] = env.test_faults()
_said: set[str] = set()  # what this process's integrations have said once already


def inject(hooks: Iterable[str]) -> None:
    """Test-only: from now on the named hooks' rlotel parts raise (empty: none)."""
    global _faults
    _faults = frozenset(hooks)


def fault(hook: str) -> None:
    """Test-only fault point, placed where a hook's rlotel part starts its own work."""
    if _faults and (hook in _faults or ALL in _faults):
        raise InjectedFault(f"test fault in the {hook} hook")


def failed(hook: str, error: BaseException, loses: str) -> None:
    """rlotel's part of `hook` raised `error`: count it; the first time, say so and what the
    process `loses`. Ray folds lines of different processes that match once their words with
    digits are dropped (its log deduplication) and prints the last: what the hook gives keeps
    each hook's line its own where names differ by digits alone (the `verl_v1_*` hooks)."""
    try:
        from rlotel.base.drops import HOOK_FAILURES  # numpy's module: loaded on failure only

        if HOOK_FAILURES.add(hook) == 1:
            log.warning(
                "rlotel: the %s hook failed (%r), so this process loses: %s. That call, and "
                "any later one where it fails, runs without rlotel (counted in "
                "rlotel_integration_failures_total)",
                hook,
                error,
                loses,
            )
            log.debug("rlotel: the %s hook's failure", hook, exc_info=error)
    except Exception:  # the logging setup of the host process is not ours to break
        pass


def once(key: str) -> bool:
    """True the first time `key` is asked for in this process: a warning said once, not per
    call."""
    if key in _said:
        return False
    _said.add(key)
    return True


def warn_once(key: str, message: str, *args: Any) -> None:
    """`message` logged the first time `key` comes up in this process."""
    if once(key):
        log.warning(message, *args)


def argument(args: tuple, kwargs: dict, position: int, name: str) -> Any:
    """An argument given by position or by name; `UnexpectedCall` when it is neither."""
    if len(args) > position:
        return args[position]
    if name in kwargs:
        return kwargs[name]
    raise UnexpectedCall(f"no {name!r} argument")
