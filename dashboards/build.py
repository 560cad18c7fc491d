"""Grafana dashboards, built from data.

    python dashboards/build.py           # (re)write the dashboards
    python dashboards/build.py --check   # fail on drift or on a metric nothing exports

Panels are data: each `Panel` lists `Target`s, and each target names the catalogue entries
(`rlotel.schema.catalogue`), rollout-engine metrics (`rlotel.schema.engine_metrics`) or
node_exporter and dcgm-exporter metrics (`rlotel.schema.host_metrics`) it queries; units
come from those entries. The check parses every PromQL expression
(`promql_names`) and fails when a target queries a series other than the ones it names,
or a name that neither rlotel, an engine nor a recording rule in the shipped stack's
`collector/rules/` provides. The outputs are written beside this file: the one copy
docker-compose.yml mounts and the wheel carries (`rlotel stack DIR`). Alerts are not built
here: they are the Prometheus rules alone (`collector/rules/`, routed by Alertmanager), and
Grafana shows them through its datasources without a copy of its own, so one condition
notifies once.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from grafana_foundation_sdk.builders import (
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
    DataTransformerConfig,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dashboards import promql_names  # noqa: E402
from rlotel.schema import catalogue as cat  # noqa: E402
from rlotel.schema import engine_metrics as eng  # noqa: E402
from rlotel.schema import host_metrics as host  # noqa: E402
from rlotel.schema import transfer_queue_metrics as tq  # noqa: E402


@dataclass(frozen=True)
class Recorded:
    """A series a recording rule in `collector/rules/` records, per run (no job, instance):
    the dashboard check finds its name among the rules' (`promql_names.recorded_names`)."""

    name: str
    unit: str = ""

    @property
    def sample_names(self) -> tuple[str, ...]:
        return (self.name,)


Metric = cat.MetricSpec | eng.EngineMetric | host.ExporterMetric | tq.QueueMetric | Recorded
# Mean reward of each source's trained samples over 5 minutes (sums over counts).
SOURCE_REWARD_MEAN = Recorded("rlotel:source_reward:mean5m")

PROMETHEUS = DataSourceRef(type_val="prometheus", uid="${datasource}")
TEMPO = DataSourceRef(type_val="tempo", uid="tempo")
# rlotel's own series (driver or worker); the dashboards' `run`, `job`, `instance` variables.
SELECTOR = 'run=~"$run", job=~"$job", instance=~"$instance"'
# Engines are scraped by job `rollout-engines`, whose discovery files give `run` and `replica`.
ENGINE_SELECTOR = 'run=~"$run", replica=~"$replica"'
# Per-rank series: a worker labels them with its `role` and `rank` (the worker discovery
# gives its targets the same labels, so either spelling of the scrape ends with both).
RANK_SELECTOR = 'run=~"$run", rank!=""'
# A node's exporters (jobs `node-exporter`, `dcgm-exporter`) carry the workers' `node` label.
NODE_SELECTOR = 'node=~"$node"'
# Recording rules aggregate per run (and their own labels): only `run` selects them.
RECORDED_SELECTOR = 'run=~"$run"'
# TransferQueue's controller is scraped by job `transfer-queue`; its discovery file gives `run`.
QUEUE_SELECTOR = 'run=~"$run", job="transfer-queue"'
# role and rank of every worker of the run on each node, from its own series (its target
# labels): what a node's figures are joined to, `* on (node) group_left ()`.
RANKS_ON_NODES = (
    'group by (node, role, rank) ({__name__=~"rlotel_.+", run=~"$run", node=~"$node", rank!=""})'
)
# `rlotel_train_metric{key}`'s keys grouped by their first path part, as verl names its
# families (`actor/pg_loss` → `actor`, `val-core/…` → `val-core`): the `prefix` variable's
# values (Grafana keeps a regex's first group, once per value) and the keys of one.
KEY_PREFIX_REGEX = "/^([^/]+)/"
KEYS_OF_PREFIX = 'key=~"${prefix:regex}(/.*)?"'
STEP_UID, TAIL_UID = "rlotel-step-breakdown", "rlotel-rollout-tail"
STACK = promql_names.STACK  # the repository: collector/ and dashboards/
RULES = promql_names.RULES_DIR / "rlotel.rules.yml"
OUTPUTS = {
    STEP_UID: STACK / "dashboards" / "rl-step-breakdown.json",
    TAIL_UID: STACK / "dashboards" / "rl-rollout-tail.json",
}
# Grafana units for the catalogue's units.
UNITS = {
    "seconds": "s",
    "ratio": "percentunit",
    "tokens": "short",
    "steps": "short",
    "bytes": "bytes",
    "": "short",
}
GEN = 'stage="generate_sequences"'
# When a panel has no data by design, said in its description (`Panel.empty_when`). On verl's
# real `main_ppo` (tests/e2e/test_main_ppo.py) every panel answers or says one of these that
# is true of that run.
EMPTY = {
    "sync": "Empty on synchronous runs (verl's default trainer): async modes only.",
    "no_replay_buffer": "Empty without a replay buffer that evicts (async modes).",
    "no_tools": "Empty for tool_calls when the agent loop calls no tool.",
    "one_rank": "Empty with one rank per role: a spread needs two.",
    "no_worker_group": "Empty where no verl worker group is called and no data queue used "
    "(rlotel's own demo).",
    "no_engine_discovery": "Empty until the engines are scraped: one discovery file per "
    "replica in collector/engines/, or verl's rollout.prometheus with the plugin on.",
    "no_node_exporter": "Empty until node_exporter serves on the workers' nodes (port 9100, "
    "job node-exporter).",
    "no_dcgm": "Empty until NVIDIA's dcgm-exporter serves on the workers' nodes (port 9400, "
    "job dcgm-exporter).",
    "loopback_only": "Empty on a node whose only network device is loopback (a job in a "
    "network namespace of its own).",
    "no_transfer_queue": "Empty unless verl's TransferQueue serves its metrics "
    "(V1, transfer_queue.metrics.enabled=True; job transfer-queue).",
}


# --- panels as data ----------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel and the metrics it reads."""

    expr: str
    legend: str
    metrics: tuple[Metric, ...]
    exemplar: bool = False
    format: Literal["time_series", "heatmap", "table"] = "time_series"


@dataclass(frozen=True)
class Panel:
    """A Prometheus panel: its kind, title and targets; the unit defaults to the first
    metric's."""

    title: str
    targets: tuple[Target, ...]
    kind: Literal["timeseries", "stat", "heatmap", "table"] = "timeseries"
    unit: str | None = None
    description: str = ""
    stacked: bool = False
    trace_links: bool = False
    # A table of `rows` × `columns` from one instant query (Grafana's groupingToMatrix).
    matrix: tuple[str, str] | None = None
    empty_when: tuple[str, ...] = ()  # keys of EMPTY: when it has no data by design
    repeat: str | None = None  # a variable: one copy of the panel per selected value

    @property
    def full_description(self) -> str:
        """The description, then when the panel is empty by design."""
        return " ".join([self.description, *(EMPTY[k] for k in self.empty_when)]).strip()

    @property
    def grafana_unit(self) -> str:
        return self.unit or UNITS[self.targets[0].metrics[0].unit]


@dataclass(frozen=True)
class TraceTable:
    """A table of spans from Tempo (TraceQL)."""

    title: str
    traceql: str
    limit: int = 20


@dataclass(frozen=True)
class Section:
    """A dashboard row and its panels."""

    title: str
    panels: tuple[Panel | TraceTable, ...]


@dataclass(frozen=True)
class Variable:
    """A multi-select template variable over one label's values, optionally reduced by a
    regex (Grafana keeps its first capture group)."""

    name: str
    query: str
    regex: str = ""


@dataclass(frozen=True)
class Board:
    title: str
    uid: str
    linked: str  # title of the link to the other rlotel dashboards
    sections: tuple[Section, ...]
    variables: tuple[Variable, ...] = ()  # after `run`, `job`, `instance`


REPLICA = Variable("replica", 'label_values({run=~"$run", replica!=""}, replica)')
# Nodes the run's workers are on (their series carry the target label `node`).
NODE = Variable("node", 'label_values({run=~"$run", node!=""}, node)')
PREFIX = Variable(
    "prefix", f"label_values({cat.TRAIN_METRIC.name}{{{SELECTOR}}}, key)", KEY_PREFIX_REGEX
)


def selector_of(metric: Metric) -> str:
    if isinstance(metric, Recorded):
        return RECORDED_SELECTOR
    if isinstance(metric, host.ExporterMetric):
        return NODE_SELECTOR
    if isinstance(metric, tq.QueueMetric):
        return QUEUE_SELECTOR
    return ENGINE_SELECTOR if isinstance(metric, eng.EngineMetric) else SELECTOR


def select(metric: Metric, match: str = "", selector: str | None = None) -> str:
    """`series{match, selector}`: the metric's queried series (counters' `_total`,
    histograms' `_bucket`) under the dashboard's label selector."""
    matchers = ", ".join(part for part in (match, selector or selector_of(metric)) if part)
    return f"{metric.sample_names[0]}{{{matchers}}}"


def value(metric: Metric, legend: str, match: str = "", wrap: str = "{}") -> Target:
    """The series itself, optionally wrapped (`wrap` holds `{}` where the series goes)."""
    return Target(wrap.format(select(metric, match)), legend, (metric,))


def increase(metric: Metric, legend: str, by: str, match: str = "") -> Target:
    """`sum by (by) (increase(...))` of a counter over the rate interval."""
    return Target(
        f"sum by ({by}) (increase({select(metric, match)}[$__rate_interval]))", legend, (metric,)
    )


def increase_from_zero(metric: Metric, legend: str, by: str) -> Target:
    """`increase` of a counter that appears at its first increment (verl logs a count only
    at a step that has one): the whole value while the series is younger than the rate
    interval, so that first increment is counted; `increase` alone has no sample before it."""
    series = select(metric)
    young = f"{series} unless {series} offset $__rate_interval"
    return Target(
        f"sum by ({by}) (({young}) or increase({series}[$__rate_interval]))", legend, (metric,)
    )


def quantile(
    metric: Metric,
    q: float,
    legend: str = "",
    match: str = "",
    by: str = "",
    window: str = "$__rate_interval",
    exemplar: bool = False,
) -> Target:
    """`histogram_quantile(q, ...)` of a histogram, per `by` labels."""
    labels = f"{by}, le" if by else "le"
    return Target(
        f"histogram_quantile({q}, sum by ({labels}) (rate({select(metric, match)}[{window}])))",
        legend or f"p{round(q * 100)}",
        (metric,),
        exemplar=exemplar,
    )


def per_second(metric: Metric, legend: str, by: str, match: str = "") -> Target:
    """`sum by (by) (rate(...))` of a counter: its events per second."""
    return Target(
        f"sum by ({by}) (rate({select(metric, match)}[$__rate_interval]))", legend, (metric,)
    )


def signed_mean(
    total: cat.MetricSpec, count: cat.MetricSpec, legend: str, by: str, window: str = "5m"
) -> Target:
    """A mean over `window` from a sum kept by sign (`total`: |values| by sign) and its
    count: (positive - negative) / count, per `by`; none where the window has no sample."""
    signs = [select(total, f'sign="{sign}"') for sign in ("positive", "negative")]
    parts = [f"sum by ({by}) (increase({series}[{window}]))" for series in signs]
    samples = f"sum by ({by}) (increase({select(count)}[{window}]))"
    return Target(f"({parts[0]} - {parts[1]}) / ({samples} > 0)", legend, (total, count))


BY_SOURCE = "{{data_source}}"
WEIGHTED = (
    "Weighted by volume: the sum over every trained sample of the source in the last 5 "
    "minutes divided by their count, not a mean of per-step means, which would give a step "
    "with 3 of the source's samples the weight of one with 300 (verl #3785)."
)


def on_ranks(by_node: str) -> str:
    """A per-node figure on each worker of the run on that node (`role`, `rank`, `node`)."""
    return f"{RANKS_ON_NODES} * on (node) group_left () ({by_node})"


def node_rate(metric: host.ExporterMetric, match: str = "") -> str:
    """Per-second rate of a node_exporter counter, summed per node."""
    return f"sum by (node) (rate({select(metric, match)}[$__rate_interval]))"


def per_gpu(metric: host.ExporterMetric, scale: str = "") -> Target:
    """A dcgm-exporter gauge per node and GPU, optionally scaled to the panel's unit."""
    return Target(
        f"max by (node, gpu) ({select(metric)}){scale}", "{{node}} GPU {{gpu}}", (metric,)
    )


IDLE_CPU = select(host.NODE_CPU, 'mode="idle"')
CPU_BUSY = f"1 - avg by (node) (rate({IDLE_CPU}[$__rate_interval]))"
MEMORY_USED = (
    f"1 - sum by (node) ({select(host.NODE_MEMORY_AVAILABLE)})"
    f" / sum by (node) ({select(host.NODE_MEMORY_TOTAL)})"
)
SWAPPING = (
    f"sum by (node) (rate({select(host.NODE_SWAP_IN)}[$__rate_interval])"
    f" + rate({select(host.NODE_SWAP_OUT)}[$__rate_interval]))"
)
MIB = " * 1048576"  # dcgm-exporter's MiB in bytes
ON_RANKS = "{{role}} {{rank}} ({{node}})"
SAME_NODE = (
    "Each worker of the run (role, rank) draws its node's figure, so a rank's line can be "
    "read beside its phases; ranks on one node draw the same line."
)


def trace_links() -> list[DashboardLink]:
    """Panel links to the trace UI (Tempo datasource uid `tempo`)."""
    return [
        DashboardLink("Traces of this run (Tempo)")
        .type(DashboardLinkType.LINK)
        .url(
            '/explore?left={"datasource":"tempo","queries":[{"queryType":"traceql",'
            '"query":"{ resource.rl.run = \\"${run}\\" }"}]}'
        )
        .target_blank(True),
    ]


STEP_BREAKDOWN = Board(
    "RL step breakdown",
    STEP_UID,
    "Rollout tail",
    (
        Section(
            "Where the step goes",
            (
                Panel(
                    "Step time and phases (last step)",
                    (
                        value(cat.STEP_PHASE_SECONDS, "{{phase}}"),
                        value(cat.STEP_TIME, "step"),
                    ),
                    stacked=True,
                    trace_links=True,
                ),
                Panel(
                    "Phase share of step",
                    (
                        Target(
                            f"{select(cat.STEP_PHASE_SECONDS)} / ignoring(phase) group_left "
                            f"{select(cat.STEP_TIME)}",
                            "{{phase}}",
                            (cat.STEP_PHASE_SECONDS, cat.STEP_TIME),
                        ),
                    ),
                    unit="percentunit",
                ),
                Panel(
                    "Unaccounted time (between windows)",
                    (value(cat.STEP_UNACCOUNTED, "{{run}}"),),
                ),
                Panel(
                    "Phase p90 over 30m (histogram)",
                    (quantile(cat.PHASE_DURATION, 0.9, "{{phase}}", by="phase", window="30m"),),
                ),
            ),
        ),
        Section(
            "Throughput and efficiency",
            (
                Panel(
                    "Throughput (tokens/s/GPU)",
                    (value(cat.THROUGHPUT, "{{run}}"),),
                ),
                Panel("MFU by role", (value(cat.MFU, "{{role}}"),)),
                Panel("Time per token by phase", (value(cat.PHASE_TIME_PER_TOKEN, "{{phase}}"),)),
                Panel("Tokens per step", (value(cat.STEP_TOKENS, "{{kind}}"),)),
            ),
        ),
        Section(
            "Goodput and async windows",
            (
                Panel(
                    "Goodput (productive seconds ÷ step)",
                    (value(cat.GOODPUT, "{{run}}"),),
                ),
                Panel(
                    "Seconds by bucket",
                    (increase(cat.BUCKET_SECONDS, "{{bucket}}", by="bucket"),),
                    stacked=True,
                ),
                Panel(
                    "Idle ratio by role",
                    (value(cat.ROLE_IDLE, "{{role}}"),),
                    description="Share of the step's wall time each role waited.",
                    empty_when=("sync",),
                ),
                Panel(
                    "Sample staleness and weight span (steps)",
                    (
                        quantile(cat.SAMPLE_STALENESS, 0.5, "staleness p50"),
                        quantile(cat.SAMPLE_STALENESS, 0.99, "staleness p99"),
                        quantile(cat.SAMPLE_WEIGHT_SPAN, 0.99, "weight span p99"),
                    ),
                ),
                Panel(
                    "Replay-buffer evictions by reason",
                    (increase_from_zero(cat.REPLAY_EVICTED, "{{reason}}", by="reason"),),
                    empty_when=("no_replay_buffer",),
                ),
            ),
        ),
        Section(
            "By data source",
            (
                Panel(
                    "Mean reward by source (5m)",
                    (value(SOURCE_REWARD_MEAN, BY_SOURCE),),
                    unit="short",
                    description="Each data_source's mean reward (recording rule "
                    f"{SOURCE_REWARD_MEAN.name}). {WEIGHTED}",
                ),
                Panel(
                    "Trained samples/s by source",
                    (per_second(cat.SOURCE_SAMPLES, BY_SOURCE, "data_source"),),
                    unit="cps",
                    stacked=True,
                    description="The mix the policy trains on: a source whose share falls "
                    "is drawn less, or filtered or evicted more, than the others. Sources after "
                    "the first 10 a process sees are summed as other.",
                ),
                Panel(
                    "Response length p50 / p90 by source",
                    tuple(
                        quantile(
                            cat.SOURCE_LENGTH,
                            q,
                            f"p{round(q * 100)} {BY_SOURCE}",
                            'kind="response"',
                            by="data_source",
                        )
                        for q in (0.5, 0.9)
                    ),
                ),
                Panel(
                    "generate_sequences p90 by source",
                    (quantile(cat.SOURCE_STAGE_DURATION, 0.9, BY_SOURCE, GEN, by="data_source"),),
                    description="Per-sample generation seconds: the source whose tail holds "
                    "the step.",
                ),
                Panel(
                    "tool_calls p90 by source",
                    (
                        quantile(
                            cat.SOURCE_STAGE_DURATION,
                            0.9,
                            BY_SOURCE,
                            'stage="tool_calls"',
                            by="data_source",
                        ),
                    ),
                    description="Per-sample seconds in tool calls (0 for a sample that "
                    "called none).",
                    empty_when=("no_tools",),
                ),
                Panel(
                    "Mean reward component by source (5m)",
                    (
                        signed_mean(
                            cat.SOURCE_REWARD_COMPONENT,
                            cat.SOURCE_REWARD_COMPONENT_SAMPLES,
                            "{{component}} {{data_source}}",
                            "component, data_source",
                        ),
                    ),
                    unit="short",
                    description="Each numeric reward_extra_info component (acc, format, ...: "
                    f"what the reward function returned beside the score). {WEIGHTED}",
                ),
            ),
        ),
        Section(
            "Stragglers (ranks)",
            (
                Panel(
                    "Rank spread by phase (slowest ÷ median)",
                    (value(cat.PHASE_RANK_SPREAD, "{{phase}}"),),
                    unit="short",
                    description="1 = balanced; the alert RLStragglerRank watches this.",
                    empty_when=("one_rank",),
                ),
                Panel(
                    "Phase seconds by rank (last step)",
                    (
                        Target(
                            "label_join(max by (role, rank, phase) ("
                            f"{select(cat.RANK_PHASE_SECONDS, selector=RANK_SELECTOR)}),"
                            ' "worker", " ", "role", "rank")',
                            "{{worker}} {{phase}}",
                            (cat.RANK_PHASE_SECONDS,),
                            format="table",
                        ),
                    ),
                    kind="table",
                    matrix=("worker", "phase"),
                    description="Seconds each worker (role and rank) spent in each method the "
                    "trainer called, in the latest step that called it: measured in the "
                    "worker's own process.",
                ),
            ),
        ),
        Section(
            "Data movement (the data half of the ledger)",
            (
                Panel(
                    "Worker-group calls by stage",
                    (increase(cat.DATA_MOVEMENT_SECONDS, "{{phase}} {{stage}}", "phase, stage"),),
                    stacked=True,
                    description="The driver's worker-group calls, stacked: dispatch, submit, "
                    "transfer, read, work, write, fetch, collect and other add up to the calls' "
                    "wall time (wait: what neither moved data nor ran on a rank). Everything "
                    "but work, wait and other is moving data; the verdict data-movement-bound "
                    "reads the same seconds.",
                    empty_when=("no_worker_group",),
                ),
                Panel(
                    "Bytes moved by phase and direction",
                    (
                        increase(
                            cat.DATA_MOVEMENT_BYTES, "{{phase}} {{direction}}", "phase, direction"
                        ),
                    ),
                    description="Sent to and returned from the ranks with the calls, read from "
                    "and written to TransferQueue by the ranks (tensor and array sizes).",
                    empty_when=("no_worker_group",),
                ),
                Panel(
                    "Data queues: seconds by queue and operation",
                    (increase(cat.QUEUE_SECONDS, "{{queue}} {{op}}", "queue, op"),),
                    description="TransferQueue (V1's data path) and fully async's MessageQueue, "
                    "in every process that puts or gets (a get includes waiting for data).",
                    empty_when=("no_worker_group",),
                ),
            ),
        ),
        Section(
            "TransferQueue (its own tq_* series)",
            (
                Panel(
                    "TransferQueue requests by operation",
                    (increase(tq.CONTROLLER_REQUESTS, "{{op_type}}", "op_type"),),
                    unit="none",
                    description="Requests TransferQueue's controller served (metadata reads, "
                    "writes' notifications, clears), per interval.",
                    empty_when=("no_transfer_queue",),
                ),
                Panel(
                    "TransferQueue request latency p99 by operation",
                    (quantile(tq.CONTROLLER_REQUEST_SECONDS, 0.99, "{{op_type}}", by="op_type"),),
                    unit="s",
                    description="The controller's own seconds per request; the seconds a "
                    "process spent in its reads and writes, waiting included, are the row "
                    "above's data queues.",
                    empty_when=("no_transfer_queue",),
                ),
                Panel(
                    "Samples written and cleared",
                    (increase(tq.CONTROLLER_REQUEST_SAMPLES, "{{op_type}}", "op_type"),),
                    unit="none",
                    description="Samples carried by the controller's requests per interval: "
                    "NOTIFY_DATA_UPDATE (written), CLEAR_META (cleared after training).",
                    empty_when=("no_transfer_queue",),
                ),
                Panel(
                    "Samples held by partition",
                    (
                        value(
                            tq.PARTITION_SAMPLES,
                            "{{partition_id}}",
                            wrap="max by (partition_id) ({})",
                        ),
                    ),
                    unit="none",
                    empty_when=("no_transfer_queue",),
                ),
                Panel(
                    "Storage used (active keys ÷ capacity)",
                    (
                        value(
                            tq.STORAGE_UTILIZATION,
                            "{{storage_unit_id}}",
                            wrap="max by (storage_unit_id) ({})",
                        ),
                    ),
                    unit="percentunit",
                    description="A storage unit near 1 refuses new samples: raise "
                    "transfer_queue.backend.SimpleStorage.total_storage_size.",
                    empty_when=("no_transfer_queue",),
                ),
            ),
        ),
        Section(
            "Diagnosis",
            (
                Panel(
                    "Bottleneck (last step)",
                    (value(cat.BOTTLENECK, "{{verdict}} {{detail}}", wrap="{} == 1"),),
                    kind="stat",
                    unit="none",
                ),
                Panel(
                    "Global step",
                    (value(cat.STEP, "{{run}}", wrap="max by (run) ({})"),),
                    kind="stat",
                    unit="none",
                ),
                Panel(
                    "Stalled phases",
                    (value(cat.PHASE_STALLED, "{{phase}} {{instance}}"),),
                    kind="stat",
                    unit="none",
                    description="1 while a phase is open past its stall threshold "
                    "(RLPhaseStalled); "
                    "the process's log line and live verdict name who holds it.",
                ),
                Panel(
                    "Open phases (oldest open span's age)",
                    (value(cat.PHASE_OPEN, "{{phase}} {{instance}}"),),
                ),
                Panel(
                    "Seconds since last step",
                    (value(cat.LAST_STEP_TIMESTAMP, "{{run}}", wrap="time() - max by (run) ({})"),),
                    kind="stat",
                ),
                Panel(
                    "Telemetry drops",
                    (  # `or vector(0)`: a healthy run shows 0, not "No data"
                        Target(
                            f"{increase(cat.DROPPED, '', by='signal, reason').expr} or vector(0)",
                            "{{signal}}/{{reason}}",
                            (cat.DROPPED,),
                        ),
                    ),
                ),
            ),
        ),
        Section(
            "Profiler captures",
            (
                Panel(
                    "Profile captures",
                    (value(cat.PROFILE_CAPTURES, "{{tool}}", wrap="sum by (tool) ({})"),),
                    kind="stat",
                    unit="none",
                ),
                TraceTable(
                    "profile.capture spans (Tempo)",
                    '{ name = "profile.capture" && resource.rl.run =~ "$run" }',
                ),
            ),
        ),
        Section(
            "Hosts (node_exporter), on the ranks of each node",
            (
                Panel(
                    "CPU busy on each rank's node",
                    (Target(on_ranks(CPU_BUSY), ON_RANKS, (host.NODE_CPU,)),),
                    unit="percentunit",
                    description=f"Share of the node's CPU time not idle. {SAME_NODE}",
                    empty_when=("no_node_exporter",),
                ),
                Panel(
                    "Memory used on each rank's node",
                    (
                        Target(
                            on_ranks(MEMORY_USED),
                            ON_RANKS,
                            (host.NODE_MEMORY_AVAILABLE, host.NODE_MEMORY_TOTAL),
                        ),
                    ),
                    unit="percentunit",
                    description=f"1 − MemAvailable ÷ MemTotal. {SAME_NODE}",
                    empty_when=("no_node_exporter",),
                ),
                Panel(
                    "Swapping on each rank's node (pages in + out per second)",
                    (
                        Target(
                            on_ranks(SWAPPING), ON_RANKS, (host.NODE_SWAP_IN, host.NODE_SWAP_OUT)
                        ),
                    ),
                    unit="short",
                    description="Above 0 while the node moves pages to or from swap: a phase "
                    f"that slows then has memory pressure to blame. {SAME_NODE}",
                    empty_when=("no_node_exporter",),
                ),
                Panel(
                    "Swap used by node",
                    (
                        Target(
                            f"sum by (node) ({select(host.NODE_SWAP_TOTAL)}"
                            f" - {select(host.NODE_SWAP_FREE)})",
                            "{{node}}",
                            (host.NODE_SWAP_TOTAL, host.NODE_SWAP_FREE),
                        ),
                    ),
                    unit="bytes",
                    empty_when=("no_node_exporter",),
                ),
                Panel(
                    "Network by node (receive, transmit)",
                    tuple(
                        Target(node_rate(metric, 'device!="lo"'), f"{{{{node}}}} {way}", (metric,))
                        for metric, way in (
                            (host.NODE_NETWORK_RECEIVE, "receive"),
                            (host.NODE_NETWORK_TRANSMIT, "transmit"),
                        )
                    ),
                    unit="Bps",
                    description="Bytes per second on every device but loopback.",
                    empty_when=("no_node_exporter", "loopback_only"),
                ),
            ),
        ),
        Section(
            "GPUs (dcgm-exporter), by node and GPU",
            (
                Panel(
                    "GPU utilisation",
                    (per_gpu(host.DCGM_GPU_UTIL),),
                    unit="percent",
                    empty_when=("no_dcgm",),
                ),
                Panel(
                    "GPU memory used (framebuffer)",
                    (per_gpu(host.DCGM_FB_USED, MIB),),
                    unit="bytes",
                    empty_when=("no_dcgm",),
                ),
                Panel(
                    "SM clock",
                    (per_gpu(host.DCGM_SM_CLOCK, " * 1e6"),),
                    unit="hertz",
                    description="A clock below its usual value while busy: power or thermal "
                    "throttling.",
                    empty_when=("no_dcgm",),
                ),
                Panel(
                    "NVLink throughput (all links, sent + received)",
                    (per_gpu(host.DCGM_NVLINK_BANDWIDTH, MIB),),
                    unit="binBps",
                    description="DCGM publishes this field as a throughput in MiB/s though the "
                    "exporter types it a counter, so it is read as it is, not through rate().",
                    empty_when=("no_dcgm",),
                ),
                Panel(
                    "Last XID error by GPU (0 = none)",
                    (per_gpu(host.DCGM_XID_ERRORS),),
                    kind="stat",
                    unit="none",
                    description="The code of the GPU's last XID error (the driver's report of "
                    "a GPU fault; e.g. 79: fallen off the bus); the exporter's newer versions "
                    "add its message as `err_msg`.",
                    empty_when=("no_dcgm",),
                ),
            ),
        ),
        Section(
            "Every verl key (rlotel_train_metric), by prefix",
            (
                Panel(
                    "Last value of every key",
                    (
                        Target(
                            f"max by (run, key) ({select(cat.TRAIN_METRIC, KEYS_OF_PREFIX)})",
                            "{{key}}",
                            (cat.TRAIN_METRIC,),
                            format="table",
                        ),
                    ),
                    kind="table",
                    description="Every key of verl's metrics dict that rlotel serves as "
                    "rlotel_train_metric (those it serves as families of their own, such as "
                    "timing_s/ phases, are in the rows above), for the prefixes selected.",
                ),
                Panel(
                    "$prefix/…",
                    (value(cat.TRAIN_METRIC, "{{key}}", KEYS_OF_PREFIX),),
                    description="The keys under one prefix, one panel per prefix selected.",
                    repeat=PREFIX.name,
                ),
            ),
        ),
    ),
    variables=(NODE, PREFIX),
)

ROLLOUT_TAIL = Board(
    "RL rollout tail",
    TAIL_UID,
    "Step breakdown",
    (
        Section(
            "Generation latency per sample",
            (
                Panel(
                    "generate_sequences p50 / p90 / p99 (exemplars → traces)",
                    (
                        *(
                            quantile(cat.AGENT_LOOP_DURATION, q, match=GEN, exemplar=True)
                            for q in (0.5, 0.9, 0.99)
                        ),
                        value(cat.AGENT_LOOP_SLOWEST, "slowest", GEN, wrap="max by (run) ({})"),
                    ),
                    trace_links=True,
                ),
                Panel(
                    "Per-sample generation time",
                    (
                        Target(
                            increase(cat.AGENT_LOOP_DURATION, "", by="le", match=GEN).expr,
                            "{{le}}",
                            (cat.AGENT_LOOP_DURATION,),
                            format="heatmap",
                        ),
                    ),
                    kind="heatmap",
                ),
            ),
        ),
        Section(
            "Tools and scoring",
            (
                Panel(
                    "tool_calls and compute_score p99",
                    tuple(
                        quantile(
                            cat.AGENT_LOOP_DURATION, 0.99, stage, f'stage="{stage}"', exemplar=True
                        )
                        for stage in ("tool_calls", "compute_score")
                    ),
                    empty_when=("no_tools",),
                ),
                Panel(
                    "Slowest sample's lengths",
                    (value(cat.AGENT_LOOP_SLOWEST_LENGTH, "{{kind}}"),),
                ),
                Panel(
                    "Response length p50 / p99",
                    tuple(
                        quantile(cat.AGENT_LOOP_LENGTH, q, match='kind="response"')
                        for q in (0.5, 0.99)
                    ),
                ),
                Panel(
                    "Preemptions",
                    (increase(cat.AGENT_LOOP_PREEMPTIONS, "{{run}}", by="run"),),
                ),
            ),
        ),
        Section(
            "Rollout engines (vLLM / SGLang, by replica)",
            (
                Panel(
                    "Engine request latency p99",
                    (
                        quantile(eng.VLLM_E2E_LATENCY, 0.99, "vLLM {{replica}}", by="replica"),
                        quantile(eng.SGLANG_E2E_LATENCY, 0.99, "SGLang {{replica}}", by="replica"),
                    ),
                    empty_when=("no_engine_discovery",),
                ),
                Panel(
                    "vLLM time to first token p50 / p99",
                    tuple(
                        quantile(
                            eng.VLLM_TIME_TO_FIRST_TOKEN,
                            q,
                            f"p{round(q * 100)} {{{{replica}}}}",
                            by="replica",
                        )
                        for q in (0.5, 0.99)
                    ),
                    empty_when=("no_engine_discovery",),
                ),
                Panel(
                    "Engine queue time p99",
                    (
                        quantile(eng.VLLM_QUEUE_TIME, 0.99, "vLLM {{replica}}", by="replica"),
                        quantile(eng.SGLANG_QUEUE_TIME, 0.99, "SGLang {{replica}}", by="replica"),
                    ),
                    empty_when=("no_engine_discovery",),
                ),
                Panel(
                    "vLLM prefill / decode p99",
                    (
                        quantile(eng.VLLM_PREFILL_TIME, 0.99, "prefill {{replica}}", by="replica"),
                        quantile(eng.VLLM_DECODE_TIME, 0.99, "decode {{replica}}", by="replica"),
                    ),
                    empty_when=("no_engine_discovery",),
                ),
                Panel(
                    "Engine preemptions (SGLang: retractions)",
                    (
                        increase(eng.VLLM_PREEMPTIONS, "vLLM {{replica}}", by="replica"),
                        increase(eng.SGLANG_RETRACTIONS, "SGLang {{replica}}", by="replica"),
                    ),
                    empty_when=("no_engine_discovery",),
                ),
                Panel(
                    "KV cache usage",
                    (
                        value(
                            eng.VLLM_KV_CACHE_USAGE,
                            "vLLM {{replica}}",
                            wrap="max by (replica) ({})",
                        ),
                        value(
                            eng.SGLANG_TOKEN_USAGE,
                            "SGLang {{replica}}",
                            wrap="max by (replica) ({})",
                        ),
                    ),
                    empty_when=("no_engine_discovery",),
                ),
                Panel(
                    "vLLM requests waiting",
                    (
                        value(
                            eng.VLLM_REQUESTS_WAITING, "{{replica}}", wrap="sum by (replica) ({})"
                        ),
                    ),
                    empty_when=("no_engine_discovery",),
                ),
            ),
        ),
    ),
    variables=(REPLICA,),
)

BOARDS = (STEP_BREAKDOWN, ROLLOUT_TAIL)


# --- rendering with grafana-foundation-sdk -----------------------------------------------


def dataquery(target: Target, ref: str) -> prometheus.Dataquery:
    query = (
        prometheus.Dataquery()
        .expr(target.expr)
        .legend_format(target.legend or "__auto")
        .ref_id(ref)
        .datasource(PROMETHEUS)
    )
    if target.exemplar:
        query = query.exemplar(True)
    if target.format == "heatmap":
        query = query.format(PromQueryFormat.HEATMAP)
    if target.format == "table":
        query = query.format(PromQueryFormat.TABLE).instant()
    return query


PANEL_BUILDERS = {
    "timeseries": timeseries.Panel,
    "stat": stat.Panel,
    "heatmap": heatmap.Panel,
    "table": table.Panel,
}


def grafana_panel(panel: Panel | TraceTable):
    if isinstance(panel, TraceTable):
        return (
            table.Panel()
            .title(panel.title)
            .datasource(TEMPO)
            .with_target(
                tempo_query.TempoQuery()
                .ref_id("A")
                .query_type("traceql")
                .query(panel.traceql)
                .limit(panel.limit)
                .datasource(TEMPO)
            )
        )
    built = PANEL_BUILDERS[panel.kind]().title(panel.title).datasource(PROMETHEUS)
    if panel.kind != "heatmap":
        built = built.unit(panel.grafana_unit)
    if panel.full_description:
        built = built.description(panel.full_description)
    for index, target in enumerate(panel.targets):
        built = built.with_target(dataquery(target, chr(ord("A") + index)))
    if panel.stacked:
        built = built.stacking(StackingConfig().mode(StackingMode.NORMAL))
    if panel.trace_links:
        built = built.links(trace_links())
    if panel.repeat:
        built = built.repeat(panel.repeat).repeat_direction("h").max_per_row(3)
    if panel.matrix:
        rows, columns = panel.matrix
        built = built.with_transformation(
            DataTransformerConfig(
                id_val="groupingToMatrix",
                options={"rowField": rows, "columnField": columns, "valueField": "Value"},
            )
        )
    return built


def label_variable(name: str, query_text: str, regex: str = "") -> QueryVariable:
    """A multi-select template variable over one label's values."""
    built = (
        QueryVariable(name)
        .label(name)
        .datasource(PROMETHEUS)
        .query(query_text)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(True)
        .multi(True)
    )
    return built.regex(regex).sort(VariableSort.ALPHABETICAL_ASC) if regex else built


def dashboard(board: Board) -> Dashboard:
    built = (
        Dashboard(board.title)
        .uid(board.uid)
        .tags(["rlotel", "rl"])
        .refresh("30s")
        .time("now-6h", "now")
        .link(DashboardLink(board.linked).type(DashboardLinkType.DASHBOARDS).tags(["rlotel"]))
        .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(label_variable("run", "label_values(rlotel_steps_total, run)"))
        .with_variable(label_variable("job", 'label_values(rlotel_steps_total{run=~"$run"}, job)'))
        .with_variable(
            label_variable(
                "instance", 'label_values(rlotel_steps_total{run=~"$run", job=~"$job"}, instance)'
            )
        )
    )
    for variable in board.variables:
        built = built.with_variable(label_variable(variable.name, variable.query, variable.regex))
    for section in board.sections:
        built = built.with_row(Row(section.title))
        for panel in section.panels:
            built = built.with_panel(grafana_panel(panel))
    return built


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
        OUTPUTS[STEP_UID]: render(dashboard(STEP_BREAKDOWN)),
        OUTPUTS[TAIL_UID]: render(dashboard(ROLLOUT_TAIL)),
    }


# --- checks ------------------------------------------------------------------------------


def expressions(node) -> list[str]:
    """Every PromQL expression in a dashboard JSON (keys `expr`, variable queries)."""
    if isinstance(node, dict):
        found = []
        for key, item in node.items():
            if (key == "expr" and isinstance(item, str)) or (
                key == "query" and isinstance(item, str) and item.startswith("label_values(")
            ):
                found.append(item)
            else:
                found += expressions(item)
        return found
    if isinstance(node, list):
        return [found for item in node for found in expressions(item)]
    return []


def undeclared_queries(boards: tuple[Board, ...] = BOARDS) -> list[str]:
    """Targets that query a series other than the metrics they name."""
    problems = []
    for board in boards:
        for section in board.sections:
            for panel in section.panels:
                if isinstance(panel, TraceTable):
                    continue
                for target in panel.targets:
                    declared = {name for m in target.metrics for name in m.sample_names}
                    try:
                        queried = promql_names.selected_names(target.expr)
                    except promql_names.PromQLError as error:
                        problems.append(f"{board.title} / {panel.title}: {error}")
                        continue
                    problems += [
                        f"{board.title} / {panel.title}: {name!r} is not among the target's metrics"
                        for name in queried
                        if name not in declared
                    ]
    return problems


def problems_in(text: str, known: set[str]) -> list[str]:
    """Unknown names and unparseable PromQL in one generated file."""
    problems = []
    for expression in expressions(json.loads(text)):
        try:
            problems += [
                f"unknown metric {name!r} in {expression!r}"
                for name, _ in promql_names.unknown_names([expression], known)
            ]
        except promql_names.PromQLError as error:
            problems.append(str(error))
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify instead of writing")
    args = parser.parse_args()
    known = promql_names.known_names()
    problems = undeclared_queries()
    for path, text in outputs().items():
        problems += [f"{path.name}: {problem}" for problem in problems_in(text, known)]
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
