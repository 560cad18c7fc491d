"""Multi-node: Ray's own test cluster (a head and worker raylets, distinct node ids and
resources, loopback only) and verl 0.9.1's real RayWorkerGroup with a rank on each node.

Every process's `/metrics` is found from one place (the driver's `/targets`, Prometheus
HTTP SD, scraped by a real Prometheus), traces reach one OTLP receiver with no shared
filesystem, a worker node whose clock is 2 s ahead is aligned back onto the driver's
clock, and a node that dies mid-step closes the phase as ERROR and leaves discovery."""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import ray
from google.protobuf.json_format import MessageToDict
from ray.cluster_utils import Cluster
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
)
from verl.utils.profiler import marked_timer

import rlotel
from rlotel.integrations import ray as ray_integration
from rlotel.integrations import verl as plugin
from rlotel.offline import analyze, perfetto
from rlotel.offline.otlp_json import STATUS_ERROR, SpanRecord
from tests.helpers import scrape
from tests.otlp_receiver import HttpReceiver
from tests.promserver import Prometheus

# A Ray cluster of several raylets and verl worker processes (slow), judged in wall time
# (timing): the clock offset's uncertainty (half a round trip, < 0.1 s), a dead node's call
# failing (< 30 s) and the shutdown after it (≤ 5 s). The whole module, so the cluster
# starts once, after the real runs.
pytestmark = [pytest.mark.slow, pytest.mark.timing]

SHIFT_S = 2.0  # the worker node's clock is this far ahead (rlotel's test-only hook)
REPO = str(Path(rlotel.__file__).resolve().parents[1])


class NodeWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_policy(self, seconds: float) -> str:
        timing_raw: dict[str, float] = {}
        with marked_timer("forward_backward", timing_raw):
            time.sleep(seconds)
        return ray.get_runtime_context().get_node_id()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def where(self) -> tuple[str, str]:
        import rlotel as imported

        return ray.get_runtime_context().get_node_id(), imported.__file__


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Head (the driver's node) + node A, whose clock runs SHIFT_S ahead; OTLP export only
    (no traces directory: nothing shared between nodes but the network)."""
    receiver = HttpReceiver()
    saved = dict(os.environ)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback only
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "RLOTEL_TRACES_DIR", "RAY_ADDRESS"):
        os.environ.pop(name, None)
    fast_failure = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}
    nodes = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "resources": {"head": 1},
            "include_dashboard": False,
            "_system_config": fast_failure,
        },
    )
    node_a = nodes.add_node(
        num_cpus=2,
        resources={"node_a": 1},
        env_vars={"RLOTEL_TEST_CLOCK_SHIFT_S": str(SHIFT_S)},
    )
    plugin.install()
    ray.init(
        address=nodes.address,
        log_to_driver=False,
        runtime_env={
            "env_vars": {
                "RLOTEL_ENABLE": "1",
                "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                "RLOTEL_PROMETHEUS_SD_DIR": str(tmp_path_factory.mktemp("sd")),
                "PYTHONPATH": os.pathsep.join(filter(None, (REPO, os.environ.get("PYTHONPATH")))),
            }
        },
    )
    try:
        yield nodes, node_a, receiver
    finally:
        ray.shutdown()
        plugin.uninstall()
        tel = rlotel.current()
        if tel is not None:
            tel.shutdown()
        nodes.shutdown()
        receiver.stop()
        os.environ.clear()
        os.environ.update(saved)


def spread_group() -> RayWorkerGroup:
    """One rank per node: each node has 2 CPUs, each placement group asks for 2. verl waits
    for its placement groups without a timeout: fail instead when the CPUs never free up."""
    wait_until(
        lambda: ray.available_resources().get("CPU", 0) >= 4 or None,
        60,
        "both nodes' CPUs free for the worker group's placement groups",
    )
    return RayWorkerGroup(
        resource_pool=RayResourcePool([1, 1], use_gpu=False, max_colocate_count=2),
        ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(NodeWorker)),
        device_name="cpu",
    )


def release(group: RayWorkerGroup) -> None:
    for worker in group.workers:
        ray.kill(worker)
    for pg in group.resource_pool.pgs or ():
        ray.util.remove_placement_group(pg)


def targets(url: str) -> list[dict]:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.headers["Content-Type"] == "application/json"
        return json.load(response)


def wait_until(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s}s")
        time.sleep(0.1)


def received_spans(receiver: HttpReceiver, out: Path) -> list[SpanRecord]:
    """What the OTLP receiver got, as an OTLP/JSON lines file (what a Collector's file
    exporter writes), read back by `rlotel analyze` (which aligns the clocks)."""
    with receiver.lock:
        requests = list(receiver.requests)
    with out.open("w") as lines:
        for request in requests:
            data = MessageToDict(request, use_integers_for_enums=True)
            for resource_spans in data.get("resourceSpans", []):
                for scope_spans in resource_spans.get("scopeSpans", []):
                    for span in scope_spans.get("spans", []):
                        for key in ("traceId", "spanId", "parentSpanId"):
                            if span.get(key):
                                span[key] = base64.b64decode(span[key]).hex()
            lines.write(json.dumps(data) + "\n")
    return analyze.load_run(out).spans


def test_a_worker_group_over_two_nodes_is_discovered_traced_and_on_one_clock(cluster, tmp_path):
    nodes, node_a, receiver = cluster
    tel = rlotel.init(run="mn", prometheus_port=0, resource_attributes={"rl.role": "driver"})
    directory = ray_integration.serve_targets(tel, file_sd=tmp_path / "cluster_sd.json")
    assert directory.url == tel.metrics_url.replace("/metrics", "/targets")
    group = spread_group()
    placed = group.where()
    node_of_rank = [node for node, _ in placed]
    assert node_of_rank[0] != node_of_rank[1]  # one rank per raylet
    assert set(node_of_rank) == {nodes.head_node.node_id, node_a.node_id}
    assert {path for _, path in placed} == {rlotel.__file__}  # the workers run this checkout
    shifted_rank = node_of_rank.index(node_a.node_id)

    with tel.phase("init_model"):  # the first traced call: workers start, t1 travels
        group.update_policy(0.0)
    for number in (1, 2):  # the second carries t4: the offset is known from here on
        with tel.step(number), tel.phase("update_actor"):
            assert group.update_policy(0.3) == node_of_rank
    assert tel.flush(10)

    # --- one place: the driver's /targets lists every process, reachable, labelled -------
    def all_three() -> list[dict] | None:
        found = targets(directory.url)
        return found if len(found) == 3 else None

    listed = wait_until(all_three, 10, "3 targets")
    workers = {
        entry["labels"]["rank"]: entry for entry in listed if entry["labels"]["role"] != "driver"
    }
    assert sorted(workers) == ["0", "1"]
    for rank, entry in workers.items():
        assert entry["labels"]["role"] == "NodeWorker"
        assert entry["labels"]["node_id"] == node_of_rank[int(rank)]
        assert entry["labels"]["node"] == "127.0.0.1"  # Ray's node address (loopback here)
    for entry in listed:
        (target,) = entry["targets"]
        assert not target.startswith("0.0.0.0")
        assert 'run="mn"' in scrape(f"http://{target}/metrics")  # rlotel, this run
    assert json.loads((tmp_path / "cluster_sd.json").read_text()) == listed  # file SD too

    # --- a real Prometheus finds and scrapes them through HTTP SD ----------------------------
    prometheus = Prometheus(
        tmp_path,
        [],
        config={
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {
                    "job_name": "rlotel",
                    "http_sd_configs": [{"url": directory.url, "refresh_interval": "1s"}],
                }
            ],
        },
    )
    try:
        prometheus.wait_for('count(up{job="rlotel", role="NodeWorker"} == 1)', 2, timeout_s=20)
        prometheus.wait_for('count(count by (node_id) (up{job="rlotel"} == 1))', 2)
        # each rank's own seconds, from its own node (the per-rank series)
        per_rank = 'rlotel_rank_phase_seconds{run="mn", phase="update_policy"}'
        prometheus.wait_for(f"count(count by (rank, node_id) ({per_rank}))", 2)
        assert {r["metric"]["node_id"] for r in prometheus.query(per_rank)} == set(node_of_rank)
        spans = received_spans(receiver, tmp_path / "collector.jsonl")

        # --- one clock ---------------------------------------------------------------------
        (phase,) = [s for s in spans if s.name == "update_actor" and s.attributes["rl.step"] == 2]
        children = {
            s.resource["rl.rank"]: s
            for s in spans
            if s.name == "update_policy" and s.parent_span_id == phase.span_id
        }
        assert sorted(children) == [0, 1]
        shifted = children[shifted_rank]
        offsets = {
            s.resource["rl.rank"]: (
                s.attributes["rl.clock.offset_ns"],
                s.attributes["rl.clock.uncertainty_ns"],
            )
            for s in spans
            if "rl.clock.offset_ns" in s.attributes
        }
        offset, uncertainty = offsets[shifted_rank]
        assert abs(offset - SHIFT_S * 1e9) <= uncertainty  # the true offset lies within ± it
        assert uncertainty < 0.1e9
        other_offset, other_uncertainty = offsets[1 - shifted_rank]
        assert abs(other_offset) <= other_uncertainty < 0.1e9  # the head node: same clock
        for rank, child in children.items():  # aligned: inside the driver's phase (the end
            slack = offsets[rank][1]  # to within the measurement's uncertainty, ms here)
            assert phase.start_ns <= child.start_ns <= child.end_ns <= phase.end_ns + slack
        shown = {r: (o / 1e6, u / 1e6) for r, (o, u) in sorted(offsets.items())}
        print(f"clock offsets (ms, ± ms) by rank: {shown}")
        raw = {s.span_id: s for s in analyze.load_run(tmp_path / "collector.jsonl").spans}
        assert raw[shifted.span_id] == shifted  # load_run is what analyze/report/perfetto read
        unaligned = [
            span
            for request in [receiver.spans()]
            for span, _ in request
            if span.span_id.hex() == shifted.span_id
        ]
        assert unaligned[0].start_time_unix_nano > phase.end_ns  # as exported: 2 s late

        out = tmp_path / "trace.json"
        perfetto.write_perfetto(tmp_path / "collector.jsonl", out)
        events = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"]
        (driver_phase,) = [e for e in events if e["args"]["span_id"] == phase.span_id]
        worker_calls = [e for e in events if e["args"].get("parent_span_id") == phase.span_id]
        assert len(worker_calls) == 2
        for event in worker_calls:
            assert driver_phase["ts"] <= event["ts"]
            slack_us = max(u for _, u in offsets.values()) / 1000
            assert event["ts"] + event["dur"] <= driver_phase["ts"] + driver_phase["dur"] + slack_us

        # --- a killed actor leaves discovery within one scrape interval --------------------
        victim = group.workers[shifted_rank]
        killed = time.monotonic()
        ray.kill(victim)
        wait_until(
            lambda: len(targets(directory.url)) == 2, ray_integration.TARGET_TTL_S + 2, "gone"
        )
        gone_s = time.monotonic() - killed
        remaining = targets(directory.url)
        assert str(shifted_rank) not in {
            e["labels"]["rank"] for e in remaining if e["labels"]["role"] != "driver"
        }
        prometheus.wait_for('count(up{job="rlotel", role="NodeWorker"})', 1, timeout_s=10)
        print(f"killed actor's target gone from /targets after {gone_s:.1f}s")
    finally:
        prometheus.stop()
        release(group)
        tel.shutdown()


def test_a_node_dying_mid_step_closes_the_phase_and_leaves_discovery(cluster, tmp_path):
    nodes, _, receiver = cluster
    tel = rlotel.init(run="mn-fault", prometheus_port=0, resource_attributes={"rl.role": "driver"})
    directory = ray_integration.serve_targets(tel)
    group = spread_group()
    node_of_rank = [node for node, _ in group.where()]
    assert len(set(node_of_rank)) == 2  # one rank per node, one of them not the driver's
    (doomed,) = [node for node in nodes.worker_nodes if node.node_id in node_of_rank]
    (survivor,) = [node for node in node_of_rank if node != doomed.node_id]
    with tel.phase("init_model"):
        group.update_policy(0.0)
    wait_until(lambda: len(targets(directory.url)) == 3, 10, "3 targets")

    removed: list[float] = []

    def kill_node() -> None:
        time.sleep(1.0)
        removed.append(time.monotonic())
        nodes.remove_node(doomed, allow_graceful=False)

    killer = threading.Thread(target=kill_node)
    killer.start()
    started = time.monotonic()
    with pytest.raises(ray.exceptions.RayError):
        with tel.step(1), tel.phase("update_actor"):
            group.update_policy(4.0)
    failed_s = time.monotonic() - started
    killer.join()
    assert failed_s < 30  # the call fails; nothing hangs
    wait_until(
        lambda: doomed.node_id not in {e["labels"]["node_id"] for e in targets(directory.url)},
        ray_integration.TARGET_TTL_S + 2,
        "dead node's targets gone",
    )
    gone_s = time.monotonic() - removed[0]
    assert [
        e["labels"]["node_id"] for e in targets(directory.url) if e["labels"]["role"] != "driver"
    ] == [survivor]

    shutdown_started = time.monotonic()
    tel.shutdown()
    shutdown_s = time.monotonic() - shutdown_started
    assert shutdown_s <= 5
    wait_until(
        lambda: [
            s
            for s in received_spans(receiver, tmp_path / "collector.jsonl")
            if s.name == "update_actor" and s.attributes.get("rl.run") == "mn-fault"
        ],
        10,
        "the driver's phase exported",
    )
    (phase,) = [
        s
        for s in received_spans(receiver, tmp_path / "collector.jsonl")
        if s.name == "update_actor" and s.attributes.get("rl.run") == "mn-fault"
    ]
    assert phase.status_code == STATUS_ERROR
    print(
        f"node death: call failed after {failed_s:.1f}s, targets gone {gone_s:.1f}s after, "
        f"shutdown {shutdown_s:.2f}s"
    )
    release(group)
