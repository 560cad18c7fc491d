"""The thread that runs the pipeline's handlers, off the training thread.

Each item is queued with the handler that takes it (no type dispatch on the far side).
The training thread pays one deque append and an Event set per step. The queue is
bounded and drops the oldest item when full (counted), so a stuck exporter can never grow
memory or block training.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from rlotel.base.drops import Drops

log = logging.getLogger("rlotel")

POLL_S = 0.05  # how often an idle publisher looks at the clock for its tick


class Publisher:
    """`tick`, if given, also runs on this thread every `tick_s` seconds (work that watches
    what is still open, e.g. stalled phases), between items, never while one is handled."""

    def __init__(
        self,
        drops: Drops,
        maxlen: int,
        tick: Callable[[], None] | None = None,
        tick_s: float = 1.0,
    ) -> None:
        self._drops = drops
        self._tick = tick
        self._tick_s = tick_s
        self._queue: deque[Any] = deque(maxlen=maxlen)
        self._wake = threading.Event()
        self._idle = threading.Condition()
        self._submitted = 0  # sequence number of the newest item
        self._handled = 0  # sequence number of the newest item handled (older: handled/dropped)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="rlotel-publisher", daemon=True)
        self._thread.start()

    def submit(self, handler: Callable[[Any], None], item: Any) -> None:
        items = self._queue
        if len(items) == items.maxlen:
            self._drops.add("spans", "queue_full", f"publisher queue of {items.maxlen} is full")
        self._submitted += 1
        items.append((self._submitted, handler, item))  # a full deque discards its oldest item
        self._wake.set()

    def wake(self) -> None:
        """Handle what is queued now (someone waits for it)."""
        self._wake.set()

    def _tick_if_due(self) -> None:
        if self._tick is None or time.monotonic() < self._next_tick:
            return
        self._next_tick = time.monotonic() + self._tick_s
        try:
            self._tick()
        except Exception:
            log.exception("rlotel publisher tick failed; continuing")
            self._drops.add("spans", "internal_error", "publisher tick failed")

    def _run(self) -> None:
        self._next_tick = time.monotonic() + self._tick_s
        while True:
            timeout = POLL_S
            if self._tick is not None:
                timeout = min(timeout, max(0.0, self._next_tick - time.monotonic()))
            self._wake.wait(timeout)
            self._wake.clear()  # anything submitted from here on sets it again
            self._tick_if_due()
            while self._queue:
                try:
                    sequence, handler, item = self._queue.popleft()
                except IndexError:
                    break
                try:
                    handler(item)
                except Exception:
                    log.exception("rlotel publisher failed on %s; continuing", type(item).__name__)
                    self._drops.add("spans", "internal_error", "publisher failed on one item")
                with self._idle:
                    self._handled = sequence
                    self._idle.notify_all()
                self._tick_if_due()  # a queue that never drains still ticks
            if self._stopping:
                return

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything submitted so far has been handled."""
        target = self._submitted
        self.wake()
        timeout_s = min(max(timeout_s, 0.0), threading.TIMEOUT_MAX)
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._handled < target:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def stop(self, timeout_s: float) -> bool:
        self._stopping = True
        self._wake.set()
        self._thread.join(min(max(timeout_s, 0.0), threading.TIMEOUT_MAX))
        return not self._thread.is_alive()
