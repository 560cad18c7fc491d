"""Dashboards as code: no drift, no unknown metric, every query answers on a live demo."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

from tests.conftest import parse_exposition, scrape
from tests.promserver import Prometheus

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("grafana_foundation_sdk")
spec = importlib.util.spec_from_file_location("dashboards_build", ROOT / "dashboards" / "build.py")
build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)

VARIABLES = {
    "$__rate_interval": "30s",
    "$run": "demo",
    "$job": ".*",
    "$instance": ".*",
    "${run}": "demo",
}


@pytest.mark.slow
def test_committed_json_matches_the_code():
    result = subprocess.run(
        [sys.executable, str(ROOT / "dashboards" / "build.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_catalogue_check_rejects_an_unknown_metric():
    known = build.known_metrics()
    good = 'rate(rlotel_steps_total{run="x"}[5m])'
    bad = "histogram_quantile(0.99, rate(rlotel_gen_latency_bucket[5m]))"
    assert build.unknown_metrics([good], known) == []
    assert build.unknown_metrics([good, bad], known) == [("rlotel_gen_latency_bucket", bad)]


def all_expressions() -> list[str]:
    exprs = []
    for text in build.outputs().values():
        exprs += [
            e for e in build.expressions(json.loads(text)) if not e.startswith("label_values")
        ]
    for path in sorted((ROOT / "collector" / "rules").glob("*.rules.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            exprs += [rule["expr"] for rule in group["rules"] if "record" in rule]
    return exprs


def substitute(expression: str) -> str:
    for name, value in VARIABLES.items():
        expression = expression.replace(name, value)
    assert "$" not in expression, expression
    return expression


@pytest.mark.slow
def test_every_panel_and_recording_rule_answers_on_a_live_demo(tmp_path):
    command = [
        sys.executable, "-m", "rlotel.cli", "demo", "--steps", "40", "--port", "0",
        "--runs-dir", str(tmp_path), "--serve-seconds", "300", "--profile-steps", "3",
    ]  # fmt: skip
    demo = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env={**os.environ})
    prometheus = None
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            match = re.search(r"metrics at (http://\S+/metrics)", demo.stdout.readline())
            url = match.group(1) if match else None
        assert url, "the demo never printed its metrics URL"
        config = yaml.safe_load((ROOT / "collector" / "prometheus.yml").read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config["rule_files"] = [str(ROOT / "collector" / "rules" / "*.rules.yml")]
        config.pop("alerting", None)
        config["scrape_configs"] = [  # the shipped job, pointed at the running demo
            {**job, "static_configs": [{"targets": [urllib.parse.urlsplit(url).netloc]}]}
            for job in config["scrape_configs"]
            if job["job_name"] == "rlotel"
        ]
        prometheus = Prometheus(tmp_path, [], features=("exemplar-storage",), config=config)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            series = parse_exposition(scrape(url))
            if series.get(("rlotel_steps_total", frozenset({("run", "demo")}))) == 40:
                break
            time.sleep(0.5)
        prometheus.wait_for('rlotel_steps_total{run="demo"}', 40, timeout_s=60)
        time.sleep(2.5)  # two more scrapes so rate() windows hold the final state
        groups = prometheus.api("rules")["groups"]  # the shipped rule file loaded cleanly
        rules = [rule for group in groups for rule in group["rules"]]
        assert len(rules) >= 10 and not [r for r in rules if r["health"] == "err"]
        checked = []
        for expression in all_expressions():
            promql = substitute(expression)
            result = prometheus.query(promql)
            assert result, f"no data for {promql}"
            checked.append(promql)
        print("\nPromQL checked against the live demo:\n  " + "\n  ".join(checked))
        assert len(checked) >= 20
    finally:
        demo.send_signal(signal.SIGINT)
        try:
            demo.wait(30)
        except subprocess.TimeoutExpired:
            demo.kill()
        if prometheus is not None:
            prometheus.stop()


def test_grafana_alert_provisioning_shape():
    """Grafana's file provisioner reads groups by name and folder; rules need data + condition."""
    alerts = json.loads(build.ALERTS.read_text())
    assert alerts["apiVersion"] == 1
    (group,) = alerts["groups"]
    assert group["name"] == "rlotel" and group["folder"] == "RL" and group["interval"] == "1m"
    (rule,) = group["rules"]
    assert rule["title"] == "RLGenTailLatencyHigh" and rule["for"] == "10m"
    assert rule["condition"] in {query["refId"] for query in rule["data"]}
    assert {q["datasourceUid"] for q in rule["data"]} == {"prometheus", "__expr__"}
