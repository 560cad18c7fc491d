"""Every `rlotel.init` option, declared once: name, default, meaning and validation.

`rlotel.init(...)` takes exactly `Config`'s fields; `Config.validated()` finds everything
that can be wrong at `init` and raises `ConfigError` with a message that says what to
change. After `init`, nothing raises.
"""

from __future__ import annotations

import inspect
import itertools
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from numbers import Real
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlotel.base.env import DEFAULT_PROMETHEUS_HOST, DEFAULT_PROMETHEUS_PORT, Environment
from rlotel.base.errors import ConfigError
from rlotel.derive.diagnose import Thresholds
from rlotel.derive.goodput import BUCKETS
from rlotel.profile.config import ProfileConfig
from rlotel.publish.sink import Sink
from rlotel.schema import catalogue as cat

if TYPE_CHECKING:
    from rlotel.record.ledger import StepHookFactory

DEFAULT_SERVICE_NAME = "rlotel"
MAX_SHUTDOWN_TIMEOUT_S = 3600.0  # a flush that may block exit longer is a mistake
MAX_BUCKETS = 100  # each bound is one more series per label set, in every scrape
# The defaults of the series caps (`rlotel replay` uses them too, to match a live run).
MAX_METRIC_KEYS = 256  # label sets per family: phases, stages, replicas, ...
MAX_LOG_KEYS = 1024  # distinct training keys of `tel.log` (rlotel_train_metric{key})
MAX_VAL_LOG_KEYS = 1024  # distinct validation keys (`val-*`, ...), a budget of their own


@dataclass(frozen=True)
class Config:
    """One run's telemetry options (the arguments of `rlotel.init`).

    run: experiment name → label `run` on every series and resource attribute `rl.run`.
    service_name: else `OTEL_SERVICE_NAME`, else "rlotel".
    n_gpus: GPUs in the job, for `perf/throughput`.
    prometheus_addr, prometheus_port: where `/metrics` listens; port 0 = ephemeral, None =
        no endpoint. `tel.metrics_url` has the port taken. Not given to `rlotel.init`:
        `OTEL_EXPORTER_PROMETHEUS_HOST` / `_PORT` (as the verl plugin reads them), else
        127.0.0.1:9464 (`init_options`).
    traces_file: OTLP/JSON-lines file of every span.
    profile_steps, profile_dir: global steps to capture with torch.profiler, and where.
    max_metric_keys: series cap per family (phases, stages, replicas, ...).
    max_log_keys, max_val_log_keys: distinct keys of `tel.log` that `rlotel_train_metric`
        holds: training keys, and validation keys (`val-core/…`, `val-aux/…`, `val/…`,
        `validation/…`) in a budget of their own, so `val_before_train`'s keys, which
        arrive first, never crowd out training keys. Keys past a budget are dropped and
        counted (`rlotel_telemetry_dropped_total{reason="log_key_cap"|"val_log_key_cap"}`).
    max_sample_spans: the slowest samples per step that get a span (and are exemplars).
    prometheus_tls=(certfile, keyfile): serve /metrics over HTTPS;
    prometheus_basic_auth=(user, password): require credentials (non-loopback binds).
    prometheus_port_retries: a busy port falls back to one of the N after it (several
        ranks per node), else `ConfigError`.
    queue_size: closed items waiting for the publisher (drop-oldest, counted).
    shutdown_timeout_s: the bound on flush and shutdown.
    histogram_buckets: `{"rlotel_phase_duration_seconds": [1, 10, 60, 600]}` replaces a
        histogram's upper bounds (put bounds near the latencies your alerts name).
    span_exporters: OTel `SpanExporter`s of your own, next to the ones
        `OTEL_EXPORTER_OTLP_*` and `traces_file` switch on.
    sinks: `rlotel.Sink`s of your own: closed steps, traces, samples, logs, captures.
    bottleneck_thresholds: tunes the per-step verdict (`rlotel.Thresholds`).
    stall_after_s: an open phase whose work shows no progress for this many seconds is
        stalled; else `RLOTEL_STALL_AFTER_S`, else 300 (`rlotel.derive.stall`).
    profile: every profiling option (`rlotel.ProfileConfig`); overrides profile_steps.
    resource_attributes: this process's own resource attributes (e.g. `rl.role`,
        `rl.rank`, `rl.node`), next to `service.name` and `rl.run`.
    phase_buckets: `{"my_wait": "idle"}` puts phase names in goodput buckets (productive,
        overhead, idle, wasted), over rlotel's table for verl's names (rlotel.derive.goodput).
    step_hooks: factories of ledger hooks (`rlotel.record.ledger.StepHooks`) an integration
        injects: each gets `rlotel.record.ledger.HookServices` at init and returns a hook or None
        (verl's capture discovery: `rlotel.integrations.verl_captures.discover`).
    """

    run: str = "default"
    service_name: str | None = None
    n_gpus: int = 1
    prometheus_addr: str = DEFAULT_PROMETHEUS_HOST
    prometheus_port: int | None = DEFAULT_PROMETHEUS_PORT
    traces_file: str | os.PathLike | None = None
    profile_steps: Iterable[int] = ()
    profile_dir: str | os.PathLike | None = None
    _: KW_ONLY
    max_metric_keys: int = MAX_METRIC_KEYS
    max_log_keys: int = MAX_LOG_KEYS
    max_val_log_keys: int = MAX_VAL_LOG_KEYS
    max_sample_spans: int = 4
    prometheus_tls: tuple[str, str] | None = None
    prometheus_basic_auth: tuple[str, str] | None = None
    prometheus_port_retries: int = 0
    queue_size: int = 1024
    shutdown_timeout_s: float = 5.0
    histogram_buckets: Mapping[str, Iterable[float]] | None = None
    span_exporters: Sequence[Any] = ()
    sinks: Sequence[Sink] = ()
    bottleneck_thresholds: Thresholds | None = None
    stall_after_s: float | None = None
    profile: ProfileConfig | None = None
    resource_attributes: Mapping[str, str | int | float | bool] | None = None
    phase_buckets: Mapping[str, str] | None = None
    step_hooks: Sequence[StepHookFactory] = ()
    # strict: the user asked for this configuration, so a bad variable is a ConfigError
    environment: Environment = field(
        default_factory=lambda: Environment.read(strict=True), repr=False
    )

    def validated(self) -> Config:
        """The same options, checked and normalised (paths, tuples, the resolved service
        name and profile config); raises `ConfigError` naming what to fix."""
        run = self.run
        if not isinstance(run, str) or not run.strip() or not _utf8(run):
            raise ConfigError(
                f"run must be a non-empty UTF-8 string naming the experiment, got {run!r}"
            )
        n_gpus = self.n_gpus
        if not isinstance(n_gpus, int) or isinstance(n_gpus, bool) or n_gpus < 1:
            raise ConfigError(
                f"n_gpus must be a positive integer (GPUs in the job), got {n_gpus!r}"
            )
        port = self.prometheus_port
        if port is not None and (
            not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535
        ):
            raise ConfigError(
                f"prometheus_port must be 0..65535 (0 = ephemeral) or None (no endpoint), "
                f"got {port!r}"
            )
        addr = self.prometheus_addr
        if not isinstance(addr, str) or not addr or not _utf8(addr):
            raise ConfigError(f"prometheus_addr must be a host address, got {addr!r}")
        for label, value, least in (
            ("max_metric_keys", self.max_metric_keys, 1),
            ("max_log_keys", self.max_log_keys, 1),
            ("max_val_log_keys", self.max_val_log_keys, 1),
            ("max_sample_spans", self.max_sample_spans, 0),
            ("queue_size", self.queue_size, 1),
            ("prometheus_port_retries", self.prometheus_port_retries, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"{label} must be an integer ≥ {least}, got {value!r}")
        timeout = self.shutdown_timeout_s
        if (
            not isinstance(timeout, (int, float))
            or isinstance(timeout, bool)
            or not 0 < timeout <= MAX_SHUTDOWN_TIMEOUT_S
        ):
            raise ConfigError(
                f"shutdown_timeout_s must be a number of seconds in (0, "
                f"{MAX_SHUTDOWN_TIMEOUT_S:.0f}], got {timeout!r}"
            )
        stall_after = self.stall_after_s
        if stall_after is None:
            stall_after = self.environment.stall_after_s
        if (
            not isinstance(stall_after, (int, float))
            or isinstance(stall_after, bool)
            or not 0 < stall_after < math.inf
        ):
            raise ConfigError(
                f"stall_after_s must be a positive number of seconds, got {stall_after!r}"
            )
        for sink in self.sinks:
            if not isinstance(sink, Sink):
                raise ConfigError(f"sinks must be rlotel.Sink instances, got {sink!r}")
        thresholds = self.bottleneck_thresholds
        if thresholds is not None and not isinstance(thresholds, Thresholds):
            raise ConfigError(
                f"bottleneck_thresholds must be rlotel.Thresholds, got {thresholds!r}"
            )
        for factory in self.step_hooks:
            if not callable(factory):
                raise ConfigError(
                    "step_hooks must be callables that take rlotel.record.ledger.HookServices and "
                    f"return a ledger hook (or None), got {factory!r}"
                )
        writable_dir(self.environment.traces_dir, "RLOTEL_TRACES_DIR")
        steps = _steps(self.profile_steps)
        profile_dir = writable_dir(self.profile_dir, "profile_dir")
        profile = self.profile
        if profile is None and steps:
            profile = ProfileConfig(steps=steps, save_dir=profile_dir)
        if profile is not None:
            if not isinstance(profile, ProfileConfig):
                raise ConfigError(f"profile must be rlotel.ProfileConfig, got {profile!r}")
            profile = profile.validated()
            if profile.save_dir is not None:
                writable_dir(profile.save_dir, "profile save_dir")
            if profile.discover_dir is not None and not self.step_hooks:
                raise ConfigError(
                    "profile discover_dir names verl's profiler output, but no step hook "
                    "reads it: pass step_hooks=[rlotel.integrations.verl_captures.discover] "
                    "(rlotel's verl integration does)"
                )
        return replace(
            self,
            service_name=self.service_name or self.environment.service_name or DEFAULT_SERVICE_NAME,
            prometheus_tls=_tls(self.prometheus_tls),
            prometheus_basic_auth=_credentials(self.prometheus_basic_auth),
            traces_file=_writable_file(self.traces_file, "traces_file"),
            profile_steps=steps,
            profile_dir=profile_dir,
            shutdown_timeout_s=float(timeout),
            stall_after_s=float(stall_after),
            histogram_buckets=_histogram_buckets(self.histogram_buckets),
            resource_attributes=_resource_attributes(self.resource_attributes),
            phase_buckets=_phase_buckets(self.phase_buckets),
            span_exporters=tuple(self.span_exporters),
            sinks=tuple(self.sinks),
            step_hooks=tuple(self.step_hooks),
            bottleneck_thresholds=(thresholds or Thresholds()).validated(),
            profile=profile
            if profile is not None and (profile.steps or profile.discover_dir)
            else None,
        )


# `rlotel.init`'s signature: Config's fields, without the environment (read at init).
INIT_SIGNATURE = inspect.signature(Config).replace(
    parameters=[
        p for name, p in inspect.signature(Config).parameters.items() if name != "environment"
    ]
)


def init_options(args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """`rlotel.init`'s arguments as `Config`'s keywords, its environment read once (strict):
    a `/metrics` address or port the caller does not pass comes from
    `OTEL_EXPORTER_PROMETHEUS_HOST` / `_PORT` (`Environment.metrics_addr`, `metrics_port`);
    one passed, `prometheus_port=None` included, wins. Integrations may pass `environment`."""
    options = dict(kwargs)
    environment = options.pop("environment", None) or Environment.read(strict=True)
    try:
        bound = INIT_SIGNATURE.bind_partial(*args, **options).arguments
    except TypeError as error:  # as a call of a function with that signature says it
        raise TypeError(f"rlotel.init() {error}") from None
    bound.setdefault("prometheus_addr", environment.metrics_addr)
    bound.setdefault("prometheus_port", environment.metrics_port)
    return {**bound, "environment": environment}


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


def _phase_buckets(given: Any) -> dict[str, str]:
    """Phase name → goodput bucket; a bucket that is not one of the four is a typo."""
    if given is None:
        return {}
    example = "{'my_wait': 'idle', 'gen': 'productive'}"
    if not isinstance(given, Mapping):
        raise ConfigError(
            f"phase_buckets must map phase names to buckets, e.g. {example}; "
            f"got {type(given).__name__}"
        )
    checked = {}
    for name, bucket in given.items():
        if not isinstance(name, str) or not name or not _utf8(name):
            raise ConfigError(f"phase_buckets: phase names must be non-empty strings, got {name!r}")
        if bucket not in BUCKETS:
            raise ConfigError(
                f"phase_buckets[{name!r}]: {bucket!r} is not a bucket; choose from "
                f"{', '.join(BUCKETS)}"
            )
        checked[name] = bucket
    return checked


def _resource_attributes(given: Any) -> dict[str, str | int | float | bool]:
    if given is None:
        return {}
    if not isinstance(given, Mapping) or not all(
        isinstance(key, str) and key and isinstance(value, (str, int, float, bool))
        for key, value in given.items()
    ):
        raise ConfigError(
            "resource_attributes must map attribute names to strings, numbers or booleans, "
            f"e.g. {{'rl.role': 'actor', 'rl.rank': 0}}; got {given!r}"
        )
    return dict(given)


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
        steps = tuple(sorted(set(() if profile_steps is None else profile_steps)))  # 0: bad
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
