"""verl's own profiler outputs for flagged steps, found on disk and linked from the steps.

verl writes torch traces (`build_trace_basename` names), torch_memory pickles and nsys
reports under `global_profiler.save_path`; this ledger hook holds each flagged step until
the next step starts (or the run ends), then links what verl wrote for it. The integration
injects it (`Config.step_hooks=[discover]`): the core never imports this module.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlotel.record.capture import Capture

if TYPE_CHECKING:
    from rlotel.record.ledger import HookServices


def find_verl_captures(
    save_dir: Path, step: int, since_epoch_s: float | None = None
) -> list[tuple[str, Path]]:
    """(tool, path) of verl profiler outputs written for `step` under `save_dir`.

    torch traces and torch_memory pickles carry the step in their names; nsys reports
    (`*.nsys-rep`, named by worker pid) do not, so they count for the step when written
    after `since_epoch_s` (the step's start).
    """
    found: list[tuple[str, Path]] = []
    if not save_dir.is_dir():
        return found
    pattern = re.compile(rf"_step{step}(?:-\d+)?_rank\d")
    for path in sorted(save_dir.rglob("*.json.gz")):
        if pattern.search(path.name):
            found.append(("torch", path))
    for path in sorted((save_dir / f"step{step}").glob("torch_memory_rank*.pickle")):
        found.append(("torch_memory", path))
    if since_epoch_s is not None:
        for path in sorted(save_dir.rglob("*.nsys-rep")):
            if path.stat().st_mtime >= since_epoch_s:
                found.append(("nsys", path))
    return found


class VerlCaptureDiscovery:
    """Ledger hooks: hold flagged steps, then link verl's captures for them."""

    def __init__(
        self,
        save_dir: Path,
        steps: frozenset[int],
        role: str,
        rank: int,
        publish_capture: Callable[[Capture], None],
        release: Callable[[list[Any]], None],
    ) -> None:
        self._save_dir = save_dir
        self._flagged = steps
        self._role = role
        self._rank = rank
        self._publish_capture = publish_capture
        self._release = release
        self._pending: list[Any] = []
        self._linked: set[Path] = set()  # outputs already linked (nsys: no step in its name)

    def on_step_start(self, number: int) -> None:
        if self._pending:
            self.flush()

    def on_step_end(self, step: Any) -> None:
        if step.number in self._flagged:
            step.held = True
            self._pending.append(step)

    def flush(self) -> None:
        held, self._pending = self._pending, []
        for step in held:
            started_s = time.time() - (time.perf_counter_ns() - step.record.start_ns) / 1e9
            found = find_verl_captures(self._save_dir, step.number, started_s)
            captures = [
                Capture(tool, path, (step.number, step.number), self._role, self._rank)
                for tool, path in found
                if path not in self._linked
            ]
            self._linked.update(c.path for c in captures)
            for capture in captures:
                capture.start_ns = step.record.start_ns
                capture.end_ns = step.record.end_ns
                self._publish_capture(capture)
            step.captures.extend(captures)
            step.held = False
        if held:
            self._release(held)


def discover(services: HookServices) -> VerlCaptureDiscovery | None:
    """`Config.step_hooks` factory: link verl's captures when the profile names verl's
    `global_profiler.save_path` (`ProfileConfig.discover_dir`); None otherwise."""
    profile = services.profile
    if profile is None or profile.discover_dir is None:
        return None
    return VerlCaptureDiscovery(
        profile.discover_dir,
        frozenset(profile.steps),
        profile.role,
        profile.rank,
        services.publish_capture,
        services.release,
    )
