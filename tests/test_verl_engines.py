"""verl's own `rollout.prometheus` writer, with the plugin on, gives every engine target the
`replica` and `run` that rlotel's engine row and engine alerts group by."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from rlotel.integrations import verl_engines
from rlotel.integrations.registered import ROLLOUT_REPLICA
from rlotel.schema import engine_metrics as eng

ROOT = Path(__file__).resolve().parents[1]

# The config verl 0.9.1's `update_prometheus_config` writes (verl/workers/rollout/utils.py).
VERL_CONFIG = {
    "global": {"scrape_interval": "10s", "evaluation_interval": "10s"},
    "scrape_configs": [
        {
            "job_name": "ray",
            "file_sd_configs": [{"files": ["/tmp/ray/prom_metrics_service_discovery.json"]}],
        },
        {
            "job_name": "rollout",
            "static_configs": [{"targets": ["10.0.0.7:8000", "10.0.0.8:8000"]}],
        },
    ],
}


class Replica:  # what the labelling reads of verl's RolloutReplica
    def __init__(self, rank: int, address: str) -> None:
        self.replica_rank, self._server_address = rank, address


def test_the_rollout_job_gets_one_labelled_group_per_engine():
    keep = [Replica(5, "10.0.0.8:8000")]  # a manager that starts at a later rank
    for replica in keep:
        verl_engines.note_replica(replica)
    try:
        labelled = verl_engines.labelled_config(VERL_CONFIG, "exp1")
    finally:
        ROLLOUT_REPLICA.state.clear()
    ray_job, rollout = labelled["scrape_configs"]
    assert ray_job == VERL_CONFIG["scrape_configs"][0]  # the rest is verl's, unchanged
    assert labelled["global"] == VERL_CONFIG["global"]
    assert rollout["static_configs"] == [
        {"targets": ["10.0.0.7:8000"], "labels": {"replica": "0", "run": "exp1"}},  # by position
        {"targets": ["10.0.0.8:8000"], "labels": {"replica": "5", "run": "exp1"}},  # its rank
    ]
    assert rollout["metric_relabel_configs"] == [eng.COLON_NAMES_RELABEL]
    assert VERL_CONFIG["scrape_configs"][1]["static_configs"][0].get("labels") is None


@pytest.mark.parametrize(
    "config",
    [
        {"scrape_configs": [{"job_name": "other", "static_configs": [{"targets": ["a:1"]}]}]},
        {"scrape_configs": "not a list"},
        {"scrape_configs": [{"job_name": "rollout", "static_configs": "x"}]},
        {},
    ],
)
def test_a_config_of_another_shape_is_left_as_it_is(config):
    assert verl_engines.labelled_config(config, "exp1") is None


def test_the_shipped_engine_job_restores_the_same_names():
    config = yaml.safe_load((ROOT / "collector" / "prometheus.yml").read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "rollout-engines"]
    assert job["metric_relabel_configs"] == [eng.COLON_NAMES_RELABEL]


# --- verl's real writer, a real Ray cluster, a real Prometheus -----------------------------


@pytest.mark.slow
def test_verls_own_writer_gives_its_engine_targets_a_replica(tmp_path, monkeypatch):
    """verl's `update_prometheus_config`, called as verl's LLMServerManager calls it (by its
    name in `llm_server`, from a `self` holding verl's config), writes its file through its
    own Ray task; Prometheus, started on exactly that file, stores every engine's series
    with the replica verl gave the replica at that address and the run; the engine row of
    the Rollout tail dashboard answers per replica."""
    import ray
    from omegaconf import OmegaConf

    from rlotel.integrations import verl as plugin
    from tests.helpers import serve_engine
    from tests.promserver import Prometheus, free_port

    monkeypatch.delenv("RLOTEL_RUN", raising=False)
    plugin.install()
    from verl.workers.config.rollout import PrometheusConfig, RolloutConfig
    from verl.workers.rollout import llm_server, utils
    from verl.workers.rollout.replica import RolloutReplica

    original = utils.update_prometheus_config.__rlotel_original__  # labelling, both
    assert llm_server.update_prometheus_config.__rlotel_original__ is original

    class StandInReplica(RolloutReplica):  # verl's base class: its __init__, its attributes
        async def launch_servers(self) -> None:
            raise NotImplementedError

    servers, stops, replicas = [], [], []
    for rank, engine in ((2, "vllm"), (3, "sglang")):  # a manager starting at rank 2
        server, stop, port = serve_engine(engine)
        servers.append(server)
        stops.append(stop)
        replica = StandInReplica(rank, RolloutConfig(name=engine), None, gpus_per_node=1)
        replica._server_address = f"127.0.0.1:{port}"
        replicas.append(replica)

    class Manager:  # what verl's callers hold: the whole config, the rollout config
        def __init__(self, file: Path) -> None:
            self.config = OmegaConf.create({"trainer": {"experiment_name": "demo"}})
            self.prometheus = PrometheusConfig(enable=True, port=free_port(), file=str(file))
            self.server_addresses = [r._server_address for r in replicas]

        def register(self, writer) -> None:
            writer(self.prometheus, self.server_addresses, "vllm")

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    prometheus = None
    try:
        plain = tmp_path / "plain" / "prometheus.yml"
        Manager(plain).register(original)  # verl's writer as verl ships it
        (plain_job,) = [
            j
            for j in yaml.safe_load(plain.read_text())["scrape_configs"]
            if j["job_name"] == "rollout"
        ]
        assert plain_job["static_configs"] == [{"targets": [r._server_address for r in replicas]}]

        written = tmp_path / "ray" / "prometheus.yml"
        Manager(written).register(llm_server.update_prometheus_config)  # with the plugin
        config = yaml.safe_load(written.read_text())
        (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "rollout"]
        assert job["static_configs"] == [
            {
                "targets": [r._server_address],
                "labels": {"replica": str(r.replica_rank), "run": "demo"},
            }
            for r in replicas
        ]
        promtool = shutil.which("promtool")
        assert promtool, "promtool is not installed: run `make test`"
        checked = subprocess.run(
            [promtool, "check", "config", str(written)], capture_output=True, text=True
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr

        prometheus = Prometheus(tmp_path, [], config_file=written)  # verl's file, as it is
        prometheus.wait_for('count(up{job="rollout"} == 1)', 2, timeout_s=40)
        up = {r["metric"]["replica"]: r["metric"] for r in prometheus.query('up{job="rollout"}')}
        assert sorted(up) == ["2", "3"] and {m["run"] for m in up.values()} == {"demo"}
        # the engines' documented names are what is stored (vllm:…, not vllm_…)
        prometheus.wait_for('count(vllm:kv_cache_usage_perc{run="demo", replica="2"})', 1)
        prometheus.wait_for('count(sglang:token_usage{run="demo", replica="3"})', 1)
        time.sleep(21)  # verl's 10 s scrape interval: rate() windows need two scrapes
        from tests.test_dashboards import ENGINES, NOT_IN_THE_DEMO, sourced_expressions, substitute

        panels = [
            (where, expression)
            for where, expression in sourced_expressions()
            if NOT_IN_THE_DEMO.get(where) == ENGINES and where.startswith("RL rollout tail /")
        ]  # the engine row (the recording rules are not in verl's file)
        assert len({where for where, _ in panels}) == 7  # every panel of the row
        for where, expression in panels:
            result = prometheus.query(substitute(expression.replace("$__rate_interval", "1m")))
            assert result, f"{where}: no data on verl's own Prometheus config"
            assert {r["metric"].get("replica") for r in result} <= {"2", "3"}, where
    finally:
        if prometheus is not None:
            prometheus.stop()
        for stop in stops:
            stop.set()
        for server in servers:
            server.shutdown()
        ray.shutdown()
        plugin.uninstall()
