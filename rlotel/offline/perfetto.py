"""`rlotel perfetto`: spans and torch.profiler captures on one Chrome trace-event timeline.

Output is the trace-event JSON object format (ui.perfetto.dev and chrome://tracing open
it): one process per exporting process (service, role, rank), threads for its phases, its
sample spans and its captures (`process_name` / `thread_name` metadata), every span a
complete slice (`ph: "X"`, `ts`/`dur` in µs from the earliest span) with its attributes as
`args`.

Clock. Span times are Unix nanoseconds (rlotel records `perf_counter_ns` and adds one
`time_ns() - perf_counter_ns()` offset per export). torch.profiler (Kineto) writes each
event's `ts` in µs relative to the file's `baseTimeNanoseconds`, also on the Unix clock, so
`ts + baseTimeNanoseconds / 1000` is the event's Unix time in µs. The two clocks are read
at different moments, so a residual skew (tens of µs here) remains; it is taken out by the
`record_function` ranges rlotel opens with the phases' names while a capture runs: each
range encloses its phase span, so the shift that puts every range around the same-named
span of a covered step is added to every event of that capture (only when it is under a
second; otherwise the Unix clocks are trusted as they are). Then a step's `update_actor`
slice sits over the ops recorded inside it.
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlotel.offline import otlp_json
from rlotel.offline.analyze import Run, load_run, resolve_capture_path
from rlotel.offline.otlp_json import SpanRecord
from rlotel.schema import attributes as attr
from rlotel.schema import vocabulary as voc

MAX_ALIGNMENT_SHIFT_US = 1_000_000  # a larger "skew" means the names matched other steps
_KEPT_PHASES = frozenset({"X", "i", "I", "C", "s", "t", "f", "B", "E"})
_FLOW_PHASES = frozenset({"s", "t", "f"})
_FLOW_ID_STRIDE = 1 << 40  # flow ids of capture k are offset by k * stride: no collisions
_WINDOW_FLOW_ID = 1 << 52  # window → capture arrows: above every capture's own flow ids


class PerfettoError(Exception):
    """The input holds no spans to lay on a timeline."""


@dataclass(frozen=True)
class PerfettoResult:
    path: Path
    events: int
    spans: int
    captures_merged: int
    captures_missing: int
    skipped_lines: int


def write_perfetto(source: Path, out: Path) -> PerfettoResult:
    """Read `source` (traces file or run directory) and write the timeline to `out`
    (`.gz` → gzipped)."""
    run = load_run(Path(source))
    if not run.spans:
        raise PerfettoError(
            f"no spans found in {source} ({run.skipped_lines} unreadable line(s)); the timeline "
            "needs rlotel traces (OTLP/JSON lines), not a verl FileLogger log"
        )
    trace, merged, missing = timeline(run)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps(trace, separators=(",", ":"), allow_nan=False).encode()
    if out.name.endswith(".gz"):
        payload = gzip.compress(payload, compresslevel=6)
    out.write_bytes(payload)
    return PerfettoResult(
        out, len(trace["traceEvents"]), len(run.spans), merged, missing, run.skipped_lines
    )


def timeline(run: Run) -> tuple[dict[str, Any], int, int]:
    """The trace-event object, and how many captures were merged / not found."""
    origin_ns = min(span.start_ns for span in run.spans)
    builder = _Builder(origin_ns)
    by_process: dict[tuple[str, str], list[SpanRecord]] = defaultdict(list)
    for span in run.spans:
        by_process[otlp_json.process_key(span.resource)].append(span)
    merged = missing = 0
    linked_from = _linked_from(run.spans, by_process)
    for key, spans in by_process.items():
        pid = builder.process(
            key[0] if _unique_label(key, by_process) else f"{key[0]} {key[1][:8]}"
        )
        phases = [s for s in spans if s.name != attr.CAPTURE_SPAN and not _in_samples(s)]
        samples = [s for s in spans if _in_samples(s)]  # trajectories, their turns and tools
        captures = [s for s in spans if s.name == attr.CAPTURE_SPAN]
        builder.spans(pid, "phases", phases, attr.PHASE, sort_base=0)
        builder.spans(pid, "samples", samples, attr.SAMPLE_NAMESPACE, sort_base=100)
        builder.spans(
            pid, "profile captures", captures, attr.PROFILE_NAMESPACE, sort_base=200,
            linked_from=linked_from,
        )  # fmt: skip
        for capture in captures:
            path = resolve_capture_path(
                str(capture.attributes.get(attr.PROFILE_PATH, "")), run.source
            )
            if path is None or not path.name.endswith((".json", ".json.gz")):
                missing += 1
                continue
            covered = _covered_phases(capture, run.spans)
            if builder.torch_capture(pid, path, covered, merged, _capture_label(capture)):
                merged += 1
            else:
                missing += 1
    builder.window_flows(linked_from)
    return (
        {
            "traceEvents": builder.events,
            "displayTimeUnit": "ms",
            "otherData": {
                "rlotel.origin_unix_ns": origin_ns,
                "rlotel.source": str(run.source),
                "rlotel.clock": "ts = Unix µs − origin; captures: ts + baseTimeNanoseconds/1000, "
                "shifted so each record_function range encloses its same-named phase span",
            },
        },
        merged,
        missing,
    )


def _linked_from(
    spans: Sequence[SpanRecord], by_process: dict[tuple[str, str], list[SpanRecord]]
) -> dict[int, list[tuple[str, SpanRecord]]]:
    """Capture span id → (process label, span) of each span that links it: the windows it
    explains (a step, a trainer phase, a worker's call)."""
    captures = {s.span_id for s in spans if s.name == attr.CAPTURE_SPAN}
    found: dict[int, list[tuple[str, SpanRecord]]] = defaultdict(list)
    for key, members in by_process.items():
        for span in members:
            for link in span.links:
                if link.span_id in captures:
                    found[link.span_id].append((key[0], span))
    return found


def _in_samples(span: SpanRecord) -> bool:
    """A trajectory's span, or one of its `chat` turns and `execute_tool` calls."""
    return (
        span.name == attr.SAMPLE_SPAN
        or span.attributes.get(attr.OPERATION) in attr.GENAI_TRAJECTORY_PARTS
    )


def _unique_label(key: tuple[str, str], processes: Iterable[tuple[str, str]]) -> bool:
    return sum(1 for other in processes if other[0] == key[0]) == 1


def _covered_phases(capture: SpanRecord, spans: Sequence[SpanRecord]) -> list[SpanRecord]:
    """Phase spans of the steps a capture covers (its step range), for clock alignment."""
    first = capture.attributes.get(attr.PROFILE_STEP_FIRST)
    last = capture.attributes.get(attr.PROFILE_STEP_LAST, first)
    if not isinstance(first, int):
        return []
    return [
        s
        for s in spans
        if s.name != attr.CAPTURE_SPAN
        and not _in_samples(s)
        and isinstance(s.attributes.get(attr.STEP), int)
        and first <= s.attributes[attr.STEP] <= last
    ]


def _capture_label(capture: SpanRecord) -> str:
    """`torch step2` / `torch step2-3 mb0-1`: which steps a capture's thread tracks cover."""
    attributes = capture.attributes
    first = attributes.get(attr.PROFILE_STEP_FIRST)
    last = attributes.get(attr.PROFILE_STEP_LAST, first)
    label = f"{attributes.get(attr.PROFILE_TOOL, 'torch')} step{first}"
    if last != first:
        label += f"-{last}"
    if attr.PROFILE_MINI_BATCH_FIRST in attributes:
        label += (
            f" mb{attributes[attr.PROFILE_MINI_BATCH_FIRST]}"
            f"-{attributes.get(attr.PROFILE_MINI_BATCH_LAST)}"
        )
    return label


def pack_lanes(spans: Sequence[SpanRecord]) -> list[list[SpanRecord]]:
    """Spans into lanes where every two slices either nest or do not overlap (what one
    trace-event thread can show); concurrent spans (samples, threads) get more lanes."""
    lanes: list[list[SpanRecord]] = []
    stacks: list[list[int]] = []  # per lane: end times of the open slices
    for span in sorted(spans, key=lambda s: (s.start_ns, -s.end_ns)):
        for lane, stack in zip(lanes, stacks, strict=True):
            while stack and stack[-1] <= span.start_ns:
                stack.pop()
            if not stack or span.end_ns <= stack[-1]:
                lane.append(span)
                stack.append(span.end_ns)
                break
        else:
            lanes.append([span])
            stacks.append([span.end_ns])
    return lanes


class _Builder:
    """Accumulates trace events, handing out pids and tids with their metadata."""

    def __init__(self, origin_ns: int) -> None:
        self.origin_ns = origin_ns
        self.events: list[dict[str, Any]] = []
        self._next_tid: dict[int, int] = {}
        self._placed: dict[int, tuple[int, int, float]] = {}  # span id → pid, tid, ts

    def process(self, name: str) -> int:
        pid = len(self._next_tid) + 1
        self._next_tid[pid] = 1
        self._metadata(pid, 0, "process_name", {"name": name})
        self._metadata(pid, 0, "process_sort_index", {"sort_index": pid})
        return pid

    def thread(self, pid: int, name: str, sort_index: int) -> int:
        tid = self._next_tid[pid]
        self._next_tid[pid] = tid + 1
        self._metadata(pid, tid, "thread_name", {"name": name})
        self._metadata(pid, tid, "thread_sort_index", {"sort_index": sort_index})
        return tid

    def _metadata(self, pid: int, tid: int, name: str, args: dict[str, Any]) -> None:
        self.events.append({"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args})

    def spans(
        self,
        pid: int,
        track: str,
        spans: Sequence[SpanRecord],
        category: str,
        sort_base: int,
        linked_from: dict[int, list[tuple[str, SpanRecord]]] | None = None,
    ) -> None:
        for index, lane in enumerate(pack_lanes(spans)):
            name = track if index == 0 else f"{track} {index + 1}"
            tid = self.thread(pid, name, sort_base + index)
            for span in lane:
                ts = (span.start_ns - self.origin_ns) / 1000
                self._placed[span.span_id] = (pid, tid, ts)
                args = _args(span)
                if linked_from and span.span_id in linked_from:  # a capture: its windows
                    args["linked_from"] = sorted(
                        {
                            f"{process} {window.name}"
                            for process, window in linked_from[span.span_id]
                        }
                    )
                self.events.append(
                    {
                        "ph": "X",
                        "name": span.name,
                        "cat": attr.STEP if span.name == voc.STEP else category,
                        "pid": pid,
                        "tid": tid,
                        "ts": ts,
                        "dur": (span.end_ns - span.start_ns) / 1000,
                        "args": args,
                    }
                )

    def window_flows(self, linked_from: dict[int, list[tuple[str, SpanRecord]]]) -> None:
        """An arrow from each window (a span that links a capture) to the capture's slice:
        Perfetto draws flow events between the slices they bind to."""
        flow = _WINDOW_FLOW_ID
        for capture, windows in linked_from.items():
            target = self._placed.get(capture)
            for _, window in windows:
                source = self._placed.get(window.span_id)
                if target is None or source is None:
                    continue
                flow += 1
                for phase, (pid, tid, ts) in (("s", source), ("f", target)):
                    event = {"ph": phase, "id": flow, "pid": pid, "tid": tid, "ts": ts}
                    event.update(name=attr.CAPTURE_SPAN, cat=attr.PROFILE_NAMESPACE)
                    if phase == "f":
                        event["bp"] = "e"  # binds to the capture slice starting there
                    self.events.append(event)

    def torch_capture(
        self,
        pid: int,
        path: Path,
        covered: Sequence[SpanRecord],
        capture_index: int,
        label: str,
    ) -> bool:
        """A Kineto Chrome trace's events on this process's clock; False if unreadable."""
        opener = gzip.open if path.name.endswith(".gz") else open
        try:
            with opener(path, "rb") as stream:
                trace = json.load(stream)
            events = trace["traceEvents"]
        except (OSError, ValueError, KeyError, TypeError, EOFError):
            return False
        base_us = float(trace.get("baseTimeNanoseconds", 0)) / 1000
        shift_us = _alignment_shift(events, base_us, covered)
        to_us = base_us + shift_us - self.origin_ns / 1000
        names = {
            (e.get("pid"), e.get("tid")): e.get("args", {}).get("name", "")
            for e in events
            if e.get("ph") == "M" and e.get("name") == "thread_name"
        }
        processes = {
            e.get("pid"): e.get("args", {}).get("name", "")
            for e in events
            if e.get("ph") == "M" and e.get("name") == "process_name"
        }
        tids: dict[tuple[Any, Any], int] = {}
        for event in events:
            phase = event.get("ph")
            if phase not in _KEPT_PHASES or not isinstance(event.get("ts"), (int, float)):
                continue
            key = (event.get("pid"), event.get("tid"))
            if key not in tids:
                thread = (
                    names.get(key) or ""
                ).strip() or f"{processes.get(key[0], key[0])} {key[1]}"
                tids[key] = self.thread(pid, f"{label}: {thread}", 1000 + len(tids))
            copied = {**event, "pid": pid, "tid": tids[key], "ts": event["ts"] + to_us}
            if phase in _FLOW_PHASES:
                if not isinstance(event.get("id"), int):
                    continue
                copied["id"] = capture_index * _FLOW_ID_STRIDE + event["id"]
            self.events.append(copied)
        return True


def _alignment_shift(
    events: Sequence[dict[str, Any]], base_us: float, covered: Sequence[SpanRecord]
) -> float:
    """The shift (µs) that puts each record_function range around its phase span.

    rlotel enters the range just before it reads the phase's start and leaves it just after
    the end, so each pair allows shifts in [span end − range end, span start − range start];
    the middle of what every pair allows is taken. When the pairs disagree (no common
    shift), the median start difference is.
    """
    spans: dict[str, list[SpanRecord]] = defaultdict(list)
    for span in covered:
        spans[span.name].append(span)
    low, high, starts = -math.inf, math.inf, []
    for event in events:
        if event.get("cat") != "user_annotation" or event.get("name") not in spans:
            continue
        at = float(event["ts"]) + base_us
        end = at + float(event.get("dur", 0.0))
        span = min(spans[event["name"]], key=lambda s: abs(s.start_ns / 1000 - at))
        low = max(low, span.end_ns / 1000 - end)
        high = min(high, span.start_ns / 1000 - at)
        starts.append(span.start_ns / 1000 - at)
    if not starts:
        return 0.0
    shift = (low + high) / 2 if low <= high else statistics.median(starts)
    return shift if abs(shift) < MAX_ALIGNMENT_SHIFT_US else 0.0


def _args(span: SpanRecord) -> dict[str, Any]:
    args: dict[str, Any] = {
        key: value if not isinstance(value, bytes) else value.hex()
        for key, value in span.attributes.items()
    }
    args["span_id"] = span.span_id
    args["trace_id"] = span.trace_id
    if span.parent_span_id:
        args["parent_span_id"] = span.parent_span_id
    if span.links:
        args["links"] = [link.span_id for link in span.links]
    if span.status_code == otlp_json.STATUS_ERROR:
        args["status"] = "ERROR"
    if span.events:  # the reward's gen_ai.evaluation.result, an exception
        args["events"] = [
            {"name": event.name, **{k: _finite(v) for k, v in event.attributes.items()}}
            for event in span.events
        ]
    return {k: _finite(v) for k, v in args.items()}


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinities: those floats as text."""
    if isinstance(value, bytes):
        return value.hex()
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value
