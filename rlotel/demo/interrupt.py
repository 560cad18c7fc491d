"""Ctrl-C in `rlotel demo`: the demo stops at the next safe point, never mid-way through
rlotel's own bookkeeping, so telemetry shuts down whole and the demo can say which of its
files it wrote.

The SIGINT handler only notes the request; a wait (serving, or held at a point) looks at it
every `POLL_S`, never parks in `signal.pause()`, which a signal landing just before it would
leave parked for good (a Ctrl-C lost on a loaded machine). The safe points are the step
boundaries of training, the gaps between the printed tables and the start of each write. A
second Ctrl-C exits at once (`EXIT_INTERRUPTED`), for a shutdown that hangs.

`--hold-at POINT` (a test hook) makes the demo print `holding at POINT` and wait there for
a signal, so a test interrupts it at exactly that point rather than racing it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from types import FrameType, TracebackType

EXIT_INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a process Ctrl-C ended
POINTS = ("starting", "training", "printing", "report")  # where `--hold-at` can hold
POLL_S = 0.05  # how soon a wait ends after Ctrl-C


class Interrupted(Exception):
    """Ctrl-C stopped the demo at `point`."""

    def __init__(self, point: str) -> None:
        super().__init__(point)
        self.point = point


class CtrlC:
    """The demo's SIGINT handler while it is installed (a context manager)."""

    def __init__(self, announce: Callable[[str], None], hold_at: str | None = None) -> None:
        self.requested = False
        self._announce = announce
        self._hold_at = hold_at
        self._previous: signal.Handlers | Callable | int | None = None

    def __enter__(self) -> CtrlC:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: TracebackType | None
    ) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            os.write(2, b"rlotel demo: Ctrl-C again: exiting now, files may be incomplete\n")
            os._exit(EXIT_INTERRUPTED)
        self.requested = True

    def checkpoint(self, point: str) -> None:
        """A safe point: raises `Interrupted(point)` once Ctrl-C was pressed; held here
        until a signal when `--hold-at` names it."""
        if point == self._hold_at:
            self._announce(f"holding at {point} (--hold-at): waiting for a signal")
            self.wait(None)
        if self.requested:
            raise Interrupted(point)

    def wait(self, seconds: float | None) -> bool:
        """Sleep `seconds` (None: until a signal); True when Ctrl-C ended the wait."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while not self.requested:
            left = POLL_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, POLL_S))
        return True
