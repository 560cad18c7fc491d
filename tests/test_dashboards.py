"""Dashboards as data: no drift, no unknown metric, every query answers on live data."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

from dashboards import build, promql_names
from rlotel.schema import catalogue as cat
from rlotel.schema import engine_metrics as eng
from rlotel.schema import host_metrics as host
from tests.helpers import file_spans, parse_exposition, scrape, serve_engine
from tests.promserver import Prometheus, free_port

ROOT = Path(__file__).resolve().parent.parent
COLLECTOR = promql_names.STACK / "collector"

VARIABLES = {
    "$__rate_interval": "30s",
    "$run": "demo",
    "$job": ".*",
    "$instance": ".*",
    "$replica": ".*",
    "${run}": "demo",
    "${prefix:regex}": "actor",  # one copy of the repeated panel: verl's actor/ keys
    "$node": ".+",
}

# Panels and recording rules the demo cannot answer yet, and why. Each must still run on the
# real Prometheus and come back empty: once the demo feeds one, the test asks to drop it here.
ENGINES = "the rollout engines' own metrics: the demo runs no vLLM or SGLang"
ASYNC = (
    "idle per role and evictions: async runs only, and this live demo is sync; verl's real "
    "colocate_async run answers them (tests/e2e/test_main_ppo_modes.py, "
    "test_async_panels_answer_on_the_colocate_async_run)"
)
RANKS = (
    "per-rank series: the demo runs no worker processes; real verl workers answer them "
    "(test_rank_panels_answer_on_real_verl_workers)"
)
COMPUTE = (
    "per-rank compute seconds: ranks of a torch.distributed group; benchmarks/scale_targets.py's "
    "ranks answer it (tests/test_scale_harness.py, on a real Prometheus with the shipped rules)"
)
DATA = (
    "worker-group calls and data queues: the demo runs neither; verl's real run answers them "
    "(tests/e2e/test_main_ppo.py, test_every_dashboard_panel_answers_on_the_real_run)"
)
HOSTS = (
    "node_exporter's series: the demo runs no worker; a real node_exporter answers them "
    "(test_hosts_row_answers_on_a_real_node_exporter_joined_to_the_ranks_on_it)"
)
GPUS = "dcgm-exporter's series: no GPU and no DCGM on the test machine"
QUEUE = (
    "TransferQueue's own series: the demo has no TransferQueue; verl's real V1 run answers them "
    "(tests/e2e/test_main_ppo.py, test_every_dashboard_panel_answers_on_the_real_run)"
)
QUEUE_ROW = "TransferQueue (its own tq_* series)"
HOSTS_ROW = "Hosts (node_exporter), on the ranks of each node"
GPUS_ROW = "GPUs (dcgm-exporter), by node and GPU"
KEYS_ROW = "Every verl key (rlotel_train_metric), by prefix"
SOURCES_ROW = "By data source"
VERL_LOG = ROOT / "tests" / "data" / "verl-0.9.1-main_ppo.jsonl"  # a real run's metric dicts


def row(title: str) -> build.Section:
    """A row of the step-breakdown dashboard, by title."""
    (found,) = [s for s in build.STEP_BREAKDOWN.sections if s.title == title]
    return found


NOT_IN_THE_DEMO = {
    "RL step breakdown / Worker-group calls by stage": DATA,
    "RL step breakdown / Bytes moved by phase and direction": DATA,
    "RL step breakdown / Data queues: seconds by queue and operation": DATA,
    "RL step breakdown / Idle ratio by role": ASYNC,
    "RL step breakdown / Replay-buffer evictions by reason": ASYNC,
    "RL step breakdown / Rank spread by phase (slowest ÷ median)": RANKS,
    "RL step breakdown / Phase seconds by rank (last step)": RANKS,
    "RL rollout tail / Engine request latency p99": ENGINES,
    "RL rollout tail / vLLM time to first token p50 / p99": ENGINES,
    "RL rollout tail / Engine queue time p99": ENGINES,
    "RL rollout tail / vLLM prefill / decode p99": ENGINES,
    "RL rollout tail / Engine preemptions (SGLang: retractions)": ENGINES,
    "RL rollout tail / KV cache usage": ENGINES,
    "RL rollout tail / vLLM requests waiting": ENGINES,
    "rlotel:rank_compute_over_median:ratio": COMPUTE,
    "rlotel:engine_preemptions:rate5m": ENGINES,
    "rlotel:engine_kv_cache_usage:ratio": ENGINES,
    "rlotel:engine_queue_seconds:p99": ENGINES,
    **{f"RL step breakdown / {panel.title}": HOSTS for panel in row(HOSTS_ROW).panels},
    **{f"RL step breakdown / {panel.title}": GPUS for panel in row(GPUS_ROW).panels},
    **{f"RL step breakdown / {panel.title}": QUEUE for panel in row(QUEUE_ROW).panels},
}
ENGINE_ROW = "Rollout engines (vLLM / SGLang, by replica)"


def load_rules() -> dict:
    return yaml.safe_load(build.RULES.read_text())


def sourced_expressions() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every recording rule."""
    found = []
    for text in build.outputs().values():
        document = json.loads(text)
        for panel in document["panels"]:
            found += [
                (f"{document['title']} / {panel['title']}", target["expr"])
                for target in panel.get("targets", [])
                if "expr" in target
            ]
    for group in load_rules()["groups"]:
        found += [(rule["record"], rule["expr"]) for rule in group["rules"] if "record" in rule]
    return found


def substitute(expression: str) -> str:
    for name, value in VARIABLES.items():
        expression = expression.replace(name, value)
    assert "$" not in expression, expression
    return expression


def engine_panels() -> list[build.Panel]:
    (row,) = [s for s in build.ROLLOUT_TAIL.sections if s.title == ENGINE_ROW]
    return list(row.panels)


# --- the check ---------------------------------------------------------------------------


@pytest.mark.slow
def test_committed_json_matches_the_code():
    result = subprocess.run(
        [sys.executable, str(ROOT / "dashboards" / "build.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_check_rejects_unknown_metrics_rlotel_and_engine_alike():
    known = promql_names.known_names()
    good = 'rate(rlotel_steps_total{run="x"}[5m])'
    bad = "histogram_quantile(0.99, rate(rlotel_gen_latency_bucket[5m]))"
    engine_typo = 'max by (replica) (vllm:kv_cache_usage_percent{run=~"$run"})'
    assert promql_names.unknown_names([good], known) == []
    assert promql_names.unknown_names([good, bad, engine_typo], known) == [
        ("rlotel_gen_latency_bucket", bad),
        ("vllm:kv_cache_usage_percent", engine_typo),
    ]
    with pytest.raises(promql_names.PromQLError, match="does not parse"):
        promql_names.unknown_names(["sum(rate(rlotel_steps_total[5m])"], known)


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        # metric-like words inside label values, `by (...)` lists and function names
        ('rlotel_steps_total{run="rlotel_fake_total", stage=~"vllm:x|y"}', ["rlotel_steps_total"]),
        ("sum by (rlotel_label, le) (rate(rlotel_tokens_total[5m]))", ["rlotel_tokens_total"]),
        ("histogram_quantile(0.9, rate(a_bucket[5m])) > bool 1", ["a_bucket"]),
        ("rlotel_step offset 5m + rlotel_step @ 1700000000", ["rlotel_step", "rlotel_step"]),
        ("max_over_time(vllm:kv_cache_usage_perc[10m:1m] offset 1h)", ["vllm:kv_cache_usage_perc"]),
        ("rlotel:a:p99 > on() group_left() rlotel:b:s", ["rlotel:a:p99", "rlotel:b:s"]),
        ('{__name__="rlotel_step", run="x"}', ["rlotel_step"]),
        ('count({__name__=~"rlotel_.*"})', []),  # a regex names no single series
        ("time() - vector(1) * 2", []),
        # Grafana: interval macros and template-variable queries
        ("rate(rlotel_steps_total{run=~\"$run\"}[$__rate_interval])", ["rlotel_steps_total"]),
        ('label_values(rlotel_steps_total{run=~"$run"}, job)', ["rlotel_steps_total"]),
        ('label_values({run=~"$run", replica!=""}, replica)', []),
        ("label_values(replica)", []),
    ],
)  # fmt: skip
def test_checker_finds_names_only_where_promql_selects_series(expression, names):
    assert promql_names.selected_names(expression) == names


def test_every_target_names_the_metrics_it_queries():
    assert build.undeclared_queries() == []
    typo = build.Target(
        'max by (replica) (vllm:kv_cache_usage_percent{run=~"$run"})',
        "{{replica}}",
        (eng.VLLM_KV_CACHE_USAGE,),
    )
    other = build.Target("rlotel_step_time_seconds", "", (cat.STEP,))
    board = build.Board("B", "b", "x", (build.Section("S", (build.Panel("P", (typo, other)),)),))
    assert build.undeclared_queries((board,)) == [
        "B / P: 'vllm:kv_cache_usage_percent' is not among the target's metrics",
        "B / P: 'rlotel_step_time_seconds' is not among the target's metrics",
    ]


def test_built_dashboard_with_an_engine_typo_fails_the_check():
    panel = build.Panel(
        "KV", (build.value(eng.VLLM_KV_CACHE_USAGE, "{{replica}}", wrap="max by (replica) ({})"),)
    )
    text = build.render(
        build.dashboard(build.Board("B", "b", "x", (build.Section("S", (panel,)),)))
    )
    known = promql_names.known_names()
    assert build.problems_in(text, known) == []
    broken = text.replace("vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_pct")
    assert build.problems_in(broken, known) == [
        "unknown metric 'vllm:kv_cache_usage_pct' in "
        '\'max by (replica) (vllm:kv_cache_usage_pct{run=~"$run", replica=~"$replica"})\''
    ]


def test_units_come_from_the_metrics():
    units = {
        panel.title: panel.grafana_unit
        for board in build.BOARDS
        for section in board.sections
        for panel in section.panels
        if isinstance(panel, build.Panel)
    }
    assert units["KV cache usage"] == "percentunit"  # engine gauges in 0..1
    assert units["Engine queue time p99"] == "s"
    assert units["Goodput (productive seconds ÷ step)"] == "percentunit"
    assert units["Tokens per step"] == "short"


def test_engine_row_reads_every_allowed_engine_metric_by_replica():
    queried = {
        name
        for panel in engine_panels()
        for target in panel.targets
        for name in promql_names.selected_names(target.expr)
    }
    assert queried == {metric.sample_names[0] for metric in eng.ENGINE_METRICS}
    for panel in engine_panels():
        for target in panel.targets:
            assert "by (replica" in target.expr and "{{replica}}" in target.legend, target.expr
    tail = json.loads(build.OUTPUTS[build.TAIL_UID].read_text())
    variables = {v["name"]: v for v in tail["templating"]["list"]}
    assert "replica" in variables


def test_straggler_and_async_panels_use_the_new_catalogue_entries():
    step = json.loads(build.OUTPUTS[build.STEP_UID].read_text())
    queried = {
        name
        for expression in build.expressions(step)
        for name in promql_names.selected_names(expression)
    }
    new_specs = (
        cat.PHASE_RANK_SPREAD,
        cat.GOODPUT,
        cat.BUCKET_SECONDS,
        cat.ROLE_IDLE,
        cat.SAMPLE_STALENESS,
        cat.SAMPLE_WEIGHT_SPAN,
        cat.REPLAY_EVICTED,
        cat.RANK_PHASE_SECONDS,
    )
    assert {s.sample_names[0] for s in new_specs} <= queried
    (matrix,) = [p for p in step["panels"] if p["title"] == "Phase seconds by rank (last step)"]
    assert matrix["type"] == "table"
    options = matrix["transformations"][0]["options"]
    assert (options["rowField"], options["columnField"]) == ("worker", "phase")  # role + rank


def test_the_data_source_row_reads_every_source_family_by_source():
    """One line per data_source in every panel; the two means are sums over counts (the
    rewards' through the shipped recording rule), never a mean of per-step means."""
    panels = row(SOURCES_ROW).panels
    targets = [target for panel in panels for target in panel.targets]
    queried = {name for target in targets for name in promql_names.selected_names(target.expr)}
    families = (
        cat.SOURCE_SAMPLES,
        cat.SOURCE_LENGTH,
        cat.SOURCE_STAGE_DURATION,
        cat.SOURCE_REWARD_COMPONENT,
        cat.SOURCE_REWARD_COMPONENT_SAMPLES,
    )
    assert queried == {build.SOURCE_REWARD_MEAN.name, *(f.sample_names[0] for f in families)}
    assert all("{{data_source}}" in target.legend for target in targets)
    rules = {
        rule["record"]: rule["expr"]
        for group in load_rules()["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    mean = rules[build.SOURCE_REWARD_MEAN.name]
    assert set(promql_names.selected_names(mean)) == {
        cat.SOURCE_REWARD.sample_names[0],
        cat.SOURCE_REWARDED.sample_names[0],
    }
    for expression in (mean, targets[-1].expr):  # the reward's, each component's
        assert 'sign="positive"' in expression and 'sign="negative"' in expression
        assert "avg" not in expression and "> 0)" in expression
    means = [p for p in panels if p.title.startswith("Mean reward")]
    assert len(means) == 2 and all("verl #3785" in p.description for p in means)


@pytest.mark.slow  # the demo, run once for the session (tests/conftest.py)
def test_the_tempo_panel_selects_the_capture_span_of_the_demos_profiled_step(demo_run):
    """The one panel no Prometheus answers reads Tempo, and no Tempo runs here (the test
    machine has no Tempo binary): its TraceQL is read and matched against the spans the
    demo exported for its profiled step, by name and by the run it is filtered on."""
    tables = [
        (board.title, panel)
        for board in build.BOARDS
        for section in board.sections
        for panel in section.panels
        if isinstance(panel, build.TraceTable)
    ]
    assert [(board, panel.title) for board, panel in tables] == [
        ("RL step breakdown", "profile.capture spans (Tempo)")
    ]
    traceql = tables[0][1].traceql
    selects = re.fullmatch(r'\{ name = "([^"]+)" && resource\.rl\.run =~ "\$run" \}', traceql)
    assert selects, traceql
    spans = file_spans(demo_run / "traces.jsonl", run="rep")  # every span's resource: rl.run
    captures = [span for span in spans if span["name"] == selects.group(1)]
    assert len(captures) == 1, [span["name"] for span in spans]  # --profile-steps 2


def step_panel(title: str) -> dict:
    """A panel of the generated step-breakdown dashboard, as Grafana reads it."""
    (panel,) = [
        panel
        for panel in json.loads(build.OUTPUTS[build.STEP_UID].read_text())["panels"]
        if panel["title"] == title
    ]
    return panel


@pytest.mark.slow  # a real Prometheus
def test_the_evictions_panel_counts_each_reasons_first_evictions(make_tel, prometheus_for):
    """verl logs an eviction count only at a step that evicted, so a reason's counter
    appears at its first evictions: the panel counts them, where `increase` alone (no sample
    before them) shows 0."""
    tel = make_tel(run="demo")
    prometheus = prometheus_for(tel.metrics_url)
    (target,) = step_panel("Replay-buffer evictions by reason")["targets"]
    tel.log(
        {"training/off_policy/evicted_samples": 3, "training/filter_groups/evicted_samples": 2},
        step=1,
    )
    assert tel.flush(10)
    prometheus.wait_for('count(rlotel_replay_evicted_samples_total{run="demo"})', 2)
    answer = {
        r["metric"]["reason"]: float(r["value"][1])
        for r in prometheus.query(substitute(target["expr"]))
    }
    assert answer == {"staleness": 3.0, "filter_groups": 2.0}


# --- alerts: the Prometheus rules only ---------------------------------------------------


def test_alerts_notify_once_from_prometheus_not_grafana():
    """One notification per condition: the alerts are the Prometheus rules, routed by the
    stack's Alertmanager; Grafana provisions no alert rule of its own (it had a copy of
    RLGenTailLatencyHigh, a second notification for the same condition) and shows
    Prometheus' alerts through its Alertmanager datasource."""
    provisioning = COLLECTOR / "grafana" / "provisioning"
    assert not (provisioning / "alerting").exists()
    assert all("alerting" not in path.parts for path in build.outputs())
    sources = yaml.safe_load((provisioning / "datasources" / "datasources.yaml").read_text())
    (alertmanager,) = [s for s in sources["datasources"] if s["type"] == "alertmanager"]
    assert alertmanager["url"] == "http://alertmanager:9093"
    config = yaml.safe_load((COLLECTOR / "prometheus.yml").read_text())
    (targets,) = [
        c["targets"] for a in config["alerting"]["alertmanagers"] for c in a["static_configs"]
    ]
    assert targets == ["alertmanager:9093"]


# --- live queries against a real Prometheus ----------------------------------------------


def check_live(prometheus: Prometheus, expressions: list[tuple[str, str]]) -> list[str]:
    """Query each; exempt ones (NOT_IN_THE_DEMO) must run and be empty, others answer."""
    checked = []
    for where, expression in expressions:
        promql = substitute(expression)
        result = prometheus.query(promql)  # fails on a query Prometheus rejects
        if where in NOT_IN_THE_DEMO:
            assert not result, (
                f"{where} now answers on the demo: drop it from NOT_IN_THE_DEMO ({promql})"
            )
        else:
            assert result, f"{where}: no data for {promql}"
            checked.append(promql)
    return checked


def test_demo_exemptions_name_existing_panels_and_rules():
    sources = {where for where, _ in sourced_expressions()}
    assert set(NOT_IN_THE_DEMO) <= sources


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
        config = yaml.safe_load((COLLECTOR / "prometheus.yml").read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config["rule_files"] = [str(COLLECTOR / "rules" / "*.rules.yml")]
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
        checked = check_live(prometheus, sourced_expressions())
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


@pytest.mark.slow
def test_engine_row_and_rules_answer_on_engines_found_by_file_discovery(tmp_path):
    """The shipped `rollout-engines` job finds engines through discovery files, keeps only
    targets with a `replica`, and the engine row's queries and rules answer per replica."""
    config = yaml.safe_load((COLLECTOR / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(COLLECTOR / "rules" / "*.rules.yml")]
    config.pop("alerting", None)
    config["scrape_configs"] = [
        job for job in config["scrape_configs"] if job["job_name"] == "rollout-engines"
    ]
    servers, stops = [], []
    prometheus = None
    try:
        discovery = tmp_path / "engines"  # `engines/*.json`, relative to the config file
        discovery.mkdir()
        targets = []
        for replica, engine in (("0", "vllm"), ("1", "sglang"), (None, "vllm")):
            server, stop, port = serve_engine(engine)
            servers.append(server)
            stops.append(stop)
            labels = {"run": "demo"} | ({"replica": replica} if replica else {})
            targets.append({"targets": [f"127.0.0.1:{port}"], "labels": labels})
        for index, target in enumerate(targets):
            (discovery / f"replica-{index}.json").write_text(json.dumps([target]))
        prometheus = Prometheus(tmp_path, [], config=config)
        prometheus.wait_for('count(up{job="rollout-engines"} == 1)', 2, timeout_s=30)
        assert {r["metric"]["replica"] for r in prometheus.query("up")} == {"0", "1"}
        time.sleep(3)  # rate() windows hold a few scrapes of changing values
        engine = [
            (where, expression)
            for where, expression in sourced_expressions()
            if NOT_IN_THE_DEMO.get(where) == ENGINES
        ]
        assert {where for where, _ in engine} == {
            where for where, reason in NOT_IN_THE_DEMO.items() if reason == ENGINES
        }
        for where, expression in engine:
            result = prometheus.query(substitute(expression))
            assert result, f"{where}: no data for {substitute(expression)}"
            assert {r["metric"].get("replica") for r in result} <= {"0", "1"}, where
    finally:
        for stop in stops:
            stop.set()
        for server in servers:
            server.shutdown()
        if prometheus is not None:
            prometheus.stop()


@pytest.mark.slow
def test_rank_panels_answer_on_real_verl_workers(tmp_path, monkeypatch):
    """The stragglers row on a live run: verl 0.9.1's real RayWorkerGroup (2 ranks, the
    rlotel plugin on, rank 1 eight times slower), the driver scraped by the shipped `rlotel`
    job and the workers by the shipped `rlotel-workers` job through the files they write.
    Each rank's own seconds and the driver's rank spread answer, labelled by worker."""
    import ray

    import rlotel
    from rlotel.integrations import verl as plugin
    from tests.test_verl_workers import SLOW_RANK, worker_group

    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    workers = tmp_path / "workers"  # `workers/rlotel-*.json`, relative to the config file
    plugin.install()
    ray.init(
        address="local",
        num_cpus=32,  # logical: verl's resource pool asks a bundle of CPUs per rank
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"RLOTEL_ENABLE": "1", "RLOTEL_PROMETHEUS_SD_DIR": str(workers)}},
    )
    tel = prometheus = None
    try:
        tel = rlotel.init(run="demo", prometheus_port=0)
        group = worker_group()
        for number in (1, 2, 3):
            with tel.step(number), tel.phase("update_actor"):
                group.update_policy(0.05)  # rank 1 sleeps 0.4 s, rank 0 0.05 s
        assert tel.flush(10)
        config = yaml.safe_load((COLLECTOR / "prometheus.yml").read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config["rule_files"] = [str(COLLECTOR / "rules" / "*.rules.yml")]
        config.pop("alerting", None)
        driver = urllib.parse.urlsplit(tel.metrics_url).netloc
        config["scrape_configs"] = [
            {**job, "static_configs": [{"targets": [driver]}]}
            if job["job_name"] == "rlotel"
            else job
            for job in config["scrape_configs"]
            if job["job_name"] in ("rlotel", "rlotel-workers")
        ]
        prometheus = Prometheus(tmp_path, [], config=config)
        prometheus.wait_for('count(up{job="rlotel-workers"} == 1)', 2, timeout_s=30)
        prometheus.wait_for('count(up{job="rlotel"} == 1)', 1, timeout_s=30)
        spread_s = parse_exposition(scrape(tel.metrics_url))  # what the driver serves
        assert any(name == "rlotel_phase_rank_spread_ratio" for name, _ in spread_s)
        prometheus.wait_for('count(rlotel_rank_phase_seconds{run="demo"})', 2, timeout_s=30)
        prometheus.wait_for('count(rlotel_phase_rank_spread_ratio{run="demo"})', 1)
        ranks = [
            (where, expression)
            for where, expression in sourced_expressions()
            if NOT_IN_THE_DEMO.get(where) == RANKS
        ]
        assert {where for where, _ in ranks} == {
            where for where, reason in NOT_IN_THE_DEMO.items() if reason == RANKS
        }
        answers = {}
        for where, expression in ranks:
            answers[where] = prometheus.query(substitute(expression))
            assert answers[where], f"{where}: no data for {substitute(expression)}"
        table = {
            (r["metric"]["worker"], r["metric"]["phase"]): float(r["value"][1])
            for r in answers["RL step breakdown / Phase seconds by rank (last step)"]
        }
        (role,) = {worker.split()[0] for worker, _ in table}
        fast, slow = (
            table[f"{role} {1 - SLOW_RANK}", "update_policy"],
            table[f"{role} {SLOW_RANK}", "update_policy"],
        )
        # each rank's own seconds: at least what it slept, the slow rank the slower (no upper
        # margin: a real run beside this test stretches every sleep)
        assert fast >= 0.05 and slow >= 0.4 and slow > fast, table
        (spread,) = answers["RL step breakdown / Rank spread by phase (slowest ÷ median)"]
        assert spread["metric"]["phase"] == "update_actor"
        ratio = float(spread["value"][1])
        # the panel's spread is the driver's: slowest ÷ median of the seconds until each
        # rank's reply, which a loaded machine stretches past a rank's own (CI once saw the
        # fast rank reply at two thirds of the slow one's time for an eighth of its work), so
        # it is checked against what the driver serves, not the ranks' own seconds; of two
        # ranks (the median their mean) it is < 2
        served = parse_exposition(scrape(tel.metrics_url))
        (reply_spread,) = (
            value for (name, _), value in served.items() if name == "rlotel_phase_rank_spread_ratio"
        )
        assert 1 < ratio < 2 and ratio == pytest.approx(reply_spread), (spread, table)
        series = prometheus.query('rlotel_rank_phase_seconds{run="demo"}')
        for found in series:  # bounded: the worker's identity and the method, nothing per call
            assert set(found["metric"]) == {
                *("__name__", "run", "phase", "role", "rank", "node", "job", "instance"),
            }, found["metric"]
        print(f"\nper-rank seconds: {table}; spread {float(spread['value'][1]):.2f}")
    finally:
        if prometheus is not None:
            prometheus.stop()
        ray.shutdown()
        plugin.uninstall()
        if tel is not None:
            tel.shutdown()


# --- every verl key, the hosts and the GPUs ------------------------------------------------


def grafana_regex(pattern: str, values: list[str]) -> list[str]:
    """A query variable's values through its regex as Grafana reduces them: `/re/`, the
    first capture group of each value that matches, each once."""
    compiled = re.compile(pattern.strip("/"))
    found = [m.group(1) for m in map(compiled.search, values) if m]
    return list(dict.fromkeys(found))


def grafana_escape(value: str) -> str:
    """`${var:regex}` of one value as Grafana's Prometheus datasource writes it into a
    PromQL string: regex metacharacters behind a backslash, itself escaped."""
    return re.sub(r"([\\$^*{}\[\]'+?.()|])", r"\\\\\1", value)


def keys_row_exprs(prefixes: str) -> dict[str, str]:
    """The every-key row's queries by panel title, with `prefix` set to a regex of values."""
    return {
        panel.title: substitute(panel.targets[0].expr.replace("${prefix:regex}", prefixes))
        for panel in row(KEYS_ROW).panels
    }


@pytest.mark.slow  # a real Prometheus
def test_every_key_row_shows_each_served_key_under_its_prefix(make_tel, prometheus_for):
    """verl 0.9.1's own metric dicts (a real main_ppo run) and a key a user logs without a
    slash: the `prefix` variable's values are the keys' first path parts, each copy of the
    repeated panel shows exactly its prefix's keys, and together with the table they show
    every key rlotel serves as rlotel_train_metric, with its value."""
    tel = make_tel(run="demo")
    prometheus = prometheus_for(tel.metrics_url)
    for line in VERL_LOG.read_text().splitlines():
        record = json.loads(line)
        tel.log({**record["data"], "loss": 0.25}, step=record["step"])
    assert tel.flush(10)
    served = {
        dict(labels)["key"]: value
        for (name, labels), value in parse_exposition(scrape(tel.metrics_url)).items()
        if name == cat.TRAIN_METRIC.name
    }
    prometheus.wait_for(f'count({cat.TRAIN_METRIC.name}{{run="demo"}})', len(served))
    step = json.loads(build.OUTPUTS[build.STEP_UID].read_text())
    (variable,) = [v for v in step["templating"]["list"] if v["name"] == "prefix"]
    selector = promql_names.LABEL_VALUES.fullmatch(variable["query"]).group("selector")
    keys = prometheus.api("label/key/values", **{"match[]": substitute(selector)})
    prefixes = grafana_regex(variable["regex"], keys)
    # verl's perf/ and timing_s/ keys here are rlotel families of their own (phases, MFU)
    assert {"actor", "critic", "response_length", "training", "val-core", "loss"} <= set(prefixes)
    assert sorted(prefixes) == sorted({key.split("/")[0] for key in served})
    shown: dict[str, float] = {}
    for prefix in prefixes:  # the repeated panel, one copy per value
        (expression,) = [
            e for title, e in keys_row_exprs(grafana_escape(prefix)).items() if "$" in title
        ]
        answer = {r["metric"]["key"]: float(r["value"][1]) for r in prometheus.query(expression)}
        assert answer and all(key.split("/")[0] == prefix for key in answer), (prefix, answer)
        assert not shown.keys() & answer.keys()
        shown |= answer
    assert shown == served
    every = "(" + "|".join(map(grafana_escape, prefixes)) + ")"  # `All`, as Grafana writes it
    table = keys_row_exprs(every)["Last value of every key"]
    assert {r["metric"]["key"]: float(r["value"][1]) for r in prometheus.query(table)} == served
    print(f"\n{len(served)} keys under {len(prefixes)} prefixes: {sorted(prefixes)}")


def test_gpu_row_reads_only_dcgm_exporters_default_counters():
    """The GPU row's names are dcgm-exporter's (etc/default-counters.csv enables each of
    them), per node and GPU; a misspelt one fails the dashboard check."""
    exprs = [target.expr for panel in row(GPUS_ROW).panels for target in panel.targets]
    queried = {name for expr in exprs for name in promql_names.selected_names(expr)}
    dcgm = {m.name for m in host.EXPORTER_METRICS if m.exporter == "dcgm-exporter"}
    assert queried == dcgm
    assert all("by (node, gpu)" in expr and 'node=~"$node"' in expr for expr in exprs)
    typo = exprs[0].replace("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTILIZATION")
    assert promql_names.unknown_names([typo], promql_names.known_names()) == [
        ("DCGM_FI_DEV_GPU_UTILIZATION", typo)
    ]


def start_node_exporter(port: int, log: Path) -> subprocess.Popen:
    """Debian's prometheus-node-exporter on loopback, once its /metrics answers (30 s)."""
    binary = shutil.which("prometheus-node-exporter")
    if binary is None:
        pytest.fail("prometheus-node-exporter is not installed: run `make system-deps`")
    with log.open("w") as out:
        process = subprocess.Popen(
            [binary, f"--web.listen-address=127.0.0.1:{port}"], stdout=out, stderr=out
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        try:
            scrape(f"http://127.0.0.1:{port}/metrics")
            return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    pytest.fail(f"node_exporter did not serve in 30 s: {log.read_text()[-500:]}")


@pytest.mark.slow  # a real Prometheus and a real node_exporter
def test_hosts_row_answers_on_a_real_node_exporter_joined_to_the_ranks_on_it(make_tel, tmp_path):
    """Two worker ranks on one node, found by the shipped `rlotel-workers` job through their
    discovery files; the shipped `node-exporter` job derives one target for the node from
    those files (on a free port here, 9100 shipped) and scrapes Debian's node_exporter. Each
    hosts-row query answers; the per-rank ones carry each rank's role and rank with its
    node's figure. The `dcgm-exporter` job finds the same one node (nothing serves there)."""
    port = free_port()
    exporter = start_node_exporter(port, tmp_path / "node_exporter.log")
    prometheus = None
    try:
        tel = make_tel(run="demo")
        tel.log({"actor/pg_loss": 0.5}, step=1)  # a worker's series carries its run
        assert tel.flush(10)
        workers = tmp_path / "workers"  # `workers/rlotel-*.json`, relative to the config file
        workers.mkdir()
        target = urllib.parse.urlsplit(tel.metrics_url).netloc
        for rank in ("0", "1"):  # as rlotel.integrations.ray.write_target writes them
            labels = {"role": "actor", "rank": rank, "node": "127.0.0.1"}
            (workers / f"rlotel-{rank}.json").write_text(
                json.dumps([{"targets": [target], "labels": labels}])
            )
        config = yaml.safe_load((COLLECTOR / "prometheus.yml").read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config.pop("alerting", None)
        config.pop("rule_files", None)
        jobs = ("rlotel-workers", "node-exporter", "dcgm-exporter")
        config["scrape_configs"] = [j for j in config["scrape_configs"] if j["job_name"] in jobs]
        (node_job,) = [j for j in config["scrape_configs"] if j["job_name"] == "node-exporter"]
        (address,) = [
            r for r in node_job["relabel_configs"] if r.get("target_label") == "__address__"
        ]
        assert address["replacement"] == "$1:9100"
        address["replacement"] = f"$1:{port}"
        prometheus = Prometheus(tmp_path, [], config=config)
        prometheus.wait_for('count(up{job="rlotel-workers"} == 1)', 2, timeout_s=30)
        prometheus.wait_for('count(up{job="node-exporter"} == 1)', 1, timeout_s=30)
        prometheus.wait_for('count(up{job="dcgm-exporter"})', 1, timeout_s=30)  # one node, no DCGM
        node_up = prometheus.query('up{job="node-exporter"}')
        assert set(node_up[0]["metric"]) == {"__name__", "job", "instance", "node"}, node_up
        step = json.loads(build.OUTPUTS[build.STEP_UID].read_text())
        (variable,) = [v for v in step["templating"]["list"] if v["name"] == "node"]
        selector = promql_names.LABEL_VALUES.fullmatch(variable["query"]).group("selector")
        assert prometheus.api("label/node/values", **{"match[]": substitute(selector)}) == [
            "127.0.0.1"
        ]
        hosts = [(w, e) for w, e in sourced_expressions() if NOT_IN_THE_DEMO.get(w) == HOSTS]
        assert len(hosts) == len(row(HOSTS_ROW).panels) + 1  # network: receive and transmit
        deadline = time.monotonic() + 30  # rate() answers once its window holds two scrapes
        while time.monotonic() < deadline and not all(
            prometheus.query(substitute(expression)) for _, expression in hosts
        ):
            time.sleep(0.5)
        for where, expression in hosts:
            answer = prometheus.query(substitute(expression))
            assert answer, f"{where}: no data for {substitute(expression)}"
            assert {r["metric"]["node"] for r in answer} == {"127.0.0.1"}, where
            values = [float(r["value"][1]) for r in answer]
            assert all(v >= 0 for v in values), (where, values)
            if "each rank's node" in where:  # joined: each rank, its node's one figure
                ranks = {(r["metric"]["role"], r["metric"]["rank"]) for r in answer}
                assert ranks == {("actor", "0"), ("actor", "1")} and len(set(values)) == 1
                if "swapping" not in where.lower():
                    assert 0 < values[0] <= 1, (where, values)  # a share (a busy CPU: 1)
        gpus = [(w, e) for w, e in sourced_expressions() if NOT_IN_THE_DEMO.get(w) == GPUS]
        for where, expression in gpus:  # run, and empty: nothing serves DCGM here
            assert not prometheus.query(substitute(expression)), where
    finally:
        if prometheus is not None:
            prometheus.stop()
        exporter.terminate()
        try:
            exporter.wait(10)
        except subprocess.TimeoutExpired:
            exporter.kill()
            exporter.wait(5)
