"""The acceptance test: verl 0.9.1's real `python -m verl.trainer.main_ppo` (V1 trainer,
GRPO, vLLM rollout, 3 steps, a tiny local model, CPU, loopback only) with the rlotel plugin
on, zero code — and the same run with it off. Everything asserted is read from the run's
own outputs: verl's file logger, the trainer's `/metrics` scraped while it trained, the
traces directory, and rlotel's offline commands on it."""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import statistics
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from benchmarks import series_budget as sb
from rlotel.cli import commands as cli
from rlotel.cli import doctor
from rlotel.integrations.registered import HOOKS
from rlotel.offline import analyze
from rlotel.schema import vocabulary as voc
from rlotel.schema.data_moves import DIRECTIONS, MOVING, STAGES
from tests.e2e import ahead
from tests.e2e.ahead import figure
from tests.e2e.assets import SOURCES, source_of
from tests.e2e.main_ppo import (
    EXPERIMENT,
    ROLLOUTS,
    SCRAPE_TIMEOUT_S,
    TIMEOUT_S,
    TQ_CAPACITY,
    isolated,
)
from tests.helpers import file_spans, parse_exposition, span_rows

pytestmark = pytest.mark.slow

STEPS = 3
TRAJECTORIES = 4 * 2  # data.train_batch_size × rollout.n
VERL_ROLES = {
    *("actor", "rollout", "ref", "critic", "reward"),  # verl's own role names
    *("agent_loop", "load_balancer", "transfer_queue"),  # its other actors
}
COMPARED = (voc.TIMING_S, voc.TIMING_PER_TOKEN_MS, voc.OFF_POLICY)
COMPARED_KEYS = (voc.THROUGHPUT, voc.TIME_PER_STEP, voc.TOTAL_NUM_TOKENS)


def declare_main_ppo(key: str, *argv: str, steps: int = STEPS) -> None:
    """A real run of `main_ppo` (`steps`, the shared inputs, `argv`) read by fixture `key`."""
    ahead.declare(
        key,
        "rl-e2e-",
        lambda work, assets: isolated(
            [str(work), "--steps", str(steps), "--assets", str(assets), *argv]
        ),
        TIMEOUT_S + 60,
    )


def main_ppo(key: str) -> Iterator[Path]:
    """The directory of the run of `key`, once it trained to the end."""
    for work in ahead.work_of(key):
        result = ahead.finished(key).result
        log = work / "console.log"
        console = log.read_text(errors="replace") if log.exists() else ""
        assert result is not None and result.returncode == 0, (
            result.stderr[-3000:] + console[-6000:]
        )
        yield work


PROFILED_STEP = 2
TOKEN_WINDOW = (1, 4)  # the rollout engine records decode iterations [1, 4): vLLM's delay/max
PROFILE = (  # verl's torch profiler on the actor for step 2, written under its save_path
    "global_profiler.tool=torch",
    f"global_profiler.steps=[{PROFILED_STEP}]",
    "actor_rollout_ref.actor.profiler.enable=True",
    "actor_rollout_ref.actor.profiler.all_ranks=True",
    # discrete: a trace per worker stage, the update's named by its mini-batch window, and
    # the rollout engine's (vLLM's profiler, per replica) over `gen` in a token window
    "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=True",
    "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.active=1",
    f"actor_rollout_ref.rollout.profiler.tool_config.torch.profile_token_start={TOKEN_WINDOW[0]}",
    f"actor_rollout_ref.rollout.profiler.tool_config.torch.profile_token_end={TOKEN_WINDOW[1]}",
)

# the toy reward as a dict: verl's reward_extra_info carries its components (score, acc)
SCORED_WITH_ACC = "reward.custom_reward_function.name=compute_score_with_acc"
COMPONENTS = ("score", "acc")
REFERENCE = 8  # bytes an object column holds a sample (numpy's nbytes of a dtype=object array)


# scraped as shipped, verl's RL-Insight logger and its own stack beside rlotel, the rewards
# as a dict (its components by data source), and the test's own count of TransferQueue's hops
declare_main_ppo(
    "plugin_on", "--prometheus", "--rl-insight", "--tq-probe", SCORED_WITH_ACC, *PROFILE
)
declare_main_ppo("plugin_off", "--off", *PROFILE)
declare_main_ppo("every_hook_failing", "--faults", "all", *PROFILE)


@pytest.fixture(scope="module")
def plugin_on() -> Iterator[Path]:
    yield from main_ppo("plugin_on")


@pytest.fixture(scope="module")
def plugin_off() -> Iterator[Path]:
    yield from main_ppo("plugin_off")


@pytest.fixture(scope="module")
def every_hook_failing() -> Iterator[Path]:
    """The plugin on, each hook's rlotel part made to raise where it starts its work."""
    yield from main_ppo("every_hook_failing")


def verl_log(work: Path) -> dict[int, dict]:
    lines = (work / "verl.jsonl").read_text().splitlines()
    return {record["step"]: record["data"] for record in map(json.loads, lines)}


def compared(data: dict) -> dict[str, float]:
    return {
        key: value
        for key, value in data.items()
        if key.startswith(COMPARED) or key in COMPARED_KEYS
    }


def last_scrape(work: Path) -> tuple[int, dict]:
    """The step the last scrape of the trainer's /metrics shows, and its series."""
    series = parse_exposition(sorted((work / "scrapes").glob("*.txt"))[-1].read_text())
    number = int(series[("rlotel_step", frozenset({("run", EXPERIMENT)}))])
    assert number >= 2
    return number, series


def spans_by_role(work: Path) -> dict[str, list[dict]]:
    roles: dict[str, list[dict]] = {}
    for path in sorted((work / "traces").glob("*.jsonl")):
        roles.setdefault(path.name.split("-", 1)[0], []).extend(file_spans(path, EXPERIMENT))
    return roles


def test_trainer_metrics_at_the_documented_address_while_training(plugin_on: Path) -> None:
    scrapes = sorted((plugin_on / "scrapes").glob("*.txt"))
    assert scrapes, "nothing answered at 127.0.0.1:9464/metrics during the run"
    during = [
        text
        for text in (path.read_text() for path in scrapes)
        if parse_exposition(text).get(("rlotel_step", frozenset({("run", EXPERIMENT)})), 0) < STEPS
    ]
    assert during, "no scrape while steps were still to come"
    for text in (path.read_text() for path in scrapes):
        series = [line for line in text.splitlines() if line and not line.startswith("#")]
        assert series
        unlabelled = [line for line in series if f'run="{EXPERIMENT}"' not in line]
        assert not unlabelled, unlabelled[:5]


def test_verl_numbers_equal_rlotel_numbers(plugin_on: Path) -> None:
    logged = verl_log(plugin_on)
    assert sorted(logged) == list(range(1, STEPS + 1))
    ours = {step.number: step for step in analyze.load_steps(plugin_on / "traces")}
    assert sorted(ours) == sorted(logged)
    counts = {}
    for number, data in logged.items():
        theirs = compared(data)
        counts[number] = len(theirs)
        assert {k for k in theirs if k.startswith(voc.TIMING_S)} >= {
            "timing_s/step", "timing_s/gen", "timing_s/update_actor",
        }  # fmt: skip
        mine = {**ours[number].metrics, **{f"{voc.TIMING_S}{k}": v for k, v in
                                           ours[number].timing_raw.items()}}  # fmt: skip
        for key, value in theirs.items():
            if key.startswith(voc.OFF_POLICY):
                continue  # per-sample means: checked against the histograms below
            assert key in mine, (number, key)
            assert math.isclose(mine[key], value, rel_tol=1e-6, abs_tol=1e-9), (key, value)
    figure("keys verl logged and rlotel computed, equal, by step:", counts)
    # the exported series, from the last scrape (taken while it trained: some step ≥ 2)
    number, last = last_scrape(plugin_on)
    final = logged[number]
    run = ("run", EXPERIMENT)
    for name, seconds in ((k, v) for k, v in final.items() if k.startswith(voc.TIMING_S)):
        phase = name.removeprefix(voc.TIMING_S)
        key = ("rlotel_step_phase_seconds", frozenset({run, ("phase", phase)}))
        if phase == voc.STEP:
            key = ("rlotel_step_time_seconds", frozenset({run}))
        assert math.isclose(last[key], seconds, rel_tol=1e-6), (phase, last.get(key), seconds)
    # verl's per-step means of staleness and weight spans × trajectories = the histograms' sums
    for family, key in (
        ("rlotel_sample_staleness_steps", "trajectory_staleness/mean"),
        ("rlotel_sample_weight_span_steps", "trajectory_spans/mean"),
    ):
        expected = sum(
            logged[n][f"{voc.OFF_POLICY}{key}"] * TRAJECTORIES for n in logged if n <= number
        )
        assert last[(f"{family}_count", frozenset({run}))] == number * TRAJECTORIES
        assert math.isclose(last[(f"{family}_sum", frozenset({run}))], expected), family
    # the per-sample read rlotel adds inside verl's gen window: ≤ 1 % of gen
    batches = (
        "rlotel_integration_events_total",
        frozenset({run, ("hook", "verl_v1_replay_batch")}),
    )
    spent = last[("rlotel_integration_seconds_total", batches[1])]
    read = int(last[batches])  # one a step; the next step's may be read already
    gen = sum(logged[n]["timing_s/gen"] for n in logged if n <= read)
    assert read in (number, number + 1) and 0 < spent <= 0.01 * gen, (read, spent, gen)
    throughput = last[("rlotel_throughput_tokens_per_second_per_gpu", frozenset({run}))]
    assert math.isclose(throughput, final[voc.THROUGHPUT], rel_tol=1e-6)
    kinds = {
        dict(labels)["kind"]: value
        for (name, labels), value in last.items()
        if name == "rlotel_step_tokens" and run in labels
    }
    assert set(kinds) == {"prompt", "response"}  # the parts; their sum is verl's total
    assert math.isclose(sum(kinds.values()), final[voc.TOTAL_NUM_TOKENS])


def test_samples_per_step_with_identity_and_worker_times(plugin_on: Path) -> None:
    trainer = spans_by_role(plugin_on)["trainer"]
    steps = {s["attrs"]["rl.step"]: s for s in trainer if s["name"] == "step"}
    assert sorted(steps) == list(range(1, STEPS + 1))
    for number, step in steps.items():
        samples = [s for s in trainer if s["name"] == "sample" and s["trace"] == step["trace"]]
        assert 1 <= len(samples) <= TRAJECTORIES, number  # the slowest get spans (budget)
        for sample in samples:
            attrs = sample["attrs"]
            assert attrs["rl.sample.uid"] and "rl.sample.session" in attrs
            assert attrs["rl.sample.turns"] >= 1  # stamped by the agent-loop worker
            assert attrs["rl.sample.generate_sequences_s"] > 0
            assert step["start"] - 60e9 < sample["start"] < sample["end"] <= step["end"]
            # its model turns (the worker timed each generate call) and verl's reward
            chats = [s for s in trainer if s["name"] == "chat" and s["parent"] == sample["id"]]
            assert len(chats) == 1, sample  # single-turn GRPO: one model turn
            assert sample["start"] <= chats[0]["start"] < chats[0]["end"] <= sample["end"]
            (score,) = [e for n, e in sample["events"] if n == "gen_ai.evaluation.result"]
            assert score["gen_ai.evaluation.score.value"] >= 0  # the toy reward's range
    number, last = last_scrape(plugin_on)
    count = [
        v
        for (name, labels), v in last.items()
        if name == "rlotel_agent_loop_duration_seconds_count"
        and ("stage", "generate_sequences") in labels
    ]
    assert count == [number * TRAJECTORIES]


def test_worker_spans_under_the_driver_phases(plugin_on: Path) -> None:
    roles = spans_by_role(plugin_on)
    assert "trainer" in roles and "actor" in roles
    assert set(roles) - {"trainer"} <= VERL_ROLES, set(roles)
    trainer = {s["id"]: s for s in roles["trainer"]}
    nested = {}
    for span in roles["actor"]:
        parent = trainer.get(span["parent"])
        if parent is not None:
            nested.setdefault(parent["name"], set()).add(span["name"])
            assert parent["trace"] == span["trace"]
    assert nested.get("update_actor") == {"update_actor"}, nested
    assert nested.get("old_log_prob") == {"compute_log_prob"}, nested


UPDATE_ACTOR_DATA = (
    r"update_actor [\d.]+ [\d.]+% (?:[\d.]+ )?[\d.]+ "
    r"\((?:dispatch|submit|transfer|read|write|fetch|collect) [\d.]+, [\d.e+-]+ MB; work [\d.]+\)"
)


def test_offline_commands_read_the_run(plugin_on: Path, capsys, tmp_path) -> None:
    traces = plugin_on / "traces"
    assert cli.main(["analyze", str(traces), "--every", "1"]) == 0
    tables = capsys.readouterr().out.split("Step ledger, ")[1:]
    logged = verl_log(plugin_on)
    assert len(tables) == len(logged)
    for table, (number, data) in zip(tables, sorted(logged.items()), strict=True):
        assert table.startswith(f"steps {number}–{number}")
        for phase in ("gen", "update_actor", "step"):
            assert re.search(rf"{phase}\s+│\s+{data[f'timing_s/{phase}']:.4f}", table), phase
        # update_actor's calls: data-movement seconds (the longest stage, MB, work); the
        # table wraps its cells to the console's width, so read it with the borders gone
        flat = re.sub(r"[\s│┃]+", " ", table)
        assert re.search(UPDATE_ACTOR_DATA, flat), flat
    report = tmp_path / "report.html"
    assert cli.main(["report", str(traces), "-o", str(report)]) == 0
    from tests.chromium import Chromium, chromium_binary, file_url

    if chromium_binary() is None:
        pytest.fail("chromium is not installed: `make system-deps` installs Debian's")
    with Chromium() as browser:
        load = browser.open(file_url(report), "document.body.dataset.drawn === '1'")
        assert load.console_errors == [] and load.requests == []
        shown = json.loads(
            browser.evaluate(
                "JSON.stringify({charts: document.querySelectorAll('.js-plotly-plot').length,"
                " data: !document.getElementById('data-movement').hidden,"
                " steps: [...document.querySelectorAll('#step-select option')].map(e => e.value)})"
            )
        )
    assert shown["charts"] >= 5 and shown["steps"] == [str(n) for n in range(1, STEPS + 1)]
    assert shown["data"]  # the Data movement chart: the run's worker-group calls
    assert cli.main(["perfetto", str(traces), "-o", str(tmp_path / "trace.json")]) == 0
    events = json.loads((tmp_path / "trace.json").read_text())
    names = {e.get("name") for e in events.get("traceEvents", events)}
    assert {"step", "gen", "update_actor", "compute_log_prob"} <= names


def links_of(span: dict) -> dict[tuple[str, str], dict]:
    """A span's capture links: (trace, span) of the capture span → the link's attributes."""
    return {(t, s): a for t, s, a in span["links"] if "rl.profile.path" in a}


def test_verl_profiler_captures_linked_from_their_windows(plugin_on: Path, tmp_path) -> None:
    """verl's discrete profile of step 2: the actor's log-prob and update traces and the
    rollout engine's, each linked from the step, the trainer phase it explains, and the
    span of the worker (or rollout replica) that wrote it, with its writer, window and step."""
    roles = spans_by_role(plugin_on)
    trainer = roles["trainer"]
    captures = {
        (s["trace"], s["id"]): s["attrs"] for s in trainer if s["name"] == "profile.capture"
    }
    for attrs in captures.values():
        path = Path(attrs["rl.profile.path"])
        assert (path if path.is_absolute() else plugin_on / path).is_file(), path
    stages = sorted(a.get("rl.profile.stage", "engine") for a in captures.values())
    assert stages == ["actor_compute_log_prob", "actor_update", "engine"], captures
    steps = {s["attrs"]["rl.step"]: s for s in trainer if s["name"] == "step"}
    assert set(links_of(steps[PROFILED_STEP])) == set(captures)
    assert not any(links_of(s) for n, s in steps.items() if n != PROFILED_STEP)

    def linked_from(spans: list[dict], name: str) -> dict[tuple[str, str], dict]:
        return {k: a for s in spans if s["name"] == name for k, a in links_of(s).items()}

    in_step = [s for s in trainer if s["attrs"].get("rl.step") == PROFILED_STEP]
    windows = {"old_log_prob": "actor_compute_log_prob", "update_actor": "actor_update"}
    for phase, stage in (*windows.items(), ("gen", None)):
        ((key, link),) = linked_from(in_step, phase).items()
        assert key in captures and link.get("rl.profile.stage") == stage, (phase, link)
        assert link["rl.profile.step_first"] == link["rl.profile.step_last"] == PROFILED_STEP
    (log_prob,) = linked_from(in_step, "old_log_prob").values()
    assert (log_prob["rl.profile.role"], log_prob["rl.profile.rank"]) == ("actor", 0)
    (update,) = linked_from(in_step, "update_actor").values()
    assert (update["rl.profile.mini_batch_first"], update["rl.profile.mini_batch_last"]) == (0, 0)
    assert "_mb0." in update["rl.profile.path"]
    (engine,) = linked_from(in_step, "gen").values()
    assert (engine["rl.profile.role"], engine["rl.profile.replica"]) == ("rollout", 0)
    assert (engine["rl.profile.token_start"], engine["rl.profile.token_end"]) == TOKEN_WINDOW
    assert "agent_loop_rollout_replica_0/" in engine["rl.profile.path"]
    # the writers' own spans link the same capture spans
    actor = roles["actor"]
    methods = {"compute_log_prob": windows["old_log_prob"], "update_actor": windows["update_actor"]}
    for method, stage in methods.items():
        ((key, link),) = linked_from(actor, method).items()
        assert captures[key]["rl.profile.stage"] == link["rl.profile.stage"] == stage
    replica = [s for s in roles["rollout"] if s["attrs"].get("rl.replica", 0) == 0]
    ((key, link),) = linked_from(replica, "stop_profile").items()
    assert key in captures and link["rl.profile.replica"] == 0
    assert (link["rl.profile.token_start"], link["rl.profile.token_end"]) == TOKEN_WINDOW
    seconds = {n: round(d["timing_s/step"], 2) for n, d in verl_log(plugin_on).items()}
    wall = json.loads((plugin_on / "run.json").read_text())["wall_s"]
    figure("step seconds:", seconds, "run wall s:", round(wall, 1))
    quoted = {"old_log_prob": log_prob, "update_actor": update, "gen": engine,
              "rollout stop_profile": link}  # fmt: skip
    for window, attributes in quoted.items():
        figure("link from", window, {k: v for k, v in attributes.items() if k not in
                                     ("rl.profile.phases", "rl.profile.top_ops")})  # fmt: skip
    # the report lists each capture with its windows; the timeline puts it over them
    from tests.test_report import page_data

    expected = {
        Path(log_prob["rl.profile.path"]).name: ["compute_log_prob", "old_log_prob"],
        Path(update["rl.profile.path"]).name: ["update_actor"],
        Path(engine["rl.profile.path"]).name: ["gen", "stop_profile"],
    }
    report = tmp_path / "report.html"
    assert cli.main(["report", str(plugin_on / "traces"), "-o", str(report)]) == 0
    listed = {Path(c["path"]).name: c for c in page_data(report)["captures"]}
    assert {name: c["windows"] for name, c in listed.items()} == expected
    assert all(c["covers"] == [PROFILED_STEP] and c["exists"] for c in listed.values())
    assert cli.main(["perfetto", str(plugin_on / "traces"), "-o", str(tmp_path / "t.json")]) == 0
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    slices = [e for e in events if e.get("name") == "profile.capture" and e["ph"] == "X"]
    shown = {Path(e["args"]["rl.profile.path"]).name: e["args"]["linked_from"] for e in slices}
    windows = {n: sorted({w.split()[-1] for w in ws} - {"step"}) for n, ws in shown.items()}
    assert windows == expected
    arrows = [e for e in events if e.get("cat") == "rl.profile" and e["ph"] == "s"]
    assert len(arrows) == sum(len(ws) for ws in shown.values())


def test_verdicts_carry_mfu_and_token_evidence(plugin_on: Path) -> None:
    """Each step's verdict quotes the MFU verl logged for that step (0.0 on CPU: verl's
    value as it is), not merely a key."""
    logged = verl_log(plugin_on)
    trainer = spans_by_role(plugin_on)["trainer"]
    steps = [s for s in trainer if s["name"] == "step"]
    assert sorted(s["attrs"]["rl.step"] for s in steps) == sorted(logged)
    for step in steps:
        attrs = step["attrs"]
        assert "rl.bottleneck" in attrs
        mfu = logged[attrs["rl.step"]]["perf/mfu/actor"]
        quoted = attrs["rl.bottleneck.evidence.mfu_actor"]  # rounded to 4 places
        assert math.isclose(quoted, mfu, abs_tol=5e-5), (quoted, mfu)


def test_the_data_ledger_of_every_worker_group_call(plugin_on: Path) -> None:
    """Each window that called a worker group carries its calls' stages and bytes: the
    stages add up to the calls' wall time on the driver, the ranks' TransferQueue reads and
    writes (V1's data path) are in them, the hops show in each process's own series, and a
    run that moves little data is not called data-movement-bound."""
    trainer = spans_by_role(plugin_on)["trainer"]
    windows = [s for s in trainer if "rl.data.calls" in s["attrs"]]
    assert {s["name"] for s in windows} >= {"old_log_prob", "update_actor"}, windows
    worst_other = 0.0
    for span in windows:
        data = {k.removeprefix("rl.data."): v for k, v in span["attrs"].items() if "rl.data." in k}
        stages = {k[:-2]: v for k, v in data.items() if k.endswith("_s") and k != "wall_s"}
        assert set(stages) == set(STAGES), stages
        assert math.isclose(sum(stages.values()), data["wall_s"], abs_tol=1e-6 * data["calls"])
        assert data["wall_s"] <= (span["end"] - span["start"]) / 1e9 + 1e-6  # inside its window
        worst_other = max(worst_other, stages["other"] / data["wall_s"])
        moving = sum(stages[stage] for stage in MOVING)
        figure(
            f"{span['name']} (step {span['attrs'].get('rl.step', '?')}): {data['calls']:.0f} "
            f"call(s), wall {data['wall_s'] * 1e3:.1f} ms, moving {moving * 1e3:.1f} ms:",
            ", ".join(f"{k} {v * 1e3:.1f}" for k, v in stages.items() if v),
            "; bytes",
            ", ".join(f"{d} {data[f'{d}_bytes']:.0f}" for d in DIRECTIONS),
        )
    figure(f"unattributed (other) at most {worst_other:.2%} of a window's calls")
    assert worst_other < 0.05
    updates = [s for s in windows if s["name"] == "update_actor"]
    assert all(s["attrs"]["rl.data.read_bytes"] > 0 for s in updates)  # read from TransferQueue
    # bytes, window by window, against the test's own count of the ranks' TransferQueue hops
    # where verl turns metadata into batches and back (verl_cpu/rlotel_test_tq_probe.py):
    # tensors' elements × element size, non-tensor columns' items as references
    probed = [
        json.loads(line)
        for path in (plugin_on / "tq_probe").glob("*.jsonl")
        for line in path.read_text().splitlines()
    ]
    counted = dict.fromkeys(("get", "put"), 0)
    for span in windows:
        start, end = span["start"] / 1e9, span["end"] / 1e9
        for direction, op in (("read", "get"), ("write", "put")):
            hops = [h for h in probed if h["op"] == op and start <= h["start"] <= h["end"] <= end]
            size = sum(h["tensor_bytes"] + REFERENCE * h["non_tensor_items"] for h in hops)
            assert span["attrs"][f"rl.data.{direction}_bytes"] == size, (span["name"], op, hops)
            counted[op] += size
    assert counted["get"] > 0 and sum(h["op"] == "get" for h in probed) >= len(updates)
    every = sum(h["tensor_bytes"] + REFERENCE * h["non_tensor_items"] for h in probed)
    assert sum(counted.values()) == every  # the ranks move data only in a window's calls
    figure(
        f"bytes equal the test's own count in every window: {len(probed)} hops, "
        f"{counted['get']:,} read, {counted['put']:,} written"
    )
    for step in (s for s in trainer if s["name"] == "step"):
        assert not step["attrs"]["rl.bottleneck"].startswith("data-movement"), step["attrs"]
    hops: dict[tuple[str, str], list[float]] = {}
    for path in (plugin_on / "targets").glob("*.txt"):
        for (name, labels), value in parse_exposition(path.read_text()).items():
            if name.startswith("rlotel_queue_") and name.endswith("_total"):
                key = (dict(labels)["queue"], dict(labels)["op"])
                totals = hops.setdefault(key, [0.0, 0.0, 0.0])
                totals[("seconds", "bytes", "operations").index(name.split("_")[2])] += value
    for (queue, op), (seconds, moved, operations) in sorted(hops.items()):
        figure(f"{queue} {op}: {operations:.0f} ops, {seconds:.3f} s, {moved / 1e6:.3f} MB")
    for op in ("put", "get"):
        seconds, moved, operations = hops[("transfer_queue", op)]
        assert operations > 0 and seconds > 0 and moved > 0, (op, hops)


def test_each_process_serves_within_the_documented_series_bound(plugin_on: Path) -> None:
    """docs/production.md's series table is a bound computed from the catalogue: each process
    of the real run, at its last scrape, serves within it (the trainer a driver's, every
    other process a worker's); the measured counts are printed beside the bounds."""
    scale = sb.Scale(8)
    bounds = {"driver": sb.process_series(sb.DRIVER, scale),
              "worker": sb.process_series(sb.WORKER, scale)}  # fmt: skip
    role_of = {path.stem.rsplit("-", 1)[-1]: path.name.split("-", 1)[0]
               for path in (plugin_on / "traces").glob("*.jsonl")}  # fmt: skip

    def rlotel_series(text: str) -> int:
        return sum(name.startswith("rlotel_") for name, _ in parse_exposition(text))

    trainer = rlotel_series(sorted((plugin_on / "scrapes").glob("*.txt"))[-1].read_text())
    workers = {
        role_of.get(path.stem.removeprefix("rlotel-"), path.stem): rlotel_series(path.read_text())
        for path in (plugin_on / "targets").glob("rlotel-*.txt")
    }
    figure(
        f"series served, measured against the documented bound: trainer {trainer} of "
        f"{bounds['driver']:,};",
        ", ".join(f"{role} {count}" for role, count in sorted(workers.items())),
        f"of {bounds['worker']} each",
    )
    assert 0 < trainer <= bounds["driver"]
    assert {"actor", "rollout", "agent_loop"} <= set(workers), workers
    assert all(0 < count <= bounds["worker"] for count in workers.values()), workers


def test_plugin_off_trains_with_the_same_keys(plugin_on: Path, plugin_off: Path) -> None:
    on, off = verl_log(plugin_on), verl_log(plugin_off)
    assert sorted(off) == sorted(on)
    for number in on:
        assert set(off[number]) == set(on[number]), number
    assert not (plugin_off / "traces").exists()
    assert not list((plugin_off / "scrapes").glob("*.txt"))


# The hooks the V1 trainer's processes reach with every rlotel part failing at its start
# (a hook downstream of a failed one is not reached: no carrier, no phase, no wrapped class).
REACHED_FAILING = {
    "verl_v1_fit",  # the trainer: not declared the driver, so its telemetry is a worker's
    "verl_timer",
    "verl_tracking",
    "verl_worker_group",
    "verl_v1_replay_batch",
    "verl_v1_evict",
    "ray_actor_submit",
    "ray_actor_class",  # every Ray worker process
    "verl_v1_score",  # the agent-loop worker
    "verl_v1_turn",
    "verl_rollout_replica",
}
REGISTERED = {hook.name for hook in HOOKS}
# Said on the console by processes with no /metrics of their own: main_ppo's, and the vLLM
# server's (its engine's telemetry is vLLM's own tracing)
SAID_FAILING = {"verl_runtime_env", "vllm_engine", "vllm_request_context"}
# Hooks the healthy run fires that the chaos run cannot reach, each for the hook upstream of
# it that failed first (or what the chaos run does not ask for)
DOWNSTREAM = {
    "verl_v1_trajectory": "opens only under a traced dispatch (ray_actor_submit failed)",
    "torch_collective": "attached by a traced worker call (ray_actor_class failed)",
    "vllm_span_exporter": "asked for once vLLM's tracing is on (vllm_engine failed)",
    "verl_prometheus_writer": "the chaos run does not ask verl for rollout.prometheus",
}


def hook_events(work: Path) -> dict[str, float]:
    """rlotel_integration_events_total by hook, over every process's last scrape."""
    events: dict[str, float] = {}
    paths = [*(work / "targets").glob("*.txt"), *sorted((work / "scrapes").glob("*.txt"))[-1:]]
    for path in paths:
        for (name, labels), value in parse_exposition(path.read_text()).items():
            if name == "rlotel_integration_events_total":
                hook = dict(labels)["hook"]
                events[hook] = events.get(hook, 0) + value
    return events


def hook_failures(work: Path) -> dict[str, dict[str, float]]:
    """rlotel_integration_failures_total by hook, from the last scrape of each process."""
    failures: dict[str, dict[str, float]] = {}
    for path in sorted((work / "targets").glob("*.txt")):
        for (name, labels), value in parse_exposition(path.read_text()).items():
            if name == "rlotel_integration_failures_total":
                failures.setdefault(dict(labels)["hook"], {})[path.stem] = value
    return failures


def test_every_hook_failing_trains_exactly_as_without_rlotel(
    every_hook_failing: Path, plugin_off: Path, plugin_on: Path
) -> None:
    """It trained to the end (the fixture checked the exit code) logging exactly the keys
    verl logs with the plugin off; every process's /metrics names the hooks that failed,
    each process said so once per hook, and no traceback went through rlotel."""
    failing, off = verl_log(every_hook_failing), verl_log(plugin_off)
    assert sorted(failing) == sorted(off) == list(range(1, STEPS + 1))
    for number in off:
        assert set(failing[number]) == set(off[number]), number
    failures = hook_failures(every_hook_failing)
    assert set(failures) >= REACHED_FAILING, sorted(failures)
    assert len(failures["ray_actor_class"]) >= 2  # every process whose telemetry started
    console = (every_hook_failing / "console.log").read_text(errors="replace")
    said = Counter(
        (re.search(r"pid=(\d+)", line)[1] if "pid=" in line else "", hook)
        for line in console.splitlines()
        for hook in re.findall(r"rlotel: the (\w+) hook failed", line)
    )
    assert set(failures) <= {hook for _, hook in said}, said  # every failure was said
    assert max(said.values()) == 1, said.most_common(3)  # once per hook, not per call
    assert ("", "verl_runtime_env") in said  # main_ppo's own process, which has no /metrics
    failed = set(failures) | {hook for _, hook in said}
    assert failed >= SAID_FAILING, sorted(failed)
    # every registered hook the same run fires with rlotel working failed here
    fired = {hook for hook, n in hook_events(plugin_on).items() if n and hook in REGISTERED}
    assert fired - set(DOWNSTREAM), "no registered hook fired in the healthy run"
    assert fired - set(DOWNSTREAM) <= failed, sorted(fired - set(DOWNSTREAM) - failed)
    assert set(DOWNSTREAM) <= fired  # an exemption the healthy run does not need goes
    figure("every hook failing; failed:", sorted(failed), "fired when healthy:", sorted(fired))
    # `rlotel doctor --traces` says the same after the runs, from the files their processes left
    assert set(doctor.traces_counts(str(every_hook_failing / "traces"))["failures"]) >= set(
        failures
    )
    healthy = doctor.traces_counts(str(plugin_on / "traces"))
    assert set(healthy["events"]) >= fired and not healthy["failures"], healthy
    # what the doctor counts is registered hooks, and every hook this run reaches (it failed
    # in the chaos run, in a process that keeps a traces file) fired in the healthy one
    assert set(healthy["events"]) <= REGISTERED, sorted(set(healthy["events"]) - REGISTERED)
    reached = set(doctor.traces_counts(str(every_hook_failing / "traces"))["failures"])
    unfired = {hook for hook in reached if not healthy["events"].get(hook)}
    figure("doctor --traces of the healthy run, fired:", dict(sorted(healthy["events"].items())))
    assert not unfired, f"ran, yet the doctor says fired 0: {sorted(unfired)}"
    assert not healthy["not_attached"], healthy
    assert not re.search(r'File "[^"]*/rlotel/', console)


def otlp_spans(work: Path) -> dict[str, dict]:
    lines = (work / "otlp.jsonl").read_text().splitlines()
    return {span["id"]: span for span in map(json.loads, lines)}


def ancestry(span: dict, spans: dict[str, dict]) -> list[tuple[str, str]]:
    chain: list[tuple[str, str]] = []
    while span is not None:
        assert len(chain) < 64, f"a cycle of parents: {chain[:8]}"
        chain.append((span["role"] or span["service"], span["name"]))
        span = spans.get(span["parent"])
    return chain


def ids_of(span: dict, spans: dict[str, dict]) -> list[str]:
    """The ids of `span` and its ancestors, innermost first."""
    ids = []
    while span is not None:
        ids.append(span["id"])
        span = spans.get(span["parent"])
    return ids


def test_engine_requests_under_the_trajectory_they_served(plugin_on: Path) -> None:
    spans = otlp_spans(plugin_on)
    requests = [s for s in spans.values() if s["name"] == "llm_request"]
    assert len(requests) >= STEPS * TRAJECTORIES, len(requests)
    # what vLLM's request spans add to the traces a Collector takes: one per request
    sent = {service: [s["bytes"] for s in spans.values() if s["service"] == service]
            for service in ("vllm", "rlotel")}  # fmt: skip
    figure(
        f"OTLP spans over {STEPS} steps of {TRAJECTORIES} trajectories: vLLM {len(requests)} "
        f"llm_request spans, {statistics.median(s['bytes'] for s in requests):.0f} B each "
        f"(protobuf), {sum(sent['vllm']) / STEPS / 1e3:.1f} kB a step with its start-up spans; "
        f"rlotel {len(sent['rlotel'])} spans, {sum(sent['rlotel']) / STEPS / 1e3:.1f} kB a step"
    )
    for request in requests:
        assert request["service"] == "vllm"  # vLLM's own span, from its own tracer
        parent = spans.get(request["parent"])  # rlotel's `generate` span in the server
        assert parent is not None and parent["trace"] == request["trace"], request
        chain = ancestry(request, spans)
        names = [name for _, name in chain]
        assert names[1] == "generate" and chain[1][0] == "rollout", chain
        # the trajectory runs under the trainer's phase that dispatched it (V1: its step)
        trajectory = names.index("trajectory")
        assert chain[trajectory][0] == "agent_loop", chain
        assert all(role == "trainer" for role, _ in chain[trajectory + 1 :]), chain
        assert names[-1] == "step", chain
        assert len({spans[span_id]["trace"] for span_id in ids_of(request, spans)}) == 1
    # the trainer's sample spans link the worker-side trajectory spans they were
    trajectories = {s["id"] for s in spans.values() if s["name"] == "trajectory"}
    samples = [s for s in spans_by_role(plugin_on)["trainer"] if s["name"] == "sample"]
    linked = {span for s in samples for _, span, link in s["links"]
              if link.get("rl.link.relation") == "trajectory"}  # fmt: skip
    assert samples and len(linked) == len(samples)
    assert linked <= trajectories


def test_report_of_the_real_run_in_chromium(plugin_on: Path, tmp_path: Path) -> None:
    """`rlotel report` on the real run's traces, drawn by headless Chromium and read back
    from the DOM and the pixels: integer step ticks; verl's MFU 0.0 (CPU) said to be unknown,
    not drawn; throughput on an axis from 0; the tail from every trajectory of a step; verl's
    preempted -1 as unknown; each span in its role's colour; weight-sync stages drawn."""
    import base64
    import io

    from PIL import Image

    from tests.chromium import Chromium, chromium_binary, file_url
    from tests.test_report import _pixels_are_not_blank, page_data

    if chromium_binary() is None:
        pytest.fail("chromium is not installed: `make system-deps` installs Debian's")
    report = tmp_path / "report.html"
    assert cli.main(["report", str(plugin_on / "traces"), "-o", str(report)]) == 0
    data, logged = page_data(report), verl_log(plugin_on)
    with Chromium(height=6000) as browser:  # every section inside the viewport
        load = browser.open(file_url(report), "document.body.dataset.drawn === '1'")
        assert load.console_errors == [] and load.requests == []
        dom = json.loads(
            browser.evaluate(
                """(() => {
                  const texts = (s) => [...document.querySelectorAll(s)].map(e => e.textContent);
                  const box = (id) => { const r = document.getElementById(id)
                    .querySelector('.main-svg').getBoundingClientRect();
                    return { x: r.x, y: r.y + window.scrollY, width: r.width, height: r.height }; };
                  const charts = ['chart-phases', 'chart-throughput', 'chart-tail',
                                  'chart-verdicts', 'chart-weight-sync'];
                  return JSON.stringify({
                    xticks: Object.fromEntries(charts.map(id => [id, texts(`#${id} .xtick text`)])),
                    yticks: texts('#chart-throughput .ytick text'),
                    y2ticks: texts('#chart-throughput .y2tick text'),
                    mfu: document.getElementById('mfu-note').hidden ? null
                         : document.getElementById('mfu-note').textContent,
                    tailLegend: texts('#chart-tail .legendtext'),
                    preempted: [...document.querySelectorAll('#slowest-samples tr')].slice(1)
                                 .map(r => r.cells[5].textContent),
                    roles: texts('#chart-waterfall .legendtext'),
                    syncLegend: texts('#chart-weight-sync .legendtext'),
                    hidden: Object.fromEntries(['weight-sync', 'occasional', 'stalls', 'replicas']
                              .map(id => [id, document.getElementById(id).hidden])),
                    boxes: { tail: box('chart-tail'), waterfall: box('chart-waterfall') },
                  });
                })()"""
            )
        )
        page = browser.screenshot()
        shots = {}
        for name, box in dom["boxes"].items():  # one chart's pixels each
            shot = browser.call(
                "Page.captureScreenshot", session=True, format="png", clip={**box, "scale": 1}
            )
            shots[name] = Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")
    (tmp_path / "report.png").write_bytes(page)  # kept by pytest for a reader to look at
    steps = [str(n) for n in range(1, STEPS + 1)]
    assert dom["xticks"] == {chart: steps for chart in dom["xticks"]}, dom["xticks"]
    # MFU: verl logged 0.0 every step on CPU → unknown, said, no line and no MFU axis
    zero = sorted(k.removeprefix(voc.MFU) for k in logged[1] if k.startswith(voc.MFU)
                  if all(logged[n][k] == 0.0 for n in logged))  # fmt: skip
    assert zero, "verl 0.9.1 logs perf/mfu/<role> 0.0 on CPU: this run has no unknown MFU"
    assert data["mfu_unknown"] == zero and not set(zero) & set(data["mfu"])
    assert dom["mfu"] and all(role in dom["mfu"] for role in zero) and "unknown" in dom["mfu"]
    # no MFU line, so no MFU axis (its bounds: test_report's demo test, a run with MFU)
    assert data["mfu"] == {} and dom["y2ticks"] == []
    assert dom["yticks"][0] == "0" and all(float(t) >= 0 for t in dom["yticks"])
    for number in logged:
        assert math.isclose(data["throughput"][number - 1], logged[number][voc.THROUGHPUT],
                            rel_tol=1e-5)  # fmt: skip
    # the tail from every trajectory of each step, the slowest sample spans as drill-down
    tail = data["tail"]
    assert tail["basis"] == ["trajectory"] and tail["samples_per_step"] == [TRAJECTORIES] * STEPS
    for i in range(STEPS):
        assert 0 < tail["p50"][i] <= tail["p90"][i] <= tail["p99"][i]
    assert [t for t in dom["tailLegend"] if t.startswith("p")] == [
        f"{q} (every trajectory span)" for q in ("p50", "p90", "p99")
    ]
    # vLLM 0.27's outputs carry no num_preempted: verl logs -1 for every sample, shown unknown
    samples = [s for s in spans_by_role(plugin_on)["trainer"] if s["name"] == "sample"]
    assert samples and {s["attrs"].get("rl.sample.num_preempted") for s in samples} == {-1}
    assert dom["preempted"] and set(dom["preempted"]) == {"unknown"}
    # roles per span: the legend names the roles the spans carry, each drawn in its colour
    assert {"trainer", "actor", "agent_loop", "rollout"} <= set(dom["roles"]), dom["roles"]
    rows = span_rows(data, data["default_step"])
    role_of = {r["name"]: data["roles"][r["role"]] for r in rows}
    assert role_of["trajectory"] == "agent_loop" and role_of["generate"] == "rollout"
    assert role_of["compute_log_prob"] == "actor" and role_of["gen"] == "trainer"

    def pixels(image: Image.Image, colour: str, tolerance: int = 12) -> int:
        """How many pixels are within `tolerance` (per channel) of a #rrggbb colour."""
        target = bytes.fromhex(colour.lstrip("#"))
        return sum(
            n
            for n, c in image.getcolors(maxcolors=1 << 24) or ()
            if max(abs(a - b) for a, b in zip(c, target, strict=True)) <= tolerance
        )

    palette = ["#3366cc", "#dc3912", "#ff9900", "#109618", "#990099", "#0099c6", "#dd4477"]
    palette.append("#66aa00")  # page.js's waterfall palette, by role index
    longest = rows[0]["duration_ms"]
    drawn = {r["role"] for r in rows if r["duration_ms"] > 0.005 * longest}  # a visible bar
    for role in drawn:
        found = pixels(shots["waterfall"], palette[role % len(palette)])
        assert found > 30, (data["roles"][role], found)
    # the p99 line (plotly's third colour, over p50/p90 where they meet) is drawn
    assert pixels(shots["tail"], "#2ca02c", 16) > 100
    # weight sync stages (the run has them); no empty section drawn as if it were data
    assert not dom["hidden"]["weight-sync"] and dom["syncLegend"] == list(data["weight_sync"])
    # occupancy per rollout replica, from every trajectory's real times
    occupancy = data["replica_occupancy"]["ratio"]
    assert not dom["hidden"]["replicas"] and list(occupancy) == ["replica 0"]
    assert all(0 < v <= 1 for v in occupancy["replica 0"]), occupancy
    assert dom["hidden"]["occasional"] == (data["occasional"] == [])
    assert dom["hidden"]["stalls"] == (data["stalls"] == [])
    colors, coverage = _pixels_are_not_blank(page)
    assert colors > 50 and coverage > 0.05, (colors, coverage)


# What this run is, in the words the dashboards' descriptions use for when a panel is empty
# (dashboards/build.py `EMPTY`): a panel that is empty on it must say one of these.
# (its node_exporter runs in the run's own network namespace: loopback only)
THIS_RUN = ("sync", "no_replay_buffer", "no_tools", "one_rank", "loopback_only", "no_dcgm")
OTHER_ENGINE = "sglang:"  # the engine row's panels query vLLM and SGLang side by side


@contextlib.contextmanager
def run_tsdb(work: Path, tmp_path: Path) -> Iterator[Callable[[str], list[dict]]]:
    """PromQL over the run's window (`query_range`, 1 s steps: the result's series), on a
    Prometheus that reads the TSDB the run's own Prometheus wrote (`--prometheus`)."""
    from tests.promserver import Prometheus

    shutil.copytree(work / "prometheus" / "data", tmp_path / "data")
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": []}  # reads, scrapes none
    prometheus = Prometheus(tmp_path, [], config=config)
    try:
        head = prometheus.api("status/tsdb")["headStats"]  # the run's first and last sample
        window = {"start": str(head["minTime"] / 1000), "end": str(head["maxTime"] / 1000)}
        yield lambda promql: prometheus.api("query_range", query=promql, step="1", **window)[
            "result"
        ]
    finally:
        prometheus.stop()


def dashboards_on(work: Path, tmp_path: Path) -> dict[str, tuple[int, int, list[str]]]:
    """Every panel query of every shipped dashboard over the run's window (`run_tsdb`):
    dashboard → (answering panels, panels, the titles of those empty)."""
    from dashboards import build
    from tests.test_dashboards import VARIABLES

    variables = {**VARIABLES, "$run": EXPERIMENT, "${run}": EXPERIMENT}
    with run_tsdb(work, tmp_path) as over_the_run:
        found: dict[str, tuple[int, int, list[str]]] = {}
        for text in (json.loads(path.read_text()) for path in build.OUTPUTS.values()):
            panels = [p for p in text["panels"] if any("expr" in t for t in p.get("targets", []))]
            empty, queries, answered = [], 0, 0  # a panel answers when all its queries do
            for panel in panels:
                for target in panel["targets"]:
                    promql = target["expr"]
                    if OTHER_ENGINE in promql:
                        continue  # the engine this run does not use: no series by design
                    for name, value in variables.items():
                        promql = promql.replace(name, value)
                    assert "$" not in promql, promql
                    series = over_the_run(promql)
                    queries, answered = queries + 1, answered + bool(series)
                    if not series and panel["title"] not in empty:
                        empty.append(panel["title"])
            found[text["title"]] = (len(panels) - len(empty), len(panels), empty)
            found[f"{text['title']} (queries)"] = (answered, queries, [])
            # a panel is empty on this run exactly when its description says so for a run
            # of this kind
            for panel in panels:
                said = panel.get("description", "")
                if panel["title"] not in empty:
                    assert not any(build.EMPTY[kind] in said for kind in THIS_RUN), (
                        f"{text['title']} / {panel['title']} answers on the real run though its "
                        f"description says it is empty on a run like it: {said!r}"
                    )
                    continue
                assert any(build.EMPTY[kind] in said for kind in THIS_RUN), (
                    f"{text['title']} / {panel['title']} has no data on the real run and "
                    f"its description does not say when it is empty: {said!r}"
                )
        # the shipped recording rules, evaluated by the run's Prometheus: each recorded
        # series exists exactly where its expression has data on the run's series
        rules = {
            rule["record"]: rule["expr"]
            for group in yaml.safe_load(build.RULES.read_text())["groups"]
            for rule in group["rules"]
            if "record" in rule
        }

        def answers(promql: str) -> bool:
            return bool(over_the_run(promql))

        recorded = {name for name in rules if answers(name)}
        assert recorded == {name for name, expr in rules.items() if answers(expr)}
        found["recording rules"] = (len(recorded), len(rules), sorted(set(rules) - recorded))
        # the shipped alerts, evaluated by the run's Prometheus on this healthy run: none fired
        fired = over_the_run('ALERTS{alertstate="firing"}')
        names = sorted({series["metric"]["alertname"] for series in fired})
        found["alerts firing"] = (len(names), 0, names)
        return found


def test_every_dashboard_panel_answers_on_the_real_run(plugin_on: Path, tmp_path: Path) -> None:
    """A real Prometheus scraped the run as shipped (the trainer at the documented address,
    the workers by file discovery, the shipped rules, every second); every query of every
    panel of both dashboards is evaluated over the run's window (SGLang's queries aside: the
    run's engine is vLLM, found through verl's own `rollout.prometheus` writer). A panel
    answers, or its description says it is empty on a run like this one (CPU, synchronous,
    one rank)."""
    found = dashboards_on(plugin_on, tmp_path)
    for title, (answering, total, empty) in found.items():
        figure(f"\n{title}: {answering}/{total} answer on the real run; empty: {empty}")
    assert found["RL step breakdown"][0] >= 30 and found["RL rollout tail"][0] >= 12
    assert found["recording rules"][0] >= 22  # the engines' included
    assert found["alerts firing"][2] == []  # on-call keeps them on: a healthy run fires none
    run = json.loads((plugin_on / "run.json").read_text())
    figure(f"stopping Prometheus took {run['prometheus_stop_s']:.2f} s of {run['wall_s']:.0f} s")


def values_of(attribute: dict) -> list:
    """An OTLP/JSON `arrayValue` attribute's values (`intValue`s are strings there)."""
    return [
        int(value) if kind == "intValue" else value
        for kind, value in (next(iter(v.items())) for v in attribute["values"])
    ]


def test_samples_by_data_source_are_verls_rows_by_source(plugin_on: Path, tmp_path: Path) -> None:
    """The dataset's two sources (`tests/e2e/assets.py`). Per step, each source's trained
    samples and reward sum on the step span are those of verl's own dump of that step
    (`trainer.rollout_data_dir`: every trained row with verl's score, its source read back
    from its ground truth); sample spans say their source and the reward's components; the
    trainer's series by source agree with the dumps at its last scrape; the run's own
    Prometheus has them by source."""
    dumped: dict[int, dict[str, list[float]]] = {}  # step → source → verl's scores
    for path in sorted((plugin_on / ROLLOUTS).glob("*.jsonl")):
        for row in map(json.loads, path.read_text().splitlines()):
            by_source = dumped.setdefault(int(row["step"]), {})
            by_source.setdefault(source_of(row["gts"]), []).append(row["score"])
    assert sorted(dumped) == list(range(1, STEPS + 1))
    assert {source for rows in dumped.values() for source in rows} == set(SOURCES)
    trainer = spans_by_role(plugin_on)["trainer"]
    steps = {s["attrs"]["rl.step"]: s for s in trainer if s["name"] == "step"}
    for number, rows in dumped.items():
        attrs = steps[number]["attrs"]
        names = values_of(attrs["rl.data_source.names"])
        counts = dict(zip(names, values_of(attrs["rl.data_source.samples"]), strict=True))
        sums = dict(zip(names, values_of(attrs["rl.data_source.reward.sum"]), strict=True))
        assert counts == {source: len(scores) for source, scores in rows.items()}, number
        for source, scores in rows.items():  # verl's scores are float32 sums of rm_scores
            assert math.isclose(sums[source], math.fsum(scores), rel_tol=1e-6), (number, sums)
        samples = [
            s for s in trainer if s["name"] == "sample" and s["trace"] == steps[number]["trace"]
        ]
        for sample in samples:
            sample_attrs = sample["attrs"]
            assert sample_attrs["rl.sample.data_source"] in rows
            (score,) = [e for n, e in sample["events"] if n == "gen_ai.evaluation.result"]
            value = score["gen_ai.evaluation.score.value"]
            assert sample_attrs["rl.sample.reward.score"] == value  # verl's dict: score, acc
            assert sample_attrs["rl.sample.reward.acc"] in (0.0, 1.0)
    number, last = last_scrape(plugin_on)
    run = ("run", EXPERIMENT)

    def scraped(name: str, **labels: str) -> float:
        return last.get((name, frozenset({run, *labels.items()})), 0.0)

    for source in SOURCES:  # samples of steps up to the scrape's, maybe some of the next's
        before = [s for n, rows in dumped.items() if n <= number for s in rows.get(source, [])]
        upto = [s for n, rows in dumped.items() if n <= number + 1 for s in rows.get(source, [])]
        samples = scraped("rlotel_source_samples_total", data_source=source)
        assert len(before) <= samples <= len(upto), (source, number, samples)
        reward = scraped("rlotel_source_reward_total", data_source=source, sign="positive")
        assert math.fsum(before) - 1e-3 <= reward <= math.fsum(upto) + 1e-3, (source, reward)
        for component in COMPONENTS:
            name = "rlotel_source_reward_component_samples_total"
            assert scraped(name, component=component, data_source=source) == samples
    with run_tsdb(plugin_on, tmp_path) as over_the_run:
        stored = over_the_run(
            f'sum by (data_source) (rlotel_source_samples_total{{run="{EXPERIMENT}"}})'
        )
    assert {series["metric"]["data_source"] for series in stored} == set(SOURCES)
    figure(
        "samples and reward sums by data source, per step, as verl dumped them: "
        + "; ".join(
            f"step {n}: "
            + ", ".join(f"{s} {len(v)} / {math.fsum(v):.3f}" for s, v in sorted(rows.items()))
            for n, rows in sorted(dumped.items())
        )
    )


def test_transfer_queue_scraped_as_shipped(plugin_on: Path, tmp_path: Path) -> None:
    """TransferQueue's own series, its metrics on as verl's config allows: rlotel's trainer
    registered the controller's endpoint for file discovery with the run's name, and the
    shipped `transfer-queue` job scraped it while the run trained — the capacity it serves is
    the one the run configured, its controller served requests of several kinds and had every
    trajectory the run trained written — and the target went when `fit` ended."""
    run = f'run="{EXPERIMENT}", job="transfer-queue"'
    with run_tsdb(plugin_on, tmp_path) as over_the_run:
        up = over_the_run(f"up{{{run}}}")
        (took,) = over_the_run(f"scrape_duration_seconds{{{run}}}")
        capacity = over_the_run(f"sum(tq_storage_capacity_total{{{run}}})")
        served = over_the_run(f"max by (op_type) (tq_controller_request_total{{{run}}})")
        samples = over_the_run(f"max by (op_type) (tq_controller_request_samples_total{{{run}}})")
    (target,) = up
    values = [float(v) for _, v in target["values"]]
    ended = len(values) - values[::-1].index(1.0)  # scrapes until the last one up
    # Registered the whole time the run trained: a scrape that failed then timed out (the
    # exporter was there but slower than the timeout, on a loaded machine), never refused
    # (gone: a refusal takes milliseconds); nearly every scrape answered.
    seconds = dict(took["values"])
    failed = [seconds[at] for at, v in target["values"][:ended] if float(v) == 0]
    assert all(float(s) >= 0.9 * SCRAPE_TIMEOUT_S for s in failed), (failed, values)
    assert len(failed) <= ended // 10, values
    # closed with the run, scraped down until Prometheus' discovery (5 s updates) drops it
    assert len(values) - ended <= 6, values
    assert {float(v) for series in capacity for _, v in series["values"]} == {TQ_CAPACITY}
    requests = {series["metric"]["op_type"]: float(series["values"][-1][1]) for series in served}
    assert len(requests) >= 2 and all(count > 0 for count in requests.values()), requests
    carried = {series["metric"]["op_type"]: float(series["values"][-1][1]) for series in samples}
    assert carried.get("NOTIFY_DATA_UPDATE", 0) >= STEPS * TRAJECTORIES, carried  # written
    assert not list((plugin_on / "sd").glob("transfer-queue-*.json"))  # gone with `fit`
    figure(
        f"transfer-queue: {ended - len(failed)} scrapes up and {len(failed)} timed out while "
        f"the run trained, {len(values) - ended} down at its end, "
        f"capacity {TQ_CAPACITY}, controller requests {requests}, samples carried {carried}"
    )


def test_beside_rl_insight_each_logger_has_verls_numbers(plugin_on: Path) -> None:
    """verl's in-tree RL-Insight ran beside rlotel on this run (`trainer.logger` with both,
    `VERL_RL_INSIGHT_ENABLE=1`, RL-Insight's own server and Prometheus started as its docs
    say), so every other test of this module holds with it there. Here: RL-Insight's hub
    served every key of verl's metrics dict with verl's value of one of its steps, its
    Prometheus had its hub, TransferQueue and the vLLM engine up, no process of RL-Insight's
    joined rlotel's, and no rlotel hook failed in any process (no
    `rlotel_integration_failures_total`)."""
    up = json.loads((plugin_on / "rl_insight.json").read_text())["up"]
    assert {"trainer_metrics", "transfer_queue", "vllm"} <= set(up), up
    hub = {
        name.removeprefix("rl_insight_monitor_"): value
        for (name, _), value in parse_exposition(
            (plugin_on / "rl_insight_hub.txt").read_text()
        ).items()
        if name.startswith("rl_insight_monitor_")
    }
    logged: dict[str, set[float]] = {}  # as verl's RLInsightLogger sends them: `/` → `_`
    for data in verl_log(plugin_on).values():
        for key, value in data.items():
            with contextlib.suppress(TypeError, ValueError):
                logged.setdefault(key.replace("/", "_"), set()).add(float(value))
    # one event per key: the harness's last scrape of the hub may fall between two steps' logs,
    # so each key holds verl's value of one step (NaN: verl logged NaN for it)
    differ = {
        key: (sorted(logged.get(key, ())), hub.get(key))
        for key in logged.keys() | hub.keys()
        if key not in hub
        or key not in logged
        or not (
            hub[key] in logged[key] or (math.isnan(hub[key]) and any(map(math.isnan, logged[key])))
        )
    }
    assert not differ, differ
    assert set(spans_by_role(plugin_on)) <= {"trainer", *VERL_ROLES}
    processes = [*sorted((plugin_on / "scrapes").glob("*.txt")), *(plugin_on / "targets").glob("*")]
    failed = [p.name for p in processes if "rlotel_integration_failures_total" in p.read_text()]
    assert not failed, failed
    figure(
        f"beside RL-Insight: its hub served {len(hub)} of verl's keys, each at verl's value; "
        f"its Prometheus had up {sorted(up)}; no rlotel hook failed in {len(processes)} scrapes"
    )


def test_one_verdict_per_step_live_analyze_and_report(plugin_on: Path, tmp_path: Path) -> None:
    """verl's real step: the verdict the trainer said live (its step span), `rlotel analyze`
    and the report give each step the same label and confidence, from the facts the live
    path recorded on the step span."""
    from rlotel.derive.diagnose import FACTS, Diagnoser
    from tests.test_report import page_data

    roots = [s["attrs"] for s in spans_by_role(plugin_on)["trainer"] if s["name"] == voc.STEP]
    assert all(FACTS in attrs for attrs in roots), "a step span without its verdict's facts"
    live = {a["rl.step"]: (a["rl.bottleneck"], a["rl.bottleneck.confidence"]) for a in roots}
    assert sorted(live) == list(range(1, STEPS + 1)), sorted(live)
    diagnoser = Diagnoser()  # what `rlotel analyze` reads each step's verdict with
    analyzed = {
        step.number: (verdict.label, verdict.confidence)
        for step in analyze.load_run(plugin_on / "traces").steps
        for verdict in (diagnoser.observe(step.facts),)
    }
    report = tmp_path / "report.html"
    assert cli.main(["report", str(plugin_on / "traces"), "-o", str(report)]) == 0
    trees = page_data(report)["trees"]
    reported = {
        n: (trees[str(n)]["verdict"]["label"], trees[str(n)]["verdict"]["confidence"]) for n in live
    }
    figure("verdicts by step, live:", live)
    assert analyzed == live and reported == live, (live, analyzed, reported)
