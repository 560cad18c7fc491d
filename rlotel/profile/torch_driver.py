"""torch.profiler around flagged steps, driven by the ledger's step hooks.

The ledger runs every step and finds the window; the profiler runs only on flagged steps
and explains it. Unflagged steps pay one set lookup. Steps inside a capture are marked
held; the pipeline publishes them once their captures are written, so the step span can
link to them. The driver never publishes a step itself.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from rlotel.base.drops import Drops
from rlotel.profile.config import ProfileConfig
from rlotel.record.capture import Capture, trace_basename

log = logging.getLogger("rlotel")


class StepProfiler:
    """Starts and stops torch.profiler around flagged steps (ledger hooks, training thread).

    `publish_capture` receives each written capture; `release` the held steps it covers,
    after their `captures` are filled in (a step inside a continuous capture is held until
    the capture is written, so its span can link to it).
    """

    def __init__(
        self,
        config: ProfileConfig,
        drops: Drops,
        publish_capture: Callable[[Capture], None],
        release: Callable[[list[Any]], None],
        phase_context: Callable[[], tuple[int, int] | None],
    ) -> None:
        self.config = config
        self.flagged = frozenset(config.steps)
        self._drops = drops
        self._publish_capture = publish_capture
        self._release = release
        self._phase_context = phase_context
        self._profiler: Any = None
        self._block: list[Any] = []  # steps of the capture in progress (held)
        self._captures: list[Capture] = []  # captures of the block in progress
        self._block_first = 0
        self._block_start = 0
        self._mini_batch = 0
        self._current_step = 0
        self._hook_thread: threading.Thread | None = None
        self.last_flagged = max(self.flagged) if self.flagged else None

    @property
    def active(self) -> bool:
        return self._profiler is not None

    def phase_range(self, name: str) -> Any:
        """`record_function` ranges named like the phases, only while a capture runs."""
        if self._profiler is None:
            return None
        import torch

        return torch.profiler.record_function(name)

    def on_step_start(self, number: int) -> None:
        self._current_step = number
        if number not in self.flagged or self._profiler is not None:
            return
        try:
            self._start(number)
        except Exception as error:
            self._profiler = None
            self._drops.add("profile", "profiler_error", f"cannot start torch.profiler: {error!r}")

    def on_step_end(self, step: Any) -> None:
        if self._profiler is None:
            return
        step.held = True
        self._block.append(step)
        if self.config.continuous and step.number + 1 in self.flagged:
            return
        self._finish_block(step.number)

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
        """Release held steps (end of run): a capture still open is written first."""
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
            self._publish_capture(capture)
        for step in self._block:
            step.captures.extend(self._captures)
            step.held = False
        self._release(self._block)
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
