"""The two-tier Collector (collector/otelcol-tier1-loadbalancer.yaml → otelcol-tier2-sampler.yaml)
holds together: components and fields contrib 0.144.0 accepts, pipelines that name defined
components, and sampling policies that name attributes rlotel emits — checked by applying
the policies to spans rlotel really makes."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import threading
import time
from typing import Any

import pytest
import yaml
from opentelemetry.trace import StatusCode

from rlotel.integrations.data_moves import RankReply
from rlotel.record.samples import DURATION_FIELDS
from rlotel.schema import attributes as attr
from tests.helpers import finished_spans
from tests.otelcol_schema import (
    LOADBALANCING_EXPORTER,
    OTTL_ERROR_MODES,
    RESOURCE_ACTIONS,
    ROUTING_KEYS,
    STATUS_CODES,
    component_errors,
    field_errors,
)
from tests.test_stack_configs import (
    COLLECTOR,
    OTELCOL,
    ROOT,
    collector_errors,
    host_port,
    load,
    seconds,
    services,
)

TIER1 = COLLECTOR / "otelcol-tier1-loadbalancer.yaml"
TIER2 = COLLECTOR / "otelcol-tier2-sampler.yaml"
RULES = COLLECTOR / "rules" / "rlotel.rules.yml"

# Span and resource attribute names rlotel emits: attributes.py's constants, and the
# per-sample duration attributes it derives (`rl.sample.<stage>_s`).
RLOTEL_ATTRIBUTES = {
    value
    for name, value in vars(attr).items()
    if name.isupper() and isinstance(value, str) and "." in value
} | {attr.sample_attribute(field, True) for field in DURATION_FIELDS}

# The restricted OTTL the policies use, and this test evaluates: clauses joined by `and`.
_CLAUSE = re.compile(
    r'^(?:attributes\["(?P<key>[^"]+)"\]|(?P<name>name))\s*(?P<op>==|!=|>=|<=|>|<)\s*'
    r'(?:"(?P<string>[^"]*)"|(?P<number>-?\d+(?:\.\d+)?))$'
)


def tier1() -> dict[str, Any]:
    return load(TIER1)


def tier2() -> dict[str, Any]:
    return load(TIER2)


def policies() -> list[dict[str, Any]]:
    return tier2()["processors"]["tail_sampling"]["policies"]


def ottl_clauses(condition: str) -> list[re.Match]:
    clauses = [_CLAUSE.match(part.strip()) for part in condition.split(" and ")]
    assert all(clauses), f"not the OTTL subset this test evaluates: {condition!r}"
    return clauses  # type: ignore[return-value]


def policy_keys(policy: dict[str, Any]) -> set[str]:
    """The attribute keys a policy reads."""
    block = policy.get(policy["type"]) or {}
    keys = {block["key"]} if "key" in block else set()
    for condition in block.get("span", []) if policy["type"] == "ottl_condition" else []:
        keys |= {clause["key"] for clause in ottl_clauses(condition) if clause["key"]}
    return keys


def rule_threshold(record: str) -> float:
    (expr,) = [
        rule["expr"]
        for group in load(RULES)["groups"]
        for rule in group["rules"]
        if rule.get("record") == record
    ]
    match = re.fullmatch(r"vector\(([\d.]+)\)", expr.strip())
    assert match, expr
    return float(match.group(1))


def ottl_threshold(policy_name: str, key: str) -> float:
    (policy,) = [p for p in policies() if p["name"] == policy_name]
    values = [
        float(clause["number"])
        for condition in policy["ottl_condition"]["span"]
        for clause in ottl_clauses(condition)
        if clause["key"] == key and clause["op"] == ">"
    ]
    assert len(values) == 1, policy
    return values[0]


# --- the collector would start ---------------------------------------------------------


@pytest.mark.parametrize("path", [TIER1, TIER2], ids=lambda p: p.name)
def test_pipelines_reference_defined_components(path):
    assert collector_errors(load(path)) == []


@pytest.mark.parametrize("path", [TIER1, TIER2], ids=lambda p: p.name)
def test_components_use_only_fields_contrib_0_144_knows(path):
    assert component_errors(load(path)) == []


@pytest.mark.parametrize("path", [TIER1, TIER2], ids=lambda p: p.name)
def test_memory_limiter_comes_first_in_every_pipeline(path):
    for name, pipeline in load(path)["service"]["pipelines"].items():
        assert pipeline["processors"][0] == "memory_limiter", name


def test_the_schema_check_rejects_what_0_144_would():
    broken = tier2()
    sampler = broken["processors"]["tail_sampling"]
    sampler["sampling_strategy"] = "span-ingest"  # 0.149.0
    sampler["policies"].append({"name": "x", "type": "not", "not": {}})  # not pinned to 0.144
    sampler["policies"][0]["status_code"]["codes"] = ["ERROR"]  # a misspelt field
    lb = tier1()
    lb["exporters"]["loadbalancing"]["resolver"]["dns"]["hostnames"] = ["a"]
    assert sorted(component_errors(broken) + component_errors(lb)) == [
        "exporters.loadbalancing.resolver.dns.hostnames: not a field of this component in "
        "contrib 0.144.0",
        "processors.tail_sampling.policies[0].status_code.codes: not a field of this component "
        "in contrib 0.144.0",
        "processors.tail_sampling.policies[7]: policy type 'not' is not one of contrib 0.144.0's",
        "processors.tail_sampling.sampling_strategy: not a field of this component in contrib "
        "0.144.0",
    ]


def test_the_documented_k8s_resolver_is_valid_too():
    """The commented-out `k8s:` alternative in tier 1 parses and uses known fields."""
    text = TIER1.read_text()
    block = text[text.index("replace `dns:` above with:") :].splitlines()[1:]
    lines = []
    for line in block:
        if not line.strip().startswith("#   "):
            break
        lines.append(line.strip()[4:])
    resolver = yaml.safe_load("\n".join(lines))
    assert set(resolver) == {"k8s"}
    assert field_errors(resolver, LOADBALANCING_EXPORTER["resolver"], "resolver") == []
    assert resolver["k8s"]["ports"] == [tier2_otlp_port()]


def tier2_otlp_port() -> int:
    return host_port(tier2()["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])[1]


# --- tier 1 routes whole traces to tier 2 ------------------------------------------------


def test_tier1_routes_traces_by_trace_id_to_tier2s_receiver():
    config = tier1()
    lb = config["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "traceID" and lb["routing_key"] in ROUTING_KEYS
    assert "endpoint" not in lb["protocol"]["otlp"], "the resolver sets each backend's endpoint"
    assert int(lb["resolver"]["dns"]["port"]) == tier2_otlp_port()
    for name, pipeline in config["service"]["pipelines"].items():
        if "loadbalancing" in pipeline["exporters"]:
            assert name.split("/")[0] == "traces", "trace-id routing is for spans only"
    assert not any(p.split("/")[0] == "tail_sampling" for p in config.get("processors", {}))
    assert "loadbalancing" not in tier2().get("exporters", {})


def test_tier1_accepts_what_rlotel_processes_send():
    protocols = tier1()["receivers"]["otlp"]["protocols"]
    assert host_port(protocols["grpc"]["endpoint"]) == ("0.0.0.0", 4317)
    assert host_port(protocols["http"]["endpoint"]) == ("0.0.0.0", 4318)  # rlotel's default
    pipelines = tier1()["service"]["pipelines"]
    assert "otlp" in pipelines["metrics"]["receivers"], "rlotel also pushes OTLP metrics"


# --- tier 2's sampling decisions ------------------------------------------------------------


def test_tail_sampling_timing_fits_rl_steps():
    sampler = tier2()["processors"]["tail_sampling"]
    wait, after_root = (
        seconds(sampler["decision_wait"]),
        seconds(sampler["decision_wait_after_root_received"]),
    )
    # The processor only ever moves a decision earlier: a root wait ≥ decision_wait is inert.
    assert 0 < after_root < wait
    assert wait >= rule_threshold("rlotel:alert_stall_threshold:seconds")
    cache = sampler["decision_cache"]["sampled_cache_size"]
    assert cache >= 10 * sampler["num_traces"], "docs/production.md asks for ≫ num_traces"


def test_policies_name_attributes_rlotel_emits():
    read = {key for policy in policies() for key in policy_keys(policy)}
    assert read, "no policy reads an attribute"
    assert read <= RLOTEL_ATTRIBUTES, read - RLOTEL_ATTRIBUTES
    deleted = {
        action["key"]
        for action in tier2()["processors"]["resource/spanmetrics"]["attributes"]
        if action["key"].startswith("rl.")
    }
    assert deleted <= RLOTEL_ATTRIBUTES, deleted - RLOTEL_ATTRIBUTES
    assert {attr.RANK, attr.NODE, attr.NODE_ID} <= deleted


def test_policy_values_are_valid():
    for policy in policies():
        block = policy.get(policy["type"]) or {}
        if policy["type"] == "status_code":
            assert set(block["status_codes"]) <= STATUS_CODES
        if policy["type"] == "ottl_condition":
            assert block["error_mode"] in OTTL_ERROR_MODES
        if policy["type"] == "boolean_attribute":
            assert isinstance(block["value"], bool)
        assert not block.get("invert_match"), "0.144 disables invert decisions: use drop"
    (baseline,) = [p for p in policies() if p["type"] == "probabilistic"]
    assert 0 < baseline["probabilistic"]["sampling_percentage"] <= 10, "a small random share"
    for action in tier2()["processors"]["resource/spanmetrics"]["attributes"]:
        assert action["action"] in RESOURCE_ACTIONS


def test_sampling_thresholds_are_the_alerts_thresholds():
    for policy, key in (
        ("straggler-rank", attr.RANK_SPREAD),
        ("straggler-compute", attr.RANK_COMPUTE_SPREAD),
    ):
        assert ottl_threshold(policy, key) == rule_threshold(
            "rlotel:alert_rank_spread_threshold:ratio"
        )
    slow_key = attr.sample_attribute("generate_sequences", True)
    assert ottl_threshold("slow-sample", slow_key) == rule_threshold(
        "rlotel:alert_gen_p99_threshold:seconds"
    )


def test_span_metrics_match_the_single_collector_and_come_before_sampling():
    config = tier2()
    assert config["connectors"]["spanmetrics"] == load(OTELCOL)["connectors"]["spanmetrics"]
    pipelines = config["service"]["pipelines"]
    (feeding,) = [p for p in pipelines.values() if "spanmetrics" in p["exporters"]]
    assert "tail_sampling" not in feeding["processors"], "span metrics must see every span"
    (sampled,) = [p for p in pipelines.values() if "tail_sampling" in p["processors"]]
    assert "spanmetrics" not in sampled["exporters"]


def test_compose_runs_the_two_tiers():
    names = set(services())
    tier2_host = tier1()["exporters"]["loadbalancing"]["resolver"]["dns"]["hostname"]
    assert tier2_host in names
    tempo_host = host_port(tier2()["exporters"]["otlp_grpc/tempo"]["endpoint"])[0]
    assert tempo_host in names
    scale = {name: s for name, s in services().items() if "scale" in s.get("profiles", [])}
    mounted = {volume.split(":")[0] for s in scale.values() for volume in s.get("volumes", [])}
    assert {f"./{TIER1.relative_to(ROOT)}", f"./{TIER2.relative_to(ROOT)}"} <= mounted
    assert scale[tier2_host]["deploy"]["replicas"] >= 2, "DNS must resolve to several backends"


# --- the policies keep what they should, on spans rlotel really makes ---------------------


def _ottl_true(condition: str, span) -> bool:
    for clause in ottl_clauses(condition):
        value = span.name if clause["name"] else (span.attributes or {}).get(clause["key"])
        if clause["string"] is not None:
            expected: Any = clause["string"]
            if not isinstance(value, str):
                return False
        else:
            expected = float(clause["number"])
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return False  # OTTL: a missing or non-numeric value compares false
        ok = {
            "==": value == expected,
            "!=": value != expected,
            ">": value > expected,
            ">=": value >= expected,
            "<": value < expected,
            "<=": value <= expected,
        }[clause["op"]]
        if not ok:
            return False
    return True


def _matches(policy: dict[str, Any], spans: list) -> bool:
    kind, block = policy["type"], policy.get(policy["type"]) or {}
    if kind == "status_code":
        return any(s.status.status_code.name in block["status_codes"] for s in spans)
    if kind == "boolean_attribute":
        return any(
            (s.attributes or {}).get(block["key"]) is block["value"]
            or s.resource.attributes.get(block["key"]) is block["value"]
            for s in spans
        )
    if kind == "ottl_condition":
        return any(_ottl_true(c, s) for s in spans for c in block["span"])
    raise AssertionError(f"this test does not evaluate {kind} policies")


def kept_by(spans: list) -> set[str]:
    """Names of the deterministic policies (not the random share) that keep these spans."""
    return {p["name"] for p in policies() if p["type"] != "probabilistic" and _matches(p, spans)}


def by_step(spans: list) -> dict[int, list]:
    traces: dict[int, list] = {}
    for span in spans:
        traces.setdefault(span.context.trace_id, []).append(span)
    steps = {}
    for trace in traces.values():
        (number,) = {s.attributes[attr.STEP] for s in trace if attr.STEP in (s.attributes or {})}
        steps[number] = trace
    return steps


def test_each_policy_keeps_the_step_it_is_for_and_no_healthy_one(make_tel, span_exporter):
    tel = make_tel(
        max_sample_spans=2,
        stall_after_s=0.3,
    )
    with tel.step(1):  # healthy: balanced ranks, fast samples
        with tel.phase("gen"):
            tel.record_samples(generate_sequences=[2.0, 3.0, 5.0])
            time.sleep(0.02)
        with tel.phase("update_actor"):
            tel.record_rank_seconds({0: 1.0, 1: 1.1, 2: 1.05, 3: 1.0})
    with pytest.raises(RuntimeError), tel.step(2), tel.phase("update_actor"):
        raise RuntimeError("a rank died")
    with tel.step(3), tel.phase("update_actor"):  # one rank twice as slow as the median
        tel.record_rank_seconds({0: 1.0, 1: 1.0, 2: 1.0, 3: 2.0})
    with tel.step(4), tel.phase("gen"):  # one trajectory generating for 200 s
        tel.record_samples(generate_sequences=[3.0, 200.0, 4.0])
    with tel.step(6), tel.phase("update_actor"):  # replies together, rank 2 computed 3x
        tel.record_rank_seconds({0: 1.5, 1: 1.5, 2: 1.5})
        tel.record_rank_compute(
            {
                rank: RankReply(None, compute, 1.5 - compute)
                for rank, compute in enumerate((0.5, 0.5, 1.5))
            }
        )
    release = threading.Event()

    def hang() -> None:
        with tel.step(5), tel.phase("gen"):
            release.wait(10)

    hung = threading.Thread(target=hang)
    hung.start()
    try:
        deadline = time.monotonic() + 10
        while not tel.stalled:
            assert time.monotonic() < deadline, "the phase never stalled"
            time.sleep(0.05)
        assert tel.flush(10)  # the partial spans are out while the step hangs
    finally:
        release.set()
        hung.join(10)

    steps = by_step(finished_spans(tel, span_exporter))
    kept = {number: kept_by(spans) for number, spans in steps.items()}
    assert kept == {
        1: set(),
        2: {"errors", "incomplete"},
        3: {"straggler-rank"},
        4: {"slow-sample"},
        5: {"incomplete", "stalled"},
        6: {"straggler-compute"},
    }
    # What the policies read has the type they compare (OTTL: doubles, not strings).
    (spread,) = [
        s.attributes[attr.RANK_SPREAD] for s in steps[3] if attr.RANK_SPREAD in s.attributes
    ]
    assert isinstance(spread, float) and spread == pytest.approx(2.0)
    assert any(s.status.status_code is StatusCode.ERROR for s in steps[2])


def test_the_evaluator_refuses_ottl_it_does_not_understand():
    with pytest.raises(AssertionError, match="OTTL subset"):
        ottl_clauses('IsMatch(name, "samp.*")')
    policy = copy.deepcopy(policies()[0])
    policy["type"] = "latency"
    with pytest.raises(AssertionError, match="does not evaluate latency"):
        _matches(policy, [])


# --- docs/production.md: the Prometheus snippets ----------------------------------------


def page_yaml_after(marker: str) -> dict[str, Any]:
    text = (ROOT / "docs" / "production.md").read_text()
    after = text[text.index(marker) :]
    block = after[after.index("```yaml\n") + len("```yaml\n") :]
    return yaml.safe_load(block[: block.index("```")])


def test_documented_nhcb_snippet_is_a_scrape_config_of_the_rlotel_job():
    snippet = page_yaml_after("<!-- prometheus 3: nhcb -->")
    (job,) = snippet["scrape_configs"]
    jobs = {j["job_name"] for j in load(COLLECTOR / "prometheus.yml")["scrape_configs"]}
    assert job["job_name"] in jobs
    assert job["convert_classic_histograms_to_nhcb"] is True


@pytest.mark.slow
def test_documented_remote_write_snippet_passes_promtool(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: `make system-deps` installs it"
    config = load(COLLECTOR / "prometheus.yml")
    snippet = page_yaml_after("<!-- checked: remote_write -->")
    assert set(snippet) == {"remote_write"}
    config.update(snippet)
    config["rule_files"] = [str(COLLECTOR / rules) for rules in config["rule_files"]]
    merged = tmp_path / "prometheus.yml"
    merged.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [promtool, "check", "config", str(merged)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
