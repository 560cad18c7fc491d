"""rlotel: OpenTelemetry spans, NVTX ranges and Prometheus series for RL training steps."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from rlotel import diagnose as _diagnose
from rlotel.config import INIT_SIGNATURE, Config
from rlotel.diagnose import Diagnoser, StepFacts, Thresholds, Verdict
from rlotel.errors import ConfigError
from rlotel.ledger import Phase, Step
from rlotel.profile.config import ProfileConfig, sglang_profiler_args, vllm_profiler_args
from rlotel.sinks.base import Sink
from rlotel.telemetry import Telemetry, build

__all__ = [
    "Config",
    "ConfigError",
    "Diagnoser",
    "ProfileConfig",
    "Sink",
    "Step",
    "StepFacts",
    "Telemetry",
    "Thresholds",
    "Verdict",
    "current",
    "diagnose",
    "init",
    "marked_timer",
    "sglang_profiler_args",
    "vllm_profiler_args",
]
__version__ = "0.1.0"

_current: Telemetry | None = None


def init(*args: Any, **kwargs: Any) -> Telemetry:
    """Start telemetry for one run; raises `ConfigError` at once on a bad configuration.

    The options are `rlotel.Config`'s fields (see its docstring for each one's meaning
    and default); `OTEL_EXPORTER_OTLP_*` variables switch on OTLP export.
    """
    global _current
    _current = build(*args, **kwargs)
    return _current


init.__signature__ = INIT_SIGNATURE.replace(return_annotation=Telemetry)  # type: ignore[attr-defined]


def current() -> Telemetry | None:
    """The telemetry `init` created last (None before init or after its shutdown)."""
    return _current


def marked_timer(
    name: str,
    timing_raw: MutableMapping[str, float],
    color: str | None = None,
    domain: str | None = None,
    category: str | None = None,
) -> Phase:
    """Drop-in for verl's `marked_timer`: sums seconds into `timing_raw[name]` like verl,
    mirrors an NVTX range, and records the phase in the current step when rlotel is on.
    `domain` and `category` are accepted for signature compatibility."""
    tel = _current
    if tel is not None and name == "step" and tel.current_step is not None:
        # `step` is the step's own entry in timing_raw; a phase of that name would vanish
        # into it. It is still summed into the caller's dict, as verl does.
        tel.drops.add("spans", "bad_name", "a phase named 'step' inside a step; not a span")
        return Phase(None, name, color, timing_raw)
    return Phase(tel.ledger if tel is not None else None, name, color, timing_raw)


def diagnose(step: Step | StepFacts, thresholds: Thresholds | None = None) -> Verdict:
    """Bottleneck verdict of one closed step (or of facts built from a logged verl dict),
    from that step's own evidence; `step.verdict` adds trends over the run."""
    facts = step.facts() if isinstance(step, Step) else step
    return _diagnose.diagnose(facts, thresholds)
