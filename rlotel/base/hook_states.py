"""How each hook of the process stands, published by the hook registry, read by the series.

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


HOOK_STATES = HookStates()
