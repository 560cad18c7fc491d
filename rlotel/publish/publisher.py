"""The one queue-and-thread of rlotel: a bounded queue and the daemon thread that drains it.

Work leaves a thread that must not be slowed (the training thread, or the publisher) by one
`put`: the item goes to a bounded queue that drops its oldest items when full (counted),
so a stuck consumer can never grow memory or block the caller. `Publisher` runs the
pipeline's handlers off the training thread; each span exporter drains its own `Worker`
(`rlotel.sinks.traces.export_queue`), so a slow exporter holds up nothing else.
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


class Worker:
    """`put` from any thread; a daemon thread hands `handle` batches of items in order.

    `capacity` bounds the queued weight (an item weighs 1 unless `put` says more: a batch of
    spans weighs its spans). The thread hands over what is queued when `batch` weight is
    waiting, when someone waits (`wake`, `flush`), or `delay_s` after the oldest item came
    (a longer delay coalesces small puts into fewer, larger batches). `tick`, if given, runs
    every `tick_s` seconds between batches (work that watches what is still open, e.g.
    stalled phases). Idle, the thread sleeps until a put or its tick: it never polls, so it
    takes no core and no GIL from the training processes it shares a machine with.
    """

    def __init__(
        self,
        name: str,
        handle: Callable[[list[Any]], None],
        drops: Drops,
        capacity: int,
        *,
        batch: int = 1,
        delay_s: float = 0.0,
        tick: Callable[[], None] | None = None,
        tick_s: float = 1.0,
    ) -> None:
        self.name = name
        self._handle = handle
        self._drops = drops
        self._capacity = max(1, capacity)
        self._batch = max(1, batch)
        self._delay_s = delay_s
        self._tick = tick
        self._tick_s = tick_s
        self._next_tick = time.monotonic() + tick_s
        self._items: deque[tuple[int, Any, int]] = deque()  # (sequence, item, weight)
        self._queued = 0  # weight waiting
        self._oldest_s: float | None = None  # when the queue last became non-empty
        self._now = False  # hand over what is queued without waiting out the delay
        self._submitted = 0  # sequence number of the newest item
        self._handled = 0  # sequence number of the newest item handled (older: handled/dropped)
        self._lock = threading.Condition()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"rlotel-{name}", daemon=True)
        self._thread.start()

    def put(self, item: Any, weight: int = 1) -> None:
        with self._lock:
            self._submitted += 1
            self._items.append((self._submitted, item, weight))
            self._queued += weight
            while self._queued > self._capacity and len(self._items) > 1:
                _, _, dropped = self._items.popleft()
                self._queued -= dropped
                self._drops.add(
                    "spans", "queue_full", f"{self.name}: {self._capacity} waiting", dropped
                )
            first = self._oldest_s is None
            if first:
                self._oldest_s = time.monotonic()
            full = self._queued >= self._batch
        if full:
            self.wake()
        elif first:
            self._wake.set()  # the thread starts the item's delay

    def wake(self) -> None:
        """Handle what is queued now (someone waits for it)."""
        self._now = True
        self._wake.set()

    def _take(self) -> tuple[list[Any], int]:
        """Up to `batch` weight of the oldest items (at least one) and the last one's number."""
        with self._lock:
            items: list[Any] = []
            taken = last = 0
            while self._items and (not items or taken < self._batch):
                last, item, weight = self._items.popleft()
                items.append(item)
                taken += weight
            self._queued -= taken
            if not self._items:
                self._oldest_s = None
            return items, last

    def _timeout(self) -> float | None:
        """Seconds until the next tick or the oldest item's delay ends; None: neither."""
        due = [self._next_tick] if self._tick is not None else []
        oldest = self._oldest_s
        if oldest is not None:
            due.append(oldest + self._delay_s)
        return max(0.0, min(due) - time.monotonic()) if due else None

    def _tick_if_due(self) -> None:
        if self._tick is None or time.monotonic() < self._next_tick:
            return
        self._next_tick = time.monotonic() + self._tick_s
        try:
            self._tick()
        except Exception:
            log.exception("rlotel %s tick failed; continuing", self.name)
            self._drops.add("spans", "internal_error", f"{self.name} tick failed")

    def _run(self) -> None:
        while True:
            self._wake.wait(self._timeout())
            self._wake.clear()  # anything put from here on sets it again
            self._tick_if_due()
            oldest = self._oldest_s
            due = oldest is not None and time.monotonic() >= oldest + self._delay_s
            if not (due or self._now or self._stopping):
                continue
            self._now = False
            while True:
                items, last = self._take()
                if not items:
                    break
                try:
                    self._handle(items)
                except Exception:
                    log.exception("rlotel %s failed on a batch; continuing", self.name)
                    self._drops.add("spans", "internal_error", f"{self.name} failed on a batch")
                with self._lock:
                    self._handled = last
                    self._lock.notify_all()
                self._tick_if_due()  # a queue that never drains still ticks
            if self._stopping:
                return

    def flush(self, deadline: float) -> bool:
        """Wait until everything put so far has been handled; False if `deadline`
        (`time.monotonic()`) passes first."""
        with self._lock:
            target = self._submitted
        self.wake()
        with self._lock:
            while self._handled < target:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(min(remaining, threading.TIMEOUT_MAX))
        return True

    def stop(self, deadline: float) -> bool:
        """Handle what is queued, then end the thread; False if still running at `deadline`."""
        self._stopping = True
        self._wake.set()
        self._thread.join(min(max(deadline - time.monotonic(), 0.0), threading.TIMEOUT_MAX))
        return not self._thread.is_alive()


class Publisher(Worker):
    """Runs the pipeline's handlers off the training thread: each item is queued with the
    handler that takes it (no type dispatch on the far side)."""

    def __init__(
        self,
        drops: Drops,
        capacity: int,
        tick: Callable[[], None] | None = None,
        tick_s: float = 1.0,
    ) -> None:
        super().__init__("publisher", _run_handlers, drops, capacity, tick=tick, tick_s=tick_s)

    def submit(self, handler: Callable[[Any], None], item: Any) -> None:
        self.put((handler, item))


def _run_handlers(items: list[tuple[Callable[[Any], None], Any]]) -> None:
    for handler, item in items:
        handler(item)
