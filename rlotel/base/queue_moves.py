"""Data-queue operations of this process (TransferQueue, fully async's MessageQueue):
counted where they happen, on whatever thread or event loop runs them, read by the series
(`rlotel_queue_*`). Process-wide, like the hook events: a queue client works before and
beside the process's telemetry."""

from __future__ import annotations

import threading


class QueueMoves:
    """Seconds, bytes and operations by (queue, op)."""

    def __init__(self) -> None:
        self._totals: dict[tuple[str, str], tuple[float, int, int]] = {}
        self._lock = threading.Lock()

    def moved(self, queue: str, op: str, seconds: float, nbytes: int) -> None:
        with self._lock:
            spent, moved, ops = self._totals.get((queue, op), (0.0, 0, 0))
            self._totals[queue, op] = (spent + seconds, moved + nbytes, ops + 1)

    def snapshot(self) -> dict[tuple[str, str], tuple[float, int, int]]:
        """(queue, op) → (seconds, bytes, operations)."""
        with self._lock:
            return dict(self._totals)


QUEUE_MOVES = QueueMoves()
