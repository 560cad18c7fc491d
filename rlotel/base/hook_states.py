"""How each hook of the process stands and how often it ran, published by the hook registry
and its hooks, read by the series.

Apart from `drops` (which loads numpy) so that the plugin, switched on, loads nothing heavy
until verl imports what it hooks.
"""

from __future__ import annotations

import threading


class HookStates:
    """How each hook of the process stands (`rlotel_integration_hooks{hook,state}`), as the
    hook registry (`rlotel.integrations.hooks`) last published it."""

    def __init__(self) -> None:
        self._states: dict[str, str] = {}
        self._lock = threading.Lock()

    def set(self, states: dict[str, str]) -> None:
        with self._lock:
            self._states = dict(states)

    def snapshot(self) -> dict[str, str]:
        with self._lock:
            return dict(self._states)


class HookEvents:
    """How often each hook ran (`rlotel_integration_events_total{hook}`) and what it cost
    its callers' threads (`rlotel_integration_seconds_total{hook}`), for the whole process:
    a hook can run before the process's telemetry starts (a trainer's `fit`, a replica
    made at start-up), and one that stops counting has stopped firing."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    def fired(self, hook: str, seconds: float = 0.0) -> None:
        with self._lock:
            self._counts[hook] = self._counts.get(hook, 0) + 1
            if seconds:
                self._seconds[hook] = self._seconds.get(hook, 0.0) + seconds

    def snapshot(self) -> tuple[dict[str, int], dict[str, float]]:
        """(runs by hook, seconds by hook)."""
        with self._lock:
            return dict(self._counts), dict(self._seconds)


HOOK_STATES = HookStates()
HOOK_EVENTS = HookEvents()
