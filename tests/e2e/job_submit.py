"""verl 0.9.1's real `main_ppo` submitted to a running Ray cluster, the cluster way:
`ray start --head`, then `ray job submit -- python -m verl.trainer.main_ppo ...`.

    python -m tests.e2e.job_submit WORKDIR [--steps N] [--assets DIR]
                                   [--via json|hydra|entrypoint|submit-shell]
                                   [--fully-async] [HYDRA_OVERRIDES...]

The cluster (`ray start`) gets the e2e run's platform environment (`environment(work,
plugin=False)`: the CPU stand-ins, vLLM's and verl's CPU settings, verl's file logger) and
no RLOTEL_* or OTEL_* variable. rlotel's variables (`RLOTEL_ENABLE`, `RLOTEL_TRACES_DIR`
and a non-default `OTEL_EXPORTER_PROMETHEUS_PORT`, so the scrape proves an OTEL_* variable
arrived) are given the way `--via` says:

- `json`: `ray job submit --runtime-env-json '{"env_vars": {...}}'` (documented);
- `hydra`: verl's `+ray_kwargs.ray_init.runtime_env.env_vars.NAME='value'` overrides;
- `entrypoint`: `ray job submit -- env NAME=value python -m ...` (the entrypoint only);
- `submit-shell`: in the environment of the `ray job submit` command (reaches nothing).

`main_ppo` (or, `--fully-async`, verl's fully async policy with the harness's overrides for
it) gets the e2e overrides minus `ray_kwargs.ray_init.*` (they start a local cluster;
connecting to a running one takes none: the job's `RAY_ADDRESS`). The trainer's
`/metrics` is scraped while it trains. Everything lands in WORKDIR: `verl.jsonl`,
`console.log` (the job's logs), `traces/`, `scrapes/`, `run.json` (the job's status, wall
times). Run it through `isolated()`: a private network, mount and PID namespace, so only
loopback exists, `ray stop` sees this cluster's processes only, and whatever is left dies
with the namespace.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.main_ppo import (
    ENGINE_PYTHON,
    FULLY_ASYNC,
    TIMEOUT_S,
    environment,
    fully_async_overrides,
    merged,
    overrides,
    scrape,
)

RAY = ENGINE_PYTHON.parent / "ray"
METRICS_PORT = 19464  # not rlotel's default: a scrape here means OTEL_* reached the trainer
VIAS = ("json", "hydra", "entrypoint", "submit-shell")
SUBMISSION_ID = "rlotel-e2e"
LOCAL_CLUSTER = ("ray_kwargs.ray_init.", "+ray_kwargs.ray_init.")
FINISHED = ("SUCCEEDED", "FAILED", "STOPPED")


def local_cluster(override: str) -> bool:
    """An override for the cluster `ray.init` starts (a job joins the running one)."""
    return override.startswith(LOCAL_CLUSTER)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rlotel_variables(work: Path) -> dict[str, str]:
    """What the plugin needs in every process: the e2e run's RLOTEL_*/OTEL_* variables."""
    plain = environment(work, plugin=False)
    added = {k: v for k, v in environment(work, plugin=True).items() if plain.get(k) != v}
    return {**added, "OTEL_EXPORTER_PROMETHEUS_PORT": str(METRICS_PORT)}


def main_ppo_command(
    assets: Path, work: Path, steps: int, via: str, fully_async: bool, extra: list[str]
) -> list[str]:
    given = rlotel_variables(work)
    extra = ['trainer.logger=["console","file","rlotel"]', *extra]
    if fully_async:
        extra = [*fully_async_overrides(steps), *extra]
    command = [
        str(ENGINE_PYTHON),
        "-m",
        FULLY_ASYNC if fully_async else "verl.trainer.main_ppo",
        *(o for o in merged(overrides(assets, work, steps), extra) if not local_cluster(o)),
    ]
    if via == "hydra":  # quoted: an unquoted 1 is an int, and Ray takes strings only
        prefix = "+ray_kwargs.ray_init.runtime_env.env_vars"
        command += [f"{prefix}.{name}='{value}'" for name, value in given.items()]
    if via == "entrypoint":
        command = ["env", *(f"{k}={v}" for k, v in given.items()), *command]
    return command


def submit_command(dashboard: str, entrypoint: list[str], work: Path, via: str) -> list[str]:
    command = [str(RAY), "job", "submit", "--address", dashboard, "--no-wait"]
    command += ["--submission-id", SUBMISSION_ID]
    if via == "json":
        command += ["--runtime-env-json", json.dumps({"env_vars": rlotel_variables(work)})]
    return [*command, "--", *entrypoint]


def start_cluster(work: Path, cluster_env: dict[str, str]) -> tuple[str, float]:
    """`ray start --head` on loopback: (the dashboard's URL, seconds it took)."""
    dashboard_port = free_port()
    command = [
        str(RAY), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={free_port()}",
        # logical: fully async asks 10 CPUs for each of its trainer and rollouter actors, and
        # a fake GPU for the trainer's and one for the rollout pool's
        "--num-cpus=32", "--num-gpus=2", "--include-dashboard=true",
        "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}",
        f"--temp-dir={work / 'r'}", "--disable-usage-stats",
    ]  # fmt: skip
    started = time.monotonic()
    with (work / "ray-start.log").open("w") as out:
        subprocess.run(command, env=cluster_env, stdout=out, stderr=subprocess.STDOUT, check=True)
    return f"http://127.0.0.1:{dashboard_port}", time.monotonic() - started


def wait_for_job(dashboard: str, work: Path, timeout: float) -> tuple[str, int]:
    """Poll the job, scraping the trainer's /metrics meanwhile: (status, scrapes)."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(dashboard)
    scrapes = work / "scrapes"
    scrapes.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{METRICS_PORT}/metrics"
    deadline = time.monotonic() + timeout
    count, status = 0, "UNKNOWN"
    while time.monotonic() < deadline:
        status = str(client.get_job_status(SUBMISSION_ID).value)
        if status in FINISHED:
            break
        text = scrape(url)
        if text:
            count += 1
            (scrapes / f"{count:04d}.txt").write_text(text)
        time.sleep(0.5)
    else:
        status = "TIMED_OUT"
        with contextlib.suppress(Exception):
            client.stop_job(SUBMISSION_ID)
    with contextlib.suppress(Exception):
        (work / "console.log").write_text(client.get_job_logs(SUBMISSION_ID))
    return status, count


def stop_cluster(cluster_env: dict[str, str]) -> None:
    """`ray stop --force` (it sees this namespace's processes only), then SIGKILL by PID
    whatever is left here but this process and its parent (the namespace's init)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(
            [str(RAY), "stop", "--force"], env=cluster_env, capture_output=True, timeout=60
        )
    mine = {os.getpid(), os.getppid()}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in mine:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)


def run(work: Path, steps: int, assets: Path, via: str, fully_async: bool, extra: list[str]) -> int:
    if not (assets / "model").exists():
        subprocess.run([sys.executable, "-m", "tests.e2e.assets", str(assets)], check=True)
    started = time.monotonic()
    # Ray 2.60 turns token auth on where ~/.ray/auth_token exists (any local ray.init on
    # this machine writes one); a loopback-only namespace needs none
    cluster_env = {**environment(work, plugin=False), "RAY_AUTH_MODE": "disabled"}
    submit_env = dict(cluster_env)
    if via == "submit-shell":
        submit_env.update(rlotel_variables(work))
    script = f"cd {shlex.quote(str(work))} && exec " + shlex.join(
        main_ppo_command(assets, work, steps, via, fully_async, extra)
    )
    entrypoint = ["sh", "-c", script]  # the e2e run's cwd (Hydra writes outputs/ there)
    result: dict = {"via": via, "steps": steps}
    try:
        dashboard, result["ray_start_s"] = start_cluster(work, cluster_env)
        submit = submit_command(dashboard, entrypoint, work, via)
        result["submit"] = shlex.join(submit)
        answer = subprocess.run(submit, env=submit_env, capture_output=True, text=True)
        if answer.returncode != 0:
            result["status"] = "NOT_SUBMITTED"
            (work / "console.log").write_text(answer.stdout + answer.stderr)
            return 1
        submitted = time.monotonic()
        result["status"], result["scrapes"] = wait_for_job(dashboard, work, TIMEOUT_S)
        result["job_s"] = time.monotonic() - submitted
    finally:
        stop_cluster(cluster_env)
        result["wall_s"] = time.monotonic() - started
        (work / "run.json").write_text(json.dumps(result))
    return 0 if result.get("status") == "SUCCEEDED" else 1


def isolated(argv: list[str]) -> list[str]:
    """This module in a private network, mount and PID namespace (loopback only, a private
    /dev/shm and /proc); `sh` is the namespace's init and reaps Ray's orphans."""
    module = shlex.join([str(ENGINE_PYTHON), "-m", "tests.e2e.job_submit", *argv])
    inner = f"ip link set lo up && mount -t tmpfs -o size=8g tmpfs /dev/shm && {module}; exit $?"
    return [
        "unshare", "-n", "-m", "-p", "--fork", "--mount-proc", "--propagation", "private",
        "sh", "-c", inner,
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--assets", type=Path, help="inputs built once (default WORKDIR/assets)")
    parser.add_argument("--via", choices=VIAS, default="json")
    parser.add_argument("--fully-async", action="store_true", help="verl's fully async policy")
    parser.add_argument("extra", nargs="*", help="more Hydra overrides")
    options = parser.parse_intermixed_args()
    work = options.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    assets = options.assets.resolve() if options.assets else work / "assets"
    return run(work, options.steps, assets, options.via, options.fully_async, options.extra)


if __name__ == "__main__":
    sys.exit(main())
