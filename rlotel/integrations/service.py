"""What an integration may ask of its process's telemetry, and nothing more.

The hooks in this package see a `Telemetry` through this one narrow interface — a hook
fired, an input dropped, the run and the process's identity, where the ledger stands, the
stall watch's progress — so the ledger, the stall watch, the drop counts and the config can
change behind it without touching a hook. Opening windows and recording samples go through
the user API (`tel.step`, `tel.phase`, `tel.record_samples`), as for any user.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlotel.telemetry import Telemetry


class TelemetryService:
    __slots__ = ("_tel",)

    def __init__(self, tel: Telemetry) -> None:
        self._tel = tel

    # --- counting -------------------------------------------------------------------------

    def dropped(self, signal: str, reason: str, detail: str, count: int = 1) -> None:
        """Inputs of `signal` dropped (`rlotel_telemetry_dropped_total`), said once."""
        self._tel.drops.add(signal, reason, detail, count)

    # --- identity ---------------------------------------------------------------------------

    @property
    def run(self) -> str:
        return self._tel.config.run

    @property
    def resource(self) -> Mapping[str, Any]:
        """The process's resource attributes (role, rank, node, ...)."""
        return self._tel.config.resource_attributes

    # --- where the ledger stands -----------------------------------------------------------

    def next_step_number(self) -> int:
        """The number a step opened now without one gets."""
        return (self._tel.ledger.last_step_number or 0) + 1

    def idle(self) -> bool:
        """No step and no window open in this process."""
        ledger = self._tel.ledger
        return ledger.current_step is None and not ledger.in_open_phase()

    def in_trace(self) -> bool:
        return self._tel.ledger.current_trace is not None

    def context_ids(self) -> tuple[int, int] | None:
        """The open window's (trace id, span id), None outside one."""
        return self._tel.ledger.current_context()

    def flush_captures(self) -> None:
        """verl stopped its profilers: the captures of the last steps get linked now."""
        for hook in self._tel.ledger.hooks:
            hook.flush()

    # --- the stall watch --------------------------------------------------------------------

    def progress_reported(self) -> dict[str, int]:
        """This process's progress under other processes' spans."""
        return self._tel.stalls.reported

    def heard_progress(self, span_ids: Iterable[int]) -> int:
        """Other processes' progress under these spans; how many were dropped."""
        return self._tel.stalls.heard(span_ids)


def of(tel: Telemetry) -> TelemetryService:
    """The service of `tel` to integrations."""
    return TelemetryService(tel)
