"""Every environment variable rlotel reads, read here and nowhere else.

Standard OpenTelemetry names come from `opentelemetry.sdk.environment_variables` (a module
of constants: importing it loads no SDK machinery). The OTLP exporters read their own
endpoint, headers, timeout, compression and certificate variables, as the SDK documents.
Importing this module is cheap: the verl plugin reads `enabled()` in every verl process.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.environment_variables import OTEL_METRICS_EXPORTER, OTEL_TRACES_EXPORTER
from opentelemetry.sdk.environment_variables import (
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
    OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    OTEL_EXPORTER_PROMETHEUS_HOST,
    OTEL_EXPORTER_PROMETHEUS_PORT,
    OTEL_METRIC_EXPORT_INTERVAL,
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
RANK = "RANK"  # torch.distributed's, as verl's workers set it
WORLD_SIZE = "WORLD_SIZE"

TRACES, METRICS = "TRACES", "METRICS"
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
DEFAULT_PROMETHEUS_PORT = 9464
DEFAULT_EXPORT_INTERVAL_MS = 60000.0
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
    raw = environ.get(OTEL_METRIC_EXPORT_INTERVAL, str(DEFAULT_EXPORT_INTERVAL_MS))
    try:
        interval_ms = float(raw)
    except ValueError:
        interval_ms = -1.0
    if not interval_ms > 0:
        raise ConfigError(
            f"{OTEL_METRIC_EXPORT_INTERVAL} must be a positive number of milliseconds, got {raw!r}"
        )
    return interval_ms / 1000


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
