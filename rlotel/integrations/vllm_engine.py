"""vLLM inside verl's rollout server (`vLLMHttpServer`): its request spans join the trace.

verl calls the engine in-process (`AsyncLLM.generate`, no HTTP, no `trace_headers`), so
vLLM's own tracing, even when on, starts a new trace per request. In the rollout server's
process rlotel
- switches vLLM's request tracing on from the OpenTelemetry settings the other processes
  export with (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT`; the
  protocol of `OTEL_EXPORTER_OTLP_*PROTOCOL`, http/protobuf by default as OpenTelemetry's
  spec says — vLLM alone defaults to gRPC) unless the engine was given its own endpoint,
  with request statistics on (vLLM makes its spans from them; verl turns them off);
- passes the open phase's context (the traced `generate` call, itself under the trajectory
  that called it) as `trace_headers`, so vLLM's `llm_request` span is its child;
- checks once that vLLM's exporter delivers: one line saying so, or one warning saying it
  does not (vLLM otherwise drops its spans silently).
Installed when the rollout server's class loads (`verl_workers`), where vLLM is imported.
"""

from __future__ import annotations

import logging
from typing import Any

from rlotel.base import env
from rlotel.integrations import guard
from rlotel.integrations.registered import VLLM_ENGINE, VLLM_REQUEST, VLLM_SPAN_EXPORTER
from rlotel.schema import attributes as attr
from rlotel.schema import vocabulary

log = logging.getLogger("rlotel")

ENGINE_SERVICE = "vllm"  # service.name of the engine's spans unless OTEL_SERVICE_NAME says
SERVICE_NAME = attr.SERVICE_NAME


def traced_engine_init(original: Any) -> Any:
    def __init__(self, *args, **kwargs):
        with VLLM_ENGINE.guarded():  # else the engine starts as it would without rlotel
            VLLM_ENGINE.fault()
            kwargs = _traced_engine_options(args, kwargs)
            VLLM_ENGINE.fired()
        original(self, *args, **kwargs)

    return __init__


def _traced_engine_options(args: tuple, kwargs: dict) -> dict:
    """`AsyncLLM(vllm_config, ...)`'s keyword options with request tracing on (and the
    config's tracing endpoint set), unless the engine has its own endpoint or the options
    are given by position (not ours to change)."""
    vllm_config = args[0] if args else kwargs["vllm_config"]
    observability = vllm_config.observability_config
    target = env.otlp_traces_endpoint()
    if target is None or observability.otlp_traces_endpoint is not None:
        return kwargs
    if len(args) > 1:
        raise guard.UnexpectedCall("AsyncLLM called with positional options")
    endpoint, protocol = target
    observability.otlp_traces_endpoint = endpoint
    # vLLM builds request spans from request stats
    kwargs = {**kwargs, "log_stats": True}
    env.set_value(env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, protocol)  # grpc or http/protobuf
    # vLLM's span processor exports this often: Ray skips its exit flush
    env.set_default(env.OTEL_BSP_SCHEDULE_DELAY, str(env.WORKER_SPAN_EXPORT_DELAY_MS))
    env.add_resource_attribute(SERVICE_NAME, ENGINE_SERVICE)  # OTEL_SERVICE_NAME wins
    env.add_resource_attribute(attr.ROLE, vocabulary.VERL_CLASS_ROLES["vLLMHttpServer"])
    log.info("rlotel: vLLM request tracing on, to %s (%s)", endpoint, protocol)
    return kwargs


def traced_generate(original: Any) -> Any:
    def generate(self, *args, **kwargs):  # returns vLLM's own async generator: no per-token cost
        with VLLM_REQUEST.guarded():  # never fail a request over its trace context
            VLLM_REQUEST.fault()
            kwargs = _with_trace_headers(kwargs)
        return original(self, *args, **kwargs)

    return generate


def _with_trace_headers(kwargs: dict) -> dict:
    """The request's options with the open phase's context as `trace_headers`, unless the
    caller gave some."""
    if kwargs.get("trace_headers") is not None:
        return kwargs
    import rlotel

    tel = rlotel.current()
    carrier = tel.current_context() if tel is not None else None
    if not carrier:
        return kwargs
    VLLM_REQUEST.fired()
    return {**kwargs, "trace_headers": carrier}


def checked_exporter(original: Any) -> Any:
    def get_span_exporter(*args, **kwargs):
        exporter = original(*args, **kwargs)
        with VLLM_SPAN_EXPORTER.guarded():
            VLLM_SPAN_EXPORTER.fault()
            endpoint = args[0] if args else kwargs["endpoint"]
            VLLM_SPAN_EXPORTER.fired()
            return DeliveryCheck(exporter, endpoint)
        return exporter

    return get_span_exporter


class DeliveryCheck:
    """vLLM's span exporter, saying once whether its first export arrived."""

    def __init__(self, exporter: Any, endpoint: str) -> None:
        self._exporter = exporter
        self._endpoint = endpoint
        self._checked = False

    def export(self, *args: Any, **kwargs: Any) -> Any:
        result = self._exporter.export(*args, **kwargs)
        if not self._checked:
            self._checked = True
            VLLM_SPAN_EXPORTER.attempt(self._say, result)
        return result

    def _say(self, result: Any) -> None:
        if getattr(result, "name", "") == "SUCCESS":
            log.info("rlotel: vLLM request spans arrive at %s", self._endpoint)
        else:
            log.warning(
                "rlotel: vLLM request spans do not arrive at %s (%s): the rollout engine's "
                "spans are missing from the trace",
                self._endpoint,
                result,
            )

    def __getattr__(self, name: str) -> Any:  # shutdown, force_flush, ...
        return getattr(self._exporter, name)
