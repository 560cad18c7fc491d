"""rlotel: OpenTelemetry spans, NVTX ranges and Prometheus series for RL training steps."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter

from rlotel import diagnose as _diagnose
from rlotel.config import ConfigError
from rlotel.diagnose import Diagnoser, StepFacts, Thresholds, Verdict
from rlotel.ledger import Phase, Step
from rlotel.profiling import ProfileConfig, sglang_profiler_args, vllm_profiler_args
from rlotel.telemetry import Telemetry, build

__all__ = [
    "ConfigError",
    "Diagnoser",
    "ProfileConfig",
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


def init(
    run: str = "default",
    service_name: str | None = None,
    n_gpus: int = 1,
    prometheus_addr: str = "127.0.0.1",
    prometheus_port: int | None = 9464,
    traces_file: Any = None,
    profile_steps: Iterable[int] = (),
    profile_dir: Any = None,
    *,
    max_metric_keys: int = 256,
    max_sample_spans: int = 4,
    prometheus_tls: tuple[str, str] | None = None,
    prometheus_basic_auth: tuple[str, str] | None = None,
    prometheus_port_retries: int = 0,
    queue_size: int = 1024,
    shutdown_timeout_s: float = 5.0,
    histogram_buckets: Mapping[str, Iterable[float]] | None = None,
    span_exporters: Sequence[SpanExporter] = (),
    bottleneck_thresholds: Thresholds | None = None,
    profile: ProfileConfig | None = None,
) -> Telemetry:
    """Start telemetry for one run; raises `ConfigError` at once on a bad configuration.

    `max_sample_spans` caps the slowest samples per step that get a span (and serve as
    histogram exemplars). `span_exporters` adds exporters of your own (each behind its
    own batch processor) to the ones OTEL_EXPORTER_OTLP_* and `traces_file` switch on.
    `prometheus_tls=(certfile, keyfile)` serves /metrics over HTTPS and
    `prometheus_basic_auth=(user, password)` requires credentials (for a non-loopback bind).
    A busy `prometheus_port` raises `ConfigError` unless `prometheus_port_retries=N` lets
    it take the next free one of the N after it (several ranks per node); the port taken is
    in `tel.metrics_url`.
    `histogram_buckets={"rlotel_phase_duration_seconds": [1, 10, 60, 600]}` replaces a
    histogram's upper bounds (put bounds near the latencies your alerts and SLOs name).
    `bottleneck_thresholds` tunes the per-step verdict (`rlotel.diagnose.Thresholds`).
    `profile_steps` + `profile_dir` capture those global steps with torch.profiler; a
    `profile=ProfileConfig(...)` sets every option (continuous, schedule, token window,
    finish hook, verl capture discovery).
    """
    global _current
    _current = build(
        run,
        service_name,
        n_gpus,
        prometheus_addr,
        prometheus_port,
        traces_file,
        profile_steps,
        profile_dir,
        max_metric_keys=max_metric_keys,
        max_sample_spans=max_sample_spans,
        prometheus_tls=prometheus_tls,
        prometheus_basic_auth=prometheus_basic_auth,
        prometheus_port_retries=prometheus_port_retries,
        queue_size=queue_size,
        shutdown_timeout_s=shutdown_timeout_s,
        histogram_buckets=histogram_buckets,
        span_exporters=span_exporters,
        bottleneck_thresholds=bottleneck_thresholds,
        profile=profile,
    )
    return _current


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
