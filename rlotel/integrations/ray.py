"""Ray: every worker process runs rlotel, and Prometheus finds each one by file discovery.

    ray.init(runtime_env={"worker_process_setup_hook": "rlotel.integrations.ray.setup_worker"})

The hook initialises rlotel in each worker process. Traces go over OTLP (the standard
`OTEL_EXPORTER_OTLP_*` variables in the runtime env); the driver's
`tel.current_context()` travels with the actor call and the worker opens
`tel.phase(name, context=carrier)` / `record_samples(..., context=carrier)`, so worker
spans are children of the driver's phase.

Metrics: each worker serves `/metrics` on its own ephemeral port and registers it in a
Prometheus file-service-discovery JSON (one file per process, like Ray's own
`prom_metrics_service_discovery.json`; Prometheus reads `files: [<dir>/*.json]`). Chosen
over OTLP metrics because a scrape keeps OpenMetrics exemplars (p99 → trace) and the
exact catalogue series the dashboards query. `rank`, `role` and `node` are target labels
from the discovery file, so they reach every series with cardinality bounded by the
number of workers, not by anything the workload does.
"""

from __future__ import annotations

import atexit
import json
import os
import urllib.parse
from pathlib import Path

import rlotel
from rlotel import env


def discovery_dir() -> Path:
    """Where worker endpoints are registered (`RLOTEL_PROMETHEUS_SD_DIR`, by default next
    to Ray's own discovery file)."""
    return env.Environment.read().prometheus_sd_dir


def setup_worker() -> None:
    """`worker_process_setup_hook`: telemetry for this worker process, registered for
    scraping. Never raises: a worker must start even if telemetry cannot."""
    try:
        import ray

        environment = env.Environment.read()
        tel = rlotel.current() or rlotel.init(
            run=environment.run or "ray",
            service_name=environment.service_name or "rlotel-ray-worker",
            prometheus_addr=environment.prometheus_host or "127.0.0.1",
            prometheus_port=0,
        )
        labels = {
            "role": environment.role or "worker",
            "rank": str(environment.rank),
            "node": ray.util.get_node_ip_address(),
        }
        register(tel.metrics_url, labels)
    except Exception as error:
        import logging

        logging.getLogger("rlotel").warning("rlotel: Ray worker telemetry off: %r", error)


def register(metrics_url: str | None, labels: dict[str, str]) -> Path | None:
    """Write this process's target to the discovery directory; removed at exit."""
    if not metrics_url:
        return None
    target = urllib.parse.urlsplit(metrics_url).netloc
    directory = discovery_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"rlotel-{os.getpid()}.json"
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps([{"targets": [target], "labels": labels}]))
    temporary.replace(path)  # atomic: Prometheus never reads half a file
    atexit.register(path.unlink, missing_ok=True)
    return path
