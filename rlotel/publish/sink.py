"""The one interface everything downstream of the ledger implements, and its composite.

In the spirit of OpenTelemetry's `SpanProcessor` + `SynchronousMultiSpanProcessor` and
vLLM's `StatLoggerBase` + `StatLoggerManager`: a sink gets small calls on the publisher
thread, each with data the pipeline already finished (verdicts, derived numbers, capture
summaries are computed once, before fan-out), and flush/shutdown share one deadline.
A user's own sink subclasses `Sink` and goes to `rlotel.init(sinks=[...])`.

The interface belongs to the pipeline layer, beneath both the series recorder and the
exporters that implement it (`tests/test_architecture.py`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rlotel.base.drops import Drops

if TYPE_CHECKING:
    from rlotel.derive.stall import OpenPhase
    from rlotel.record.capture import Capture
    from rlotel.record.ledger import Step, Trace
    from rlotel.record.samples import SampleBatch

log = logging.getLogger("rlotel")


class Sink:
    """Receives closed telemetry on the publisher thread; every method is optional.

    Methods must not block for long (the publisher serves every sink in turn) and may
    raise: the composite counts the failure and carries on with the other sinks.
    `deadline` is a `time.monotonic()` value shared by every sink of one flush/shutdown.
    """

    def on_step(self, step: Step) -> None:
        """A closed step: its trace, derived numbers, verdict and capture links are final."""

    def on_trace(self, trace: Trace) -> None:
        """A phase tree opened outside any step (verl's `testing`, a worker's phase)."""

    def on_samples(self, batch: SampleBatch) -> None:
        """Samples recorded outside any local trace (remote parent, or none)."""

    def on_log(self, data: Mapping[str, Any], step: int | None) -> None:
        """A verl `Tracking.log` dict; `step` is None when its step number was unusable."""

    def on_capture(self, capture: Capture) -> None:
        """A profiler output, already summarised; steps that link to it follow."""

    def on_open_phases(self, phases: Sequence[OpenPhase]) -> None:
        """Every tick (about once a second): each phase name with an open span now, its
        oldest span's age and whether it stalled (`onset`: on this tick)."""

    def force_flush(self, deadline: float) -> bool:
        """Push what was received so far; True when done before `deadline`."""
        return True

    def shutdown(self, deadline: float) -> None:
        """Flush and release resources, returning by `deadline`."""


class CompositeSink(Sink):
    """Fans each call out to its sinks in order; one failing sink never stops the others."""

    def __init__(self, sinks: Sequence[Sink], drops: Drops) -> None:
        self.sinks = list(sinks)
        self._drops = drops

    def _each(self, method: str, *args: Any) -> None:
        for sink in self.sinks:
            try:
                getattr(sink, method)(*args)
            except Exception as error:
                self._drops.add("spans", "sink_error", f"{type(sink).__name__}.{method}: {error!r}")

    def on_step(self, step: Step) -> None:
        self._each("on_step", step)

    def on_trace(self, trace: Trace) -> None:
        self._each("on_trace", trace)

    def on_samples(self, batch: SampleBatch) -> None:
        self._each("on_samples", batch)

    def on_log(self, data: Mapping[str, Any], step: int | None) -> None:
        self._each("on_log", data, step)

    def on_capture(self, capture: Capture) -> None:
        self._each("on_capture", capture)

    def on_open_phases(self, phases: Sequence[OpenPhase]) -> None:
        self._each("on_open_phases", phases)

    def force_flush(self, deadline: float) -> bool:
        done = True
        for sink in self.sinks:
            try:
                done = sink.force_flush(deadline) and done
            except Exception as error:
                self._drops.add("spans", "sink_error", f"{type(sink).__name__}: {error!r}")
                done = False
        return done and time.monotonic() <= deadline

    def shutdown(self, deadline: float) -> None:
        """In parallel: an exporter facing a blackholed collector may block until its own
        timeout, and must not take the others' share of the deadline."""
        closers = [
            threading.Thread(target=self._close, args=(sink, deadline), daemon=True)
            for sink in self.sinks
        ]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(max(0.0, deadline - time.monotonic()))
            if closer.is_alive():
                log.warning("rlotel: export did not finish by the shutdown deadline; giving up")

    @staticmethod
    def _close(sink: Sink, deadline: float) -> None:
        try:
            sink.shutdown(deadline)
        except Exception as error:
            log.warning("rlotel: %s did not shut down cleanly: %r", type(sink).__name__, error)
