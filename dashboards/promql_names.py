"""The one check of the series names that dashboards and rules query.

An expression is parsed into PromQL's syntax tree (promql-parser, the Rust parser that
follows Prometheus' grammar), so a name is found only where PromQL selects a series — not
inside a label value, a function name or a `by (...)` list — and an expression that does
not parse is an error too. A name is known when rlotel exports it (`rlotel.schema.catalogue`), a
rollout engine serves it (`rlotel.schema.engine_metrics`), node_exporter or dcgm-exporter
serves it (`rlotel.schema.host_metrics`), TransferQueue serves it
(`rlotel.schema.transfer_queue_metrics`), a recording rule records it or Prometheus writes
it for every scrape (`up`).

`dashboards/build.py --check` and `tests/test_alert_rules.py` both use this module.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import promql_parser
import yaml

from rlotel.schema import catalogue, engine_metrics, host_metrics, transfer_queue_metrics

# The shipped stack's one source (`rlotel stack DIR`, docker-compose.yml): the repository's
# top-level collector/ (rules, configs) and dashboards/ (the generated JSON).
STACK = Path(__file__).resolve().parents[1]
RULES_DIR = STACK / "collector" / "rules"

# Grafana's interval macros stand where PromQL wants a duration; any duration parses alike.
GRAFANA_MACRO = re.compile(r"\$__\w+|\$\{__\w+\}")
# Grafana's template-variable query `label_values(label)` / `label_values(selector, label)`.
LABEL_VALUES = re.compile(r"\s*label_values\((?:(?P<selector>.*),)?\s*(?P<label>\w+)\s*\)\s*", re.S)
# Names mentioned in prose (alert annotations): PromQL names with one of the known prefixes.
MENTIONED_NAME = re.compile(r"(?<![\w:.])(?:rlotel|vllm|sglang)[_:][\w:]*\w")


class PromQLError(ValueError):
    """An expression that is not valid PromQL."""


def parse(expression: str) -> promql_parser.Expr:
    """The syntax tree of a PromQL expression; Grafana's `$__rate_interval` etc. read as 5m."""
    try:
        return promql_parser.parse(GRAFANA_MACRO.sub("5m", expression))
    except ValueError as error:
        raise PromQLError(f"{expression!r} does not parse: {error}") from None


def selected_names(expression: str) -> list[str]:
    """Names of the series the expression's selectors read, in order of appearance
    (`name{...}` and `{__name__="name"}`). Grafana's `label_values(...)` is unwrapped."""
    variable_query = LABEL_VALUES.fullmatch(expression)
    if variable_query:
        selector = variable_query.group("selector")
        return selected_names(selector) if selector else []
    names: list[str] = []

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.append(node.name)
            names.extend(
                matcher.value
                for matcher in node.matchers.matchers
                if matcher.name == "__name__" and matcher.op == promql_parser.MatchOp.Equal
            )

    promql_parser.walk(parse(expression), visit)
    return names


def mentioned_names(text: str) -> list[str]:
    """Series names mentioned in prose such as an alert's description."""
    return MENTIONED_NAME.findall(text)


def recorded_names(rules_dir: Path = RULES_DIR) -> set[str]:
    """Names recorded by the recording rules in `rules_dir/*.rules.yml`."""
    names: set[str] = set()
    for path in sorted(rules_dir.glob("*.rules.yml")):
        names |= recorded_in(yaml.safe_load(path.read_text()) or {})
    return names


def recorded_in(rules: dict) -> set[str]:
    """Names recorded by one parsed rule file."""
    return {
        rule["record"]
        for group in rules.get("groups", [])
        for rule in group.get("rules", [])
        if "record" in rule
    }


def exported_names() -> set[str]:
    """Series served by rlotel, a rollout engine or a node's exporters."""
    return (
        catalogue.series_names()
        | engine_metrics.series_names()
        | host_metrics.series_names()
        | transfer_queue_metrics.series_names()
    )


# Series Prometheus writes itself for every target it scrapes (RLTrainerDown reads `up`).
SCRAPE_NAMES = frozenset(
    {
        "up",
        "scrape_duration_seconds",
        "scrape_samples_scraped",
        "scrape_samples_post_metric_relabeling",
        "scrape_series_added",
    }
)


def known_names(rules_dir: Path = RULES_DIR) -> set[str]:
    """Every name a dashboard or rule may query."""
    return exported_names() | SCRAPE_NAMES | recorded_names(rules_dir)


def unknown_names(expressions: Iterable[str], known: set[str]) -> list[tuple[str, str]]:
    """(name, expression) for each selected name that is not known, in order; raises
    `PromQLError` for an expression that does not parse."""
    return [
        (name, expression)
        for expression in expressions
        for name in selected_names(expression)
        if name not in known
    ]
