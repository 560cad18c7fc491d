"""What to capture on flagged steps, validated at `init` like every other option."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlotel.base import env
from rlotel.base.errors import ConfigError


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
    rank: int = field(default_factory=env.rank)
    world_size: int = field(default_factory=env.world_size)
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
