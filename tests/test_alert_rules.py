"""The Prometheus alert rules: promtool accepts and unit-tests them; they name only real series."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards import promql_names

ROOT = promql_names.STACK
RULES_DIR = promql_names.RULES_DIR
RULES = RULES_DIR / "rlotel.rules.yml"
RULE_TESTS = RULES_DIR / "rlotel.rules.test.yml"

ALERTS = (
    "RLTrainerDown",
    "RLTrainerAbsent",
    "RLGenTailLatencyHigh",
    "RLGenTailSpread",
    "RLThroughputDrop",
    "RLTrainingStalled",
    "RLWeightSyncSlow",
    "RLStragglerRank",
    "RLSlowRank",
    "RLTrainerStarved",
    "RLRolloutIdle",
    "RLStalenessHigh",
    "RLEnginePreemptions",
    "RLEngineKVCacheSaturated",
    "RLEngineQueueTimeHigh",
    "RLPhaseStalled",
    "RLAsyncBias",
    "RLMetricSeriesCapped",
)
# Judged in-process (no progress for stall_after_s): the rule reads the flag.
JUDGED_IN_PROCESS = {"RLPhaseStalled"}
# Read the scrape, not a run's series (`up`, `absent()`): no threshold, and no `run` label.
SCRAPE_ALERTS = {"RLTrainerDown", "RLTrainerAbsent"}
# Where each alert's runbook is: a section of this page, relative to the stack's root (the
# repository, or the DIR `rlotel stack DIR` writes, which carries the page).
RUNBOOKS = ROOT / "docs" / "runbooks.md"

Rule = dict[str, Any]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool is not installed: run `make test`"
    return subprocess.run(
        [binary, *args], cwd=RULES_DIR, capture_output=True, text=True, timeout=120
    )


def load_rules(path: Path = RULES) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def all_rules(rules: dict[str, Any]) -> list[Rule]:
    return [rule for group in rules["groups"] for rule in group["rules"]]


def unknown_names(rules: dict[str, Any]) -> list[str]:
    """Names the rules' expressions select, or their annotations mention, that neither rlotel
    nor a rollout engine exports and no rule records (the checker `dashboards/build.py` uses)."""
    known = promql_names.exported_names() | promql_names.SCRAPE_NAMES
    known |= promql_names.recorded_in(rules)
    problems = []
    for rule in all_rules(rules):
        where = rule.get("record") or rule.get("alert")
        names = promql_names.selected_names(rule["expr"])
        for text in rule.get("annotations", {}).values():
            names += promql_names.mentioned_names(text)
        problems += [f"{where}: {name}" for name in names if name not in known]
    return problems


def check_output(result: subprocess.CompletedProcess[str]) -> str:
    return f"rc={result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


@pytest.mark.slow
def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", RULES.name)
    assert result.returncode == 0, check_output(result)


@pytest.mark.slow
def test_promtool_unit_tests_pass() -> None:
    result = promtool("test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, check_output(result)


def test_rules_name_only_catalogue_engine_and_recorded_series() -> None:
    rules = load_rules()
    assert unknown_names(rules) == []
    selected = {
        name for rule in all_rules(rules) for name in promql_names.selected_names(rule["expr"])
    }
    assert {"rlotel_step_phase_seconds", "vllm:num_preemptions_total"} <= selected
    assert "rlotel:alert_stall_threshold:seconds" in selected  # the checker does see names


@pytest.mark.parametrize(
    ("expr", "unknown"),
    [
        ("rate(rlotel_does_not_exist[5m]) > 1", "rlotel_does_not_exist"),
        ("rlotel:does_not_exist:p99 > 1", "rlotel:does_not_exist:p99"),
        ("rlotel_step_phase_seconds / rlotel_step_time_secs", "rlotel_step_time_secs"),
        ("rate(vllm:num_preemption_total[5m])", "vllm:num_preemption_total"),  # engine typo
        ('max by (replica) (sglang:token_usage_perc{run="a"})', "sglang:token_usage_perc"),
        ('{__name__="rlotel_step_tim_seconds"} offset 5m', "rlotel_step_tim_seconds"),
    ],
)
def test_checker_rejects_unknown_names(expr: str, unknown: str) -> None:
    broken = load_rules()  # a fresh copy: editing it leaves the file alone
    alert = next(rule for rule in all_rules(broken) if rule.get("alert") == "RLWeightSyncSlow")
    alert["expr"] = expr
    assert unknown_names(broken) == [f"RLWeightSyncSlow: {unknown}"]


def test_checker_reads_names_in_annotations() -> None:
    broken = load_rules()
    alert = next(rule for rule in all_rules(broken) if rule.get("alert") == "RLWeightSyncSlow")
    alert["annotations"]["description"] += " See vllm:kv_cache_usage_percent."
    assert unknown_names(broken) == ["RLWeightSyncSlow: vllm:kv_cache_usage_percent"]


def test_every_alert_has_for_severity_and_annotations() -> None:
    alerts = {rule["alert"]: rule for rule in all_rules(load_rules()) if "alert" in rule}
    assert set(alerts) == set(ALERTS)
    for name, rule in alerts.items():
        assert rule.get("for"), name
        assert rule.get("labels", {}).get("severity") in {"warning", "critical"}, name
        annotations = rule.get("annotations", {})
        assert annotations.get("summary") and annotations.get("description"), name
        if name == "RLTrainerDown":  # one per target: `up` has no `run`
            assert "$labels.instance" in annotations["summary"], name
        elif name not in SCRAPE_ALERTS:
            assert "$labels.run" in annotations["summary"], name


def test_thresholds_are_defined_once_and_used() -> None:
    """One threshold recording rule per alert, each used, and no number in an alert."""
    rules = load_rules()
    groups = {group["name"]: group["rules"] for group in rules["groups"]}
    thresholds = {rule["record"] for rule in groups["rlotel-thresholds"]}
    assert len(thresholds) == len(set(ALERTS) - JUDGED_IN_PROCESS - SCRAPE_ALERTS)
    assert all(":alert_" in name for name in thresholds)
    used = [
        name
        for rule in groups["rlotel-alerts"]
        for name in promql_names.selected_names(rule["expr"])
        if name in thresholds
    ]
    assert sorted(used) == sorted(thresholds)  # each threshold used by exactly one alert
    for rule in groups["rlotel-alerts"]:  # numbers live in the thresholds group only
        assert not re.search(r"[<>]=?\s*[\d.]+", rule["expr"]), rule["alert"]


def _sections(page: Path) -> dict[str, str]:
    """Each `## ` section of a page by its GitHub anchor: its text up to the next heading."""
    sections: dict[str, str] = {}
    for chunk in re.split(r"^## ", page.read_text(), flags=re.MULTILINE)[1:]:
        heading, _, body = chunk.partition("\n")
        sections[re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")] = body
    return sections


def test_every_alert_links_its_runbook_section_which_says_what_to_look_at_first() -> None:
    """`runbook_url` on every alert: `docs/runbooks.md#<alert>`, a section of the page that
    says when the alert fires and what to look at first, and the page has no section for an
    alert that does not exist."""
    alerts = [rule for rule in all_rules(load_rules()) if "alert" in rule]
    sections = _sections(RUNBOOKS)
    for rule in alerts:
        url = rule["annotations"].get("runbook_url")
        assert url == f"docs/runbooks.md#{rule['alert'].lower()}", (rule["alert"], url)
        body = sections.get(url.partition("#")[2])
        assert body is not None, f"{rule['alert']}: no section {url} in {RUNBOOKS.name}"
        assert "**Fires when**" in body and "**Look first**" in body, rule["alert"]
    assert set(sections) == {rule["alert"].lower() for rule in alerts}


def test_the_scrape_alerts_watch_every_job_that_scrapes_rlotel_and_no_other() -> None:
    """RLTrainerDown reads `up` of the jobs named `rlotel` or `rlotel-*`: the trainer, the
    compose demo and the workers in collector/prometheus.yml, not the engines, the Collector
    or Prometheus itself."""
    alerts = {rule["alert"]: rule for rule in all_rules(load_rules()) if "alert" in rule}
    (matcher,) = re.findall(r'up\{job=~"([^"]+)"\}', alerts["RLTrainerDown"]["expr"])
    assert re.findall(r'up\{job=~"([^"]+)"\}', alerts["RLTrainerAbsent"]["expr"]) == [matcher]
    config = yaml.safe_load((RULES_DIR.parent / "prometheus.yml").read_text())
    watched = {
        job["job_name"]
        for job in config["scrape_configs"]
        if re.fullmatch(matcher, job["job_name"])
    }
    assert watched == {"rlotel", "rlotel-demo", "rlotel-workers"}


def test_the_runbooks_name_only_series_that_exist() -> None:
    """A runbook that says "look at rlotel_x" sends its reader to a real series."""
    known = promql_names.known_names()
    mentioned = promql_names.mentioned_names(RUNBOOKS.read_text())
    assert "rlotel_last_step_timestamp_seconds" in mentioned
    assert [name for name in mentioned if name not in known] == []
