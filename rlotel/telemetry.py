"""`Telemetry`: wires the ledger, the publisher and the sinks behind the public API."""

from __future__ import annotations

import atexit
import logging
import math
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExporter

from rlotel import catalogue as cat
from rlotel.config import MAX_SHUTDOWN_TIMEOUT_S, Config, ConfigError, writable_dir
from rlotel.diagnose import Diagnoser, Thresholds
from rlotel.drops import Drops, describe, encodable
from rlotel.ledger import Ledger, Phase, RemotePhase, Step, Trace
from rlotel.profiling import Capture, ProfileConfig, StepProfiler, summarize
from rlotel.propagation import parse, traceparent
from rlotel.publisher import Publisher
from rlotel.samples import SampleBatch, build_batch, pick_sample_spans, use_remote_spans
from rlotel.sinks.jsonl import OtlpJsonLinesExporter
from rlotel.sinks.otlp import otlp_span_exporter
from rlotel.sinks.otlp_metrics import OtlpMetricsPusher, otlp_metric_exporter
from rlotel.sinks.prometheus import PrometheusSink, SeriesStore
from rlotel.sinks.spans import SpanSink

log = logging.getLogger("rlotel")


class _LogRecord:
    __slots__ = ("data", "step")

    def __init__(self, data: dict, step: Any) -> None:
        self.data = data
        self.step = step


class Telemetry:
    """One run's telemetry. Create with `rlotel.init`; nothing here raises after that."""

    def __init__(
        self,
        config: Config,
        span_exporters: Sequence[SpanExporter] = (),
        bottleneck_thresholds: Thresholds | None = None,
        profile: ProfileConfig | None = None,
    ) -> None:
        self.config = config
        self.drops = Drops()
        self._spans: SpanSink | None = None
        self._prometheus: PrometheusSink | None = None
        self._otlp_metrics: OtlpMetricsPusher | None = None
        self.metrics_url: str | None = None
        if config.sdk_disabled:
            log.info("rlotel: OTEL_SDK_DISABLED is set; no export, verl dicts still computed")
        else:
            self._start_sinks(span_exporters)
        self._publisher = Publisher(self._publish, self.drops, config.queue_size)
        self.ledger = Ledger(
            self._publisher.submit, self.drops, config.n_gpus, Diagnoser(bottleneck_thresholds)
        )
        if profile is not None and (profile.steps or profile.discover_dir):
            self.ledger.profiler = StepProfiler(
                profile, self.drops, self._publisher.submit, self.ledger.current_context
            )
        self._closed = False
        atexit.register(self.shutdown)  # flush what training closed, within the time bound
        _flush_on_sigterm(self)
        os.register_at_fork(after_in_child=_after_fork_hook(weakref.ref(self)))

    def _start_sinks(self, span_exporters: Sequence[SpanExporter]) -> None:
        """Everything that can fail on configuration fails here, before training starts."""
        config = self.config
        resource = Resource.create({"service.name": config.service_name, "rl.run": config.run})
        exporters: dict[str, SpanExporter] = {}
        otlp = otlp_span_exporter(os.environ)
        if otlp is not None:
            exporters["otlp"] = otlp
        metric_exporter = otlp_metric_exporter(os.environ)
        interval_s = _export_interval_s(os.environ)
        if config.traces_file is not None:
            exporters["traces_file"] = OtlpJsonLinesExporter(config.traces_file)
        for index, exporter in enumerate(span_exporters):
            exporters[f"{type(exporter).__name__}#{index}"] = exporter
        store = SeriesStore(
            config.run, self.drops, config.max_metric_keys, config.histogram_buckets
        )
        self._prometheus = PrometheusSink(store, self.drops)
        if config.prometheus_port is not None:
            self.metrics_url = self._prometheus.serve(
                config.prometheus_addr,
                config.prometheus_port,
                config.prometheus_tls,
                config.prometheus_basic_auth,
                config.prometheus_port_retries,
            )
        if exporters:
            self._spans = SpanSink(resource, config.run, exporters, self.drops)
        if metric_exporter is not None:
            self._otlp_metrics = OtlpMetricsPusher(
                metric_exporter,
                self._prometheus.store,
                config.run,
                resource,
                self.drops,
                interval_s,
            )

    # --- training-thread API ---------------------------------------------------------------

    def step(self, global_step: int) -> Step:
        """Context manager of one training step (root span `step`, NVTX range `step`)."""
        return Step(self.ledger, global_step)

    def phase(
        self, name: str, color: str | None = None, context: Mapping[str, str] | None = None
    ) -> Phase:
        """Context manager of one phase: a child span of the open step (or a root span).

        `context` (a carrier from `current_context()` in another process, e.g. a Ray
        driver) makes a phase opened outside any local step a child of that remote phase.
        """
        if not isinstance(name, str) or not name or not encodable(name) or name == "step":
            self.drops.add(
                "spans",
                "bad_name",
                f"phase name {describe(name)} is not a usable name (non-empty UTF-8 string, "
                "not the reserved 'step'); the body runs untimed",
            )
            return Phase(None, "unnamed", color)
        if context is not None and self.ledger.current_trace is None:
            ids = parse(context)
            if ids is not None:
                return RemotePhase(self.ledger, name, color, ids)
            self.drops.add("spans", "bad_context", f"no valid traceparent in {context!r}")
        return Phase(self.ledger, name, color)

    @property
    def current_step(self) -> Step | None:
        return self.ledger.current_step

    def record_samples(
        self,
        records: Any = None,
        /,
        *,
        context: Mapping[str, str] | None = None,
        exemplar_spans: Mapping[int, Any] | None = None,
        **fields: Any,
    ) -> dict[int, str]:
        """Per-sample agent-loop timings and lengths, one entry per sample.

        Keyword arrays (lists, numpy, torch): generate_sequences, tool_calls, compute_score
        (seconds), num_preempted (-1 = unknown), prompt_length, response_length; any
        subset. Or verl's shapes as `records`: a list of per-sample metric dicts, or the
        list[list[dict]] of worker chunks `AgentLoopManager._performance_metrics` receives.

        `context`: a carrier from `current_context()` in another process; the slowest
        samples' spans become children of that remote phase. `exemplar_spans`: sample index
        → span id of spans another process already made (returned by its own call); they
        become this process's exemplars and no spans are made here.
        Returns sample index → span id (hex) of the samples that got a span here.
        """
        try:
            batch = build_batch(records, fields, self.drops)
            if batch is None:
                return {}
            span_budget = self.config.max_sample_spans if self._spans is not None else 0
            if exemplar_spans is not None:
                span_budget = 0
            if context is not None:
                self._attach_remote(batch, context, span_budget)
            elif not self.ledger.attach_samples(batch, span_budget):
                self._publisher.submit(batch)  # outside any trace: histograms only
            if exemplar_spans is not None:
                bad = use_remote_spans(batch, exemplar_spans)
                if bad:
                    self.drops.add("samples", "bad_exemplar", f"{bad} unusable exemplar span(s)")
            if batch.exported_elsewhere:
                return {}
            return {span.index: f"{span.span_id:016x}" for span in batch.spans}
        except Exception as error:  # telemetry must never raise into training
            self.drops.add("samples", "internal_error", repr(error))
            return {}

    def current_context(self) -> dict[str, str]:
        """W3C `traceparent` of the innermost open phase, for work in other processes.

        Empty when no phase or step is open (or on error): a worker then records without
        a parent."""
        try:
            ids = self.ledger.current_context()
        except Exception as error:
            self.drops.add("spans", "internal_error", repr(error))
            return {}
        return traceparent(*ids) if ids else {}

    def _attach_remote(self, batch: SampleBatch, carrier: Any, span_budget: int) -> None:
        ids = parse(carrier)
        batch.end_ns = time.perf_counter_ns()
        if ids is None:
            self.drops.add("samples", "bad_context", f"no valid traceparent in {carrier!r}")
        else:
            batch.trace_id, batch.parent_span_id = ids
            pick_sample_spans(batch, span_budget)
        self._publisher.submit(batch)

    def profile_step(self) -> None:
        """One update mini-batch done: advances a profiler schedule on flagged steps."""
        profiler = self.ledger.profiler
        if profiler is not None:
            profiler.profile_step()

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """verl `Tracking.log`-compatible: known keys to the catalogue, other scalars generic."""
        try:
            snapshot = dict(data)
        except Exception as exc:
            self.drops.add("metrics", "bad_dict", f"tel.log data is not a mapping: {exc!r}")
            return
        self._publisher.submit(_LogRecord(snapshot, step))

    # --- lifecycle -------------------------------------------------------------------------

    def flush(self, timeout_s: float | None = None) -> bool:
        """Publish everything closed so far and push it to every exporter; bounded wait."""
        timeout = bounded(timeout_s, self.config.shutdown_timeout_s)
        deadline = time.monotonic() + timeout
        done = self._publisher.flush(timeout)
        if self._spans is not None:
            left = max(0.0, deadline - time.monotonic())
            done = self._spans.provider.force_flush(int(left * 1000)) and done
        if self._otlp_metrics is not None:
            done = self._otlp_metrics.export(max(0.1, deadline - time.monotonic())) and done
        return done

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Flush and stop everything, returning within about `timeout_s` seconds."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        timeout = bounded(timeout_s, self.config.shutdown_timeout_s)
        self.ledger.abandon_open_step()  # exiting mid-step: export what closed, incomplete
        profiler = self.ledger.profiler
        if profiler is not None:
            try:
                profiler.flush()  # a capture still open, steps held for discovery
            except Exception as error:
                self.drops.add("profile", "profiler_error", repr(error))
            profiler.wait_for_hook(timeout / 4)
        self._publisher.flush(timeout / 2)
        self._publisher.stop(0.5)
        # Exporters may face a blackholed collector: close them in parallel, bounded threads.
        closers = []
        if self._spans is not None:
            closers.append(threading.Thread(target=self._spans.shutdown, daemon=True))
        if self._otlp_metrics is not None:
            closers.append(
                threading.Thread(
                    target=self._otlp_metrics.shutdown, args=(timeout / 2,), daemon=True
                )
            )
        deadline = time.monotonic() + timeout / 2
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(max(0.0, deadline - time.monotonic()))
            if closer.is_alive():
                log.warning("rlotel: export did not finish within %.1fs; giving up", timeout)
        if self._prometheus is not None:
            self._prometheus.shutdown()
        import rlotel

        if rlotel._current is self:
            rlotel._current = None

    # --- publisher thread ------------------------------------------------------------------

    def _publish(self, item: Step | Trace | SampleBatch | _LogRecord) -> None:
        if isinstance(item, _LogRecord):
            if self._prometheus is not None:
                self._prometheus.observe_log(item.data, item.step)
            return
        if isinstance(item, Capture):
            self._publish_capture(item)
            return
        if isinstance(item, SampleBatch):
            if self._spans is not None and item.parent_span_id:
                self._spans.export_remote_samples(item)
            if self._prometheus is not None:
                self._prometheus.observe_samples(item)
            return
        if isinstance(item, Step):
            unclosed = [phase.name for phase in item.trace.records if not phase.end_ns]
            if unclosed:
                self.drops.add("spans", "unclosed_phase", f"step closed with {unclosed} open")
            if self._spans is not None:
                self._spans.export_step(item)
            if self._prometheus is not None:
                self._prometheus.observe_step(item)
            trace = item.trace
        else:
            if self._spans is not None:
                self._spans.export_trace(item)
            trace = item
        if self._prometheus is not None:
            for batch in trace.samples:
                self._prometheus.observe_samples(batch)

    def _forked(self) -> None:
        """In a forked child (dataloader workers, multiprocessing): go quiet.

        The parent's threads did not survive the fork and their locks may be held forever,
        and exporting here would duplicate the parent's data: the child keeps timing into
        its ledger (so `timing_raw` still works) but publishes and exports nothing.
        """
        self._closed = True
        self.drops = Drops()  # a fresh lock: the parent's may have been held at fork time
        self.ledger.drops = self.drops
        self._publisher.submit = _discard
        self.ledger.set_publisher(_discard)
        if self._prometheus is not None:
            self._prometheus.release_in_child()
        self.metrics_url = None
        self._spans = self._prometheus = self._otlp_metrics = None

    def _publish_capture(self, capture: Capture) -> None:
        profiler = self.ledger.profiler
        try:
            summarize(capture, profiler.config.top_n if profiler else 10)
        except Exception as error:  # a missing or truncated file still gets its link
            self.drops.add("profile", "unreadable_capture", f"{capture.path}: {error!r}")
        if self._spans is not None:
            self._spans.export_capture(capture)
        if self._prometheus is not None:
            self._prometheus.store.inc(cat.PROFILE_CAPTURES, 1.0, capture.tool)

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


def bounded(timeout_s: Any, default: float) -> float:
    """A wait every layer accepts (threading, the OTel SDK's ns deadlines): finite, ≥ 0,
    at most MAX_SHUTDOWN_TIMEOUT_S."""
    if timeout_s is None or isinstance(timeout_s, bool):
        return default
    try:
        value = float(timeout_s)
    except OverflowError:  # an int beyond float range: as long as allowed
        return MAX_SHUTDOWN_TIMEOUT_S
    except (TypeError, ValueError):
        return default
    if math.isnan(value):
        return default
    return min(max(value, 0.0), MAX_SHUTDOWN_TIMEOUT_S)


_live: weakref.WeakSet[Telemetry] = weakref.WeakSet()


def _on_sigterm(signum: int, frame: Any) -> None:
    for tel in list(_live):
        tel.shutdown()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _flush_on_sigterm(tel: Telemetry) -> None:
    """SIGTERM (a scheduler's stop, `kill`) skips atexit: flush first, then die as before.

    Installed only when nobody handles SIGTERM yet, and only from the main thread (where
    Python allows it); the default action is restored and the signal re-raised, so the
    process ends exactly as it would have — with its telemetry flushed within the bound.
    """
    _live.add(tel)
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def _discard(item: Any) -> None:
    """The publisher of a forked child: nothing leaves the child."""


def _after_fork_hook(reference: weakref.ref) -> Callable[[], None]:
    def after_fork() -> None:
        tel = reference()
        if tel is not None:
            tel._forked()

    return after_fork


def _export_interval_s(environ: Mapping[str, str]) -> float:
    raw = environ.get("OTEL_METRIC_EXPORT_INTERVAL", "60000")
    try:
        interval_ms = float(raw)
    except ValueError:
        interval_ms = -1.0
    if not interval_ms > 0:
        raise ConfigError(
            f"OTEL_METRIC_EXPORT_INTERVAL must be a positive number of milliseconds, got {raw!r}"
        )
    return interval_ms / 1000


def build(
    run: str,
    service_name: str | None,
    n_gpus: int,
    prometheus_addr: str,
    prometheus_port: int | None,
    traces_file: Any,
    profile_steps: Iterable[int],
    profile_dir: Any,
    span_exporters: Sequence[SpanExporter] = (),
    bottleneck_thresholds: Thresholds | None = None,
    profile: ProfileConfig | None = None,
    **tuning: Any,
) -> Telemetry:
    config = Config.build(
        run=run,
        service_name=service_name,
        n_gpus=n_gpus,
        prometheus_addr=prometheus_addr,
        prometheus_port=prometheus_port,
        traces_file=traces_file,
        profile_steps=profile_steps,
        profile_dir=profile_dir,
        max_metric_keys=tuning.get("max_metric_keys", 256),
        max_sample_spans=tuning.get("max_sample_spans", 4),
        prometheus_tls=tuning.get("prometheus_tls"),
        prometheus_basic_auth=tuning.get("prometheus_basic_auth"),
        queue_size=tuning.get("queue_size", 1024),
        shutdown_timeout_s=tuning.get("shutdown_timeout_s", 5.0),
        histogram_buckets=tuning.get("histogram_buckets"),
        prometheus_port_retries=tuning.get("prometheus_port_retries", 0),
        environ=os.environ,
    )
    if profile is None and config.profile_steps:
        profile = ProfileConfig(steps=config.profile_steps, save_dir=config.profile_dir)
    if profile is not None:
        profile = profile.validated()
        if profile.save_dir is not None:
            writable_dir(profile.save_dir, "profile save_dir")
    return Telemetry(config, span_exporters, bottleneck_thresholds, profile)
