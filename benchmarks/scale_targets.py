"""Many real worker targets: K ranks of verl 0.9.1's real `RayWorkerGroup` (light workers:
verl's `Worker`, a method that waits, no model), each with rlotel's own `/metrics` found by
file discovery as shipped, scraped by a real Prometheus with the shipped rules. One rank
computes 3x as long as the others.

    python benchmarks/scale_targets.py --ranks 16

Real: Ray, verl's worker group and its dispatch, each rank's rlotel (its traced method, its
compute seconds, its `/metrics` and discovery file), the driver's rlotel (reply timing, rank
spread), Prometheus (Debian's) with `collector/prometheus.yml`'s `rlotel-workers` job as it
is (`file_sd_configs`, `honor_labels`) and `collector/rules/*.rules.yml` as they are.
Changed for the run: 1 s scrape and evaluation intervals (15 s shipped), the driver's own
job pointed at its ephemeral port. Stand-in: the ranks' work is a wait (a toy GPU).

It prints: every target up and how long discovery took, series per target, scrape time,
the rules' evaluation time, and what the rank rules say: RLSlowRank (each rank's compute
over the median's, from its own /metrics) pending with the slow rank named, and the
driver's spreads: replies (RLStragglerRank's input; ~1 here, as every rank leaves the
all-reduce together) and compute (the slow rank's 3x).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import ray
from ray.util.placement_group import remove_placement_group
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

import rlotel
from rlotel.integrations import verl as plugin

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.promserver: the suite's own Prometheus runner

from benchmarks import scale  # noqa: E402
from tests.promserver import Prometheus  # noqa: E402

WORK_S = 0.2  # a rank's work in update_actor; the slow rank's is SLOW_TIMES that
SLOW_TIMES = 3
STEPS = 4
PHASE = "update_actor"
RUN = "targets"


class ScaleWorker(Worker):
    """A light verl worker in a torch.distributed group (gloo, as verl's workers form one):
    its traced method works (a wait, the slow rank's longer), then meets the others in an
    all-reduce, so the fast ranks' wait for the slow one is collective time."""

    def __init__(self) -> None:
        super().__init__()
        import torch.distributed as dist

        dist.init_process_group("gloo")  # verl's Worker set MASTER_ADDR/PORT, RANK, WORLD_SIZE

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_policy(self, seconds: float, slow_rank: int) -> int:
        import torch
        import torch.distributed as dist

        time.sleep(seconds * (SLOW_TIMES if self.rank == slow_rank else 1))
        dist.all_reduce(torch.ones(1))
        return self.rank


def prometheus_config(workdir: Path, driver_target: str) -> Path:
    """The shipped configuration with 1 s intervals, its worker job as it is (discovery
    files in workdir/workers/), the rules copied beside it; the driver as `rlotel`."""
    shipped = yaml.safe_load((ROOT / "collector" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in shipped["scrape_configs"]}
    workers = jobs["rlotel-workers"]
    driver = {**jobs["rlotel"], "static_configs": [{"targets": [driver_target]}]}
    (workdir / "rules").mkdir()
    for rules in (ROOT / "collector" / "rules").glob("*.rules.yml"):
        shutil.copy(rules, workdir / "rules" / rules.name)
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": shipped["rule_files"],
        "scrape_configs": [driver, workers],
    }
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def wait_for(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.25)
    raise TimeoutError(f"not within {timeout_s:g} s: {what}")


def pending(prometheus: Prometheus, name: str) -> list[dict[str, str]]:
    """Labels of the alert `name`'s pending or firing instances."""
    alerts = prometheus.api("alerts")["alerts"]
    return [a["labels"] for a in alerts if a["labels"]["alertname"] == name]


def worker_spans(traces: Path, ranks: int) -> dict[str, float]:
    """The spans every rank exported for the STEPS calls (bounded wait: they export on
    their publisher thread), per rank and step: what a Collector takes at any N."""

    def counted() -> tuple[int, int] | None:
        found = [scale.spans_in(path) for path in traces.glob("*.jsonl")]
        spans = sum(len(spans) for spans, _ in found)
        return (spans, sum(size for _, size in found)) if spans >= ranks * STEPS else None

    spans, size = wait_for(counted, 60, f"{ranks * STEPS} worker spans")
    return {
        "worker_spans_rank_step": spans / ranks / STEPS,
        "worker_kb_rank_step": size / ranks / STEPS / 1e3,
    }


def run(ranks: int) -> dict[str, Any]:
    """K real ranks scraped by a real Prometheus: the figures and what the rules named."""
    slow_rank = ranks // 2
    figures: dict[str, Any] = {"ranks": ranks, "slow_rank": slow_rank}
    with tempfile.TemporaryDirectory(prefix="rlotel-targets-") as tmp:
        workdir = Path(tmp)
        discovery = workdir / "workers"
        discovery.mkdir()  # before Prometheus starts: it watches the directory for files
        traces = workdir / "traces"  # every rank's spans, OTLP/JSON lines: what a Collector gets
        plugin.install()
        ray.init(
            address="local",
            num_cpus=10 * ranks + 2,  # logical: verl's pool asks a bundle of CPUs per rank
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"RLOTEL_ENABLE": "1"}},
        )
        tel = rlotel.init(run=RUN, prometheus_addr="127.0.0.1", prometheus_port=0)
        pool = RayResourcePool([ranks], use_gpu=False)
        prometheus = None
        try:
            started = time.monotonic()
            group = RayWorkerGroup(
                resource_pool=pool,
                ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(ScaleWorker)),
                device_name="cpu",
                worker_env={
                    "RLOTEL_PROMETHEUS_SD_DIR": str(discovery),
                    "RLOTEL_TRACES_DIR": str(traces),
                },
            )
            figures["workers_start_s"] = time.monotonic() - started
            driver_target = tel.metrics_url.split("//")[1].split("/")[0]
            prometheus = Prometheus(
                workdir, [], config_file=prometheus_config(workdir, driver_target)
            )
            for step in range(1, STEPS + 1):
                with tel.step(step), tel.phase(PHASE):
                    assert sorted(group.update_policy(WORK_S, slow_rank)) == list(range(ranks))
            tel.flush(10)
            figures.update(worker_spans(traces, ranks))
            started = time.monotonic()
            up = 'count(up{job="rlotel-workers"} == 1)'
            prometheus.wait_for(up, ranks, timeout_s=60)
            figures["all_up_s"] = time.monotonic() - started
            figures["files"] = len(list(discovery.glob("*.json")))
            per_target = prometheus.query('scrape_samples_scraped{job="rlotel-workers"}')
            figures["series_per_target"] = statistics.median(
                float(r["value"][1]) for r in per_target
            )
            durations = prometheus.query('scrape_duration_seconds{job="rlotel-workers"}')
            figures["scrape_ms_median"] = (
                statistics.median(float(r["value"][1]) for r in durations) * 1e3
            )
            figures["scrape_ms_max"] = max(float(r["value"][1]) for r in durations) * 1e3
            compute = 'rlotel_rank_compute_seconds{job="rlotel-workers"}'
            prometheus.wait_for(f"count({compute})", ranks, timeout_s=30)
            figures["compute_s"] = {
                r["metric"]["rank"]: round(float(r["value"][1]), 3)
                for r in prometheus.query(compute)
            }
            ratio = "rlotel:rank_compute_over_median:ratio"
            try:
                slow = wait_for(lambda: pending(prometheus, "RLSlowRank"), 60, "RLSlowRank")
            except TimeoutError as error:
                recorded = {r["metric"].get("rank"): r["value"][1] for r in prometheus.query(ratio)}
                raise TimeoutError(
                    f"{error}: compute {figures['compute_s']}, {ratio} {recorded}"
                ) from None
            figures["slow_rank_alerts"] = slow
            # The driver's view: replies spread (RLStragglerRank's input) and compute spread.
            # Under a collective every rank replies together, so only compute names the slow.
            for key, name in (
                ("driver_reply_spread", "rlotel_phase_rank_spread_ratio"),
                ("driver_compute_spread", "rlotel_phase_rank_compute_spread_ratio"),
            ):
                figures[key] = prometheus.scalar(f'{name}{{run="{RUN}", phase="{PHASE}"}}')
            figures["straggler_alerts"] = pending(prometheus, "RLStragglerRank")
            groups = prometheus.api("rules")["groups"]
            figures["rules_eval_ms"] = sum(g["evaluationTime"] for g in groups) * 1e3
            figures["rules"] = sum(len(g["rules"]) for g in groups)
            figures["rule_errors"] = [
                rule["name"]
                for g in groups
                for rule in g["rules"]
                if rule.get("health") not in ("ok", "unknown")
            ]
        finally:
            if prometheus is not None:
                prometheus.stop()
            tel.shutdown()
            for pg in pool.pgs or []:
                remove_placement_group(pg)
            ray.shutdown()
            plugin.uninstall()
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=16)
    args = parser.parse_args(argv)
    figures = run(args.ranks)
    print(
        f"{args.ranks} real verl worker ranks (Ray {ray.__version__}, {os.cpu_count()} cores), "
        f"one real Prometheus (1 s scrape and evaluation):"
    )
    for key, value in figures.items():
        print(f"  {key}: {value}")


if __name__ == "__main__":
    main()
