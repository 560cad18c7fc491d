"""The node and GPU exporters' metrics that rlotel's hosts and GPU rows read.

node_exporter (its default collectors; Debian's `prometheus-node-exporter` 1.5 serves these
names) and NVIDIA's dcgm-exporter (the fields its `etc/default-counters.csv` enables) serve
them; rlotel does not. The shipped Prometheus scrapes both on every node that rlotel's
workers run on (jobs `node-exporter` and `dcgm-exporter`, collector/prometheus.yml), with
the workers' `node` label, so a panel can put a node's figures beside the ranks on it. The
dashboard and rule checks accept exactly these names besides rlotel's and the engines', so a
misspelt exporter name fails the build rather than showing an empty panel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Exporter = Literal["node_exporter", "dcgm-exporter"]


@dataclass(frozen=True)
class ExporterMetric:
    """One series name as the exporter serves it (counters already end in `_total` where
    the exporter writes it so; dcgm-exporter's do not)."""

    exporter: Exporter
    name: str
    unit: str  # the exporter's own unit, for the reader; panels state their Grafana unit
    help: str

    @property
    def sample_names(self) -> tuple[str, ...]:
        return (self.name,)


NODE_CPU = ExporterMetric(
    "node_exporter", "node_cpu_seconds_total", "seconds", "Seconds each CPU spent in each mode."
)
NODE_MEMORY_AVAILABLE = ExporterMetric(
    "node_exporter", "node_memory_MemAvailable_bytes", "bytes", "Memory available (MemAvailable)."
)
NODE_MEMORY_TOTAL = ExporterMetric(
    "node_exporter", "node_memory_MemTotal_bytes", "bytes", "Memory installed (MemTotal)."
)
NODE_SWAP_TOTAL = ExporterMetric(
    "node_exporter", "node_memory_SwapTotal_bytes", "bytes", "Swap space (SwapTotal)."
)
NODE_SWAP_FREE = ExporterMetric(
    "node_exporter", "node_memory_SwapFree_bytes", "bytes", "Swap space unused (SwapFree)."
)
# /proc/vmstat's counters, served untyped and without `_total`.
NODE_SWAP_IN = ExporterMetric(
    "node_exporter", "node_vmstat_pswpin", "pages", "Pages swapped in since boot."
)
NODE_SWAP_OUT = ExporterMetric(
    "node_exporter", "node_vmstat_pswpout", "pages", "Pages swapped out since boot."
)
NODE_NETWORK_RECEIVE = ExporterMetric(
    "node_exporter",
    "node_network_receive_bytes_total",
    "bytes",
    "Bytes received by each network device.",
)
NODE_NETWORK_TRANSMIT = ExporterMetric(
    "node_exporter",
    "node_network_transmit_bytes_total",
    "bytes",
    "Bytes sent by each network device.",
)

# dcgm-exporter's default counters (etc/default-counters.csv), labelled `gpu`, `UUID`,
# `device`, `modelName` (and `Hostname`) per GPU.
DCGM_GPU_UTIL = ExporterMetric("dcgm-exporter", "DCGM_FI_DEV_GPU_UTIL", "%", "GPU utilization.")
DCGM_FB_USED = ExporterMetric(
    "dcgm-exporter", "DCGM_FI_DEV_FB_USED", "MiB", "Framebuffer memory used."
)
DCGM_SM_CLOCK = ExporterMetric("dcgm-exporter", "DCGM_FI_DEV_SM_CLOCK", "MHz", "SM clock.")
# Typed `counter` in the CSV, but DCGM publishes a throughput (MiB/s, sent and received,
# every link): dcgm-exporter#417 and #658. Read as it is, never through rate().
DCGM_NVLINK_BANDWIDTH = ExporterMetric(
    "dcgm-exporter",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "MiB/s",
    "NVLink throughput of all the GPU's links.",
)
DCGM_XID_ERRORS = ExporterMetric(
    "dcgm-exporter",
    "DCGM_FI_DEV_XID_ERRORS",
    "",
    "The last XID error's code (0: none); newer exporters add `err_code` and `err_msg`.",
)

EXPORTER_METRICS: tuple[ExporterMetric, ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, ExporterMetric)
)


def series_names() -> set[str]:
    """Every exporter series name a dashboard or rule may query."""
    return {metric.name for metric in EXPORTER_METRICS}
