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

from rlotel import env
from rlotel.integrations.patches import Patches
from rlotel.schema import attributes as attr
from rlotel.schema import vocabulary

log = logging.getLogger("rlotel")

ENGINE_SERVICE = "vllm"  # service.name of the engine's spans unless OTEL_SERVICE_NAME says
SERVICE_NAME = attr.SERVICE_NAME
_patches = Patches()


def install() -> None:
    """Patch vLLM's `AsyncLLM` and its span exporter factory (idempotent; needs vLLM)."""
    if _patches:
        return
    from vllm.tracing import otel
    from vllm.v1.engine import async_llm

    engine = async_llm.AsyncLLM
    _patch(engine, "__init__", _engine_init)
    _patch(engine, "generate", _generate)
    _patch(otel, "get_span_exporter", _checked_exporter)


def uninstall() -> None:
    _patches.undo()


def _patch(owner: Any, name: str, make: Any) -> None:
    _patches.replace(owner, name, make(getattr(owner, name)))


def _engine_init(original: Any) -> Any:
    def __init__(self, vllm_config, *args, **kwargs):
        try:
            observability = vllm_config.observability_config
            target = env.otlp_traces_endpoint()
            if target is not None and observability.otlp_traces_endpoint is None:
                if args:  # log_stats given by position: not ours to change
                    raise TypeError("AsyncLLM called with positional options")
                endpoint, protocol = target
                observability.otlp_traces_endpoint = endpoint
                kwargs["log_stats"] = True  # vLLM builds request spans from request stats
                env.set_default(env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, protocol)
                # vLLM's span processor exports this often: Ray skips its exit flush
                env.set_default(env.OTEL_BSP_SCHEDULE_DELAY, str(env.WORKER_SPAN_EXPORT_DELAY_MS))
                env.add_resource_attribute(SERVICE_NAME, ENGINE_SERVICE)  # OTEL_SERVICE_NAME wins
                env.add_resource_attribute(attr.ROLE, vocabulary.VERL_CLASS_ROLES["vLLMHttpServer"])
                log.info("rlotel: vLLM request tracing on, to %s (%s)", endpoint, protocol)
        except Exception as error:  # the engine must start even if tracing cannot
            log.warning("rlotel: vLLM tracing not switched on: %r", error)
        original(self, vllm_config, *args, **kwargs)

    return __init__


def _generate(original: Any) -> Any:
    def generate(self, *args, **kwargs):  # returns vLLM's own async generator: no per-token cost
        if kwargs.get("trace_headers") is None:
            try:
                import rlotel

                tel = rlotel.current()
                carrier = tel.current_context() if tel is not None else None
                if carrier:
                    kwargs["trace_headers"] = carrier
                    tel.drops.fired("vllm_request_context")
            except Exception as error:  # never fail a request over its trace context
                log.debug("rlotel: no trace context for a vLLM request: %r", error)
        return original(self, *args, **kwargs)

    return generate


def _checked_exporter(original: Any) -> Any:
    def get_span_exporter(endpoint):
        return DeliveryCheck(original(endpoint), endpoint)

    return get_span_exporter


class DeliveryCheck:
    """vLLM's span exporter, saying once whether its first export arrived."""

    def __init__(self, exporter: Any, endpoint: str) -> None:
        self._exporter = exporter
        self._endpoint = endpoint
        self._checked = False

    def export(self, spans: Any) -> Any:
        result = self._exporter.export(spans)
        if not self._checked:
            self._checked = True
            if getattr(result, "name", "") == "SUCCESS":
                log.info("rlotel: vLLM request spans arrive at %s", self._endpoint)
            else:
                log.warning(
                    "rlotel: vLLM request spans do not arrive at %s (%s): the rollout engine's "
                    "spans are missing from the trace",
                    self._endpoint,
                    result,
                )
        return result

    def __getattr__(self, name: str) -> Any:  # shutdown, force_flush, ...
        return getattr(self._exporter, name)
