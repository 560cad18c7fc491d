"""rlotel: OpenTelemetry spans, NVTX ranges and Prometheus series for RL training steps.

Importing the package is cheap (the verl plugin imports it in every verl process, also
when rlotel is off): the exporters, numpy and the OTel SDK load on first use of `init`
or of a class below (PEP 562).
"""

from __future__ import annotations

import importlib
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

from rlotel import active
from rlotel.base.errors import ConfigError
from rlotel.derive import diagnose as _diagnose
from rlotel.derive.diagnose import StepFacts, Thresholds, Verdict

if TYPE_CHECKING:
    from rlotel.record.ledger import Phase
    from rlotel.telemetry import Telemetry

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

_LAZY = {
    "Config": "rlotel.config",
    "Diagnoser": "rlotel.derive.diagnose",
    "ProfileConfig": "rlotel.profile.config",
    "Sink": "rlotel.publish.sink",
    "Step": "rlotel.record.ledger",
    "Telemetry": "rlotel.telemetry",
    "sglang_profiler_args": "rlotel.profile.config",
    "vllm_profiler_args": "rlotel.profile.config",
}

_phase: type[Phase] | None = None


def __getattr__(name: str) -> Any:
    if name == "init":
        value: Any = _make_init()
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'rlotel' has no attribute {name!r}")
    globals()[name] = value
    return value


def _make_init() -> Any:
    from rlotel.config import INIT_SIGNATURE, init_options
    from rlotel.telemetry import Telemetry, build

    def init(*args: Any, **kwargs: Any) -> Telemetry:
        """Start telemetry for one run; raises `ConfigError` at once on a bad configuration.

        The options are `rlotel.Config`'s fields (see its docstring for each one's meaning
        and default); `OTEL_EXPORTER_OTLP_*` variables switch on OTLP export, and
        `OTEL_EXPORTER_PROMETHEUS_HOST` / `_PORT` place `/metrics` where `prometheus_addr` /
        `prometheus_port` are not given.
        """
        active.current = build(**init_options(args, kwargs))
        return active.current

    init.__signature__ = INIT_SIGNATURE.replace(return_annotation=Telemetry)  # type: ignore[attr-defined]
    init.__module__ = __name__
    return init


def current() -> Telemetry | None:
    """The telemetry `init` created last (None before init or after its shutdown)."""
    return active.current


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
    phase = _phase or _load_phase()
    tel = active.current
    if tel is None:
        return phase(None, name, color, timing_raw)
    if name == "step" and tel.current_step is not None:
        # `step` is the step's own entry in timing_raw; a phase of that name would vanish
        # into it. It is still summed into the caller's dict, as verl does.
        tel.drops.add("spans", "bad_name", "a phase named 'step' inside a step; not a span")
        return phase(None, name, color, timing_raw)
    return phase(tel.ledger, name, color, timing_raw)


def _load_phase() -> type[Phase]:
    global _phase
    from rlotel.record.ledger import Phase

    _phase = Phase
    return Phase


def diagnose(step: Any, thresholds: Thresholds | None = None) -> Verdict:
    """Bottleneck verdict of one closed step (or of facts built from a logged verl dict),
    from that step's own evidence; `step.verdict` adds trends over the run."""
    facts = step if isinstance(step, StepFacts) else step.summary.facts
    return _diagnose.diagnose(facts, thresholds)
