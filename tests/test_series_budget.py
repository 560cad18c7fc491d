"""benchmarks/series_budget.py: series counted from the catalogue with a bound for every
label, bounds that hold for what rlotel really serves, and the docs table as the code
prints it."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import yaml
from opentelemetry.sdk.metrics._internal._view_instrument_match import (
    _DEFAULT_CARDINALITY_LIMIT,
)

import rlotel
from benchmarks import series_budget as sb
from rlotel.derive.goodput import DEFAULT_BUCKETS
from rlotel.integrations.registered import HOOKS, RAY_ACTOR_CLASS
from rlotel.schema import catalogue as cat
from tests.helpers import parse_exposition, scrape

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "production.md"
BEGIN, END = "<!-- series-budget:begin -->", "<!-- series-budget:end -->"
FAMILY_OF = {name: spec for spec in cat.CATALOGUE for name in spec.sample_names}


def served(tel: rlotel.Telemetry) -> dict[str, set[frozenset]]:
    """Label sets per catalogue family on /metrics (histograms: every `_bucket`, `_sum`,
    `_count` series counted)."""
    series: dict[str, set[frozenset]] = {}
    for name, labels in parse_exposition(scrape(tel.metrics_url)):
        spec = FAMILY_OF.get(name)
        if spec is not None:
            series.setdefault(spec.name, set()).add(frozenset({*labels, ("__name__", name)}))
    return series


def test_the_documented_table_is_what_the_code_prints():
    text = PAGE.read_text()
    assert BEGIN in text and END in text
    shown = text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip()
    assert shown == sb.markdown(), (
        "docs/production.md series table is stale: paste the output of "
        f"`python -m benchmarks.series_budget` between {BEGIN} and {END}"
    )


def test_every_catalogue_label_has_a_stated_bound():
    for spec in cat.CATALOGUE:
        for kind in sb.KINDS:
            for label in spec.labels:
                assert sb.label_bound(spec, label, kind).at(sb.Scale(8)) >= 1
    used = {label for spec in cat.CATALOGUE for label in spec.labels}
    assert set(sb.LABELS) <= used, f"bounds for labels no family has: {set(sb.LABELS) - used}"
    names = {spec.name for spec in cat.CATALOGUE}
    for table in (sb.FAMILY_LABELS, sb.FAMILY_SETS, sb.UNCAPPED, sb.WORKER.families):
        assert set(table) <= names


def test_the_limits_are_the_real_defaults():
    assert sb.OTEL_SDK_ATTRIBUTE_SETS == _DEFAULT_CARDINALITY_LIMIT
    assert rlotel.Config().max_metric_keys == sb.CAP
    prometheus = yaml.safe_load((ROOT / "collector" / "prometheus.yml").read_text())
    assert prometheus["global"]["scrape_interval"] == f"{sb.SCRAPE_INTERVAL_S}s"


def test_bounds_cover_the_names_in_the_code():
    scale = sb.Scale(8)
    assert sb.LABELS["phase"].at(scale) >= len(DEFAULT_BUCKETS) + 1  # + the step itself
    pairs = set()
    for path in (ROOT / "rlotel").rglob("*.py"):
        source = path.read_text()
        pairs |= set(re.findall(r'\.add\(\s*"(\w+)",\s*"(\w+)"', source))
    hooks = {hook.name for hook in HOOKS}  # every {hook} label is a registered hook's name
    assert pairs and hooks
    assert len(pairs) <= sb.FAMILY_SETS[cat.DROPPED.name].at(scale)
    assert len({signal for signal, _ in pairs}) <= sb.LABELS["signal"].at(scale)
    assert len(hooks) <= sb.LABELS["hook"].at(scale)


def test_histograms_and_the_cap_count_as_stated():
    scale = sb.Scale(1000, gpus_per_replica=1)  # 1,000 replicas: past the cap
    assert sb.label_sets(cat.ROLLOUT_OCCUPANCY, sb.DRIVER, scale) == sb.CAP
    assert cat.ROLLOUT_OCCUPANCY.name in sb.capped(sb.DRIVER, scale)
    assert sb.label_sets(cat.DROPPED, sb.WORKER, scale) == 48  # a tally: never capped
    assert sb.label_sets(cat.STEP_PHASE_SECONDS, sb.WORKER, scale) == 0  # not a worker's
    phases = sb.LABELS["phase"].at(scale)
    assert sb.family_series(cat.PHASE_DURATION, sb.DRIVER, scale) == phases * (
        len(cat.PHASE_DURATION.buckets) + 3
    )
    assert sb.family_series(cat.PHASE_DURATION, sb.DRIVER, scale, nhcb=True) == phases
    run = sb.budget(sb.Scale(1000))
    assert (
        run.total
        == run.scrape + run.per_process[sb.DRIVER.name] + 1000 * (run.per_process[sb.WORKER.name])
    )
    assert run.total_nhcb < run.total and run.total_no_drops < run.total


def test_a_driver_serves_no_more_than_its_bound(make_tel):
    """A verl-like trainer step with more names than a real one has: every family stays
    within its stated bound, and a histogram label set is buckets + 3 series."""
    tel = make_tel(n_gpus=8)
    rng = np.random.default_rng(0)
    phases = [name for name in DEFAULT_BUCKETS if not name.startswith("rollout_")]
    for number in (1, 2, 3):
        with tel.step(number) as step:
            for name in phases:
                with tel.phase(name):
                    if name == "gen":
                        tel.record_samples(
                            generate_sequences=rng.uniform(1, 60, 64),
                            tool_calls=rng.uniform(0, 5, 64),
                            compute_score=rng.uniform(0, 1, 64),
                            num_preempted=np.zeros(64, dtype=int),
                            prompt_length=rng.integers(10, 500, 64),
                            response_length=rng.integers(10, 4000, 64),
                            min_weight_version=np.full(64, number - 1),
                            max_weight_version=np.full(64, number - 1),
                        )
                        tel.record_samples(generate_sequences=[1.0, 2.0], discarded="stale")
                    if name == "update_actor":
                        tel.record_rank_seconds({rank: 1.0 + rank / 10 for rank in range(8)})
            step.set_tokens(prompt=[100] * 8, response=[900] * 8)
            step.set_mfu(actor=0.4, critic=0.3)
        budget = rlotel.Config().max_log_keys
        keys = {f"actor/key_{i}": float(i) for i in range(budget + 50)}  # past the budget
        tel.log({**keys, "val-core/score": 1.0}, step=number)
    assert tel.flush(10)
    series = served(tel)
    scale = sb.Scale(8)
    assert len(series[cat.TRAIN_METRIC.name]) == budget + 1  # and the validation key
    for name, found in series.items():
        spec = cat.BY_NAME[name]
        assert len(found) <= sb.family_series(spec, sb.DRIVER, scale), name
        if spec.kind == "histogram":
            sets = {frozenset(kv for kv in s if kv[0] not in ("le", "__name__")) for s in found}
            assert len(found) == len(sets) * sb.series_per_set(spec), name
    assert sum(map(len, series.values())) <= sb.process_series(sb.DRIVER, scale)


def test_a_worker_serves_only_the_worker_families(make_tel):
    """A Ray worker's telemetry: phases under the driver's context, no steps of its own."""
    tel = make_tel(resource_attributes={"rl.role": "actor", "rl.rank": 3})
    carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    for name in ("generate_sequences", "compute_log_prob", "update_actor"):
        with tel.phase(name, context=carrier):
            RAY_ACTOR_CLASS.fired()
            if name != "update_actor":
                continue
            deadline = time.monotonic() + 10
            while (cat.PHASE_OPEN.name, name) not in {
                (family, dict(labels).get("phase"))
                for family, found in served(tel).items()
                for labels in found
            }:  # open ages are written on the publisher's tick while the phase is open
                assert time.monotonic() < deadline, f"{name}: no open age served"
                time.sleep(0.05)
    tel.drops.add("spans", "bad_context", "a carrier that did not parse")  # a tally
    assert tel.flush(10)
    series = served(tel)
    assert set(series) <= sb.WORKER.families, set(series) - sb.WORKER.families
    for name, found in series.items():
        assert len(found) <= sb.family_series(cat.BY_NAME[name], sb.WORKER, sb.Scale(8))
