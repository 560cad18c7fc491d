"""`rlotel hangs DIR`: the phase a run is stuck in, since when, its last progress, and where
each stuck process's threads are — from a traces directory, while the run still hangs or
after it was killed.

Every process writes one JSON line per stall it judged (`<role>-<rank>-<pid>.stacks`,
`rlotel.derive.stall`). A stall whose span later closed complete in the traces files was
a phase that got going again, not a hang; every other one is.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlotel.offline import otlp_json
from rlotel.schema import attributes as attr

FRAMES_SHOWN = 8  # innermost frames printed per thread
MAIN_THREAD = "MainThread"  # always printed: where the process's own work runs
PROCESS_KEYS = ("role", "rank", "node", attr.PROCESS_PID)


@dataclass(frozen=True)
class Stall:
    """One stall a process judged, with every thread's stack at that moment."""

    phase: str
    since_unix_s: float
    last_progress_unix_s: float
    quiet_s: float
    evidence: dict[str, Any]
    threads: list[dict[str, Any]]
    span: tuple[str, str]  # (trace id, span id), hex
    source: Path

    @property
    def process(self) -> str:
        return " ".join(
            f"{key.removeprefix('process.')}={self.evidence[key]}"
            for key in PROCESS_KEYS
            if key in self.evidence
        )


def read_stalls(directory: Path) -> list[Stall]:
    """Every stall line of a traces directory (a corrupt or cut-off line is skipped)."""
    stalls = []
    for path in sorted(Path(directory).glob("*.stacks")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            stall = _stall(line, path)
            if stall is not None:
                stalls.append(stall)
    return stalls


def _stall(line: str, source: Path) -> Stall | None:
    try:
        data = json.loads(line)
        return Stall(
            data["phase"],
            float(data["since_unix_s"]),
            float(data["last_progress_unix_s"]),
            float(data["quiet_s"]),
            dict(data["evidence"]),
            list(data["threads"]),
            (str(data["trace_id"]).lower(), str(data["span_id"]).lower()),
            source,
        )
    except (ValueError, KeyError, TypeError):
        return None


def _closed_spans(directory: Path) -> set[tuple[str, str]]:
    """The spans written complete (a stalled one's partial carries `rl.open_s`)."""
    closed = set()
    for path in otlp_json.iter_files(directory):
        for span in otlp_json.read_file(path).spans:
            if span.attributes.get(attr.OPEN_S) is None:
                closed.add((span.trace_id.lower(), span.span_id.lower()))
    return closed


def hangs(directory: Path) -> list[Stall]:
    """The stalls whose phase never closed, oldest first."""
    closed = _closed_spans(directory)
    return sorted(
        (s for s in read_stalls(directory) if s.span not in closed),
        key=lambda s: s.since_unix_s,
    )


def render(stalls: list[Stall]) -> Iterator[str]:
    """The lines `rlotel hangs` prints: per stall, its phase and times, then its process's
    threads that run the user's code (and its main thread), each with its innermost user
    frame, then its innermost frames, marked; threads in library code alone are named on
    one line (a runtime's idle loops), those in rlotel or the stdlib alone counted."""
    for stall in stalls:
        step = stall.evidence.get("step")
        at = f" in step {step}" if step is not None else ""
        yield (
            f"HANG: phase {stall.phase!r}{at} open since {_clock(stall.since_unix_s)}, last "
            f"progress {_clock(stall.last_progress_unix_s)} (no progress for "
            f"{stall.quiet_s:.1f} s when judged)"
        )
        yield f"  process {stall.process} ({stall.source.name})"
        pending = stall.evidence.get("pending_ranks")
        if pending:
            yield f"  ranks that never replied: {pending}"
        quiet, library = 0, []
        shown: dict[tuple[str, ...], tuple[list[str], list[dict[str, Any]]]] = {}
        for thread in stall.threads:
            frames = thread.get("frames", [])
            kinds = {f.get("kind") for f in frames}
            name = str(thread.get("thread"))
            waiting = str(thread.get("waiting") or "")
            if "user" not in kinds and name != MAIN_THREAD and not waiting:
                if "library" in kinds:
                    library.append(name)
                else:
                    quiet += 1
                continue
            same = (waiting, *(str(f.get("where")) for f in frames))  # a pool's: one stack
            shown.setdefault(same, ([], frames))[0].append(name)
        for (waiting, *_), (names, frames) in shown.items():
            user = next((f.get("where") for f in frames if f.get("kind") == "user"), None)
            stuck = f" stuck at {user}" if user else ""
            same = f" ({len(names)} threads, one stack)" if len(names) > 1 else ""
            yield f"  thread {', '.join(names)}{same}:{stuck}"
            if waiting:
                yield f"    waiting in {waiting}"
            for frame in frames[:FRAMES_SHOWN]:
                yield f"    [{frame.get('kind')}] {frame.get('where')}"
        if library:
            yield f"  threads in library code only: {', '.join(library)}"
        if quiet:
            yield f"  ({quiet} more thread(s) in rlotel or the standard library only)"
    yield from _collectives(stalls)


COLLECTIVE = re.compile(  # `rlotel.integrations.collectives` describes a blocked call so
    r"^(?P<op>\S+) on group (?P<group>\[[\d, ]*\]|of \d+) as rank (?P<rank>\d+)"
)


def _collectives(stalls: list[Stall]) -> Iterator[str]:
    """Per collective the stuck processes wait in (op and group): the ranks that entered
    it and, where the group's members are known, those that did not (where to look)."""
    entered: dict[tuple[str, str], set[int]] = {}
    for stall in stalls:
        for thread in stall.threads:
            found = COLLECTIVE.match(str(thread.get("waiting") or ""))
            if found:
                key = (found["op"], found["group"])
                entered.setdefault(key, set()).add(int(found["rank"]))
    for (op, group), ranks in sorted(entered.items()):
        line = f"COLLECTIVE: {op} on group {group}: entered by rank(s) {sorted(ranks)}"
        if group.startswith("["):
            members = {int(r) for r in group.strip("[]").split(",") if r.strip()}
            missing = sorted(members - ranks)
            line += f"; not entered by {missing}" if missing else "; every member is in it"
        yield line


def _clock(unix_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(unix_s)) + "Z"
