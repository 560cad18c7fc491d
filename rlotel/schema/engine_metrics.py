"""The rollout engines' own Prometheus metrics that rlotel's dashboards and alerts read.

vLLM and SGLang serve these on their `/metrics`; rlotel does not export them. Prometheus
scrapes the engines (job `rollout-engines`, file discovery, target labels `replica` and
`run`), and the dashboard and rule checks accept exactly these names besides rlotel's own
catalogue, so a typo in an engine query still fails the build.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlotel.schema.catalogue import Kind, MetricSpec

Engine = Literal["vllm", "sglang"]

# prometheus_client 0.26 (what vLLM and SGLang serve /metrics with) writes `vllm:x` as
# `vllm_x` in OpenMetrics 1.0, which Prometheus 2.x asks for first: this metric relabelling
# puts the colon back, so the names below are what gets stored. The shipped
# `rollout-engines` job (collector/prometheus.yml) and the rollout job verl's own writer
# produces with the plugin on (rlotel.integrations.verl_engines) both apply it.
COLON_NAMES_RELABEL: dict[str, object] = {
    "source_labels": ["__name__"],
    "regex": "(vllm|sglang)_(.+)",
    "target_label": "__name__",
    "replacement": "$1:$2",
}


@dataclass(frozen=True)
class EngineMetric:
    """One metric family as the engine's registry declares it (counters without `_total`)."""

    engine: Engine
    name: str
    kind: Kind
    unit: str
    help: str

    @property
    def sample_names(self) -> tuple[str, ...]:
        """Series names in the engine's exposition (what PromQL queries)."""
        return MetricSpec(self.name, self.kind, self.unit, self.help).sample_names


VLLM_E2E_LATENCY = EngineMetric(
    "vllm",
    "vllm:e2e_request_latency_seconds",
    "histogram",
    "seconds",
    "End-to-end request latency.",
)
VLLM_TIME_TO_FIRST_TOKEN = EngineMetric(
    "vllm", "vllm:time_to_first_token_seconds", "histogram", "seconds", "Time to first token."
)
VLLM_QUEUE_TIME = EngineMetric(
    "vllm",
    "vllm:request_queue_time_seconds",
    "histogram",
    "seconds",
    "Time a request spent WAITING in the scheduler queue.",
)
VLLM_PREFILL_TIME = EngineMetric(
    "vllm",
    "vllm:request_prefill_time_seconds",
    "histogram",
    "seconds",
    "Time a request spent in prefill.",
)
VLLM_DECODE_TIME = EngineMetric(
    "vllm",
    "vllm:request_decode_time_seconds",
    "histogram",
    "seconds",
    "Time a request spent in decode.",
)
VLLM_PREEMPTIONS = EngineMetric(
    "vllm", "vllm:num_preemptions", "counter", "", "Requests preempted by the scheduler."
)
VLLM_KV_CACHE_USAGE = EngineMetric(
    "vllm", "vllm:kv_cache_usage_perc", "gauge", "ratio", "KV-cache usage, 0 to 1 (1 = full)."
)
VLLM_REQUESTS_WAITING = EngineMetric(
    "vllm", "vllm:num_requests_waiting", "gauge", "", "Requests waiting to be scheduled."
)
SGLANG_E2E_LATENCY = EngineMetric(
    "sglang",
    "sglang:e2e_request_latency_seconds",
    "histogram",
    "seconds",
    "End-to-end request latency.",
)
SGLANG_QUEUE_TIME = EngineMetric(
    "sglang",
    "sglang:queue_time_seconds",
    "histogram",
    "seconds",
    "Time a request spent in the waiting queue.",
)
SGLANG_RETRACTIONS = EngineMetric(
    "sglang",
    "sglang:num_retracted_requests",
    "counter",
    "",
    "Requests retracted (preempted) because the KV pool was full.",
)
SGLANG_TOKEN_USAGE = EngineMetric(
    "sglang", "sglang:token_usage", "gauge", "ratio", "KV token-pool usage, 0 to 1 (1 = full)."
)

ENGINE_METRICS: tuple[EngineMetric, ...] = (
    VLLM_E2E_LATENCY,
    VLLM_TIME_TO_FIRST_TOKEN,
    VLLM_QUEUE_TIME,
    VLLM_PREFILL_TIME,
    VLLM_DECODE_TIME,
    VLLM_PREEMPTIONS,
    VLLM_KV_CACHE_USAGE,
    VLLM_REQUESTS_WAITING,
    SGLANG_E2E_LATENCY,
    SGLANG_QUEUE_TIME,
    SGLANG_RETRACTIONS,
    SGLANG_TOKEN_USAGE,
)


def series_names() -> set[str]:
    """Every engine series name a dashboard or rule may query."""
    return {name for metric in ENGINE_METRICS for name in metric.sample_names}
