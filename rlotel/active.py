"""The telemetry `rlotel.init` created last: one owner for the process's current run.

Read by `rlotel.current()` and `rlotel.marked_timer` (and so by the integrations), cleared
by that telemetry's shutdown. A module of its own, importing nothing, so that neither the
package nor `rlotel.telemetry` needs the other.
"""

from typing import Any

current: Any = None  # the `rlotel.telemetry.Telemetry` of the run, or None
