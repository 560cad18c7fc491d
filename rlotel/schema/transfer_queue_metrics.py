"""TransferQueue's own metrics that the step-breakdown dashboard's TransferQueue row reads.

TransferQueue (verl V1's data path, `transfer_queue` 0.1.x) serves them with
prometheus_client from its controller when verl's config says `transfer_queue.metrics.enabled`
(`transfer_queue/metrics.py`); rlotel does not. rlotel registers that endpoint for file
discovery beside its own processes, labelled with the run (`rlotel.integrations.verl_v1`), and
the shipped Prometheus's `transfer-queue` job scrapes it. The dashboard and rule checks accept
exactly these names besides rlotel's, the engines' and the hosts', so a misspelt name fails
the build rather than showing an empty panel.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QueueMetric:
    """One series name as TransferQueue's controller serves it (counters with `_total`)."""

    name: str
    unit: str  # TransferQueue's own unit, for the reader; panels state their Grafana unit
    help: str

    @property
    def sample_names(self) -> tuple[str, ...]:
        return (self.name,)


PRODUCTION_PROGRESS = QueueMetric(
    "tq_partition_production_progress",
    "ratio",
    "Share of a partition's samples whose fields are all written, by partition and task.",
)
CONSUMPTION_PROGRESS = QueueMetric(
    "tq_partition_consumption_progress",
    "ratio",
    "Share of a partition's samples a task (a consumer) has read, by partition and task.",
)
PARTITION_SAMPLES = QueueMetric(
    "tq_partition_samples_total", "samples", "Samples held in each partition (a gauge)."
)
STORAGE_UTILIZATION = QueueMetric(
    "tq_storage_utilization_ratio", "ratio", "Active keys ÷ capacity, per storage unit."
)
STORAGE_CAPACITY = QueueMetric(
    "tq_storage_capacity_total", "keys", "A storage unit's capacity in keys (a gauge)."
)
CONTROLLER_REQUESTS = QueueMetric(
    "tq_controller_request_total", "requests", "Requests the controller served, by op_type."
)
STORAGE_LATENCY_P99 = QueueMetric(
    "tq_storage_request_latency_p99",
    "seconds",
    "p99 of a storage unit's request latency, by op_type (computed by the unit).",
)

QUEUE_METRICS: tuple[QueueMetric, ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, QueueMetric)
)


def series_names() -> set[str]:
    """Every TransferQueue series name a dashboard or rule may query."""
    return {metric.name for metric in QUEUE_METRICS}
