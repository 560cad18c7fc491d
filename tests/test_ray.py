"""A local Ray cluster: worker spans under the driver's phase, worker metrics discovered."""

from __future__ import annotations

import time

import pytest
import ray

import rlotel
from tests.helpers import finished_spans
from tests.otlp_receiver import HttpReceiver
from tests.promserver import Prometheus

pytestmark = pytest.mark.slow  # Ray workers, a real Prometheus


@ray.remote(num_cpus=1)
class Rollout:
    def work(self, carrier: dict, size: int) -> int:
        import os

        import numpy as np

        tel = rlotel.current()  # made by the worker_process_setup_hook
        with tel.phase("generate", context=carrier):
            values = np.random.default_rng(size).lognormal(size=size)
            values.sort()
        tel.record_samples(generate_sequences=values, context=carrier)
        tel.flush(10)
        return os.getpid()


def test_ray_workers_join_the_driver_trace_and_get_scraped(make_tel, span_exporter, tmp_path):
    receiver = HttpReceiver()
    sd_dir = tmp_path / "sd"
    env_vars = {
        "RLOTEL_RUN": "rayrun",
        "RLOTEL_ROLE": "rollout",
        "RLOTEL_PROMETHEUS_SD_DIR": str(sd_dir),
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_METRIC_EXPORT_INTERVAL": "600000",
    }
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={
            "worker_process_setup_hook": "rlotel.integrations.ray.setup_worker",
            "env_vars": env_vars,
        },
    )
    prometheus = None
    try:
        tel = make_tel(run="rayrun")
        workers = [Rollout.remote() for _ in range(2)]
        with tel.step(1), tel.phase("gen"):
            carrier = tel.current_context()
            pids = ray.get([w.work.remote(carrier, 500 + i) for i, w in enumerate(workers)])
        assert len(set(pids)) == 2
        gen = next(s for s in finished_spans(tel, span_exporter) if s.name == "gen")

        remote = [
            span for span, resource in receiver.spans() if span.name in ("generate", "sample")
        ]
        generates = [s for s in remote if s.name == "generate"]
        assert len(generates) == 2
        for span in generates:  # worker phase spans: children of the driver's gen span
            assert span.trace_id.hex() == f"{gen.context.trace_id:032x}"
            assert span.parent_span_id.hex() == f"{gen.context.span_id:016x}"
        assert [s for s in remote if s.name == "sample"]

        files = sorted(sd_dir.glob("*.json"))
        assert len(files) >= 2  # every worker process registered its endpoint
        config = {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [
                {"job_name": "ray-workers", "file_sd_configs": [{"files": [f"{sd_dir}/*.json"]}]}
            ],
        }
        prometheus = Prometheus(tmp_path, [], config=config)
        query = 'rlotel_agent_loop_duration_seconds_count{run="rayrun", stage="generate_sequences"}'
        deadline = time.monotonic() + 60
        result = []
        while time.monotonic() < deadline:
            result = prometheus.query(query)
            if len(result) == 2:
                break
            time.sleep(0.5)
        assert len(result) == 2, result
        for series in result:
            labels = series["metric"]
            assert labels["role"] == "rollout" and labels["rank"] == "0" and labels["node"]
        assert sorted(float(s["value"][1]) for s in result) == [500.0, 501.0]
    finally:
        if prometheus is not None:
            prometheus.stop()
        ray.shutdown()
        receiver.stop()
