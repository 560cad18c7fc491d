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

from rlotel.schema.catalogue import Kind, exposed_names


@dataclass(frozen=True)
class QueueMetric:
    """One family as TransferQueue's controller declares it with prometheus_client."""

    name: str
    kind: Kind
    unit: str  # TransferQueue's own unit, for the reader; panels state their Grafana unit
    help: str

    @property
    def sample_names(self) -> tuple[str, ...]:
        return exposed_names(self.name, self.kind)


# What verl 0.9.1's V1 run moves shows here (its real run, scraped as shipped): the controller's
# requests by operation, their latency and the samples they carry, the samples a partition
# holds, the storage units' use. TransferQueue's production and consumption progress stay 0 or
# absent on it (verl reads and writes through the key-value API, which they do not follow), and
# the storage units' own request counters stay 0: neither is on the dashboard.
CONTROLLER_REQUESTS = QueueMetric(
    "tq_controller_request", "counter", "requests", "Requests the controller served, by op_type."
)
CONTROLLER_REQUEST_SECONDS = QueueMetric(
    "tq_controller_request_duration_seconds",
    "histogram",
    "seconds",
    "Seconds the controller took per request, by op_type.",
)
CONTROLLER_REQUEST_SAMPLES = QueueMetric(
    "tq_controller_request_samples",
    "counter",
    "samples",
    "Samples the controller's requests carried, by op_type (NOTIFY_DATA_UPDATE: written; "
    "CLEAR_META: cleared).",
)
PARTITION_SAMPLES = QueueMetric(
    "tq_partition_samples_total", "gauge", "samples", "Samples each partition holds."
)
STORAGE_UTILIZATION = QueueMetric(
    "tq_storage_utilization_ratio", "gauge", "ratio", "Active keys ÷ capacity, per storage unit."
)
STORAGE_CAPACITY = QueueMetric(
    "tq_storage_capacity_total", "gauge", "keys", "A storage unit's capacity in keys."
)

QUEUE_METRICS: tuple[QueueMetric, ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, QueueMetric)
)


def series_names() -> set[str]:
    """Every TransferQueue series name a dashboard or rule may query."""
    return {name for metric in QUEUE_METRICS for name in metric.sample_names}
