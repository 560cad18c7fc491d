"""Every environment variable rlotel reads, read here and nowhere else.

Standard OpenTelemetry names come from `opentelemetry.sdk.environment_variables` (a module
of constants: importing it loads no SDK machinery). The OTLP exporters read their own
endpoint, headers, timeout, compression and certificate variables, as the SDK documents.
Importing this module is cheap: the verl plugin reads `enabled()` in every verl process.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.environment_variables import OTEL_METRICS_EXPORTER, OTEL_TRACES_EXPORTER
from opentelemetry.sdk.environment_variables import (
    OTEL_BSP_SCHEDULE_DELAY,
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
    OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    OTEL_EXPORTER_PROMETHEUS_HOST,
    OTEL_EXPORTER_PROMETHEUS_PORT,
    OTEL_METRIC_EXPORT_INTERVAL,
    OTEL_RESOURCE_ATTRIBUTES,
    OTEL_SDK_DISABLED,
    OTEL_SERVICE_NAME,
)

from rlotel.errors import ConfigError

RLOTEL_ENABLE = "RLOTEL_ENABLE"  # the verl plugin and the instrumentor switch on
RLOTEL_RUN = "RLOTEL_RUN"
RLOTEL_TRACES_FILE = "RLOTEL_TRACES_FILE"
RLOTEL_TRACES_DIR = "RLOTEL_TRACES_DIR"  # each process writes <dir>/<role>-<rank>-<pid>.jsonl
RLOTEL_ROLE = "RLOTEL_ROLE"
RLOTEL_PROMETHEUS_SD_DIR = "RLOTEL_PROMETHEUS_SD_DIR"
RLOTEL_TEST_CLOCK_SHIFT_S = "RLOTEL_TEST_CLOCK_SHIFT_S"  # test-only: shift rlotel's Unix clock
RANK = "RANK"  # torch.distributed's, as verl's workers set it
WORLD_SIZE = "WORLD_SIZE"

TRACES, METRICS = "TRACES", "METRICS"
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
DEFAULT_PROMETHEUS_PORT = 9464
DEFAULT_EXPORT_INTERVAL_MS = 60000.0
# Span export at most this often (OTEL_BSP_SCHEDULE_DELAY, ms): OTel's 5 s would lose the
# last seconds of a Ray worker, which Ray ends without running its exit handlers.
DEFAULT_SPAN_EXPORT_DELAY_MS = 1000.0
WORKER_SPAN_EXPORT_DELAY_MS = 250
_OTLP = {
    TRACES: (
        OTEL_TRACES_EXPORTER,
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    ),
    METRICS: (
        OTEL_METRICS_EXPORTER,
        OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
        OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    ),
}


def truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """`RLOTEL_ENABLE=1`: the zero-code integrations start telemetry."""
    return truthy(environ.get(RLOTEL_ENABLE))


@dataclass(frozen=True)
class Environment:
    """What the environment says, parsed; `read()` raises `ConfigError` on a bad value."""

    sdk_disabled: bool
    service_name: str | None
    otlp_traces: str | None  # protocol when OTLP span export is on, else None
    otlp_metrics: str | None
    metric_export_interval_s: float
    span_export_delay_s: float | None  # OTEL_BSP_SCHEDULE_DELAY; None: rlotel's default
    prometheus_host: str | None
    prometheus_port: int | None
    run: str | None
    traces_file: str | None
    traces_dir: Path | None
    role: str | None
    rank: int
    world_size: int
    prometheus_sd_dir: Path

    @classmethod
    def read(cls, environ: Mapping[str, str] = os.environ) -> Environment:
        return cls(
            sdk_disabled=truthy(environ.get(OTEL_SDK_DISABLED)),
            service_name=environ.get(OTEL_SERVICE_NAME) or None,
            otlp_traces=_otlp(environ, TRACES),
            otlp_metrics=_otlp(environ, METRICS),
            metric_export_interval_s=_interval_s(environ),
            span_export_delay_s=_milliseconds(environ, OTEL_BSP_SCHEDULE_DELAY, allow_zero=True),
            prometheus_host=environ.get(OTEL_EXPORTER_PROMETHEUS_HOST) or None,
            prometheus_port=_port(environ.get(OTEL_EXPORTER_PROMETHEUS_PORT)),
            run=environ.get(RLOTEL_RUN) or None,
            traces_file=environ.get(RLOTEL_TRACES_FILE) or None,
            traces_dir=Path(environ[RLOTEL_TRACES_DIR]) if environ.get(RLOTEL_TRACES_DIR) else None,
            role=environ.get(RLOTEL_ROLE) or None,
            rank=rank(environ),
            world_size=world_size(environ),
            prometheus_sd_dir=Path(
                environ.get(RLOTEL_PROMETHEUS_SD_DIR)
                or Path(tempfile.gettempdir()) / "ray" / "rlotel_prometheus_sd"
            ),
        )


def _otlp(environ: Mapping[str, str], signal: str) -> str | None:
    """The protocol when OTLP export of `signal` is on: an endpoint variable is set and
    `OTEL_{signal}_EXPORTER` does not say `none`."""
    exporter, endpoint, protocol_name = _OTLP[signal]
    if "none" in environ.get(exporter, "").replace(" ", "").split(","):
        return None
    if not (environ.get(endpoint) or environ.get(OTEL_EXPORTER_OTLP_ENDPOINT)):
        return None
    protocol = (
        environ.get(protocol_name) or environ.get(OTEL_EXPORTER_OTLP_PROTOCOL) or "http/protobuf"
    ).strip()
    if protocol not in OTLP_PROTOCOLS:
        raise ConfigError(
            f"OTLP protocol {protocol!r} is not supported: set {OTEL_EXPORTER_OTLP_PROTOCOL} "
            f"to one of {', '.join(OTLP_PROTOCOLS)}"
        )
    return protocol


def _interval_s(environ: Mapping[str, str]) -> float:
    seconds = _milliseconds(environ, OTEL_METRIC_EXPORT_INTERVAL)
    return DEFAULT_EXPORT_INTERVAL_MS / 1000 if seconds is None else seconds


def _milliseconds(environ: Mapping[str, str], name: str, allow_zero: bool = False) -> float | None:
    """A variable in milliseconds, as seconds; None when unset."""
    raw = environ.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        milliseconds = float(raw)
    except ValueError:
        milliseconds = -1.0
    if not (milliseconds >= 0 if allow_zero else milliseconds > 0):
        kind = "non-negative" if allow_zero else "positive"
        raise ConfigError(f"{name} must be a {kind} number of milliseconds, got {raw!r}")
    return milliseconds / 1000


def _port(raw: str | None) -> int | None:
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(
            f"{OTEL_EXPORTER_PROMETHEUS_PORT} must be a port number, got {raw!r}"
        ) from None


def _count(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "")
    try:
        return int(raw) if raw.strip() else default
    except ValueError:
        return default


def rank(environ: Mapping[str, str] = os.environ) -> int:
    """This process's rank (`RANK`, as torch.distributed and verl's workers set it)."""
    return _count(environ, RANK, 0)


def world_size(environ: Mapping[str, str] = os.environ) -> int:
    return _count(environ, WORLD_SIZE, 1)


def otlp_traces_endpoint(environ: Mapping[str, str] = os.environ) -> tuple[str, str] | None:
    """(endpoint URL, protocol) spans go to, for a library that takes one URL (vLLM):
    `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, else `OTEL_EXPORTER_OTLP_ENDPOINT` with
    the signal's path for http (OTel's spec); None when OTLP span export is off."""
    protocol = _otlp(environ, TRACES)
    if protocol is None:
        return None
    endpoint = environ.get(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
    if not endpoint:
        endpoint = environ[OTEL_EXPORTER_OTLP_ENDPOINT].rstrip("/")
        if protocol == "http/protobuf":
            endpoint += "/v1/traces"
    return endpoint, protocol


def test_clock_shift_ns(environ: Mapping[str, str] = os.environ) -> int:
    """Test-only: seconds added to this process's Unix clock as rlotel reads it (a node
    whose clock is off), as ns; 0 when unset or not a number."""
    try:
        return round(float(environ.get(RLOTEL_TEST_CLOCK_SHIFT_S, "") or 0) * 1e9)
    except ValueError:
        return 0


def set_default(name: str, value: str, environ: MutableMapping[str, str] = os.environ) -> None:
    """For a library configured through the environment (vLLM's tracer): unless set."""
    environ.setdefault(name, value)


def add_resource_attribute(
    key: str, value: str, environ: MutableMapping[str, str] = os.environ
) -> None:
    """`OTEL_RESOURCE_ATTRIBUTES` gains `key=value` unless it names `key` already."""
    given = environ.get(OTEL_RESOURCE_ATTRIBUTES, "")
    if f"{key}=" not in given:
        environ[OTEL_RESOURCE_ATTRIBUTES] = ",".join(filter(None, (given, f"{key}={value}")))
