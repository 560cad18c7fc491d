"""What happens to a closed item before any sink sees it, on the publisher thread.

Exactly one place publishes a closed step: here. Each step is finished once, in step
order — its summary (`rlotel.derive.summary`: verl's derived numbers), then the verdict (the
diagnoser keeps the run's trends) — and only then fanned out; a step a hook holds (its
profiler capture is still being written) waits here until the hook releases it. Capture
summaries are read once, here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, NamedTuple

from rlotel.base.drops import Drops
from rlotel.derive.diagnose import Diagnoser
from rlotel.publish.sink import Sink
from rlotel.record.capture import Capture, read_trace
from rlotel.record.ledger import Step, Trace
from rlotel.record.samples import SampleBatch


class LogRecord(NamedTuple):
    """A `tel.log` call: a snapshot of the dict and the step it belongs to."""

    data: dict
    step: Any


class Pipeline:
    def __init__(
        self,
        sink: Sink,
        diagnoser: Diagnoser,
        drops: Drops,
        top_ops: int,
        closed: Callable[[Trace], None] | None = None,
    ) -> None:
        self.sink = sink
        self._closed = closed  # sees every closed trace first (the stall watch's history)
        self._diagnoser = diagnoser
        self._drops = drops
        self._top_ops = top_ops
        self._held: dict[int, Step] = {}
        self._expect_logs = False
        self._awaiting_log: Step | None = None

    def expect_logs(self, _: Any = None) -> None:
        """Every step will be logged (verl's `Tracking.log`, after its timers closed, with its
        MFU and token counts): a closed step waits for its log — until the next step is
        ready or shutdown, never longer — so its verdict has that evidence."""
        self._expect_logs = True

    def step(self, step: Step) -> None:
        if self._closed is not None:
            self._closed(step.trace)
        if step.held:
            self._held[id(step)] = step
            return
        self._publish(step)

    def _publish(self, step: Step) -> None:
        if self._expect_logs and step.logged is None:
            self._publish_awaiting()
            self._awaiting_log = step
            return
        self._finish(step)

    def _publish_awaiting(self) -> None:
        step, self._awaiting_log = self._awaiting_log, None
        if step is not None:
            self._finish(step)

    def _finish(self, step: Step) -> None:
        unclosed = [phase.name for phase in step.trace.records if not phase.end_ns]
        if unclosed:
            self._drops.add("spans", "unclosed_phase", f"step closed with {unclosed} open")
        summary = step.summary
        try:
            verdict = self._diagnoser.observe(summary.facts)
        except Exception as error:  # a verdict is never worth losing the step for
            self._drops.add("spans", "internal_error", f"verdict: {error!r}")
            verdict = None
        step.publish(replace(summary, verdict=verdict))
        self.sink.on_step(step)

    def release(self, steps: Iterable[Step]) -> None:
        """A hook finished the captures of these held steps: publish them now, in order."""
        for step in steps:
            if self._held.pop(id(step), None) is not None:
                self._publish(step)

    def release_all(self, _: Any = None) -> None:
        self._publish_awaiting()
        for step in sorted(self._held.values(), key=lambda s: s.number):
            self._finish(step)
        self._held.clear()

    def trace(self, trace: Trace) -> None:
        if self._closed is not None:
            self._closed(trace)
        self.sink.on_trace(trace)

    def samples(self, batch: SampleBatch) -> None:
        self.sink.on_samples(batch)

    def log(self, record: LogRecord) -> None:
        waiting = self._awaiting_log
        if waiting is not None and waiting.number == record.step:
            self._awaiting_log = None
            waiting.adopt_log(record.data)
            self._finish(waiting)
        else:
            for held in self._held.values():
                if held.number == record.step:
                    held.adopt_log(record.data)  # published with it once released
        self.sink.on_log(record.data, record.step)

    def capture(self, capture: Capture) -> None:
        try:
            read_trace(capture, self._top_ops)
        except Exception as error:  # a missing or truncated file still gets its link
            self._drops.add("profile", "unreadable_capture", f"{capture.path}: {error!r}")
        self.sink.on_capture(capture)
