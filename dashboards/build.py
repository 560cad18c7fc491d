"""Grafana dashboards and the Grafana gen-tail alert, built from code.

    python dashboards/build.py           # (re)write dashboards/*.json and the alert provisioning
    python dashboards/build.py --check   # fail on drift or on a metric the catalogue lacks

Every PromQL expression is checked against `rlotel.catalogue` (and the recording rules in
`collector/rules/`), so a panel can never query a metric rlotel does not export.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import yaml
from grafana_foundation_sdk.builders import (
    alerting,
    expr,
    heatmap,
    prometheus,
    stat,
    table,
    timeseries,
)
from grafana_foundation_sdk.builders import tempo as tempo_query
from grafana_foundation_sdk.builders.common import StackingConfig
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DashboardLink,
    DatasourceVariable,
    QueryVariable,
    Row,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import StackingMode
from grafana_foundation_sdk.models.dashboard import (
    DashboardLinkType,
    DataSourceRef,
    VariableRefresh,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlotel import catalogue  # noqa: E402

PROMETHEUS = DataSourceRef(type_val="prometheus", uid="${datasource}")
TEMPO = DataSourceRef(type_val="tempo", uid="tempo")
SELECTOR = 'run=~"$run", job=~"$job", instance=~"$instance"'
STEP_UID, TAIL_UID = "rlotel-step-breakdown", "rlotel-rollout-tail"
RULES_DIR = ROOT / "collector" / "rules"
OUTPUTS = {
    STEP_UID: ROOT / "dashboards" / "rl-step-breakdown.json",
    TAIL_UID: ROOT / "dashboards" / "rl-rollout-tail.json",
}
ALERTS = ROOT / "collector" / "grafana" / "provisioning" / "alerting" / "rlotel-alerts.json"


def over(function: str, metric: str, selector: str) -> str:
    """`function(metric{selector}[$__rate_interval])`: rate or increase of a counter/bucket."""
    return f"{function}({metric}{{{selector}}}[$__rate_interval])"


def quantile(q: float, metric: str, selector: str) -> str:
    return f"histogram_quantile({q}, sum by (le) ({over('rate', metric, selector)}))"


def query(expression: str, legend: str = "", ref: str = "A") -> prometheus.Dataquery:
    return (
        prometheus.Dataquery()
        .expr(expression)
        .legend_format(legend or "__auto")
        .ref_id(ref)
        .datasource(PROMETHEUS)
    )


def series(title: str, unit: str, *queries: prometheus.Dataquery) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).unit(unit).datasource(PROMETHEUS)
    for target in queries:
        panel = panel.with_target(target)
    return panel


def single(title: str, unit: str, target: prometheus.Dataquery) -> stat.Panel:
    return stat.Panel().title(title).unit(unit).datasource(PROMETHEUS).with_target(target)


def trace_links() -> list[DashboardLink]:
    """Panel links to the trace UI (Tempo datasource uid `tempo`) and between dashboards."""
    return [
        DashboardLink("Traces of this run (Tempo)")
        .type(DashboardLinkType.LINK)
        .url(
            '/explore?left={"datasource":"tempo","queries":[{"queryType":"traceql",'
            '"query":"{ resource.rl.run = \\"${run}\\" }"}]}'
        )
        .target_blank(True),
    ]


def label_variable(name: str, query_text: str) -> QueryVariable:
    """A multi-select template variable over one label's values."""
    return (
        QueryVariable(name)
        .label(name)
        .datasource(PROMETHEUS)
        .query(query_text)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(True)
        .multi(True)
    )


def variables(dashboard: Dashboard) -> Dashboard:
    return (
        dashboard.with_variable(
            DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        )
        .with_variable(label_variable("run", "label_values(rlotel_steps_total, run)"))
        .with_variable(label_variable("job", 'label_values(rlotel_steps_total{run=~"$run"}, job)'))
        .with_variable(
            label_variable(
                "instance", 'label_values(rlotel_steps_total{run=~"$run", job=~"$job"}, instance)'
            )
        )
    )


def step_breakdown() -> Dashboard:
    s = SELECTOR
    dashboard = (
        Dashboard("RL step breakdown")
        .uid(STEP_UID)
        .tags(["rlotel", "rl"])
        .refresh("30s")
        .time("now-6h", "now")
        .link(DashboardLink("Rollout tail").type(DashboardLinkType.DASHBOARDS).tags(["rlotel"]))
    )
    dashboard = variables(dashboard)
    return (
        dashboard.with_row(Row("Where the step goes"))
        .with_panel(
            series(
                "Step time and phases (last step)",
                "s",
                query(f"rlotel_step_phase_seconds{{{s}}}", "{{phase}}"),
                query(f"rlotel_step_time_seconds{{{s}}}", "step", "B"),
            )
            .stacking(StackingConfig().mode(StackingMode.NORMAL))
            .links(trace_links())
        )
        .with_panel(
            series(
                "Phase share of step",
                "percentunit",
                query(
                    f"rlotel_step_phase_seconds{{{s}}} / ignoring(phase) group_left "
                    f"rlotel_step_time_seconds{{{s}}}",
                    "{{phase}}",
                ),
            )
        )
        .with_panel(
            series(
                "Unaccounted time (between windows)",
                "s",
                query(f"rlotel_step_unaccounted_seconds{{{s}}}", "{{run}}"),
            )
        )
        .with_panel(
            series(
                "Phase p90 over 30m (histogram)",
                "s",
                query(
                    "histogram_quantile(0.9, sum by (le, phase) "
                    f"(rate(rlotel_phase_duration_seconds_bucket{{{s}}}[30m])))",
                    "{{phase}}",
                ),
            )
        )
        .with_row(Row("Throughput and efficiency"))
        .with_panel(
            series(
                "Throughput (tokens/s/GPU)",
                "short",
                query(f"rlotel_throughput_tokens_per_second_per_gpu{{{s}}}", "{{run}}"),
            )
        )
        .with_panel(
            series("MFU by role", "percentunit", query(f"rlotel_mfu_ratio{{{s}}}", "{{role}}"))
        )
        .with_panel(
            series(
                "Time per token by phase",
                "s",
                query(f"rlotel_phase_time_per_token_seconds{{{s}}}", "{{phase}}"),
            )
        )
        .with_panel(
            series("Tokens per step", "short", query(f"rlotel_step_tokens{{{s}}}", "{{kind}}"))
        )
        .with_row(Row("Diagnosis"))
        .with_panel(
            single(
                "Bottleneck (last step)",
                "none",
                query(f"rlotel_step_bottleneck{{{s}}} == 1", "{{verdict}} {{detail}}"),
            )
        )
        .with_panel(
            single("Global step", "none", query(f"max by (run) (rlotel_step{{{s}}})", "{{run}}"))
        )
        .with_panel(
            single(
                "Seconds since last step",
                "s",
                query(
                    f"time() - max by (run) (rlotel_last_step_timestamp_seconds{{{s}}})", "{{run}}"
                ),
            )
        )
        .with_panel(
            series(
                "Telemetry drops",
                "short",
                query(  # `or vector(0)`: a healthy run shows 0, not "No data"
                    "sum by (signal, reason) "
                    f"({over('increase', 'rlotel_telemetry_dropped_total', s)}) or vector(0)",
                    "{{signal}}/{{reason}}",
                ),
            )
        )
        .with_row(Row("Profiler captures"))
        .with_panel(
            single(
                "Profile captures",
                "none",
                query(f"sum by (tool) (rlotel_profile_captures_total{{{s}}})", "{{tool}}"),
            )
        )
        .with_panel(
            table.Panel()
            .title("profile.capture spans (Tempo)")
            .datasource(TEMPO)
            .with_target(
                tempo_query.TempoQuery()
                .ref_id("A")
                .query_type("traceql")
                .query('{ name = "profile.capture" && resource.rl.run =~ "$run" }')
                .limit(20)
                .datasource(TEMPO)
            )
        )
    )


def rollout_tail() -> Dashboard:
    s = SELECTOR
    gen = f'stage="generate_sequences", {s}'
    duration = "rlotel_agent_loop_duration_seconds_bucket"
    quantiles = [
        query(quantile(q, duration, gen), f"p{int(q * 100)}", ref).exemplar(True)
        for q, ref in ((0.5, "A"), (0.9, "B"), (0.99, "C"))
    ]
    dashboard = (
        Dashboard("RL rollout tail")
        .uid(TAIL_UID)
        .tags(["rlotel", "rl"])
        .refresh("30s")
        .time("now-6h", "now")
        .link(DashboardLink("Step breakdown").type(DashboardLinkType.DASHBOARDS).tags(["rlotel"]))
    )
    dashboard = variables(dashboard)
    return (
        dashboard.with_row(Row("Generation latency per sample"))
        .with_panel(
            series("generate_sequences p50 / p90 / p99 (exemplars → traces)", "s", *quantiles)
            .with_target(
                query(f"max by (run) (rlotel_agent_loop_slowest_seconds{{{gen}}})", "slowest", "D")
            )
            .links(trace_links())
        )
        .with_panel(
            heatmap.Panel()
            .title("Per-sample generation time")
            .datasource(PROMETHEUS)
            .with_target(
                query(f"sum by (le) ({over('increase', duration, gen)})", "{{le}}").format(
                    PromQueryFormat.HEATMAP
                )
            )
        )
        .with_row(Row("Tools and scoring"))
        .with_panel(
            series(
                "tool_calls and compute_score p99",
                "s",
                *(
                    query(quantile(0.99, duration, f'stage="{stage}", {s}'), stage, ref).exemplar(
                        True
                    )
                    for stage, ref in (("tool_calls", "A"), ("compute_score", "B"))
                ),
            )
        )
        .with_panel(
            series(
                "Slowest sample's lengths",
                "short",
                query(f"rlotel_agent_loop_slowest_length_tokens{{{s}}}", "{{kind}}"),
            )
        )
        .with_panel(
            series(
                "Response length p50 / p99",
                "short",
                *(
                    query(
                        quantile(
                            q, "rlotel_agent_loop_length_tokens_bucket", f'kind="response", {s}'
                        ),
                        f"p{int(q * 100)}",
                        ref,
                    )
                    for q, ref in ((0.5, "A"), (0.99, "B"))
                ),
            )
        )
        .with_panel(
            series(
                "Preemptions",
                "short",
                query(
                    f"sum by (run) ({over('increase', 'rlotel_agent_loop_preemptions_total', s)})",
                    "{{run}}",
                ),
            )
        )
    )


def gen_tail_alert() -> alerting.RuleGroup:
    """The gen-tail alert as Grafana alerting provisioning (same rule as Prometheus')."""
    p99 = (
        prometheus.Dataquery()
        .expr(
            "histogram_quantile(0.99, sum by (run, le) "
            '(rate(rlotel_agent_loop_duration_seconds_bucket{stage="generate_sequences"}[5m])))'
        )
        .ref_id("A")
        .range()
    )
    return (
        alerting.RuleGroup("rlotel")
        .folder_uid("rlotel")
        .interval("1m")
        .with_rule(
            alerting.Rule("RLGenTailLatencyHigh")
            .uid("rlotel-gen-tail-latency-high")
            .condition("C")
            .for_val("10m")
            .labels({"severity": "warning"})
            .annotations(
                {
                    "summary": "Generation p99 latency above 120 s for {{ $labels.run }}",
                    "description": "The slowest 1% of rollout samples take longer than the "
                    "threshold; open the Rollout tail dashboard and follow an exemplar.",
                }
            )
            .with_query(
                alerting.Query("A")
                .datasource_uid("prometheus")
                .relative_time_range(alerting_range(600))
                .model(p99)
            )
            .with_query(
                alerting.Query("B")
                .datasource_uid("__expr__")
                .model(expr.TypeReduce().ref_id("B").expression("A").reducer("last"))
            )
            .with_query(
                alerting.Query("C")
                .datasource_uid("__expr__")
                .model(expr.TypeMath().ref_id("C").expression("$B > 120"))
            )
            .no_data_state("OK")
            .exec_err_state("Error")
        )
    )


def file_provisioning(group: dict) -> dict:
    """The SDK builds the alerting API's shape (`title`, `folderUid`); Grafana's provisioning
    files read groups by `name` and `folder` (a folder title: the dashboards' "RL")."""
    rules = [
        {k: v for k, v in rule.items() if k not in ("folderUID", "ruleGroup", "orgID")}
        for rule in group["rules"]
    ]
    return {
        "orgId": 1,
        "name": group["title"],
        "folder": "RL",
        "interval": group["interval"],
        "rules": rules,
    }


def alerting_range(seconds: int):
    from grafana_foundation_sdk.models.alerting import RelativeTimeRange

    return RelativeTimeRange(from_val=seconds, to=0)


def render(builder) -> str:
    return (
        json.dumps(
            json.loads(JSONEncoder(sort_keys=True).encode(builder.build())),
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )


def outputs() -> dict[Path, str]:
    return {
        OUTPUTS[STEP_UID]: render(step_breakdown()),
        OUTPUTS[TAIL_UID]: render(rollout_tail()),
        ALERTS: json.dumps(
            {"apiVersion": 1, "groups": [file_provisioning(json.loads(render(gen_tail_alert())))]},
            indent=2,
            sort_keys=True,
        )
        + "\n",
    }


# --- checks ------------------------------------------------------------------------------

METRIC = re.compile(r"\b(rlotel[a-z_:]*[a-z_])\b")


def expressions(node) -> Iterator[str]:
    """Every PromQL expression in a dashboard or alert JSON (keys `expr`, variable queries)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if (key == "expr" and isinstance(value, str)) or (
                key == "query" and isinstance(value, str) and value.startswith("label_values(")
            ):
                yield value
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


def recording_rules(rules_dir: Path = RULES_DIR) -> set[str]:
    names: set[str] = set()
    for path in sorted(rules_dir.glob("*.rules.yml")):
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []):
            names.update(rule["record"] for rule in group.get("rules", []) if "record" in rule)
    return names


def unknown_metrics(exprs: Iterable[str], known: set[str]) -> list[tuple[str, str]]:
    """(metric, expression) pairs naming something neither exported nor recorded."""
    return [
        (name, expression)
        for expression in exprs
        for name in METRIC.findall(expression)
        if name not in known and not name.startswith("rlotel.")
    ]


def known_metrics() -> set[str]:
    return catalogue.series_names() | recording_rules()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify instead of writing")
    args = parser.parse_args()
    problems: list[str] = []
    for path, text in outputs().items():
        bad = unknown_metrics(expressions(json.loads(text)), known_metrics())
        problems += [f"{path.name}: unknown metric {name!r} in {expr_!r}" for name, expr_ in bad]
        if args.check:
            if not path.exists() or path.read_text() != text:
                problems.append(
                    f"{path.relative_to(ROOT)} differs from the code: run dashboards/build.py"
                )
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
