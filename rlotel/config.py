"""Validated configuration: `rlotel.init` arguments plus the standard OTel variables.

Everything that can be wrong with a configuration is found here, at `init`, and raised as
`ConfigError` with a message that says what to change; after `init`, nothing raises.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

from rlotel import catalogue as cat

DEFAULT_SERVICE_NAME = "rlotel"
MAX_SHUTDOWN_TIMEOUT_S = 3600.0  # a flush that may block exit longer is a mistake
MAX_BUCKETS = 100  # each bound is one more series per label set, in every scrape


class ConfigError(ValueError):
    """A configuration rlotel cannot run with; the message says how to fix it."""


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Config:
    run: str
    service_name: str
    n_gpus: int
    prometheus_addr: str
    prometheus_port: int | None
    traces_file: Path | None
    profile_steps: tuple[int, ...]
    profile_dir: Path | None
    sdk_disabled: bool
    prometheus_tls: tuple[str, str] | None = None
    prometheus_basic_auth: tuple[str, str] | None = None
    max_metric_keys: int = 256
    max_sample_spans: int = 4
    queue_size: int = 1024
    shutdown_timeout_s: float = 5.0
    histogram_buckets: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    prometheus_port_retries: int = 0

    @classmethod
    def build(
        cls,
        *,
        run: str,
        service_name: str | None,
        n_gpus: int,
        prometheus_addr: str,
        prometheus_port: int | None,
        traces_file: str | os.PathLike | None,
        profile_steps: Iterable[int],
        profile_dir: str | os.PathLike | None,
        max_metric_keys: int,
        max_sample_spans: int,
        prometheus_tls: tuple[str, str] | None,
        prometheus_basic_auth: tuple[str, str] | None,
        queue_size: int,
        shutdown_timeout_s: float,
        environ: Mapping[str, str],
        histogram_buckets: Mapping[str, Iterable[float]] | None = None,
        prometheus_port_retries: int = 0,
    ) -> Config:
        if not isinstance(run, str) or not run.strip() or not _utf8(run):
            raise ConfigError(
                f"run must be a non-empty UTF-8 string naming the experiment, got {run!r}"
            )
        name = service_name or environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
        if not isinstance(n_gpus, int) or isinstance(n_gpus, bool) or n_gpus < 1:
            raise ConfigError(
                f"n_gpus must be a positive integer (GPUs in the job), got {n_gpus!r}"
            )
        if prometheus_port is not None and (
            not isinstance(prometheus_port, int)
            or isinstance(prometheus_port, bool)
            or not 0 <= prometheus_port <= 65535
        ):
            raise ConfigError(
                f"prometheus_port must be 0..65535 (0 = ephemeral) or None (no endpoint), "
                f"got {prometheus_port!r}"
            )
        if (
            not isinstance(prometheus_addr, str)
            or not prometheus_addr
            or not _utf8(prometheus_addr)
        ):
            raise ConfigError(f"prometheus_addr must be a host address, got {prometheus_addr!r}")
        steps = _steps(profile_steps)
        for label, value, least in (
            ("max_metric_keys", max_metric_keys, 1),
            ("max_sample_spans", max_sample_spans, 0),
            ("queue_size", queue_size, 1),
            ("prometheus_port_retries", prometheus_port_retries, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"{label} must be an integer ≥ {least}, got {value!r}")
        if (
            not isinstance(shutdown_timeout_s, (int, float))
            or isinstance(shutdown_timeout_s, bool)
            or not 0 < shutdown_timeout_s <= MAX_SHUTDOWN_TIMEOUT_S
        ):
            raise ConfigError(
                f"shutdown_timeout_s must be a number of seconds in (0, "
                f"{MAX_SHUTDOWN_TIMEOUT_S:.0f}], got {shutdown_timeout_s!r}"
            )
        return cls(
            prometheus_tls=_tls(prometheus_tls),
            prometheus_basic_auth=_credentials(prometheus_basic_auth),
            run=run,
            service_name=name,
            n_gpus=n_gpus,
            prometheus_addr=prometheus_addr,
            prometheus_port=prometheus_port,
            traces_file=_writable_file(traces_file, "traces_file"),
            profile_steps=steps,
            profile_dir=writable_dir(profile_dir, "profile_dir"),
            sdk_disabled=_truthy(environ.get("OTEL_SDK_DISABLED")),
            max_metric_keys=max_metric_keys,
            max_sample_spans=max_sample_spans,
            queue_size=queue_size,
            shutdown_timeout_s=float(shutdown_timeout_s),
            histogram_buckets=_histogram_buckets(histogram_buckets),
            prometheus_port_retries=prometheus_port_retries,
        )


def _histogram_buckets(given: Any) -> dict[str, tuple[float, ...]]:
    """Upper bounds by histogram family name, checked the way Prometheus needs them."""
    if given is None:
        return {}
    example = f"{{'{cat.AGENT_LOOP_DURATION.name}': [0.1, 1, 10, 60]}}"
    if not isinstance(given, Mapping):
        raise ConfigError(
            f"histogram_buckets must map histogram names to upper bounds, e.g. {example}; "
            f"got {type(given).__name__}"
        )
    families = {spec.name for spec in cat.CATALOGUE if spec.kind == "histogram"}
    checked = {}
    for name, bounds in given.items():
        if name not in families:
            raise ConfigError(
                f"histogram_buckets: {name!r} is not an rlotel histogram; "
                f"choose from {', '.join(sorted(families))}"
            )
        where = f"histogram_buckets[{name!r}]"
        if isinstance(bounds, (str, bytes)) or not isinstance(bounds, Iterable):
            raise ConfigError(f"{where} must be a list of upper bounds, e.g. {example}")
        values = list(bounds)
        if not 1 <= len(values) <= MAX_BUCKETS:
            raise ConfigError(
                f"{where} must have 1 to {MAX_BUCKETS} bounds (each is a series per label "
                f"set), got {len(values)}"
            )
        for value in values:
            if not isinstance(value, Real) or isinstance(value, bool):
                raise ConfigError(f"{where}: bounds must be numbers, got {value!r}")
            if not math.isfinite(value):
                raise ConfigError(
                    f"{where}: bounds must be finite, got {value!r} (+Inf is always added)"
                )
            if value < 0:
                raise ConfigError(
                    f"{where}: bounds must be ≥ 0 (durations and lengths never are), got {value!r}"
                )
        for lower, upper in itertools.pairwise(values):
            if not lower < upper:
                raise ConfigError(
                    f"{where} must be strictly increasing, but {upper!r} follows {lower!r}"
                )
        checked[name] = tuple(float(value) + 0.0 for value in values)  # -0.0 → 0.0
    return checked


def _tls(pair: Any) -> tuple[str, str] | None:
    if pair is None:
        return None
    try:
        certfile, keyfile = (str(Path(p)) for p in pair)
    except (TypeError, ValueError):
        raise ConfigError("prometheus_tls must be (certfile, keyfile)") from None
    for path in (certfile, keyfile):
        if not Path(path).is_file():
            raise ConfigError(f"prometheus_tls file {path!r} does not exist")
    return certfile, keyfile


def _credentials(pair: Any) -> tuple[str, str] | None:
    if pair is None:
        return None
    try:
        username, password = pair
    except (TypeError, ValueError):
        raise ConfigError("prometheus_basic_auth must be (username, password)") from None
    if not (isinstance(username, str) and isinstance(password, str) and username and password):
        raise ConfigError("prometheus_basic_auth needs a non-empty username and password")
    if ":" in username:
        raise ConfigError("prometheus_basic_auth username cannot contain ':'")
    return username, password


def _steps(profile_steps: Iterable[int]) -> tuple[int, ...]:
    try:
        steps = tuple(sorted(set(profile_steps or ())))
    except TypeError as exc:
        raise ConfigError(f"profile_steps must be a list of global steps: {exc}") from None
    bad = [s for s in steps if not isinstance(s, int) or isinstance(s, bool) or s < 0]
    if bad:
        raise ConfigError(f"profile_steps must be non-negative integers, got {bad!r}")
    return steps


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def writable_dir(path: str | os.PathLike | None, label: str) -> Path | None:
    if path is None:
        return None
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"{label} must be a path, got {type(path).__name__} {path!r}")
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{label} {str(directory)!r} cannot be created: {exc.strerror}") from None
    if not os.access(directory, os.W_OK):
        raise ConfigError(f"{label} {str(directory)!r} is not writable: choose another directory")
    return directory


def _writable_file(path: str | os.PathLike | None, label: str) -> Path | None:
    if path is None:
        return None
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"{label} must be a path, got {type(path).__name__} {path!r}")
    file = Path(path)
    if file.is_dir():
        raise ConfigError(f"{label} {str(file)!r} is a directory: give a file path")
    writable_dir(file.parent, f"{label}'s directory")
    if file.exists() and not os.access(file, os.W_OK):
        raise ConfigError(f"{label} {str(file)!r} is not writable: choose another path")
    return file
