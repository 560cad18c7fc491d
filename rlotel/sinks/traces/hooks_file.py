"""How the process's hooks stood and fired, beside its spans in a traces directory.

`rlotel doctor --traces DIR` reads these files after the run, when no /metrics is left to
scrape: each process's hook states (`rlotel_integration_hooks`), how often each hook fired
(`rlotel_integration_events_total`) and failed (`rlotel_integration_failures_total`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlotel.base.drops import HOOK_FAILURES
from rlotel.base.hook_states import HOOK_EVENTS, HOOK_STATES
from rlotel.publish.sink import Sink

if TYPE_CHECKING:
    from rlotel.derive.stall import OpenPhase

SUFFIX = ".hooks.json"


class HookCountsFile(Sink):
    """Rewrites `<role>-<rank>-<pid>.hooks.json` (whole, by rename) on the publisher's tick
    when a count or state changed, and at flush and shutdown: a killed process leaves its
    counts of the last second."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._written: dict[str, Any] | None = None

    def _write(self) -> None:
        facts = {
            "pid": os.getpid(),
            "states": HOOK_STATES.snapshot(),
            "events": HOOK_EVENTS.snapshot()[0],
            "failures": HOOK_FAILURES.snapshot(),
        }
        if facts == self._written:
            return
        partial = self._path.with_name(self._path.name + ".partial")
        partial.write_text(json.dumps(facts, sort_keys=True))
        os.replace(partial, self._path)
        self._written = facts

    def on_open_phases(self, phases: Sequence[OpenPhase]) -> None:
        self._write()

    def force_flush(self, deadline: float) -> bool:
        self._write()
        return True

    def shutdown(self, deadline: float) -> None:
        self._write()


def read(directory: Path) -> list[dict[str, Any]]:
    """Every process's facts in a traces directory (an unreadable file is skipped)."""
    facts = []
    for path in sorted(Path(directory).glob(f"*{SUFFIX}")):
        try:
            facts.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return facts
