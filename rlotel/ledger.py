"""The step ledger: the training thread's only contact with rlotel.

Entering or leaving a phase reads the clock, pushes or pops an NVTX range and appends one
record; spans, metrics and files are made later, off the training thread, from the closed
step. Times are `perf_counter_ns` (monotonic, exact differences); the publisher maps them
to Unix time when the step closes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from random import getrandbits
from time import perf_counter_ns
from typing import Any

from rlotel import formulas, nvtx
from rlotel.drops import Drops, as_finite_float, clean_counts

log = logging.getLogger("rlotel")


class PhaseRecord:
    """One timed window. `parent` is the enclosing record, None for a top-level window."""

    __slots__ = ("color", "end_ns", "error", "name", "parent", "span_id", "start_ns")

    def __init__(self, name: str, color: str | None, parent: PhaseRecord | None) -> None:
        self.name = name
        self.color = color
        self.parent = parent
        self.span_id = getrandbits(64) or 1
        self.start_ns = 0
        self.end_ns = 0
        self.error: BaseException | None = None

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


class Trace:
    """A tree of records with one root: a step, or a phase opened outside any step."""

    __slots__ = ("records", "root", "step", "trace_id")

    def __init__(self, root: PhaseRecord, step: int | None) -> None:
        self.trace_id = getrandbits(128) or 1
        self.root = root
        self.records: list[PhaseRecord] = []
        self.step = step


class Step:
    """Handle of one training step: feed it tokens and MFU; read verl's numbers after close."""

    def __init__(self, ledger: Ledger, number: int) -> None:
        self._ledger = ledger
        self.number = number
        self.trace = Trace(PhaseRecord("step", None, None), number)
        self.prompt_tokens: int | float | None = None
        self.response_tokens: int | float | None = None
        self.mfu: dict[str, float] = {}
        self.timing_raw: dict[str, float] = {}
        self.metrics: dict[str, float] = {}
        self.unaccounted_seconds: float = 0.0
        self.verdict: Any = None
        self.closed = False

    @property
    def record(self) -> PhaseRecord:
        return self.trace.root

    @property
    def total_tokens(self) -> int | float | None:
        if self.prompt_tokens is None or self.response_tokens is None:
            return None
        return self.prompt_tokens + self.response_tokens

    def set_tokens(self, prompt: Any = None, response: Any = None) -> None:
        """Per-sequence prompt and response token counts (lists, arrays or tensors)."""
        try:
            drops = self._ledger.drops
            sums = []
            for kind, values in (("prompt", prompt), ("response", response)):
                counts, n_bad, reason = clean_counts(values)
                if n_bad:
                    drops.add("tokens", reason, f"{n_bad} invalid {kind} token count(s)", n_bad)
                total = counts.sum()
                sums.append(int(total) if float(total).is_integer() else float(total))
            if prompt is not None and response is not None and _length(prompt) != _length(response):
                drops.add(
                    "tokens",
                    "length_mismatch",
                    f"{_length(prompt)} prompt counts vs {_length(response)} response counts "
                    "(sums kept)",
                )
            self.prompt_tokens, self.response_tokens = sums
        except Exception as exc:  # telemetry must never raise into training
            self._ledger.drops.add("tokens", "internal_error", repr(exc))

    def set_mfu(self, **roles: Any) -> None:
        """MFU ratios by role, e.g. `actor=0.41, actor_infer=0.33` (verl's perf/mfu/*)."""
        for role, value in roles.items():
            number, reason = as_finite_float(value)
            if number is None or number < 0:
                self._ledger.drops.add("mfu", reason or "negative", f"mfu {role}={value!r}")
                continue
            self.mfu[role] = number

    def __enter__(self) -> Step:
        self._ledger.open_step(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._ledger.close_step(self, exc)
        return False

    def finish(self, n_gpus: int) -> None:
        """Compute verl's timing_raw and metrics from the closed records."""
        timing: dict[str, float] = {}
        for record in self.trace.records:
            if record.end_ns:
                timing[record.name] = timing.get(record.name, 0) + record.seconds
        timing["step"] = self.record.seconds
        self.timing_raw = timing
        metrics = formulas.timing_metrics(timing, self.prompt_tokens, self.response_tokens)
        metrics.update(formulas.throughput_metrics(timing, self.total_tokens, n_gpus))
        metrics.update(formulas.mfu_metrics(self.mfu))
        self.metrics = metrics
        self.unaccounted_seconds = max(0.0, timing["step"] - self._top_level_seconds())
        self.closed = True

    def _top_level_seconds(self) -> float:
        """Seconds covered by top-level phases, overlaps counted once."""
        intervals = sorted(
            (r.start_ns, r.end_ns) for r in self.trace.records if r.parent is None and r.end_ns
        )
        covered, reach = 0, 0
        for start, end in intervals:
            start = max(start, reach)
            if end > start:
                covered += end - start
                reach = end
        return covered / 1e9


def _length(values: Any) -> int:
    try:
        return len(values)
    except TypeError:
        return 1


class PhaseScope:
    """Context manager of one phase; also verl's `marked_timer` when given a `sink` dict."""

    __slots__ = ("_color", "_ledger", "_name", "_record", "_sink", "_start")

    def __init__(
        self,
        ledger: Ledger | None,
        name: str,
        color: str | None = None,
        sink: MutableMapping[str, float] | None = None,
    ) -> None:
        self._ledger = ledger
        self._name = name
        self._color = color
        self._sink = sink
        self._record: PhaseRecord | None = None

    def __enter__(self) -> PhaseScope:
        ledger = self._ledger
        if ledger is not None:
            try:
                self._record = ledger.open_phase(self._name, self._color)
            except Exception as exc:
                ledger.drops.add("spans", "internal_error", repr(exc))
        backend = nvtx._backend
        if backend is not None:
            backend.push(self._name, self._color)
        self._start = start = perf_counter_ns()
        if self._record is not None:
            self._record.start_ns = start
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        end = perf_counter_ns()
        backend = nvtx._backend
        if backend is not None:
            backend.pop()
        sink = self._sink
        if sink is not None:
            try:
                sink[self._name] = sink.get(self._name, 0) + (end - self._start) / 1e9
            except Exception as sink_exc:
                if self._ledger is not None:
                    self._ledger.drops.add("timing_raw", "bad_dict", repr(sink_exc))
        record = self._record
        if record is not None:
            record.end_ns = end
            if exc is not None:
                record.error = exc
            try:
                self._ledger.close_phase(record)
            except Exception as ledger_exc:
                self._ledger.drops.add("spans", "internal_error", repr(ledger_exc))
        return False


class Ledger:
    """Open step, open phases and the hand-off of closed traces to the publisher."""

    def __init__(self, publish: Callable[[Any], None], drops: Drops, n_gpus: int) -> None:
        self._publish = publish
        self.drops = drops
        self._n_gpus = n_gpus
        self._stack: list[PhaseRecord] = []
        self._step: Step | None = None
        self._loose: Trace | None = None
        self.last_step_number: int | None = None

    @property
    def current_step(self) -> Step | None:
        return self._step

    def open_step(self, step: Step) -> None:
        if self._step is not None:
            self.drops.add(
                "spans",
                "nested_step",
                f"step {step.number} opened inside step {self._step.number}; its phases "
                "are recorded in the outer step",
            )
            return
        self._step = step
        self._stack.clear()
        backend = nvtx._backend
        if backend is not None:
            backend.push("step", None)
        step.record.start_ns = perf_counter_ns()

    def close_step(self, step: Step, exc: BaseException | None) -> None:
        end = perf_counter_ns()
        if self._step is not step:
            return
        backend = nvtx._backend
        if backend is not None:
            backend.pop()
        step.record.end_ns = end
        step.record.error = exc
        self._step = None
        self._stack.clear()
        self.last_step_number = step.number
        try:
            unclosed = [r.name for r in step.trace.records if not r.end_ns]
            if unclosed:
                self.drops.add("spans", "unclosed_phase", f"step closed with {unclosed} open")
            step.finish(self._n_gpus)
        except Exception as finish_exc:
            self.drops.add("metrics", "internal_error", repr(finish_exc))
        self._publish(step)

    def open_phase(self, name: str, color: str | None) -> PhaseRecord:
        stack = self._stack
        record = PhaseRecord(name, color, stack[-1] if stack else None)
        if self._step is not None:
            self._step.trace.records.append(record)
        elif self._loose is None:
            self._loose = Trace(record, self.last_step_number)
        else:
            self._loose.records.append(record)
        stack.append(record)
        return record

    def close_phase(self, record: PhaseRecord) -> None:
        stack = self._stack
        if stack and stack[-1] is record:
            stack.pop()
        elif record in stack:
            stack.remove(record)
        loose = self._loose
        if loose is not None and loose.root is record:
            self._loose = None
            stack.clear()
            self._publish(loose)
