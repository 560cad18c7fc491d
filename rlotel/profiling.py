"""torch.profiler captures of flagged steps, linked from the step spans that they explain.

The ledger runs every step and finds the window; the profiler runs only on flagged steps
and explains it. Unflagged steps pay one set lookup. A capture becomes a `profile.capture`
span in its own trace (file, size, top operators by self time, phase ranges found in the
file); the step span — and the phase a schedule window covered — link to it.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from random import getrandbits
from typing import Any

from rlotel.config import ConfigError
from rlotel.drops import Drops

log = logging.getLogger("rlotel")


# --- configuration -----------------------------------------------------------------------


def token_window(start: Any, end: Any) -> tuple[int, int]:
    """A rollout token window [start, end): non-negative integers with start < end."""
    for label, value in (("profile_token_start", start), ("profile_token_end", end)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{label} must be a non-negative integer, got {value!r}")
    if start >= end:
        raise ConfigError(
            f"profile token window [{start}, {end}) is empty: profile_token_start must be "
            "below profile_token_end (the window is half-open)"
        )
    return start, end


def vllm_profiler_args(start: int, end: int) -> dict[str, int]:
    """The window as vLLM's profiler config: skip `start` iterations, record `end - start`."""
    start, end = token_window(start, end)
    return {"delay_iterations": start, "max_iterations": end - start}


def sglang_profiler_args(start: int, end: int) -> dict[str, int]:
    """The window as SGLang's `start_profile` arguments."""
    start, end = token_window(start, end)
    return {"start_step": start, "num_steps": end - start}


@dataclass(frozen=True)
class ProfileConfig:
    """What to capture and how. `schedule` = (wait, warmup, active, repeat) counted in
    update mini-batches (`tel.profile_step()`); None captures whole steps."""

    steps: tuple[int, ...] = ()
    save_dir: Path | None = None
    continuous: bool = False
    role: str = "trainer"
    rank: int = field(default_factory=lambda: int(os.environ.get("RANK", "0") or 0))
    world_size: int = field(default_factory=lambda: int(os.environ.get("WORLD_SIZE", "1") or 1))
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    schedule: tuple[int, int, int, int] | None = None
    token_start: int | None = None
    token_end: int | None = None
    finish_hook: Sequence[str] | str | None = None
    hook_timeout_s: float = 300.0
    top_n: int = 10
    discover_dir: Path | None = None  # verl's global_profiler.save_path: link its captures

    def validated(self) -> ProfileConfig:
        if any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in self.steps):
            raise ConfigError(f"profile steps must be non-negative integers, got {self.steps}")
        if self.steps and self.save_dir is None and self.discover_dir is None:
            raise ConfigError("profile_steps needs profile_dir (where captures are written)")
        if self.schedule is not None:
            if len(self.schedule) != 4 or any(
                not isinstance(v, int) or v < 0 for v in self.schedule
            ):
                raise ConfigError(
                    "profile schedule must be (wait, warmup, active, repeat), non-negative "
                    f"integers, got {self.schedule!r}"
                )
            if self.schedule[2] < 1:
                raise ConfigError("profile schedule needs active >= 1 mini-batch")
        if (self.token_start is None) != (self.token_end is None):
            raise ConfigError("set both profile_token_start and profile_token_end, or neither")
        if self.token_start is not None:
            token_window(self.token_start, self.token_end)
        if not self.hook_timeout_s > 0:
            raise ConfigError(f"hook_timeout_s must be > 0, got {self.hook_timeout_s!r}")
        if isinstance(self.finish_hook, str) and not shlex.split(self.finish_hook):
            raise ConfigError("finish_hook is empty")
        return self

    def vllm_args(self) -> dict[str, int] | None:
        if self.token_start is None:
            return None
        return vllm_profiler_args(self.token_start, self.token_end)

    def sglang_args(self) -> dict[str, int] | None:
        if self.token_start is None:
            return None
        return sglang_profiler_args(self.token_start, self.token_end)


# --- captures ----------------------------------------------------------------------------

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


@dataclass
class Capture:
    """One profiler output file and the span that stands for it."""

    tool: str
    path: Path
    steps: tuple[int, int]
    role: str
    rank: int
    mini_batches: tuple[int, int] | None = None
    start_ns: int = 0  # perf_counter_ns
    end_ns: int = 0
    phase_context: tuple[int, int] | None = None  # (trace_id, span_id) the window covered
    trace_id: int = field(default_factory=lambda: getrandbits(128) or 1)
    span_id: int = field(default_factory=lambda: getrandbits(64) or 1)
    size: int = 0
    top_ops: list[str] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)

    def attributes(self) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "rl.profile.path": str(self.path),
            "rl.profile.size_bytes": self.size,
            "rl.profile.tool": self.tool,
            "rl.profile.role": self.role,
            "rl.profile.rank": self.rank,
            "rl.profile.step_first": self.steps[0],
            "rl.profile.step_last": self.steps[1],
        }
        if self.mini_batches is not None:
            attributes["rl.profile.mini_batch_first"] = self.mini_batches[0]
            attributes["rl.profile.mini_batch_last"] = self.mini_batches[1]
        if self.top_ops:
            attributes["rl.profile.top_ops"] = list(self.top_ops)
        if self.phases:
            attributes["rl.profile.phases"] = list(self.phases)
        return attributes


def summarize(capture: Capture, top_n: int) -> None:
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


# --- the profiler driven by the ledger ---------------------------------------------------


class StepProfiler:
    """Starts and stops torch.profiler around flagged steps; called on the training thread.

    `publish` receives Capture objects, then the steps they belong to (a step inside a
    continuous capture is held until the capture is written, so its span can link to it).
    """

    def __init__(
        self,
        config: ProfileConfig,
        drops: Drops,
        publish: Callable[[Any], None],
        phase_context: Callable[[], tuple[int, int] | None],
    ) -> None:
        self.config = config
        self.flagged = frozenset(config.steps)
        self._drops = drops
        self._publish = publish
        self._phase_context = phase_context
        self._profiler: Any = None
        self._block: list[Any] = []  # steps of the capture in progress (held)
        self._captures: list[Capture] = []  # captures of the block in progress
        self._block_first = 0
        self._block_start = 0
        self._mini_batch = 0
        self._current_step = 0
        self._pending_discovery: list[Any] = []
        self._linked: set[Path] = set()  # verl outputs already linked (nsys: no step in name)
        self._hook_thread: threading.Thread | None = None
        self.last_flagged = max(self.flagged) if self.flagged else None

    @property
    def active(self) -> bool:
        return self._profiler is not None

    # record_function ranges named like the phases, only while a capture runs
    def record_function(self, name: str):
        if self._profiler is None:
            return None
        import torch

        return torch.profiler.record_function(name)

    def on_step_start(self, number: int) -> None:
        if self._pending_discovery:
            self._discover()
        self._current_step = number
        if number not in self.flagged or self._profiler is not None:
            return
        if self.config.save_dir is None:
            return  # discovery only: verl runs the profiler
        try:
            self._start(number)
        except Exception as error:
            self._profiler = None
            self._drops.add("profile", "profiler_error", f"cannot start torch.profiler: {error!r}")

    def on_step_end(self, step: Any) -> bool:
        """True when the step is held (published later, after its capture)."""
        number = step.number
        if self.config.discover_dir is not None and number in self.flagged:
            self._pending_discovery.append(step)
            return True
        if self._profiler is None:
            return False
        self._block.append(step)
        if self.config.continuous and number + 1 in self.flagged:
            return True
        self._finish_block(number)
        return True

    def profile_step(self) -> None:
        """One update mini-batch done: advances a schedule (forward-only phases don't)."""
        if self._profiler is None or self.config.schedule is None:
            return
        self._mini_batch += 1
        try:
            self._profiler.step()
        except Exception as error:
            self._drops.add("profile", "profiler_error", f"profiler.step failed: {error!r}")

    def flush(self) -> None:
        """Publish held steps (end of run): discovery pending, captures still open."""
        if self._pending_discovery:
            self._discover()
        if self._profiler is not None:
            last = self._block[-1].number if self._block else self._block_first
            self._finish_block(last)

    def wait_for_hook(self, timeout_s: float) -> None:
        if self._hook_thread is not None:
            self._hook_thread.join(timeout_s)

    # --- internals ---------------------------------------------------------------------

    def _start(self, number: int) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        kwargs: dict[str, Any] = {
            "activities": activities,
            "record_shapes": self.config.record_shapes,
            "profile_memory": self.config.profile_memory,
            "with_stack": self.config.with_stack,
        }
        if self.config.schedule is not None:
            wait, warmup, active, repeat = self.config.schedule
            kwargs["schedule"] = schedule(wait=wait, warmup=warmup, active=active, repeat=repeat)
            kwargs["on_trace_ready"] = self._window_ready
        self._block_first = number
        self._block_start = time.perf_counter_ns()
        self._mini_batch = 0
        self._captures = []
        profiler = profile(**kwargs)
        profiler.start()
        self._profiler = profiler

    def _window_ready(self, profiler: Any) -> None:
        """A schedule window closed (inside profile_step or at stop): write it."""
        active = self.config.schedule[2]
        last = max(self._mini_batch - 1, 0)
        first = max(last - active + 1, 0)
        step = (self._current_step, self._current_step)
        self._write(profiler, step, (first, last), self._phase_context())

    def _finish_block(self, last_step: int) -> None:
        profiler, self._profiler = self._profiler, None
        try:
            profiler.stop()
            if self.config.schedule is None:
                self._write(profiler, (self._block_first, last_step), None, None)
        except Exception as error:
            self._drops.add("profile", "profiler_error", f"capture failed: {error!r}")
        for capture in self._captures:
            self._publish(capture)
        for step in self._block:
            step.captures.extend(self._captures)
            self._publish(step)
        self._block, self._captures = [], []
        if self.last_flagged is not None and last_step >= self.last_flagged:
            self._run_hook()

    def _write(
        self,
        profiler: Any,
        steps: tuple[int, int],
        mini_batches: tuple[int, int] | None,
        phase_context: tuple[int, int] | None,
    ) -> None:
        config = self.config
        name = trace_basename(config.role, steps, config.rank, config.world_size, mini_batches)
        path = config.save_dir / f"{name}.json.gz"
        capture = Capture(
            "torch",
            path,
            steps,
            config.role,
            config.rank,
            mini_batches,
            start_ns=self._block_start,
            end_ns=time.perf_counter_ns(),
            phase_context=phase_context,
        )
        try:
            profiler.export_chrome_trace(str(path))
        except Exception as error:
            self._drops.add("profile", "export_failed", f"{path}: {error!r}")
            return
        self._captures.append(capture)
        self._block_start = time.perf_counter_ns()

    def _discover(self) -> None:
        held, self._pending_discovery = self._pending_discovery, []
        for step in held:
            started_s = time.time() - (time.perf_counter_ns() - step.record.start_ns) / 1e9
            found = find_verl_captures(self.config.discover_dir, step.number, started_s)
            captures = [
                Capture(tool, path, (step.number, step.number), self.config.role, self.config.rank)
                for tool, path in found
                if path not in self._linked
            ]
            self._linked.update(c.path for c in captures)
            for capture in captures:
                capture.start_ns = step.record.start_ns
                capture.end_ns = step.record.end_ns
                self._publish(capture)
            step.captures.extend(captures)
            self._publish(step)

    def _run_hook(self) -> None:
        hook = self.config.finish_hook
        if not hook:
            return
        argv = shlex.split(hook) if isinstance(hook, str) else list(hook)
        environment = {
            **os.environ,
            "RLOTEL_PROFILE_SAVE_PATH": str(self.config.save_dir),
            "RLOTEL_PROFILE_STEPS": ",".join(str(s) for s in sorted(self.flagged)),
            "RLOTEL_PROFILE_TOOL": "torch",
            "RLOTEL_PROFILE_ROLE": self.config.role,
            "RLOTEL_PROFILE_RANK": str(self.config.rank),
        }
        timeout = self.config.hook_timeout_s
        drops = self._drops

        def run() -> None:
            try:  # argv, no shell: paths in the environment are never interpolated
                result = subprocess.run(
                    argv, env=environment, timeout=timeout, capture_output=True, check=False
                )
            except subprocess.TimeoutExpired:
                drops.add("profile", "hook_timeout", f"{argv[0]} ran past {timeout:.0f}s; killed")
                return
            except OSError as error:
                drops.add("profile", "hook_failed", f"{argv[0]}: {error}")
                return
            if result.returncode != 0:
                tail = result.stderr.decode(errors="replace")[-300:]
                drops.add("profile", "hook_failed", f"{argv[0]} exited {result.returncode}: {tail}")
            else:
                log.info("rlotel: profile finish hook %s done", argv[0])

        self._hook_thread = threading.Thread(target=run, name="rlotel-profile-hook", daemon=True)
        self._hook_thread.start()
