"""This process's Unix clock as rlotel reads it, and its measured offset to the driver's.

Every Unix time stamp rlotel writes (span times, trajectory stamps) comes from `unix_ns`.
`RLOTEL_TEST_CLOCK_SHIFT_S` (test-only) shifts it, to stand for a node whose clock is off.

Offset: a Ray worker measures its clock against the driver's NTP-style over its first
traced worker-group call (`rlotel.integrations.verl_workers`): the driver's send time t1
travels with the call, the worker notes its receive time t2 and reply time t3, the driver
notes when the reply arrived (t4) and sends t4 with its next call to that worker. Then

    offset = ((t2 - t1) + (t3 - t4)) / 2     (this clock minus the driver's)
    uncertainty = ((t4 - t1) - (t3 - t2)) / 2 (half the round trip outside the method)

and the true offset lies within ± uncertainty whatever the two legs' latencies. Spans
exported after that carry `rl.clock.offset_ns` / `rl.clock.uncertainty_ns`; `rlotel
analyze`, `report` and `perfetto` shift every span of that process by it.
"""

from __future__ import annotations

import time

from rlotel.base import env

_SHIFT_NS = env.test_clock_shift_ns()
_offset: list[tuple[int, int]] = []  # (offset_ns, uncertainty_ns) once measured


if _SHIFT_NS:

    def unix_ns() -> int:
        return time.time_ns() + _SHIFT_NS

else:
    unix_ns = time.time_ns


def ntp_offset(t1: int, t2: int, t3: int, t4: int) -> tuple[int, int]:
    """(offset, uncertainty) in ns of the clock that stamped t2, t3 against the one that
    stamped t1, t4 (send, receive, reply, reply received)."""
    return ((t2 - t1) + (t3 - t4)) // 2, max(0, ((t4 - t1) - (t3 - t2)) // 2)


def set_offset(offset_ns: int, uncertainty_ns: int) -> None:
    _offset[:] = [(int(offset_ns), int(uncertainty_ns))]


def offset() -> tuple[int, int] | None:
    """This process's measured (offset_ns, uncertainty_ns) to the driver, if measured."""
    return _offset[0] if _offset else None
