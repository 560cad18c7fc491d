"""Where rlotel's time goes inside verl's own processes on the real `main_ppo` (the e2e run
of `tests/e2e/main_ppo.py`: V1, GRPO, vLLM rollout, plugin on, scraped every 15 s as in
`verl_e2e.py`): py-spy samples every verl
process (trainer, actor, rollout server, agent-loop and reward workers) for the whole run,
and each busy sample whose innermost rlotel frame runs rlotel's own work (not the verl or
vLLM code it wraps) is counted, split three ways:

- start-up: imports and the telemetry's first start (once per process);
- per call: on the caller's thread, during a traced call (the wrappers, one span open/close);
- export: rlotel's own threads (publisher, span export, metrics).

    .venv/bin/python benchmarks/verl_worker_profile.py [--steps 6] [--rate 50]

Needs the engine venv (`make engine-venv`) and py-spy (dev extra); run as root or with
ptrace allowed. Sampling is --nonblocking: the processes are never paused.
"""

from __future__ import annotations

import argparse
import linecache
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.verl_e2e import SCRAPE_EVERY_S
from tests.e2e.main_ppo import run_isolated

KINDS = ("start-up", "per call", "export")
PROCESSES = (
    *("TaskRunnerV1", "WorkerDict", "vLLMHttpServer"),
    *("AgentLoopWorkerTQ", "RewardLoopWorker"),
)
WAITING = ("wait", "select", "poll", "sleep", "readinto", "recv", "accept", "acquire")
WRAPPED = re.compile(r"[(/](verl|vllm|torch|transfer_queue|ray)/")  # the code rlotel wraps
STARTUP = (
    *("_find_and_load", "<module>", "_start_worker", "Telemetry.__init__"),
    *("declare_verl_driver", "telemetry (rlotel/integrations/process.py"),  # the driver's start
)
ROOT = Path(__file__).resolve().parents[1]
RLOTEL_FRAME = re.compile(r"\((rlotel/[^:]+):(\d+)\)")
BLOCKING_CALL = re.compile(r"\.(get|wait|join|acquire)\(|sleep\(")
OWN_THREADS = ("Worker._run", "OtlpMetricsPusher", "serve_forever")


def classify(frames: list[str]) -> str | None:
    """One of KINDS for rlotel's own work, None for anything else."""
    own = [i for i, frame in enumerate(frames) if "rlotel/" in frame]
    if not own or any(WRAPPED.search(frame) for frame in frames[own[-1] + 1 :]):
        return None
    if any(marker in frame for frame in frames for marker in OWN_THREADS):
        return "export"
    if any(marker in frame for frame in frames[own[0] :] for marker in STARTUP):
        return "start-up"
    return "per call"


def waiting(leaf: str) -> bool:
    """An idle thread: its innermost frame waits (py-spy's --nonblocking mode cannot always
    tell), in a function named so or, in rlotel's code, on a line that blocks."""
    if any(word in leaf.split(" (")[0].lower() for word in WAITING):
        return True
    own = RLOTEL_FRAME.search(leaf)
    if own is None:
        return False
    line = linecache.getline(str(ROOT / own[1]), int(own[2]))
    return bool(BLOCKING_CALL.search(line))


def tally(raw: Path, stacks: Counter | None = None) -> tuple[int, Counter]:
    """Busy samples of one process and rlotel's own among them, by kind (and by stack
    from the outermost rlotel frame, into `stacks`)."""
    busy, own = 0, Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if waiting(frames[-1]):
            continue
        busy += int(count)
        kind = classify(frames)
        if kind:
            own[kind] += int(count)
            if stacks is not None:
                first = next(i for i, frame in enumerate(frames) if "rlotel/" in frame)
                stacks[f"{kind}: " + " ; ".join(frames[first:])] += int(count)
    return busy, own


THREAD = re.compile(r'^Thread (\d+) \(\w+\): "rlotel-', re.MULTILINE)


class ThreadClocks:
    """Each process's threads' CPU from their own clocks (`/proc/PID/task/TID/stat`, read
    every half second until the process ends), and which threads are rlotel's (named
    `rlotel-*`, their Python names as `py-spy dump` shows them). py-spy's --nonblocking
    samples count a thread waiting for the GIL inside rlotel's code as busy there; the
    thread clocks count only what the threads ran."""

    def __init__(self) -> None:
        self.ticks: dict[int, dict[int, int]] = {}  # pid → tid → utime + stime
        self.rlotel: dict[int, set[int]] = {}  # pid → rlotel's thread ids

    def watch(self, pid: int, spy: str, done: threading.Event) -> None:
        threading.Thread(target=self._watch, args=(pid, spy, done), daemon=True).start()

    def _watch(self, pid: int, spy: str, done: threading.Event) -> None:
        ticks, named = self.ticks.setdefault(pid, {}), self.rlotel.setdefault(pid, set())
        last_dump = 0.0
        while not done.is_set():
            try:
                tasks = list(Path(f"/proc/{pid}/task").iterdir())
            except FileNotFoundError:
                return  # the process ended: its threads' last readings stand
            for task in tasks:
                try:  # fields 14 and 15 of stat, after the name in parentheses
                    fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                except (FileNotFoundError, ProcessLookupError):
                    continue  # the thread ended
                ticks[int(task.name)] = int(fields[11]) + int(fields[12])
            if time.monotonic() - last_dump > 5:  # rlotel's threads start with its telemetry
                dump = subprocess.run([spy, "dump", "-p", str(pid)], capture_output=True, text=True)
                named.update(int(tid) for tid in THREAD.findall(dump.stdout))
                last_dump = time.monotonic()
            time.sleep(0.5)

    def seconds(self, pid: int) -> tuple[float, float]:
        """(every thread's CPU, rlotel's threads' CPU) in seconds."""
        ticks, hertz = self.ticks.get(pid, {}), os.sysconf("SC_CLK_TCK")
        own = sum(ticks.get(tid, 0) for tid in self.rlotel.get(pid, ()))
        return sum(ticks.values()) / hertz, own / hertz


def attach(
    out: Path, rate: int, done: threading.Event, clocks: ThreadClocks
) -> tuple[list[subprocess.Popen], dict[str, int]]:
    """py-spy on each verl process as soon as it appears (until the run ends), and its
    threads' clocks."""
    spies: dict[str, subprocess.Popen] = {}
    processes: dict[str, int] = {}
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    while not done.is_set() and len(spies) < len(PROCESSES):
        for name in PROCESSES:
            if name in spies:
                continue
            found = subprocess.run(["pgrep", "-f", f"^ray::{name}"], capture_output=True, text=True)
            pids = found.stdout.split()
            if pids:
                command = [spy, "record", "-p", pids[0], "-r", str(rate), "--nonblocking"]
                command += ["-f", "raw", "-o", str(out / f"{name}.txt")]
                spies[name] = subprocess.Popen(
                    command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
                processes[name] = int(pids[0])
                clocks.watch(processes[name], spy, done)
        time.sleep(0.5)
    return list(spies.values()), processes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rate", type=int, default=50, help="samples per second")
    parser.add_argument("--top", type=int, default=0, help="print each process's N top stacks")
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rl-prof-", dir="/tmp"))
    done = threading.Event()
    try:
        runner = threading.Thread(
            target=lambda: (
                run_isolated(
                    [
                        str(work),
                        "--steps",
                        str(options.steps),
                        "--scrape-every",
                        str(SCRAPE_EVERY_S),
                    ]
                ),
                done.set(),
            )
        )
        runner.start()
        clocks = ThreadClocks()
        spies, processes = attach(work, options.rate, done, clocks)
        runner.join()
        for spy in spies:
            spy.wait(timeout=60)
        print(f"rlotel's own CPU in verl's processes, real main_ppo, {options.steps} steps")
        print(f"(py-spy, {options.rate} Hz, busy samples only; the threads' own clocks; s):")
        print(f"  {'process':<20}{'busy':>8}{'rlotel':>9}{'share':>8}"
              f"{'start-up':>10}{'per call':>10}{'export':>8}"
              f"{'CPU':>8}{'rlotel threads':>16}")  # fmt: skip
        for name in PROCESSES:
            raw = work / f"{name}.txt"
            if not raw.exists():
                print(f"  {name:<20} (not sampled)")
                continue
            stacks: Counter = Counter()
            busy, own = tally(raw, stacks)
            total = sum(own.values())
            seconds = {kind: own[kind] / options.rate for kind in KINDS}
            cpu, threads = clocks.seconds(processes[name])
            print(f"  {name:<20}{busy / options.rate:8.2f}{total / options.rate:9.2f}"
                  f"{total / max(busy, 1):8.1%}{seconds['start-up']:10.2f}"
                  f"{seconds['per call']:10.2f}{seconds['export']:8.2f}"
                  f"{cpu:8.2f}{threads:9.2f} {threads / max(cpu, 1e-9):6.1%}")  # fmt: skip
            for stack, count in stacks.most_common(options.top):
                print(f"      {count / options.rate:6.2f}  {stack}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
