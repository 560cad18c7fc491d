"""A real Prometheus scrapes a multi-step run; promtool lints the exposition."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from tests.helpers import parse_exposition, scrape

PHASES = ["gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"]


def work(size: int) -> None:
    a = torch.randn(size, size)
    (a @ a).sum().item()


@pytest.mark.slow
def test_promql_equals_step_numbers(make_tel, prometheus_for):
    tel = make_tel(run="promql", n_gpus=2)
    prometheus = prometheus_for(tel.metrics_url)
    sel = '{run="promql"}'
    for number in range(1, 4):
        phases = PHASES if number != 3 else [p for p in PHASES if p != "ref"]
        with tel.step(number) as step:
            for phase in phases:
                with tel.phase(phase):
                    work(64 * (1 + PHASES.index(phase)))
            step.set_tokens(prompt=[30 + number, 40, 12], response=[100, 7 * number, 55])
            step.set_mfu(actor=0.25 + number / 100)
        assert tel.flush(10)
        prometheus.wait_for(f"rlotel_step{sel}", number)
        for phase in PHASES:
            got = prometheus.scalar(f'rlotel_step_phase_seconds{{run="promql",phase="{phase}"}}')
            assert got == step.timing_raw.get(phase, 0.0), phase  # absent phase reads 0
        assert (
            prometheus.scalar(f"rlotel_throughput_tokens_per_second_per_gpu{sel}")
            == (step.metrics["perf/throughput"])
        )
        assert prometheus.scalar(f"rlotel_step_time_seconds{sel}") == step.timing_raw["step"]
        assert (
            prometheus.scalar('rlotel_mfu_ratio{run="promql",role="actor"}')
            == (step.metrics["perf/mfu/actor"])
        )
        per_token = prometheus.scalar(
            'rlotel_phase_time_per_token_seconds{run="promql",phase="update_actor"}'
        )
        assert per_token == step.metrics["timing_per_token_ms/update_actor"] / 1000
    assert prometheus.scalar(f"rlotel_steps_total{sel}") == 3
    assert prometheus.scalar('rlotel_phase_duration_seconds_count{run="promql",phase="gen"}') == 3
    assert prometheus.scalar('rlotel_phase_duration_seconds_count{run="promql",phase="ref"}') == 2
    assert prometheus.query('{__name__=~"rlotel_.*_created"}') == []
    unlabelled = prometheus.query('{__name__=~"rlotel_.*", run=""}')
    assert unlabelled == []


@pytest.mark.slow
def test_promtool_check_metrics_is_clean(make_tel):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: run `make test`"
    tel = make_tel(run="lint")
    for number in range(2):
        with tel.step(number) as step:
            for phase in PHASES:
                with tel.phase(phase):
                    pass
            step.set_tokens(prompt=[1, 2], response=[3, 4])
            step.set_mfu(actor=0.5, actor_infer=0.2)
    tel.log({"actor/pg_loss": -0.1, "critic/score/mean": 0.7, "bad": float("nan")}, step=1)
    tel.flush(10)
    exposition = scrape(tel.metrics_url)
    samples = parse_exposition(exposition)
    assert (
        "rlotel_train_metric",
        frozenset({("run", "lint"), ("key", "actor/pg_loss")}),
    ) in samples
    assert any(name == "rlotel_telemetry_dropped_total" for name, _ in samples)
    result = subprocess.run(
        [promtool, "check", "metrics"], input=exposition, capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result


def test_openmetrics_exposition_served(tel):
    with tel.step(1):
        pass
    tel.flush(10)
    text = scrape(tel.metrics_url, accept="application/openmetrics-text; version=1.0.0")
    assert text.rstrip().endswith("# EOF")
    assert "rlotel_steps_total" in text and "_created" not in text
