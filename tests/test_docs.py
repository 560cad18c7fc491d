"""The README is a front page and the rest lives in docs/: every relative link resolves,
every docs page is reachable from the README, and the front page stays short and opens with
what rlotel is and a table; docs/production.md opens with the tables of every alert and every
scrape job, generated from the shipped configs."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_resolves_to_a_file_and_heading() -> None:
    broken = []
    for page in _pages():
        for target, anchor in LINK.findall(page.read_text()):
            if "://" in target:
                continue
            path = (page.parent / target).resolve()
            if not path.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and anchor[1:] not in _anchors(path):
                broken.append(f"{page.name}: {target}{anchor}")
    assert not broken, broken


def test_every_docs_page_is_linked_from_the_readme_and_the_readme_is_short() -> None:
    readme = (ROOT / "README.md").read_text()
    linked = {Path(target).name for target, _ in LINK.findall(readme)}
    pages = {page.name for page in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, sorted(pages - linked)
    assert len(readme.splitlines()) <= 160


def _docs_build():
    spec = importlib.util.spec_from_file_location("docs_build", ROOT / "docs" / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _blocks(text: str) -> list[list[str]]:
    """The page's blocks (runs of non-blank lines), without comments and headings."""
    lines = [line for line in text.splitlines() if not line.startswith(("<!--", "#"))]
    blocks, block = [], []
    for line in [*lines, ""]:
        if line.strip():
            block.append(line)
        elif block:
            blocks.append(block)
            block = []
    return blocks


def _is_table(block: list[str]) -> bool:
    return len(block) >= 3 and all(line.startswith("|") for line in block)


def test_the_readme_opens_with_two_lines_and_a_table_of_what_goes_where() -> None:
    first, second = _blocks((ROOT / "README.md").read_text())[:2]
    assert len(first) == 2 and not any(line.startswith("|") for line in first), first
    assert _is_table(second), second
    assert second[0].lower().startswith("| what you get | where it goes |")


def test_production_opens_with_the_alerts_and_scrape_jobs_of_the_shipped_configs() -> None:
    """docs/production.md's first two tables are every alert (condition, threshold, for,
    severity, runbook) and every scrape job (target, discovery, labels), as docs/build.py
    writes them from the rules, the Prometheus config and the runbooks: committed as built."""
    build = _docs_build()
    page = (ROOT / "docs" / "production.md").read_text()
    assert page == build.production_page(page), "docs/production.md drifted: python docs/build.py"
    tables = [block for block in _blocks(page) if _is_table(block)]
    alerts, jobs = tables[:2]
    assert alerts[0] == "| alert | fires when | threshold | for | severity | runbook |"
    assert jobs[0].startswith("| job | target | discovery | labels")
    rules = yaml.safe_load(build.RULES.read_text())
    names = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert [row.split("|")[1].strip(" `") for row in alerts[2:]] == names
    config = yaml.safe_load(build.PROMETHEUS.read_text())
    assert [row.split("|")[1].strip(" `") for row in jobs[2:]] == [
        job["job_name"] for job in config["scrape_configs"]
    ]
    stall = next(row for row in alerts if row.startswith("| `RLTrainingStalled` |"))
    runbook = "[RLTrainingStalled](runbooks.md#rltrainingstalled)"
    assert f"| > 900 s | 5m | critical | {runbook} |" in stall


def test_the_alert_table_follows_the_rules() -> None:
    """A threshold, `for` or severity changed in the rules changes the table; an alert with
    no runbook section, or a scrape job the table cannot describe, fails the build."""
    build = _docs_build()
    rules = yaml.safe_load(build.RULES.read_text())
    runbooks = build.RUNBOOKS.read_text()
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("record") == "rlotel:alert_stall_threshold:seconds":
                rule["expr"] = "vector(1800)"
            if rule.get("alert") == "RLTrainingStalled":
                rule["for"], rule["labels"]["severity"] = "20m", "warning"
    table = build.alerts_table(rules, runbooks)
    assert "| > 1800 s | 20m | warning |" in table
    with pytest.raises(ValueError, match="RLTrainingStalled"):
        build.alerts_table(rules, runbooks.replace("## RLTrainingStalled", "## Renamed"))
    config = yaml.safe_load(build.PROMETHEUS.read_text())
    config["scrape_configs"].append({"job_name": "mine", "static_configs": [{"targets": ["a:1"]}]})
    with pytest.raises(ValueError, match="mine"):
        build.scrape_jobs_table(config)
