"""How one validated `Config` becomes the exporters and step hooks a `Telemetry` runs:
the wiring, kept out of the user API (as the OTel SDK's `_configuration` builds the
providers outside them)."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlotel.base.drops import Drops
from rlotel.base.env import DEFAULT_SPAN_EXPORT_DELAY_MS
from rlotel.config import Config
from rlotel.derive.goodput import PhaseBuckets
from rlotel.derive.sources import SourceLabels
from rlotel.publish.pipeline import Pipeline
from rlotel.publish.sink import Sink
from rlotel.record.ledger import HookServices, Ledger, StepHooks
from rlotel.schema import attributes as attr
from rlotel.schema import catalogue as cat
from rlotel.series.recorder import Recorder
from rlotel.series.store import SeriesStore

if TYPE_CHECKING:
    from rlotel.profile.torch_driver import StepProfiler
    from rlotel.sinks.metrics.prometheus import PrometheusEndpoint

log = logging.getLogger("rlotel")


@dataclass
class Exports:
    """The sinks of one process, and its /metrics when it serves one."""

    sinks: list[Sink] = field(default_factory=list)
    endpoint: PrometheusEndpoint | None = None
    metrics_url: str | None = None
    traced: bool = False  # some span exporter is on: samples get spans
    source_labels: SourceLabels | None = None  # samples' data sources → bounded labels


def process_file(config: Config, suffix: str) -> Path | None:
    """This process's file of kind `suffix` in the traces directory
    (`<role>-<rank>-<pid><suffix>`), or None without one."""
    environment = config.environment
    if environment.traces_dir is None or environment.sdk_disabled:
        return None
    from rlotel.sinks.traces.jsonl import traces_dir_file

    own = config.resource_attributes
    role = own.get(attr.ROLE) or environment.role or "main"
    path = traces_dir_file(environment.traces_dir, str(role), own.get(attr.RANK, environment.rank))
    return path.with_suffix(suffix)


def build_exports(
    config: Config, drops: Drops, phase_buckets: Callable[[], PhaseBuckets]
) -> Exports:
    """Every sink the configuration asks for; opens files and binds /metrics, so that what
    can fail on configuration fails here, before training starts."""
    if config.environment.sdk_disabled:
        log.info("rlotel: OTEL_SDK_DISABLED is set; no export, verl dicts still computed")
        return Exports()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import SpanExporter

    from rlotel.sinks.metrics.otlp_metrics import OtlpMetricsPusher, otlp_metric_exporter
    from rlotel.sinks.metrics.prometheus import PrometheusEndpoint
    from rlotel.sinks.traces.hooks_file import SUFFIX, HookCountsFile
    from rlotel.sinks.traces.jsonl import JsonLinesExporter
    from rlotel.sinks.traces.otlp import otlp_span_exporter
    from rlotel.sinks.traces.spans import SpanSink

    environment = config.environment
    identity = {
        attr.SERVICE_NAME: config.service_name,
        attr.RUN: config.run,
        attr.PROCESS_PID: os.getpid(),
    }
    resource = Resource.create({**identity, **config.resource_attributes})
    exporters: dict[str, SpanExporter] = {}
    exports = Exports()
    if environment.otlp_traces is not None:
        exporters["otlp"] = otlp_span_exporter(environment.otlp_traces)
    if config.traces_file is not None:
        exporters["traces_file"] = JsonLinesExporter(config.traces_file)
    spans_file = process_file(config, ".jsonl")
    if spans_file is not None:  # one file per process, and its hooks' counts beside it
        exporters["traces_dir"] = JsonLinesExporter(spans_file)
        exports.sinks.append(HookCountsFile(spans_file.with_suffix(SUFFIX)))
    for index, exporter in enumerate(config.span_exporters):
        exporters[f"{type(exporter).__name__}#{index}"] = exporter
    store = SeriesStore(
        config.run,
        drops,
        config.max_metric_keys,
        config.histogram_buckets,
        (config.max_log_keys, config.max_val_log_keys),
    )
    own = config.resource_attributes  # a worker's role and rank: per-rank series
    rank = (
        (str(own[attr.ROLE]), str(own[attr.RANK])) if {attr.ROLE, attr.RANK} <= set(own) else None
    )
    exports.sinks.insert(0, Recorder(store, drops, rank))
    exports.source_labels = SourceLabels(
        drops, lambda folded: store.inc(cat.DATA_SOURCES_FOLDED, float(folded))
    )
    if exporters:
        delay_s = environment.span_export_delay_s
        if delay_s is None:
            delay_s = DEFAULT_SPAN_EXPORT_DELAY_MS / 1000
        exports.sinks.append(
            SpanSink(
                config.run,
                exporters,
                resource,
                drops,
                phase_buckets=phase_buckets,
                delay_s=delay_s,
            )
        )
        exports.traced = True
    if config.prometheus_port is not None:
        exports.endpoint = PrometheusEndpoint(store)
        exports.metrics_url = exports.endpoint.serve(
            config.prometheus_addr,
            config.prometheus_port,
            config.prometheus_tls,
            config.prometheus_basic_auth,
            config.prometheus_port_retries,
        )
        exports.sinks.append(exports.endpoint)
    if environment.otlp_metrics is not None:
        exports.sinks.append(
            OtlpMetricsPusher(
                otlp_metric_exporter(environment.otlp_metrics),
                store,
                config.run,
                resource,
                drops,
                environment.metric_export_interval_s,
            )
        )
    exports.sinks.extend(config.sinks)
    return exports


def build_step_hooks(
    config: Config,
    drops: Drops,
    submit: Callable[[Callable[[Any], None], Any], None],
    pipeline: Pipeline,
    ledger: Ledger,
) -> tuple[StepProfiler | None, list[StepHooks]]:
    """The profiler, then the hooks integrations inject (`Config.step_hooks`, e.g. verl's
    capture discovery), reacting to step start and end."""
    profile = config.profile
    services = HookServices(
        profile,
        functools.partial(submit, pipeline.capture),
        functools.partial(submit, pipeline.release),
        drops,
    )
    hooks: list[StepHooks] = []
    profiler = None
    if profile is not None and profile.steps and profile.save_dir is not None:
        from rlotel.profile.torch_driver import StepProfiler

        profiler = StepProfiler(
            profile, drops, services.publish_capture, services.release, ledger.current_context
        )
        ledger.phase_range = profiler.phase_range
        hooks.append(profiler)
    for factory in config.step_hooks:
        hook = factory(services)
        if hook is not None:
            hooks.append(hook)
    return profiler, hooks
