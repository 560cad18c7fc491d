"""The same histograms reach an OTLP metrics endpoint, with the same bucket bounds
(the catalogue's, or those `histogram_buckets` configures) as the Prometheus exposition."""

from __future__ import annotations

import numpy as np
import pytest

import rlotel
from rlotel.schema import catalogue
from tests.helpers import parse_exposition, scrape
from tests.otlp_receiver import GrpcReceiver, HttpReceiver

CUSTOM = [0.25, 0.5, 1, 2, 4, 8]


@pytest.mark.parametrize(
    ("protocol", "configured"),
    [("http/protobuf", None), ("grpc", None), ("http/protobuf", CUSTOM)],
)
def test_histograms_reach_otlp_with_matching_bounds(protocol, configured, monkeypatch):
    receiver = HttpReceiver() if protocol == "http/protobuf" else GrpcReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    buckets = {catalogue.AGENT_LOOP_DURATION.name: configured} if configured else None
    bounds = [float(b) for b in configured or catalogue.SAMPLE_DURATION_BUCKETS]
    tel = rlotel.init(run="otlpm", prometheus_port=0, histogram_buckets=buckets)
    try:
        rng = np.random.default_rng(3)
        values = rng.lognormal(0, 1.2, 500)
        with tel.step(1) as step:
            with tel.phase("gen"):
                tel.record_samples(generate_sequences=values, response_length=[10] * 500)
            step.set_tokens(prompt=[5, 5], response=[10, 20])
        assert tel.flush(10)
        exposition = parse_exposition(scrape(tel.metrics_url))
    finally:
        tel.shutdown()
        receiver.stop()
    metrics = receiver.last_metrics()
    duration = metrics["rlotel_agent_loop_duration_seconds"]
    assert duration.unit == "s"
    (point,) = [
        p
        for p in duration.histogram.data_points
        if {a.key: a.value.string_value for a in p.attributes}
        == {"run": "otlpm", "stage": "generate_sequences"}
    ]
    assert list(point.explicit_bounds) == bounds
    assert duration.histogram.aggregation_temporality == 2  # CUMULATIVE
    assert point.count == 500 and point.sum == pytest.approx(values.sum())
    assert point.min == values.min() and point.max == values.max()
    # Same numbers as the Prometheus exposition and numpy, bucket for bucket.
    cumulative = np.cumsum(point.bucket_counts)
    for bound, count in zip([*bounds, float("inf")], cumulative, strict=True):
        assert count == np.count_nonzero(values <= bound)
        le = "+Inf" if bound == float("inf") else repr(bound)
        key = (
            "rlotel_agent_loop_duration_seconds_bucket",
            frozenset({("run", "otlpm"), ("stage", "generate_sequences"), ("le", le)}),
        )
        assert exposition[key] == count
    steps = metrics["rlotel_steps"]
    assert steps.sum.is_monotonic and steps.sum.data_points[0].as_double == 1.0
    phase = metrics["rlotel_step_phase_seconds"].gauge.data_points[0]
    assert phase.as_double == step.timing_raw["gen"]
