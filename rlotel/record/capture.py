"""One profiler output file, the span that stands for it, and its summary.

The summary (size, top operators by self time, the phase ranges found in the file) is
read by streaming the Chrome trace, once, in the pipeline before the capture fans out.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlotel.base import ids
from rlotel.schema import attributes as attr

_UNSAFE = re.compile(r"[^0-9A-Za-z.=+-]+")


def trace_basename(
    role: str,
    steps: tuple[int, int],
    rank: int,
    world_size: int,
    mini_batches: tuple[int, int] | None = None,
    prefix: str = "rlotel",
) -> str:
    """verl's naming style: {prefix}_{role}_step{N}[-M]_rank{R}[-of-W]_pid{pid}_{time}[_mbA-B]."""
    first, last = steps
    parts = [
        prefix,
        role,
        f"step{first}" if first == last else f"step{first}-{last}",
        f"rank{rank}" if world_size <= 1 else f"rank{rank}-of-{world_size}",
        f"pid{os.getpid()}",
        time.strftime("%Y%m%d%H%M%S") + f"{time.time_ns() // 1_000_000 % 1000:03d}",
    ]
    if mini_batches is not None:
        parts.append(f"mb{mini_batches[0]}-{mini_batches[1]}")
    return "_".join(_UNSAFE.sub("-", part) for part in parts)


def capture_ids(path: Path | str) -> tuple[int, int]:
    """(trace id, span id) of the span that stands for the output file named `path`: drawn
    from its file name, so every process that links the file (the worker that wrote it,
    the trainer that found it) links the same span. verl's and the engines' names carry
    the pid and a millisecond timestamp."""
    digest = hashlib.blake2b(Path(path).name.encode(), digest_size=24).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:], "big") or 1
    return trace_id, span_id


@dataclass
class Capture:
    """One profiler output file and the span that stands for it."""

    tool: str
    path: Path
    steps: tuple[int, int] | None  # None: not known where it was linked (an engine's, by a worker)
    role: str
    rank: int
    mini_batches: tuple[int, int] | None = None
    start_ns: int = 0  # perf_counter_ns
    end_ns: int = 0
    phase_context: tuple[int, int] | None = None  # (trace_id, span_id) the window covered
    trace_id: int = field(default_factory=ids.trace_id)
    span_id: int = field(default_factory=ids.span_id)
    size: int = 0
    top_ops: list[str] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)
    stage: str | None = None  # the window the writer named (verl: `actor_update`, `train`)
    replica: int | None = None  # a rollout engine's capture: its replica
    token_window: tuple[int | None, int | None] | None = None  # the engine's, when set

    @classmethod
    def of_file(
        cls,
        tool: str,
        path: Path,
        steps: tuple[int, int] | None,
        role: str,
        rank: int,
        **fields: Any,
    ) -> Capture:
        """A capture whose span ids follow from its file name (`capture_ids`)."""
        trace_id, span_id = capture_ids(path)
        return cls(tool, path, steps, role, rank, trace_id=trace_id, span_id=span_id, **fields)

    def attributes(self) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            attr.PROFILE_PATH: str(self.path),
            attr.PROFILE_SIZE: self.size,
            attr.PROFILE_TOOL: self.tool,
            attr.PROFILE_ROLE: self.role,
            attr.PROFILE_RANK: self.rank,
        }
        if self.steps is not None:
            attributes[attr.PROFILE_STEP_FIRST] = self.steps[0]
            attributes[attr.PROFILE_STEP_LAST] = self.steps[1]
        if self.mini_batches is not None:
            attributes[attr.PROFILE_MINI_BATCH_FIRST] = self.mini_batches[0]
            attributes[attr.PROFILE_MINI_BATCH_LAST] = self.mini_batches[1]
        if self.stage is not None:
            attributes[attr.PROFILE_STAGE] = self.stage
        if self.replica is not None:
            attributes[attr.PROFILE_REPLICA] = self.replica
        if self.token_window is not None:
            start, end = self.token_window
            if start is not None:
                attributes[attr.PROFILE_TOKEN_START] = start
            if end is not None:
                attributes[attr.PROFILE_TOKEN_END] = end
        if self.top_ops:
            attributes[attr.PROFILE_TOP_OPS] = list(self.top_ops)
        if self.phases:
            attributes[attr.PROFILE_PHASES] = list(self.phases)
        return attributes


def read_trace(capture: Capture, top_n: int) -> None:
    """Size, top-N operators by self time and the record_function ranges (rlotel's phases,
    verl's stage ranges), streaming the Chrome trace rather than loading it."""
    import ijson

    capture.size = capture.path.stat().st_size
    if not capture.path.name.endswith((".json", ".json.gz")):
        return
    opener = gzip.open if capture.path.name.endswith(".gz") else open
    by_thread: dict[Any, list[tuple[float, float, str]]] = {}
    phases: list[tuple[float, float, str]] = []
    with opener(capture.path, "rb") as stream:
        for event in ijson.items(stream, "traceEvents.item", use_float=True):
            if event.get("ph") != "X":
                continue
            category, name = event.get("cat", ""), event.get("name", "")
            start, duration = float(event.get("ts", 0.0)), float(event.get("dur", 0.0))
            if category == "user_annotation":
                phases.append((start, duration, name))
            elif category in ("cpu_op", "kernel", "gpu_memcpy"):
                key = (event.get("pid"), event.get("tid"))
                by_thread.setdefault(key, []).append((start, duration, name))
    self_time: dict[str, float] = {}
    for events in by_thread.values():
        _add_self_times(sorted(events, key=lambda e: (e[0], -e[1])), self_time)
    ranked = sorted(self_time.items(), key=lambda item: item[1], reverse=True)[:top_n]
    capture.top_ops = [f"{name} {micros / 1000:.3f}ms" for name, micros in ranked]
    origin = min((start for start, _, _ in phases), default=0.0)
    capture.phases = [  # "name at+duration" in ms from the first range in the file
        f"{name} {(start - origin) / 1000:.3f}+{duration / 1000:.3f}ms"
        for start, duration, name in sorted(phases)
    ]


def _add_self_times(events: list[tuple[float, float, str]], totals: dict[str, float]) -> None:
    """Self time = duration minus directly nested children, per thread."""
    stack: list[list] = []  # [end, name, self_time]
    for start, duration, name in events:
        while stack and start >= stack[-1][0]:
            _, done, own = stack.pop()
            totals[done] = totals.get(done, 0.0) + own
        if stack:
            stack[-1][2] -= duration
        stack.append([start + duration, name, duration])
    for _, name, own in stack:
        totals[name] = totals.get(name, 0.0) + own
