"""Per-sample histograms through a real Prometheus: quantiles, exemplars, OpenMetrics."""

from __future__ import annotations

import shutil
import subprocess
import time

import numpy as np
import pytest

from rlotel.schema import catalogue
from tests.helpers import file_spans, parse_exposition, scrape

pytestmark = pytest.mark.slow  # a real Prometheus and promtool


def test_p99_and_exemplars_through_prometheus(make_tel, prometheus_for, tmp_path):
    traces = tmp_path / "traces.jsonl"
    tel = make_tel(run="tail", traces_file=traces, max_sample_spans=6)
    prometheus = prometheus_for(tel.metrics_url, features=("exemplar-storage",))
    rng = np.random.default_rng(7)
    recorded = []
    started = time.time()
    for number in range(1, 4):
        generate = rng.lognormal(mean=0.5, sigma=1.0, size=4000)
        tools = rng.exponential(0.2, size=4000)
        score = rng.uniform(0, 0.02, size=4000)
        recorded.append(generate)
        with tel.step(number), tel.phase("gen"):
            tel.record_samples(
                generate_sequences=generate,
                tool_calls=tools,
                compute_score=score,
                response_length=rng.integers(1, 4096, size=4000),
            )
    assert tel.flush(10)
    sel = '{run="tail",stage="generate_sequences"}'
    prometheus.wait_for(f"rlotel_agent_loop_duration_seconds_count{sel}", 12000)

    p99 = prometheus.scalar(
        f"histogram_quantile(0.99, sum by (le) (rlotel_agent_loop_duration_seconds_bucket{sel}))"
    )
    truth = float(np.percentile(np.concatenate(recorded), 99))
    bounds = np.array(catalogue.SAMPLE_DURATION_BUCKETS)
    assert abs(int(np.searchsorted(bounds, p99)) - int(np.searchsorted(bounds, truth))) <= 1, (
        p99,
        truth,
    )

    sample_spans = {
        (span["trace"], span["id"]) for span in file_spans(traces) if span["name"] == "sample"
    }
    assert len(sample_spans) == 3 * 6
    data = prometheus.api(
        "query_exemplars",
        query=f"rlotel_agent_loop_duration_seconds_bucket{sel}",
        start=str(started - 60),
        end=str(time.time() + 60),
    )
    exemplars = [e for series in data for e in series["exemplars"]]
    assert exemplars, "Prometheus stored no exemplars"
    for exemplar in exemplars:
        key = (exemplar["labels"]["trace_id"], exemplar["labels"]["span_id"])
        assert key in sample_spans
    # The last step's slowest sample (verl's argmax of the stage sum) is the exemplar of
    # the bucket its generate_sequences value fell in: it leads from a p99 panel to it.
    slowest = float(generate[np.argmax(generate + tools + score)])
    assert any(float(e["value"]) == slowest for e in exemplars)


def test_classic_text_stays_promtool_clean_with_exemplars(make_tel, tmp_path):
    tel = make_tel(run="lint2", traces_file=tmp_path / "t.jsonl")
    with tel.step(1) as step, tel.phase("gen"):
        tel.record_samples(
            generate_sequences=[0.5, 1.5, 30.0],
            tool_calls=[0.0, 0.1, 0.2],
            compute_score=[0.01, 0.01, 0.02],
            num_preempted=[0, -1, 2],
            prompt_length=[10, 20, 30],
            response_length=[100, 2000, 70000],
        )
    tel.flush(10)
    openmetrics = scrape(tel.metrics_url, accept="application/openmetrics-text; version=1.0.0")
    assert '# {span_id="' in openmetrics and "trace_id=" in openmetrics
    classic = scrape(tel.metrics_url)
    assert "trace_id" not in classic
    series = parse_exposition(classic)
    run = ("run", "lint2")
    slowest = step.metrics["agent_loop/slowest/generate_sequences"]
    assert slowest == 30.0
    key = ("rlotel_agent_loop_slowest_seconds", frozenset({run, ("stage", "generate_sequences")}))
    assert series[key] == slowest
    key = ("rlotel_agent_loop_slowest_length_tokens", frozenset({run, ("kind", "response")}))
    assert series[key] == 70000
    assert series[("rlotel_agent_loop_preemptions_total", frozenset({run}))] == 2
    promtool = shutil.which("promtool")
    assert promtool
    result = subprocess.run(
        [promtool, "check", "metrics"], input=classic, capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result
