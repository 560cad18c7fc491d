"""Every environment variable rlotel reads, read here and nowhere else.

Standard OpenTelemetry names come from `opentelemetry.sdk.environment_variables` (a module
of constants: importing it loads no SDK machinery). The OTLP exporters read their own
endpoint, headers, timeout, compression and certificate variables, as the SDK documents.
Importing this module is cheap: the verl plugin reads `enabled()` in every verl process.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import tempfile
import urllib.parse
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

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

from rlotel.base.errors import ConfigError

RLOTEL_ENABLE = "RLOTEL_ENABLE"  # the verl plugin and the instrumentor switch on
RLOTEL_RUN = "RLOTEL_RUN"
RLOTEL_TRACES_FILE = "RLOTEL_TRACES_FILE"
RLOTEL_TRACES_DIR = "RLOTEL_TRACES_DIR"  # each process writes <dir>/<role>-<rank>-<pid>.jsonl
RLOTEL_ROLE = "RLOTEL_ROLE"
RLOTEL_PROMETHEUS_SD_DIR = "RLOTEL_PROMETHEUS_SD_DIR"
RLOTEL_STALL_AFTER_S = "RLOTEL_STALL_AFTER_S"  # seconds without progress that make a stall
RLOTEL_TEST_CLOCK_SHIFT_S = "RLOTEL_TEST_CLOCK_SHIFT_S"  # test-only: shift rlotel's Unix clock
RLOTEL_TEST_FAULTS = "RLOTEL_TEST_FAULTS"  # test-only: hooks whose rlotel part raises ("all")
RANK = "RANK"  # torch.distributed's, as verl's workers set it
WORLD_SIZE = "WORLD_SIZE"

TRACES, METRICS = "TRACES", "METRICS"
OTLP_PROTOCOLS = ("grpc", "http/protobuf", "http/json")  # every value OTel's spec allows
DEFAULT_OTLP_PROTOCOL = "http/protobuf"
# Where `/metrics` listens unless the caller or OTEL_EXPORTER_PROMETHEUS_HOST/_PORT says
# (`Environment.metrics_addr`, `metrics_port`): loopback, OTel's Prometheus default port.
DEFAULT_PROMETHEUS_HOST = "127.0.0.1"
DEFAULT_PROMETHEUS_PORT = 9464
DEFAULT_EXPORT_INTERVAL_MS = 60000.0
# Span export at most this often (OTEL_BSP_SCHEDULE_DELAY, ms): OTel's 5 s would lose the
# last seconds of a Ray worker, which Ray ends without running its exit handlers.
DEFAULT_SPAN_EXPORT_DELAY_MS = 1000.0
WORKER_SPAN_EXPORT_DELAY_MS = 250
# An open phase whose work shows no progress this long is stalled. Fixed, not learned: a
# driver phase that waits on one blocking remote call (verl's `gen`) shows its progress
# only in other processes, and 5 minutes is past any healthy silence measured there.
DEFAULT_STALL_AFTER_S = 300.0
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


log = logging.getLogger("rlotel")
T = TypeVar("T")


def truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """`RLOTEL_ENABLE=1`: the zero-code integrations start telemetry."""
    return truthy(environ.get(RLOTEL_ENABLE))


@dataclass(frozen=True)
class Environment:
    """What the environment says, parsed (`read()`)."""

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
    stall_after_s: float = DEFAULT_STALL_AFTER_S  # RLOTEL_STALL_AFTER_S
    problems: tuple[str, ...] = ()  # each bad value read as its default, and why

    @classmethod
    def read(cls, environ: Mapping[str, str] = os.environ, strict: bool = False) -> Environment:
        """`strict` (`rlotel.init`: the user asked for this configuration) raises
        `ConfigError` on a bad value; otherwise (the zero-code integrations, inside someone
        else's process) a bad value reads as its default and `problems` says so."""
        values = _Values(strict)
        return cls(
            sdk_disabled=truthy(environ.get(OTEL_SDK_DISABLED)),
            service_name=environ.get(OTEL_SERVICE_NAME) or None,
            otlp_traces=_otlp(values, environ, TRACES),
            otlp_metrics=_otlp(values, environ, METRICS),
            metric_export_interval_s=values.parsed(
                lambda: _interval_s(environ), DEFAULT_EXPORT_INTERVAL_MS / 1000
            ),
            span_export_delay_s=values.parsed(
                lambda: _milliseconds(environ, OTEL_BSP_SCHEDULE_DELAY, allow_zero=True), None
            ),
            prometheus_host=environ.get(OTEL_EXPORTER_PROMETHEUS_HOST) or None,
            prometheus_port=values.parsed(
                lambda: _port(environ.get(OTEL_EXPORTER_PROMETHEUS_PORT)), None
            ),
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
            stall_after_s=values.parsed(
                lambda: _seconds(environ, RLOTEL_STALL_AFTER_S, DEFAULT_STALL_AFTER_S),
                DEFAULT_STALL_AFTER_S,
            ),
            problems=tuple(values.problems),
        )

    @property
    def metrics_addr(self) -> str:
        """Where `/metrics` binds when the caller names no address:
        `OTEL_EXPORTER_PROMETHEUS_HOST`, else loopback."""
        return self.prometheus_host or DEFAULT_PROMETHEUS_HOST

    @property
    def metrics_port(self) -> int:
        """The `/metrics` port when the caller names none: `OTEL_EXPORTER_PROMETHEUS_PORT`
        (0: an ephemeral one, as `prometheus_port=0`), else 9464."""
        return DEFAULT_PROMETHEUS_PORT if self.prometheus_port is None else self.prometheus_port


class _Values:
    """Runs the parsers of one `read`: strict, a `ConfigError` raises; lenient, the value is
    its default and the error a problem."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.problems: list[str] = []

    def parsed(self, parse: Callable[[], T], default: T, outcome: str = "its default used") -> T:
        try:
            return parse()
        except ConfigError as error:
            if self.strict:
                raise
            self.problems.append(f"{error} ({outcome})")
            return default


def _otlp(values: _Values, environ: Mapping[str, str], signal: str) -> str | None:
    """The protocol when OTLP export of `signal` is on: an endpoint variable is set and
    `OTEL_{signal}_EXPORTER` does not say `none`; a malformed endpoint leaves it off."""
    exporter = _OTLP[signal][0]
    if "none" in environ.get(exporter, "").replace(" ", "").split(","):
        return None
    off = f"no OTLP {signal.lower()} export"
    if values.parsed(lambda: _otlp_endpoint(environ, signal), None, off) is None:
        return None
    used = f"{DEFAULT_OTLP_PROTOCOL} used"
    return values.parsed(lambda: _protocol(environ, signal), DEFAULT_OTLP_PROTOCOL, used)


def _otlp_endpoint(environ: Mapping[str, str], signal: str) -> str | None:
    """The endpoint `signal` goes to (its own variable, else the common one), or None; a
    URL the exporter cannot use raises."""
    name = _OTLP[signal][1]
    if not environ.get(name):
        name = OTEL_EXPORTER_OTLP_ENDPOINT
    endpoint = environ.get(name)
    if not endpoint:
        return None
    try:  # gRPC also takes a bare host:port
        parts = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"//{endpoint}")
        usable = bool(parts.hostname) and (parts.port or 0) >= 0  # .port raises for "x"
    except ValueError:
        usable = False
    if not usable or ("://" in endpoint and parts.scheme not in ("http", "https")):
        raise ConfigError(f"{name} must be a URL such as http://collector:4318, got {endpoint!r}")
    return endpoint


def _protocol(environ: Mapping[str, str], signal: str) -> str:
    """`grpc` or `http/protobuf`: OTLP/JSON is sent as http/protobuf (the Python exporters
    have no JSON encoding; an OTLP/HTTP receiver takes both on the same path)."""
    name = _OTLP[signal][2]
    if not environ.get(name):
        name = OTEL_EXPORTER_OTLP_PROTOCOL
    protocol = (environ.get(name) or DEFAULT_OTLP_PROTOCOL).strip()
    if protocol not in OTLP_PROTOCOLS:
        raise ConfigError(
            f"OTLP protocol {protocol!r} ({name}) is not supported: set "
            f"{OTEL_EXPORTER_OTLP_PROTOCOL} to one of {', '.join(OTLP_PROTOCOLS)}"
        )
    if protocol == "http/json":
        _json_as_protobuf(name)
        return DEFAULT_OTLP_PROTOCOL
    return protocol


@functools.cache
def _json_as_protobuf(name: str) -> None:
    log.warning(
        "rlotel: %s=http/json is sent as http/protobuf to the same endpoint (the Python OTLP "
        "exporters have no JSON encoding; an OTLP/HTTP receiver accepts both)",
        name,
    )


def _interval_s(environ: Mapping[str, str]) -> float:
    seconds = _milliseconds(environ, OTEL_METRIC_EXPORT_INTERVAL)
    return DEFAULT_EXPORT_INTERVAL_MS / 1000 if seconds is None else seconds


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    """A positive, finite number of seconds; `default` when unset."""
    raw = environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < math.inf:
        raise ConfigError(f"{name} must be a positive number of seconds, got {raw!r}")
    return seconds


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
        port = int(raw)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise ConfigError(f"{OTEL_EXPORTER_PROMETHEUS_PORT} must be a port number, got {raw!r}")
    return port


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
    the signal's path for http (OTel's spec); None when OTLP span export is off. Read as
    rlotel's own span export reads them (http/json as http/protobuf, a bad value as its
    default, a malformed endpoint as off)."""
    protocol = Environment.read(environ).otlp_traces
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


def test_faults(environ: Mapping[str, str] = os.environ) -> frozenset[str]:
    """Test-only: the hooks whose rlotel part is made to raise (`all`: every hook); empty
    unless a test sets it."""
    return frozenset(filter(None, environ.get(RLOTEL_TEST_FAULTS, "").replace(" ", "").split(",")))


def set_default(name: str, value: str, environ: MutableMapping[str, str] = os.environ) -> None:
    """For a library configured through the environment (vLLM's tracer): unless set."""
    environ.setdefault(name, value)


def set_value(name: str, value: str, environ: MutableMapping[str, str] = os.environ) -> None:
    """For a library configured through the environment that accepts fewer values than
    OpenTelemetry's spec (vLLM's tracer: no http/json): the value rlotel resolved."""
    environ[name] = value


def add_resource_attribute(
    key: str, value: str, environ: MutableMapping[str, str] = os.environ
) -> None:
    """`OTEL_RESOURCE_ATTRIBUTES` gains `key=value` unless it names `key` already."""
    given = environ.get(OTEL_RESOURCE_ATTRIBUTES, "")
    if f"{key}=" not in given:
        environ[OTEL_RESOURCE_ATTRIBUTES] = ",".join(filter(None, (given, f"{key}={value}")))
