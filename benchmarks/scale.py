"""Scale harness: rlotel's driver-side code at N ranks, each figure at every N and the
exponent it grows with (least squares of log(cost) on log(N) across the sizes).

    python benchmarks/scale.py --ranks 8 64 256 1024

What is real: a local Ray cluster (its GCS, object store and KV), one `rlotel.init(...)`
telemetry per N (`/metrics` on 127.0.0.1, an ephemeral port; every span to an OTLP/JSON-lines
`traces_file`), and rlotel's own functions a run calls:

- the worker-group hook: verl's execute and collect functions wrapped by
  `verl_workers.traced_execute` / `traced_collect`, so each call goes through `_time_replies`
  (the `ray.wait` loop over real object refs, the stall watch's rank wait,
  `tel.record_rank_seconds`) and `open_replies` (`tel.record_rank_compute`), inside a real
  `tel.step` / `tel.phase`;
- heartbeats: `rlotel.integrations.ray._Heartbeat.beat`, the put `publish` makes each
  `HEARTBEAT_S`, one per simulated process; `/targets`: `serve_targets` on the driver,
  `TargetDirectory.poll` (list + multi-get of Ray's KV) and a GET of `/targets`; the entries
  are deleted with `_Heartbeat.stop`, as at a process's exit;
- `/metrics`: a GET of the driver's endpoint, its series counted from the exposition.

What is simulated: the ranks and processes. In the steps each rank's reply is an object
`ray.put` by the driver (a `RankReply` with its compute seconds, as a traced worker method
returns it), so every reply is already in when the call is timed — the case in which a
per-reply wait over every pending ref is quadratic. One real Ray actor (async, no verl) then
answers a call's N ranks one after another, evenly over `SPREAD_S`: replies that trickle in,
so the wait loop takes them in many small batches (its other bad case). The N processes
behind the heartbeats are N KV keys under this job's prefix written from the driver process.
A last call at each N has every reply in but rank N/3's, a call to the real actor that does
not return until released: the stall watch (`stall_after_s` STALL_S) must name that rank and
the actor's process. The driver's own `TargetDirectory` thread then polls for WATCH_S.

CPU is `time.process_time` (the whole driver process: rlotel's calls and the Ray client
threads they drive) around rlotel's calls only; verl's own `ray.get` of the same refs is
timed beside it for scale. One process, one run per size: expect ±20 % on a loaded machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import ray

import rlotel
from rlotel.integrations import ray as ray_integration
from rlotel.integrations import verl_workers
from rlotel.integrations.data_moves import RankReply
from rlotel.schema import attributes as attr

PHASES = ("old_log_prob", "update_actor")  # one worker-group call on every rank each
SPREAD_S = 0.25  # the real actor's replies arrive evenly over this (--spread)
WATCH_S = 10.0  # the driver's own poll thread is watched this long at each N
STALL_S = 2.0  # stall_after_s of the harness's telemetry: the stuck rank is named after it
STEP_S = 60.0  # issue 50's step: the driver's telemetry CPU is judged as a share of it

# name, unit, what it is (the table's rows, in order)
ROWS = (
    ("call_wall_ms", "ms", "worker-group call, wall (traced execute + collect)"),
    ("call_cpu_ms", "ms", "driver CPU per worker-group call (rlotel's calls)"),
    ("ray_get_ms", "ms", "  for scale: verl's own ray.get of the same refs"),
    ("spread_cpu_ms", "ms", "driver CPU per call, replies spread (1 real actor)"),
    ("spread_get_ms", "ms", "  for scale: verl's ray.get alone, same replies"),
    ("spread_added_ms", "ms", "  rlotel's added CPU (the difference)"),
    ("clock_cpu_ms", "ms", "driver CPU per call in the clock exchange (each rank's first two)"),
    ("clock_added_ms", "ms", "  the exchange's part (stamps, carriers, replies noted)"),
    ("step_cpu_ms", "ms", "driver CPU for telemetry per step"),
    ("step_cpu_pct", "%", "  of a 60 s step"),
    ("stuck_named_s", "s", f"a stuck rank named with its process (stall_after_s {STALL_S:g} s)"),
    ("series", "", "series a scrape of the driver's /metrics serves"),
    ("metrics_kb", "kB", "/metrics exposition size"),
    ("metrics_ms", "ms", "/metrics scrape time (GET on 127.0.0.1)"),
    ("spans_step", "", "spans per step exported (driver)"),
    ("bytes_step", "kB", "bytes per step exported (OTLP/JSON lines)"),
    ("kv_entries", "", "Ray KV entries while N processes beat"),
    ("kv_left", "", "Ray KV entries left after they stop"),
    ("kv_ops_s", "1/s", "Ray KV operations per second (N puts/HEARTBEAT_S + 2 a poll)"),
    ("beat_ms", "ms", "one heartbeat put (mean over N)"),
    ("poll_ms", "ms", "driver's /targets poll (list + multi-get + parse)"),
    ("poll_cpu_ms", "ms", "  its driver CPU"),
    ("poll_interval_s", "s", "  the interval the poll thread settles on (POLL_S or longer)"),
    ("poll_step_pct", "%", "  the poll thread's CPU, share of one core (its thread clock)"),
    ("targets_kb", "kB", "/targets body"),
    ("targets_ms", "ms", "/targets GET"),
)


def fetch(url: str) -> tuple[bytes, float]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read()
    return body, time.perf_counter() - started


def spans_in(path: Path) -> tuple[list[dict], int]:
    """(spans, bytes) in an OTLP/JSON-lines traces file so far."""
    if not path.exists():
        return [], 0
    spans = []
    text = path.read_bytes()
    for line in text.splitlines():
        if line.strip():
            for resource in json.loads(line).get("resourceSpans", []):
                for scope in resource.get("scopeSpans", []):
                    spans += scope.get("spans", [])
    return spans, len(text)


def ranks_named(span: dict) -> int | None:
    """The span's `rl.ranks` (how many ranks replied), as `record_rank_seconds` sets it."""
    for attribute in span.get("attributes", []):
        if attribute["key"] == attr.RANKS:
            return int(next(iter(attribute["value"].values())))
    return None


class Calls:
    """One simulated worker group on `n` ranks: its replies are real object refs made once
    (a call's `execute_fn` returns them, as verl's `execute_all` returns its actor calls')."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.refs = [
            ray.put(RankReply({"rank": rank}, 0.5 + rank * 1e-4, 0.01)) for rank in range(n)
        ]
        self.execute = verl_workers.traced_execute(lambda *_a, **_k: list(self.refs), True)
        self.collect = verl_workers.traced_collect(lambda _group, output: output)

    def call(self) -> tuple[float, float, float]:
        """verl's blocking call: execute, ray.get, collect. (wall s, rlotel CPU s, ray.get s)."""
        cpu, wall = time.process_time(), time.perf_counter()
        refs = self.execute("noop")
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        got = time.perf_counter()
        output = ray.get(refs)  # verl's own: every reply is in by now
        got = time.perf_counter() - got
        cpu2, wall2 = time.process_time(), time.perf_counter()
        values = self.collect(None, output)
        cpu += time.process_time() - cpu2
        wall += time.perf_counter() - wall2
        assert len(values) == self.n and type(values[0]) is dict
        return wall, cpu, got

    def baseline_get(self) -> float:
        started = time.perf_counter()
        ray.get(list(self.refs))
        return time.perf_counter() - started


@ray.remote(num_cpus=0)
class Replies:
    """The one real actor: answers each rank's call at its given time (an async actor, so
    every rank's call waits at once), as ranks that finish one after another do."""

    def __init__(self) -> None:
        self.released = asyncio.Event()

    async def reply(self, rank: int, at: float) -> RankReply:
        await asyncio.sleep(max(0.0, at - time.time()))
        return RankReply({"rank": rank}, 0.5, 0.01)

    async def stuck(self, rank: int) -> RankReply:
        """A rank that does not reply until released (a hung collective, a dead GPU)."""
        await self.released.wait()
        self.released.clear()
        return RankReply({"rank": rank}, 0.5, 0.01)

    async def release(self) -> None:
        self.released.set()

    def pid(self) -> int:
        return os.getpid()


def stuck_rank(tel: rlotel.Telemetry, actor: Any, calls: Calls, step: int) -> dict[str, float]:
    """One call whose rank N/3 never replies, every other rank's reply in: the seconds
    until the stall watch names that rank and its process (the real actor's pid), judged
    against `stall_after_s` plus one tick of the publisher."""
    rank = calls.n // 3
    refs = list(calls.refs)
    refs[rank] = actor.stuck.remote(rank)
    execute = verl_workers.traced_execute(lambda *_a, **_k: refs, True)
    collect = verl_workers.traced_collect(lambda _group, output: output)
    pid = ray.get(actor.pid.remote())
    named = threading.Event()
    named_s: list[float] = []

    def call() -> None:
        with tel.step(step), tel.phase(PHASES[-1]):
            collect(None, ray.get(execute("noop")))

    thread = threading.Thread(target=call, name="stuck-call")
    started = time.perf_counter()
    thread.start()
    deadline = started + STALL_S + 10
    while time.perf_counter() < deadline and not named.is_set():
        for verdict in tel.stalled:
            evidence = verdict.evidence
            if evidence.get("pending_ranks") == str(rank) and f"pid {pid} " in str(
                evidence.get("pending_processes")
            ):
                named_s.append(time.perf_counter() - started)
                named.set()
        time.sleep(0.02)
    ray.get(actor.release.remote())
    thread.join(30)
    assert named_s, f"the stuck rank {rank} of {calls.n} was not named"
    return {"stuck_named_s": named_s[0]}


def clock_exchange(tel: rlotel.Telemetry, calls: Calls, step: int) -> dict[str, float]:
    """The driver's side of the clock exchange (`verl_workers.CLOCK`, as the submit hook and
    the reply timing use it) over N actors' first two calls: each rank's first call carries
    t1 and its reply's arrival is noted as t4 by the call's own wait; its second carries
    "t1,t4" and ends the exchange. The driver CPU of such a call, stamps included."""
    exchange = verl_workers.CLOCK
    context = {verl_workers.TRACEPARENT: f"00-{'1' * 32}-{'2' * 16}-01"}
    actors = [f"sim-actor-{calls.n}-{rank}" for rank in range(calls.n)]
    cpus = []
    for repeat in range(2):
        with tel.step(step + repeat), tel.phase(PHASES[0]):
            started = time.process_time()
            for actor, ref in zip(actors, calls.refs, strict=True):
                carrier, stamped = exchange.stamp(actor, context)
                assert verl_workers.CLOCK_KEY in carrier
                if stamped:
                    exchange.sent(ref, actor)
            calls.call()  # its wait notes each reply's t4 while the exchange awaits it
            cpus.append(time.process_time() - started)
    assert exchange.done >= set(actors) and not exchange.awaiting, "the exchange did not end"
    return {"clock_cpu_ms": statistics.median(cpus) * 1e3}


def staggered(
    tel: rlotel.Telemetry, actor: Any, n: int, step: int, spread_s: float
) -> dict[str, float]:
    """Replies from a real actor, spread evenly over `spread_s`: the driver CPU of the traced
    call (its wait loop takes them as they come) and of verl's ray.get alone, same pattern."""

    def submit() -> list[Any]:
        base = time.time() + 0.05 + n * 3e-4  # after every call is submitted
        return [actor.reply.remote(rank, base + spread_s * rank / n) for rank in range(n)]

    traced, alone = [], []
    collect = verl_workers.traced_collect(lambda _group, output: output)
    for repeat in range(2):
        with tel.step(step + repeat), tel.phase(PHASES[-1]):
            refs = submit()
            execute = verl_workers.traced_execute(lambda *_a, refs=refs, **_k: refs, True)
            started = time.process_time()
            execute("noop")
            output = ray.get(refs)
            collect(None, output)
            traced.append(time.process_time() - started)
        refs = submit()
        started = time.process_time()
        ray.get(refs)
        alone.append(time.process_time() - started)
    return {
        "spread_cpu_ms": statistics.median(traced) * 1e3,
        "spread_get_ms": statistics.median(alone) * 1e3,
        "spread_added_ms": (statistics.median(traced) - statistics.median(alone)) * 1e3,
    }


def steps(tel: rlotel.Telemetry, calls: Calls, count: int, first: int) -> dict[str, float]:
    walls, cpus, gets, step_cpus = [], [], [], []
    for step in range(first, first + count):
        cpu = 0.0
        started = time.process_time()
        with tel.step(step):
            cpu += time.process_time() - started
            for name in PHASES:
                started = time.process_time()
                with tel.phase(name):
                    cpu += time.process_time() - started
                    wall, call_cpu, _ = calls.call()
                    walls.append(wall)
                    cpus.append(call_cpu)
                    gets.append(calls.baseline_get())
                    cpu += call_cpu
                    started = time.process_time()
                cpu += time.process_time() - started
            started = time.process_time()
        cpu += time.process_time() - started
        step_cpus.append(cpu)
    return {
        "call_wall_ms": statistics.median(walls) * 1e3,
        "call_cpu_ms": statistics.median(cpus) * 1e3,
        "ray_get_ms": statistics.median(gets) * 1e3,
        "step_cpu_ms": statistics.median(step_cpus) * 1e3,
        "step_cpu_pct": statistics.median(step_cpus) / STEP_S * 100,
    }


def heartbeats(n: int, directory: ray_integration.TargetDirectory, url: str) -> dict[str, float]:
    """N processes' heartbeats into the GCS KV, read back by the driver's /targets."""
    kv = ray_integration._kv()
    prefix = ray_integration._job_prefix(ray)
    beats = [
        ray_integration._Heartbeat(
            f"{prefix}sim-node/{pid}",
            f"127.0.0.1:{20000 + pid}",
            {"role": "actor", "rank": str(pid), "node": "127.0.0.1", "node_id": "sim-node"},
        )
        for pid in range(n)
    ]
    started = time.perf_counter()
    for beat in beats:
        beat.beat()
    beat_s = (time.perf_counter() - started) / n
    polls, poll_cpus = [], []
    for _ in range(3):
        started, cpu = time.perf_counter(), time.process_time()
        directory.poll()
        polls.append(time.perf_counter() - started)
        poll_cpus.append(time.process_time() - cpu)
    polled = polling(WATCH_S)
    entries = len(kv._internal_kv_list(prefix, namespace=ray_integration.KV_NAMESPACE))
    body, targets_s = fetch(url)
    live = json.loads(body)
    assert len(live) == n + 1, (len(live), n)  # the driver and every process
    for beat in beats:
        beat.stop()
    left = len(kv._internal_kv_list(prefix, namespace=ray_integration.KV_NAMESPACE))
    directory.poll()
    return {
        "kv_entries": entries,
        "kv_left": left,
        "kv_ops_s": n / ray_integration.HEARTBEAT_S + 2 / polled["interval_s"],
        "beat_ms": beat_s * 1e3,
        "poll_ms": statistics.median(polls) * 1e3,
        "poll_cpu_ms": statistics.median(poll_cpus) * 1e3,
        "poll_interval_s": polled["interval_s"],
        "poll_step_pct": polled["share"] * 100,
        "targets_kb": len(body) / 1e3,
        "targets_ms": targets_s * 1e3,
    }


def polling(seconds: float) -> dict[str, float]:
    """A `TargetDirectory` polling on its own thread, as the driver's does, for `seconds`:
    the share of a core its thread took (the thread's own CPU clock) and the interval it
    settled on (longer than POLL_S once a poll costs more than POLL_SHARE of one)."""
    directory = ray_integration.TargetDirectory()
    try:
        cpu, wall = directory.polled_cpu_s, time.perf_counter()
        time.sleep(seconds)  # the thread polls meanwhile; measured, not standing in for work
        share = (directory.polled_cpu_s - cpu) / (time.perf_counter() - wall)
        return {"share": share, "interval_s": directory.interval_s}
    finally:
        directory.close()


def at(n: int, steps_per_size: int, workdir: Path, actor: Any, spread_s: float) -> dict[str, float]:
    traces = workdir / f"traces-{n}.jsonl"
    tel = rlotel.init(
        run=f"scale-{n}",
        prometheus_addr="127.0.0.1",
        prometheus_port=0,
        traces_file=traces,
        stall_after_s=STALL_S,
    )
    try:
        directory = ray_integration.serve_targets(tel, poll_s=3600)  # polled here, by hand
        calls = Calls(n)
        steps(tel, calls, 1, 1)  # warm-up: first names, first series
        tel.flush(30)
        spans0, bytes0 = spans_in(traces)
        figures = steps(tel, calls, steps_per_size, 2)
        tel.flush(30)
        spans1, bytes1 = spans_in(traces)
        new = spans1[len(spans0) :]
        called = [span for span in new if span["name"] in PHASES]
        assert called and all(ranks_named(span) == n for span in called), "no rank records"
        figures["spans_step"] = len(new) / steps_per_size
        figures["bytes_step"] = (bytes1 - bytes0) / steps_per_size / 1e3
        body, scrape_s = fetch(tel.metrics_url)
        lines = body.decode().splitlines()
        figures["series"] = sum(1 for line in lines if line and not line.startswith("#"))
        figures["metrics_kb"] = len(body) / 1e3
        figures["metrics_ms"] = scrape_s * 1e3
        figures.update(staggered(tel, actor, n, 2 + steps_per_size, spread_s))
        figures.update(stuck_rank(tel, actor, calls, 4 + steps_per_size))
        figures.update(clock_exchange(tel, calls, 5 + steps_per_size))
        figures["clock_added_ms"] = figures["clock_cpu_ms"] - figures["call_cpu_ms"]
        figures.update(heartbeats(n, directory, directory.url))
    finally:
        tel.shutdown()
    return figures


def exponent(sizes: list[int], values: list[float]) -> float | None:
    """Slope of log(value) on log(N), least squares; None where a value is not positive."""
    if len(sizes) < 2 or any(v <= 0 for v in values):
        return None
    xs = [math.log(n) for n in sizes]
    ys = [math.log(v) for v in values]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def fmt(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.3g}" if value < 10 else f"{value:.1f}"


def table(sizes: list[int], results: dict[int, dict[str, float]]) -> str:
    head = f"| figure | unit | {' | '.join(f'N={n:,}' for n in sizes)} | exponent |"
    lines = [head, "|" + "---|" * (len(sizes) + 3)]
    for key, unit, what in ROWS:
        values = [results[n][key] for n in sizes]
        slope = exponent(sizes, values)
        shown = "—" if slope is None else f"{slope:.2f}"
        lines.append(f"| {what} | {unit} | {' | '.join(fmt(v) for v in values)} | {shown} |")
    return "\n".join(lines)


def run(
    sizes: list[int], steps_per_size: int = 3, spread_s: float = SPREAD_S
) -> dict[int, dict[str, float]]:
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory(prefix="rlotel-scale-") as workdir:
            actor = Replies.options(max_concurrency=max(sizes) + 8).remote()
            return {n: at(n, steps_per_size, Path(workdir), actor, spread_s) for n in sizes}
    finally:
        if started_ray:
            ray.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256, 1024])
    parser.add_argument("--steps", type=int, default=3, help="measured steps per size")
    parser.add_argument(
        "--spread", type=float, default=SPREAD_S, help="seconds the real actor's replies span"
    )
    args = parser.parse_args(argv)
    sizes = sorted(set(args.ranks))
    results = run(sizes, args.steps, args.spread)
    print(
        f"rlotel at N ranks: 1 real Ray actor (async; answers the spread call's N ranks); "
        f"N simulated ranks (replies ray.put by the driver) and N simulated processes "
        f"(heartbeat keys in the real GCS KV); "
        f"{len(PHASES)} worker-group calls a step, {args.steps} measured steps per N; "
        f"the spread call's replies over {args.spread:g} s; "
        f"Ray {ray.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} cores"
    )
    print(table(sizes, results))


if __name__ == "__main__":
    main()
