"""The clock exchange over a worker's first traced calls (NTP's four stamps, `rlotel.base.clock`):
the driver stamps its send time t1 on an actor's first traced call and notes the reply's
arrival t4; the next call carries "t1,t4"; the worker, having kept its receive and reply
times t2, t3 of the first, sets its offset to the driver's clock. One object per process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlotel.base import clock

CLOCK_KEY = "rlotel-clock"  # the driver's clock over a worker's first traced call: "t1", "t1,t4"


class ClockExchange:
    """Both sides of the exchange in one process: a driver's (per actor) and a worker's."""

    def __init__(self, is_reference: Callable[[], bool]) -> None:
        self._is_reference = is_reference  # asked once, unless declared first
        self.reference: bool | None = None  # this process's clock is the one workers follow
        self.done: set[Any] = set()  # actors whose exchange is over (or never needed)
        self._sent: dict[Any, list[int | None]] = {}  # actor → [t1, t4]
        # refs of the stamped calls (by id: holding the ref would pin its result) → actor
        self._refs: dict[bytes, Any] = {}
        self._call: tuple[int, int, int] | None = None  # a worker's (t1, t2, t3)

    def declare_reference(self) -> None:
        """This process runs the trainer loop: the workers measure their clocks against it."""
        self.reference = True

    def stamp(self, actor: Any, carrier: dict[str, str]) -> tuple[dict[str, str], bool]:
        """The carrier of a call to an actor whose exchange is not done: the first traced
        call gets t1 (True: note its reply, `sent`), the next one after its reply was timed
        gets "t1,t4". Only the driver's clock is the reference."""
        if self.reference is None:
            self.reference = self._is_reference()
        if not self.reference or actor is None:
            self.done.add(actor)
            return carrier, False
        state = self._sent.get(actor)
        if state is None:
            t1 = clock.unix_ns()
            self._sent[actor] = [t1, None]
            return {**carrier, CLOCK_KEY: str(t1)}, True
        t1, t4 = state
        if t4 is None:  # its reply not timed yet (or never: a call outside a worker group)
            return carrier, False
        self.done.add(actor)
        del self._sent[actor]
        return {**carrier, CLOCK_KEY: f"{t1},{t4}"}, False

    def sent(self, ref: Any, actor: Any) -> None:
        """The stamped call's reply is `ref`: its arrival is t4."""
        if hasattr(ref, "binary"):
            self._refs[ref.binary()] = actor

    @property
    def awaiting(self) -> bool:
        """A stamped call's reply is still to be timed."""
        return bool(self._refs)

    def replied(self, ready: list[Any]) -> None:
        """t4: the replies in `ready` are here (the driver's clock)."""
        t4 = clock.unix_ns()
        for ref in ready:
            actor = self._refs.pop(ref.binary(), None)
            if actor is not None and actor in self._sent:
                self._sent[actor][1] = t4

    def heard(self, value: str, t2: int, t3: int) -> None:
        """In a worker: a stamped call was received at t2 and replied at t3 (this clock)."""
        try:
            stamps = [int(part) for part in value.split(",")]
        except (AttributeError, ValueError):
            return
        if len(stamps) == 1:
            self._call = (stamps[0], t2, t3)
        elif len(stamps) == 2 and self._call is not None and self._call[0] == stamps[0]:
            t1, t2_first, t3_first = self._call
            clock.set_offset(*clock.ntp_offset(t1, t2_first, t3_first, stamps[1]))
