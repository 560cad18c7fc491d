"""The Prometheus alert rules: promtool accepts and unit-tests them; they name only real series."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlotel import catalogue

RULES_DIR = Path(__file__).resolve().parents[1] / "collector" / "rules"
RULES = RULES_DIR / "rlotel.rules.yml"
RULE_TESTS = RULES_DIR / "rlotel.rules.test.yml"

ALERTS = (
    "RLGenTailLatencyHigh",
    "RLGenTailSpread",
    "RLThroughputDrop",
    "RLTrainingStalled",
    "RLWeightSyncSlow",
)

# Exported series (rlotel_foo_total) and recorded ones (rlotel:foo:p99), not inside other names.
SERIES_NAME = re.compile(r"(?<![\w:])rlotel_\w*")
RECORDED_NAME = re.compile(r"(?<![\w:])rlotel:[\w:]*")

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


def rule_text(rule: Rule) -> str:
    """The expression and the annotations, the places a rule names series."""
    return "\n".join([str(rule["expr"]), *map(str, rule.get("annotations", {}).values())])


def unknown_names(rules: dict[str, Any]) -> list[str]:
    """Names used by the rules that rlotel does not export and no rule records."""
    exported = catalogue.series_names()
    recorded = {rule["record"] for rule in all_rules(rules) if "record" in rule}
    problems = []
    for rule in all_rules(rules):
        where = rule.get("record") or rule.get("alert")
        text = rule_text(rule)
        problems += [f"{where}: {n}" for n in SERIES_NAME.findall(text) if n not in exported]
        problems += [f"{where}: {n}" for n in RECORDED_NAME.findall(text) if n not in recorded]
    return problems


def check_output(result: subprocess.CompletedProcess[str]) -> str:
    return f"rc={result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", RULES.name)
    assert result.returncode == 0, check_output(result)


def test_promtool_unit_tests_pass() -> None:
    result = promtool("test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, check_output(result)


def test_rules_name_only_catalogue_series_and_recorded_rules() -> None:
    rules = load_rules()
    assert unknown_names(rules) == []
    text = "\n".join(rule_text(rule) for rule in all_rules(rules))
    assert SERIES_NAME.search(text) and RECORDED_NAME.search(text)  # the regexes do match


@pytest.mark.parametrize(
    ("expr", "unknown"),
    [
        ("rate(rlotel_does_not_exist[5m]) > 1", "rlotel_does_not_exist"),
        ("rlotel:does_not_exist:p99 > 1", "rlotel:does_not_exist:p99"),
        ("rlotel_step_phase_seconds / rlotel_step_time_secs", "rlotel_step_time_secs"),
    ],
)
def test_checker_rejects_unknown_names(expr: str, unknown: str) -> None:
    broken = load_rules()  # a fresh copy: editing it leaves the file alone
    alert = next(rule for rule in all_rules(broken) if rule.get("alert") == "RLWeightSyncSlow")
    alert["expr"] = expr
    assert unknown_names(broken) == [f"RLWeightSyncSlow: {unknown}"]


def test_every_alert_has_for_severity_and_annotations() -> None:
    alerts = {rule["alert"]: rule for rule in all_rules(load_rules()) if "alert" in rule}
    assert set(alerts) == set(ALERTS)
    for name, rule in alerts.items():
        assert rule.get("for"), name
        assert rule.get("labels", {}).get("severity") in {"warning", "critical"}, name
        annotations = rule.get("annotations", {})
        assert annotations.get("summary") and annotations.get("description"), name
        assert "$labels.run" in annotations["summary"], name


def test_thresholds_are_defined_once_and_used() -> None:
    rules = load_rules()
    groups = {group["name"]: group["rules"] for group in rules["groups"]}
    thresholds = {rule["record"] for rule in groups["rlotel-thresholds"]}
    assert len(thresholds) == 5 and all(":alert_" in name for name in thresholds)
    used = {
        name for rule in groups["rlotel-alerts"] for name in RECORDED_NAME.findall(rule["expr"])
    }
    assert thresholds <= used
    for rule in groups["rlotel-alerts"]:  # numbers live in the thresholds group only
        assert not re.search(r"[<>]=?\s*[\d.]+", rule["expr"]), rule["alert"]
