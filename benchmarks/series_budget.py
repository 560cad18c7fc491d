"""Prometheus series per process and per run, counted from the catalogue: every family of
rlotel/schema/catalogue.py, a stated bound for each of its labels, and the limits a run meets on
the way to a backend. Prints the "Running on 1,000 GPUs" table of docs/production.md.

    python -m benchmarks.series_budget                 # the table in docs/production.md
    python -m benchmarks.series_budget --families --gpus 2048 --gpus-per-replica 4

Upper bounds, not a measurement: a label takes at most its bound's values in one process
(most runs use fewer: a drop reason only appears once something is dropped). A family's
label sets are also capped per process at `max_metric_keys` (256; the excess is dropped and
counted), except the drop and hook tallies, which are bounded by the code. Histograms are
`_bucket` per bound plus `+Inf`, `_sum` and `_count` (no `_created`); with Prometheus 3's
native histograms with custom buckets (NHCB) each label set is one series.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlotel.config import Config
from rlotel.derive.goodput import BUCKETS, DEFAULT_BUCKETS
from rlotel.derive.sources import MAX_DATA_SOURCES, MAX_REWARD_COMPONENTS, SIGNS
from rlotel.integrations.registered import HOOKS
from rlotel.record.samples import DURATION_FIELDS, LENGTH_KINDS
from rlotel.schema import catalogue as cat
from rlotel.schema import data_moves as dm
from rlotel.schema.vocabulary import BIAS_QUANTITIES, DISCARD_REASONS

CAP = Config.max_metric_keys  # label sets per family and process (rlotel.init's default)
# `rlotel_train_metric` has budgets of its own: training keys and validation keys.
KEY_CAP = Config.max_log_keys + Config.max_val_log_keys

# Limits a run meets. Mimir: -ingester.max-global-series-per-user (in-memory series per
# tenant across the cluster, before replication) and -distributor.ingestion-rate-limit
# (samples/s per tenant), their defaults. The OpenTelemetry SDK's default cardinality limit:
# attribute sets per metric stream (opentelemetry-sdk's _DEFAULT_CARDINALITY_LIMIT).
MIMIR_SERIES_PER_TENANT = 150_000
MIMIR_SAMPLES_PER_SECOND = 10_000
OTEL_SDK_ATTRIBUTE_SETS = 2_000
SCRAPE_INTERVAL_S = 15  # collector/prometheus.yml's scrape_interval
# What Prometheus adds per target: up, scrape_duration_seconds, scrape_samples_scraped,
# scrape_samples_post_metric_relabeling, scrape_series_added.
SCRAPE_SERIES_PER_TARGET = 5


@dataclass(frozen=True)
class Scale:
    """A training job: its GPUs (one Ray worker process per GPU rank) and rollout replicas."""

    gpus: int
    gpus_per_replica: int = 8  # tensor-parallel size of one vLLM/SGLang rollout replica

    @property
    def replicas(self) -> int:
        return math.ceil(self.gpus / self.gpus_per_replica)


Bound = int | Callable[[Scale], int]


@dataclass(frozen=True)
class Label:
    values: Bound
    why: str

    def at(self, scale: Scale) -> int:
        return self.values(scale) if callable(self.values) else self.values


# The most values each label takes in one process. Every label of every catalogue family
# needs one here (tests/test_series_budget.py fails on a new label without it).
LABELS: dict[str, Label] = {
    "phase": Label(
        24,
        f"verl 0.9.1's timer names in rlotel's goodput table ({len(DEFAULT_BUCKETS)}), `step`, "
        "one spare",
    ),
    "kind": Label(3, "prompt, response, unsplit"),
    "role": Label(4, "actor, critic, ref, reward model"),
    "key": Label(KEY_CAP, "other tel.log keys: the training and validation key budgets"),
    "rank": Label(1, "a worker's own rank: one per process (its per-rank seconds)"),
    "stage": Label(len(DURATION_FIELDS), ", ".join(DURATION_FIELDS)),
    "tool": Label(3, "torch, torch_memory, nsys"),
    "bucket": Label(len(BUCKETS), ", ".join(BUCKETS)),
    "quantity": Label(len(BIAS_QUANTITIES), ", ".join(BIAS_QUANTITIES)),
    "reason": Label(8, "replay-buffer eviction reasons verl gives (staleness, filter_groups, …)"),
    "replica": Label(lambda scale: scale.replicas, "rollout replicas: GPUs ÷ GPUs per replica"),
    "hook": Label(len(HOOKS), "every registered hook: each counts when it runs"),
    "signal": Label(6, "metrics, samples, spans, tokens, profile, replay"),
    "verdict": Label(1, "one verdict at a time (the family is replaced)"),
    "detail": Label(1, "one verdict at a time (the family is replaced)"),
    "direction": Label(len(dm.DIRECTIONS), ", ".join(dm.DIRECTIONS)),
    "queue": Label(2, "transfer_queue, verl_message_queue"),
    "op": Label(2, "put, get"),
    "data_source": Label(
        MAX_DATA_SOURCES + 2, f"the first {MAX_DATA_SOURCES} sources named, other, unknown"
    ),
    "sign": Label(len(SIGNS), ", ".join(SIGNS)),
    "component": Label(MAX_REWARD_COMPONENTS, "reward_extra_info components kept per call"),
}
# The windows a worker-group call is made in (the data ledger's phase).
CALLING_PHASES = Label(
    12,
    "the windows verl 0.9.1 calls worker groups in: gen, gen_max, reward, old_log_prob, ref, "
    "values, update_critic, update_actor, update_weights, testing, save_checkpoint, step",
)
# Where a family's label means fewer values than the label's own bound.
FAMILY_LABELS: dict[str, dict[str, Label]] = {
    cat.AGENT_LOOP_LENGTH.name: {"kind": Label(len(LENGTH_KINDS), "prompt, response")},
    cat.SOURCE_LENGTH.name: {"kind": Label(len(LENGTH_KINDS), "prompt, response")},
    cat.ROLE_IDLE.name: {"role": Label(2, "trainer, rollout")},
    cat.DATA_MOVEMENT_SECONDS.name: {
        "phase": CALLING_PHASES,
        "stage": Label(len(dm.STAGES), ", ".join(dm.STAGES)),
    },
    cat.DATA_MOVEMENT_BYTES.name: {"phase": CALLING_PHASES},
    cat.SAMPLES_DISCARDED.name: {"reason": Label(len(DISCARD_REASONS), ", ".join(DISCARD_REASONS))},
    cat.INTEGRATION_FAILURES.name: {"hook": Label(len(HOOKS), "the hooks of the registry")},
    cat.INTEGRATION_HOOKS.name: {
        "hook": Label(len(HOOKS), "the hooks of the registry"),
        "state": Label(3, "attached, not_attached, not_applicable"),
    },
}
# Label sets of a family that are not the product of its labels' bounds.
FAMILY_SETS: dict[str, Label] = {
    cat.DROPPED.name: Label(48, "(signal, reason) pairs: 40 written in rlotel/ today"),
    cat.INTEGRATION_HOOKS.name: Label(len(HOOKS), "one state per hook of the registry"),
}
QUEUES = (cat.QUEUE_SECONDS.name, cat.QUEUE_BYTES.name, cat.QUEUE_OPS.name)
# Tallies kept outside the series store: not capped at max_metric_keys (bounded by the code).
UNCAPPED = frozenset(
    {
        cat.DROPPED.name,
        cat.INTEGRATION_EVENTS.name,
        cat.INTEGRATION_SECONDS.name,
        cat.INTEGRATION_FAILURES.name,
        *QUEUES,
    }
)


@dataclass(frozen=True)
class ProcessKind:
    name: str
    count: Callable[[Scale], int]
    families: frozenset[str] | None = None  # None: every catalogue family
    labels: dict[str, Label] | None = None  # this kind's own bounds


# Written by worker ranks only: their own compute vs collective seconds per phase.
WORKER_ONLY = frozenset({cat.RANK_COMPUTE.name, cat.RANK_COLLECTIVE.name})
DRIVER = ProcessKind(
    "driver (verl's trainer)",
    lambda scale: 1,
    frozenset(spec.name for spec in cat.CATALOGUE) - WORKER_ONLY,
)
# A Ray worker process per GPU rank writes its traced calls' open ages and stall flags, its
# compute and collective seconds per phase, its drops and hook counts; its samples and
# phases reach the driver's store (verl's zero-code path records samples in the trainer),
# not its own.
WORKER = ProcessKind(
    "each worker rank",
    lambda scale: scale.gpus,
    frozenset(
        {
            cat.PHASE_OPEN.name,
            cat.PHASE_STALLED.name,
            cat.RANK_PHASE_SECONDS.name,
            cat.DROPPED.name,
            cat.INTEGRATION_EVENTS.name,
            cat.INTEGRATION_SECONDS.name,
            cat.INTEGRATION_FAILURES.name,
            *QUEUES,
            *WORKER_ONLY,
        }
    ),
    {
        "phase": Label(12, "worker-group methods a rank runs (update_actor, …)"),
        "role": Label(1, "a fused worker's roles: its methods are counted across them in `phase`"),
    },
)
KINDS = (DRIVER, WORKER)


def label_bound(spec: cat.MetricSpec, label: str, kind: ProcessKind) -> Label:
    for table in ((kind.labels or {}), FAMILY_LABELS.get(spec.name, {}), LABELS):
        if label in table:
            return table[label]
    raise KeyError(f"no bound stated for label {label!r} of {spec.name}: add it to LABELS")


def cap_of(spec: cat.MetricSpec) -> int:
    """The most label sets one process keeps of a family."""
    return KEY_CAP if spec.name == cat.TRAIN_METRIC.name else CAP


def label_sets(spec: cat.MetricSpec, kind: ProcessKind, scale: Scale) -> int:
    """Distinct label sets of one family in one process of this kind (0: not written)."""
    if kind.families is not None and spec.name not in kind.families:
        return 0
    if spec.name in FAMILY_SETS:
        sets = FAMILY_SETS[spec.name].at(scale)
    else:
        sets = math.prod(label_bound(spec, label, kind).at(scale) for label in spec.labels)
    return sets if spec.name in UNCAPPED else min(sets, cap_of(spec))


def series_per_set(spec: cat.MetricSpec, nhcb: bool = False) -> int:
    if spec.kind != "histogram" or nhcb:
        return 1
    return len(spec.buckets) + 3  # each bound, +Inf, _sum, _count


def family_series(spec: cat.MetricSpec, kind: ProcessKind, scale: Scale, nhcb=False) -> int:
    return label_sets(spec, kind, scale) * series_per_set(spec, nhcb)


def process_series(kind: ProcessKind, scale: Scale, nhcb: bool = False) -> int:
    return sum(family_series(spec, kind, scale, nhcb) for spec in cat.CATALOGUE)


def capped(kind: ProcessKind, scale: Scale) -> list[str]:
    """Families whose stated label sets exceed the per-process cap at this scale."""
    over = []
    for spec in cat.CATALOGUE:
        if spec.name in UNCAPPED or (kind.families is not None and spec.name not in kind.families):
            continue
        if spec.name in FAMILY_SETS:
            sets = FAMILY_SETS[spec.name].at(scale)
        else:
            sets = math.prod(label_bound(spec, label, kind).at(scale) for label in spec.labels)
        if sets > cap_of(spec):
            over.append(spec.name)
    return over


@dataclass(frozen=True)
class RunBudget:
    scale: Scale
    per_process: dict[str, int]  # kind name → series in one such process
    processes: dict[str, int]  # kind name → how many
    scrape: int
    total: int
    total_nhcb: int
    total_no_drops: int  # a healthy run: nothing dropped, no hook failed: neither tally has series
    widest: tuple[str, int]  # the family with most label sets in one process
    widest_run: tuple[str, int]  # ... summed over the run's processes

    @property
    def samples_per_second(self) -> float:
        return self.total / SCRAPE_INTERVAL_S

    @property
    def tenant_share(self) -> float:
        return self.total / MIMIR_SERIES_PER_TENANT

    @property
    def runs_per_tenant(self) -> int:
        return MIMIR_SERIES_PER_TENANT // self.total


def budget(scale: Scale) -> RunBudget:
    per_process = {kind.name: process_series(kind, scale) for kind in KINDS}
    processes = {kind.name: kind.count(scale) for kind in KINDS}
    targets = sum(processes.values())
    scrape = SCRAPE_SERIES_PER_TARGET * targets

    def total(nhcb: bool) -> int:
        return scrape + sum(process_series(k, scale, nhcb) * k.count(scale) for k in KINDS)

    one = {
        spec.name: max(label_sets(spec, kind, scale) for kind in KINDS) for spec in cat.CATALOGUE
    }
    run = {
        spec.name: sum(label_sets(spec, kind, scale) * kind.count(scale) for kind in KINDS)
        for spec in cat.CATALOGUE
    }
    widest = max(one.items(), key=lambda item: item[1])
    widest_run = max(run.items(), key=lambda item: item[1])
    drops = sum(
        family_series(spec, k, scale) * k.count(scale)
        for spec in (cat.DROPPED, cat.INTEGRATION_FAILURES)
        for k in KINDS
    )
    return RunBudget(
        scale,
        per_process,
        processes,
        scrape,
        total(False),
        total(True),
        total(False) - drops,
        widest,
        widest_run,
    )


README_SCALES = (Scale(8), Scale(128), Scale(1000))


def _n(value: int) -> str:
    return f"{value:,}"


def markdown(scales: Sequence[Scale] = README_SCALES) -> str:
    """The docs/production.md table: what a run of each size puts into Prometheus (upper bounds)."""
    budgets = [budget(scale) for scale in scales]
    per_replica = "/".join(sorted({str(b.scale.gpus_per_replica) for b in budgets}))
    head = "| | " + " | ".join(f"{_n(b.scale.gpus)} GPUs" for b in budgets) + " |"
    rows = [
        head,
        "| --- |" + " ---: |" * len(budgets),
        (f"rollout replicas ({per_replica} GPUs each)", [_n(b.scale.replicas) for b in budgets]),
        ("series: the driver", [_n(b.per_process[DRIVER.name]) for b in budgets]),
        ("series: each worker rank", [_n(b.per_process[WORKER.name]) for b in budgets]),
        ("worker ranks", [_n(b.processes[WORKER.name]) for b in budgets]),
        (
            f"Prometheus' own, {SCRAPE_SERIES_PER_TARGET} per target",
            [_n(b.scrape) for b in budgets],
        ),
        ("**series per run**", [f"**{_n(b.total)}**" for b in budgets]),
        ("with NHCB histograms", [_n(b.total_nhcb) for b in budgets]),
        ("healthy: nothing dropped, no hook failed", [_n(b.total_no_drops) for b in budgets]),
        (
            f"of Mimir's {_n(MIMIR_SERIES_PER_TENANT)} per tenant",
            [f"{b.tenant_share:.1%}" for b in budgets],
        ),
        ("such runs per tenant", [_n(b.runs_per_tenant) for b in budgets]),
        (
            f"samples/s at a {SCRAPE_INTERVAL_S} s scrape (Mimir: {_n(MIMIR_SAMPLES_PER_SECOND)})",
            [_n(round(b.samples_per_second)) for b in budgets],
        ),
        (
            f"most label sets of a family, one process (SDK: {_n(OTEL_SDK_ATTRIBUTE_SETS)})",
            [f"{_n(b.widest[1])}" for b in budgets],
        ),
        (
            "most label sets of a family, whole run",
            [f"{_n(b.widest_run[1])}" for b in budgets],
        ),
    ]
    lines = [
        row if isinstance(row, str) else f"| {row[0]} | " + " | ".join(row[1]) + " |"
        for row in rows
    ]
    widest = {b.widest[0] for b in budgets} | {b.widest_run[0] for b in budgets}
    largest = budgets[-1]
    notes = [
        "",
        f"Widest families: {', '.join(f'`{name}`' for name in sorted(widest))}. "
        f"Largest on the driver at {_n(largest.scale.gpus)} GPUs: "
        + ", ".join(
            f"`{spec.name}` {_n(family_series(spec, DRIVER, largest.scale))}"
            for spec in sorted(
                cat.CATALOGUE,
                key=lambda s: -family_series(s, DRIVER, largest.scale),
            )[:4]
        )
        + ".",
    ]
    return "\n".join(lines + notes)


def families_table(scale: Scale) -> str:
    lines = [
        f"{'family':<48} {'labels':<24} {'driver':>8} {'worker':>8}",
    ]
    for spec in sorted(cat.CATALOGUE, key=lambda s: -family_series(s, DRIVER, scale)):
        lines.append(
            f"{spec.name:<48} {','.join(spec.labels) or '-':<24} "
            f"{family_series(spec, DRIVER, scale):>8} {family_series(spec, WORKER, scale):>8}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, help="one scale instead of the documented three")
    parser.add_argument("--gpus-per-replica", type=int, default=8)
    parser.add_argument("--families", action="store_true", help="per-family series")
    args = parser.parse_args(argv)
    scales = (Scale(args.gpus, args.gpus_per_replica),) if args.gpus else README_SCALES
    print(markdown(scales))
    for scale in scales:
        for kind in KINDS:
            for name in capped(kind, scale):
                print(
                    f"\n{_n(scale.gpus)} GPUs: {name} reaches the {CAP} label-set cap in "
                    f"the {kind.name} (raise max_metric_keys)"
                )
    if args.families:
        print()
        print(families_table(scales[-1]))


if __name__ == "__main__":
    main()
