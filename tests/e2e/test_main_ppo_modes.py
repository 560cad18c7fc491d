"""verl's other trainers through the real `main_ppo`, plugin on: V0 (`trainer.use_v1=false`,
as PPO is most often run: a critic, a reference policy, validation and checkpoints) and
V1's `colocate_async` mode. Each trains ≥ 3 steps; verl's logged windows equal rlotel's,
and the trace has the workers' spans under the trainer's phases."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest
import yaml

from rlotel.offline import analyze
from rlotel.schema import vocabulary as voc
from tests.e2e.ahead import figure
from tests.e2e.assets import SOURCES
from tests.e2e.main_ppo import EXPERIMENT, STAND_INS, overrides
from tests.e2e.test_main_ppo import (
    SCORED_WITH_ACC,
    STEPS,
    declare_main_ppo,
    links_of,
    main_ppo,
    run_tsdb,
    spans_by_role,
    values_of,
    verl_log,
)
from tests.helpers import file_spans, parse_exposition

pytestmark = pytest.mark.slow

# V0 times `start_profile` and `stop_profile` into the step dict around its `step` timer, and
# `testing` (validation) after it: rlotel records each as a root span of its own, outside
# the step ledger.
OUTSIDE_STEP = {"start_profile", "stop_profile", "testing"}
ROLLOUT_N = "actor_rollout_ref.rollout.n="
UNREACHABLE = "http://127.0.0.1:9"  # nothing listens there in the run's own network namespace
ACTOR_PROFILER = (
    "global_profiler.tool=torch",
    "actor_rollout_ref.actor.profiler.enable=True",
    "actor_rollout_ref.actor.profiler.all_ranks=True",
)
SECRET = "s3cret-token"  # an argument of the finish hook: never in a span
SUMMARY = ("rl.profile.phases", "rl.profile.top_ops")  # what is read from the file: not printed
TOOL_CONFIG = STAND_INS / "rlotel_test_tool.yaml"  # one toy tool, its latency
MULTI_TURN = "actor_rollout_ref.rollout.multi_turn"
TOOL_RUN = (
    "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",  # every prompt
    f"{MULTI_TURN}.enable=True",
    f"{MULTI_TURN}.tool_config_path={TOOL_CONFIG}",
    f"{MULTI_TURN}.format=rlotel_test_toy",  # registered by the tool's module
    f"{MULTI_TURN}.max_assistant_turns=3",
)
# verl's async buffer evicts a finished group generated more than 1 step back
SAMPLER = "trainer.v1.sampler"
STALE_DROP = (f"{SAMPLER}.max_off_policy_threshold=1", f"{SAMPLER}.max_off_policy_strategy=drop")
# DAPO's group filter on the toy reward's coin-flip `acc`: verl evicts the groups without signal
DAPO_FILTER = (
    "algorithm.filter_groups.enable=True",
    "algorithm.filter_groups.metric=acc",
    SCORED_WITH_ACC,
)
MODES = {
    # V0 also meets a collector that refuses every connection, in every process, asked for
    # in OTLP/JSON (a value OpenTelemetry's spec allows), and another program on the
    # trainer's documented /metrics port; verl profiles steps 2 and 3 as one capture; PPO
    # with a critic (GAE), a KL-loss reference, validation and checkpoints (`--ppo`), on 2
    # actor ranks (FSDP over gloo) and 2 rollout replicas (`--ranks 2`)
    "v0": [
        "trainer.use_v1=false",
        "--ppo",
        *("--ranks", "2"),
        *("--otlp-endpoint", UNREACHABLE, "--otlp-protocol", "http/json", "--hold-port"),
        *ACTOR_PROFILER,
        "global_profiler.steps=[2,3]",
        "global_profiler.profile_continuous_steps=True",
    ],
    # colocate_async: verl runs its finish hook (a stand-in upload) after profiling step 2;
    # every trajectory runs verl's tool agent loop with a toy tool and format (stand-ins);
    # its buffer drops groups generated for an earlier step (the one-batch warm-up ahead) and,
    # filtering DAPO-style, the groups whose `acc` agree; a real Prometheus scrapes it
    "colocate_async": [
        "trainer.v1.trainer_mode=colocate_async",
        *STALE_DROP,
        *DAPO_FILTER,
        *TOOL_RUN,
        *ACTOR_PROFILER,
        "global_profiler.steps=[2]",
        f'global_profiler.finish_hook_cmd="{STAND_INS}/ship_captures --token={SECRET}"',
        "--prometheus",  # scraped by a real one as shipped: the async panels read its TSDB
    ],
}


for _mode, _argv in MODES.items():
    declare_main_ppo(f"mode_run[{_mode}]", *_argv)


@pytest.fixture(scope="module", params=sorted(MODES))
def mode_run(request) -> Iterator[tuple[str, Path]]:
    for work in main_ppo(f"mode_run[{request.param}]"):
        yield request.param, work


def test_windows_equal_verl_and_workers_nest(mode_run: tuple[str, Path]) -> None:
    mode, work = mode_run
    logged = trained(work)
    assert len(logged) >= STEPS, mode
    ours = {step.number: step for step in analyze.load_steps(work / "traces")}
    assert sorted(ours) == sorted(logged), mode
    roles = spans_by_role(work)
    figure(mode, "roles:", sorted(roles))
    outside: dict[str, list[dict]] = {name: [] for name in OUTSIDE_STEP}
    for span in sorted(roles["trainer"], key=lambda s: s["start"]):
        if span["name"] in OUTSIDE_STEP and not span["parent"]:
            outside[span["name"]].append(span)
    for number, data in logged.items():
        timing = voc.timing_from_metrics(data)
        assert {"step", "gen", "update_actor"} <= set(timing), (mode, sorted(timing))
        figure(mode, f"step {number}: {len(timing)} windows equal to verl's timing_s")
        for name, seconds in timing.items():
            if name in OUTSIDE_STEP:  # a root span of its own, next to the step's
                span = outside[name].pop(0)  # each name's, in step order
                assert math.isclose((span["end"] - span["start"]) / 1e9, seconds, abs_tol=2e-6)
                continue
            assert math.isclose(ours[number].timing_raw[name], seconds, rel_tol=1e-6), name
    trainer = {span["id"]: span for span in roles["trainer"]}
    under = {
        (trainer[span["parent"]]["name"], span["name"])
        for span in roles.get("actor", [])
        if span["parent"] in trainer
    }
    assert ("update_actor", "update_actor") in under, (mode, under)


def trained(work: Path) -> dict[int, dict]:
    """verl's logged steps that trained (validation before training logs a step 0)."""
    return {n: data for n, data in verl_log(work).items() if voc.TIMING_S + "step" in data}


@pytest.mark.parametrize("mode_run", ["v0"], indirect=True)  # the PPO run
def test_ppo_calls_carry_the_role_of_the_model_they_ran(mode_run: tuple[str, Path]) -> None:
    """verl fuses actor, rollout and reference into one process and colocates the critic
    with them: the process is named `actor` (never `critic`), and each worker call's span
    carries the role of the model it ran, under the trainer window verl timed it in;
    validation and checkpoints are windows too (their seconds compared above)."""
    _, work = mode_run
    roles = spans_by_role(work)
    assert "critic" not in roles and "ref" not in roles, sorted(roles)  # one fused process
    trainer = {span["id"]: span for span in roles["trainer"]}
    ranks = spans_by_rank(work, "actor")
    assert sorted(ranks) == [0, 1], sorted(ranks)  # FSDP world size 2: a process a rank
    for rank, spans in sorted(ranks.items()):
        calls = {
            (trainer[span["parent"]]["name"], span["name"], span["attrs"].get("rl.role"))
            for span in spans
            if span["parent"] in trainer
        }
        figure(f"PPO worker calls of rank {rank} (trainer window, call, role):", sorted(calls))
        assert {
            ("old_log_prob", "compute_log_prob", "actor"),
            ("ref", "compute_ref_log_prob", "ref"),
            ("values", "infer_batch", "critic"),
            ("update_critic", "train_mini_batch", "critic"),
            ("update_actor", "update_actor", "actor"),
            ("save_checkpoint", "save_checkpoint", "actor"),
            ("save_checkpoint", "save_checkpoint", "critic"),
        } <= calls, rank
    timed = {n for data in trained(work).values() for n in voc.timing_from_metrics(data)}
    assert {"values", "update_critic", "ref", "testing", "save_checkpoint"} <= timed


@pytest.mark.parametrize("mode_run", ["v0", "colocate_async"], indirect=True)
def test_each_step_counts_its_trained_samples_by_data_source(mode_run: tuple[str, Path]) -> None:
    """V0's samples (taken in the trainer's `_performance_metrics`) and V1's async buffer's
    (taken as the buffer hands a batch over): each step span's sources are the dataset's,
    every sample has its reward (the agent loop scored it), and the reward summed over the
    sources over the samples is verl's own `critic/score/mean` of the step: the samples
    by source are exactly the batch verl trained."""
    _, work = mode_run
    trainer = spans_by_role(work)["trainer"]
    logged = trained(work)
    means = {}
    for step in (s for s in trainer if s["name"] == "step"):
        attrs, number = step["attrs"], step["attrs"]["rl.step"]
        assert set(values_of(attrs["rl.data_source.names"])) <= set(SOURCES), number
        samples = values_of(attrs["rl.data_source.samples"])
        assert values_of(attrs["rl.data_source.reward.count"]) == samples and sum(samples) > 0
        means[number] = math.fsum(values_of(attrs["rl.data_source.reward.sum"])) / sum(samples)
        verl = logged[number]["critic/score/mean"]
        assert math.isclose(means[number], verl, rel_tol=1e-5, abs_tol=1e-6), (number, verl)
    assert sorted(means) == sorted(logged)
    figure(f"mean reward by step from the sources' sums and counts {means} (verl's the same)")


def resource(path: Path) -> dict[str, str]:
    """The resource attributes of a process's trace file (OTLP/JSON: values as text)."""
    first = json.loads(path.read_text().splitlines()[0])
    return {
        a["key"]: str(next(iter(a["value"].values())))
        for spans in first["resourceSpans"]
        for a in spans["resource"]["attributes"]
    }


def spans_by_rank(work: Path, role: str) -> dict[int, list[dict]]:
    """The spans of each `role` process by its `rl.rank` (one file a process)."""
    ranks: dict[int, list[dict]] = {}
    for path in sorted((work / "traces").glob(f"{role}-*.jsonl")):
        rank = int(resource(path)["rl.rank"])
        ranks.setdefault(rank, []).extend(file_spans(path, EXPERIMENT))
    return ranks


@pytest.mark.parametrize("mode_run", ["v0"], indirect=True)  # the 2-replica run
def test_ppo_samples_spread_over_both_rollout_replicas(mode_run: tuple[str, Path]) -> None:
    """verl makes a rollout replica a GPU (TP 1) and its load balancer routes each
    trajectory to one: every step's model calls reach both replicas' servers; each sample
    span names the replica that served it. V0 leaves no id that joins a sample to the
    server's `generate` span of its request, so the join is by time: inside each `chat`
    turn the named replica served a call, and for at least 3 turns in 4 its call fits the
    turn tightest (least time between their starts plus between their ends; under a full
    machine another replica's concurrent call can fit one turn a few ms tighter: CI saw 66
    against 73 ms). A replica mapped wrong misses most turns; the trainer's /metrics has
    each replica's occupancy of the last step, each in (0, 1]."""
    _, work = mode_run
    trainer = spans_by_role(work)["trainer"]
    steps = {span["trace"]: span["attrs"]["rl.step"] for span in trainer if span["name"] == "step"}
    generates: list[tuple[str, dict]] = []  # (replica, the server's span)
    for path in sorted((work / "traces").glob("rollout-*.jsonl")):
        replica = resource(path)["rl.replica"]
        spans = file_spans(path, EXPERIMENT)
        generates += [(replica, span) for span in spans if span["name"] == "generate"]
    served: dict[int, Counter] = {}
    for replica, span in generates:
        if span["trace"] in steps:
            served.setdefault(steps[span["trace"]], Counter())[replica] += 1
    figure("model calls by step and replica:", {n: dict(c) for n, c in sorted(served.items())})
    assert sorted(served) == sorted(trained(work)), served
    assert all(set(counts) == {"0", "1"} for counts in served.values()), served
    samples = {span["id"]: span for span in trainer if span["name"] == "sample"}
    named = Counter(span["attrs"].get("rl.replica") for span in samples.values())
    checked: Counter = Counter()
    for chat in trainer:
        if chat["name"] != "chat" or chat["parent"] not in samples:
            continue
        inside = [
            (span["start"] - chat["start"] + chat["end"] - span["end"], replica)
            for replica, span in generates
            if chat["start"] <= span["start"] and span["end"] <= chat["end"]
        ]
        replica = samples[chat["parent"]]["attrs"].get("rl.replica")
        assert replica in {r for _, r in inside}, (chat, sorted(inside)[:3])
        checked[min(inside)[1] == replica] += 1
    figure("sample spans by replica:", dict(named), "turns fit tightest by it:", dict(checked))
    assert named and set(named) <= {"0", "1"} and checked.total() >= len(samples), checked
    assert checked[True] >= 3 * checked.total() / 4, checked
    (series,) = [
        series
        for series in map(parse_exposition, (p.read_text() for p in (work / "targets").glob("*")))
        if any(name == "rlotel_step_time_seconds" for name, _ in series)
    ]  # the trainer's (its /metrics moved off the taken port: found by file discovery)
    occupancy = {
        dict(labels)["replica"]: value
        for (name, labels), value in series.items()
        if name == "rlotel_rollout_occupancy_ratio"
    }
    figure("rollout occupancy of the last step by replica:", occupancy)
    assert sorted(occupancy) == ["0", "1"], occupancy
    assert all(0 < value <= 1 for value in occupancy.values()), occupancy


@pytest.mark.parametrize("mode_run", ["v0"], indirect=True)  # the run pointed at it
def test_an_unreachable_collector_costs_a_line_per_process_and_nothing_else(
    mode_run: tuple[str, Path],
) -> None:
    """It trained (the fixture checked the exit code), every step is in the traces, and
    each process said so in one counted-drop line per interval, never a traceback."""
    _, work = mode_run
    console = (work / "console.log").read_text(errors="replace")
    failed = [line for line in console.splitlines() if "(export_failed)" in line]
    assert failed, "no process said its spans could not be exported"
    assert all("rlotel dropped" in line and "otlp" in line.lower() for line in failed)
    per_process = Counter(re.search(r"pid=(\d+)", line)[1] for line in failed)
    assert max(per_process.values()) <= 3, per_process  # once per interval, not per batch
    assert not re.search(r'File "[^"]*/rlotel/', console)  # no traceback through rlotel
    assert len(verl_log(work)) >= STEPS


@pytest.mark.parametrize("mode_run", ["v0"], indirect=True)  # the run given the taken port
def test_a_taken_port_and_http_json_cost_one_warning_and_the_trainer_is_still_scraped(
    mode_run: tuple[str, Path],
) -> None:
    """It trained and traced every step (checked above); the trainer said once where its
    /metrics went, registered that address for file discovery, and it answered there."""
    _, work = mode_run
    console = (work / "console.log").read_text(errors="replace")
    moved = [line for line in console.splitlines() if "127.0.0.1:9464" in line and "rlotel" in line]
    assert len(moved) == 1, moved
    assert "http/json is sent as http/protobuf" in console
    trainer = [
        series
        for series in map(parse_exposition, (p.read_text() for p in (work / "targets").glob("*")))
        if any(name == "rlotel_step_time_seconds" for name, _ in series)
    ]
    assert len(trainer) == 1, "the trainer's moved /metrics was not discovered and scraped"
    (series,) = trainer
    assert series[("rlotel_step", frozenset({("run", "e2e-grpo")}))] >= STEPS - 1


def test_verl_captures_of_each_mode_linked_from_the_steps_they_cover(
    mode_run: tuple[str, Path],
) -> None:
    """V0 profiles steps 2–3 as one continuous capture on each of its 2 actor ranks: both
    step spans link them, and the `stop_profile` of the rank that wrote each.
    colocate_async profiles step 2 and runs verl's finish hook: an event on the actor's
    `stop_profile` span with the hook's program name, exit status and duration, never its
    arguments; the hook itself saw the capture."""
    mode, work = mode_run
    roles = spans_by_role(work)
    trainer, actor = roles["trainer"], roles["actor"]
    captures = sorted(
        (s for s in trainer if s["name"] == "profile.capture"),
        key=lambda s: s["attrs"]["rl.profile.rank"],
    )
    ranks = [capture["attrs"]["rl.profile.rank"] for capture in captures]
    assert ranks == ([0, 1] if mode == "v0" else [0]), ranks
    keys = {(capture["trace"], capture["id"]) for capture in captures}
    covered = (2, 3) if mode == "v0" else (2, 2)
    for capture in captures:
        attrs = capture["attrs"]
        assert (attrs["rl.profile.step_first"], attrs["rl.profile.step_last"]) == covered
        assert (attrs["rl.profile.role"], attrs["rl.profile.stage"]) == ("actor", "train")
        path = Path(attrs["rl.profile.path"])
        assert (path if path.is_absolute() else work / path).is_file()
    steps = {s["attrs"]["rl.step"]: s for s in trainer if s["name"] == "step"}
    for number, step in steps.items():
        linked = covered[0] <= number <= covered[1]
        assert set(links_of(step)) == (keys if linked else set()), (mode, number)
    by_rank = spans_by_rank(work, "actor")
    for capture, rank in zip(captures, ranks, strict=True):  # the last: what follows reads
        key, path = (capture["trace"], capture["id"]), Path(capture["attrs"]["rl.profile.path"])
        (stop,) = [s for s in actor if s["name"] == "stop_profile" and key in links_of(s)]
        assert stop["id"] in {s["id"] for s in by_rank[rank]}, rank  # the rank that wrote it
    said = {k: v for k, v in links_of(steps[2])[key].items() if k not in SUMMARY}
    figure(mode, "step link:", said)
    seconds = {n: round(d["timing_s/step"], 2) for n, d in trained(work).items()}
    figure(mode, "step seconds:", seconds, "run.json:", (work / "run.json").read_text())
    hooks = [(s, a) for s in actor for name, a in s["events"] if name == "rl.profile.finish_hook"]
    if mode == "v0":
        assert hooks == []
        return
    ((span, event),) = hooks
    assert span is stop, span["name"]
    figure(mode, "finish hook:", event)
    assert event["rl.profile.finish_hook.command"] == "ship_captures"
    assert event["rl.profile.finish_hook.exit_status"] == 0
    assert 0 < event["rl.profile.finish_hook.duration_s"] < (stop["end"] - stop["start"]) / 1e9
    assert not any(SECRET in p.read_text() for p in (work / "traces").glob("*.jsonl"))
    shipped = (work / "outputs" / "shipped-rank0.txt").read_text().split()
    assert any(Path(line).name == path.name for line in shipped), shipped


@pytest.mark.parametrize("mode_run", ["colocate_async"], indirect=True)  # the tool run
def test_tool_run_trajectories_have_their_model_turns_and_tool_calls(
    mode_run: tuple[str, Path],
) -> None:
    """verl's tool agent loop ran every trajectory (a toy tool and the toy model's call
    format are stand-ins; the turns, calls and their order are verl's loop's): each sample
    span has one `chat` child per model turn and one `execute_tool {tool}` child per tool
    call, alternating as verl ran them, inside the span; each call lasts at least the
    tool's own latency; their counts agree with verl's `num_turns`; the reward is its
    `gen_ai.evaluation.result` event."""
    _, work = mode_run
    (tool,) = yaml.safe_load(TOOL_CONFIG.read_text())["tools"]
    name, latency = tool["tool_schema"]["function"]["name"], tool["config"]["seconds"]
    trainer = spans_by_role(work)["trainer"]
    logged = trained(work)
    steps = {s["attrs"]["rl.step"]: s for s in trainer if s["name"] == "step"}
    shapes: Counter[tuple[int, int]] = Counter()  # (model turns, tool calls) per sample
    for number, step in steps.items():
        samples = [s for s in trainer if s["name"] == "sample" and s["trace"] == step["trace"]]
        assert samples, number
        for sample in samples:
            assert sample["attrs"]["gen_ai.operation.name"] == "invoke_agent"
            turns = sample["attrs"]["rl.sample.turns"]  # verl's num_turns of the trajectory
            low, high = (logged[number][f"training/num_turns/{s}"] for s in ("min", "max"))
            assert low <= turns <= high, (number, turns)
            parts = sorted(
                (s for s in trainer if s["parent"] == sample["id"]), key=lambda s: s["start"]
            )
            chats = [p for p in parts if p["name"] == "chat"]
            calls = [p for p in parts if p["name"] != "chat"]
            # model turn, tool call, model turn ...: in verl's order, one after the other
            alternating = [("chat", f"execute_tool {name}")[i % 2] for i in range(len(parts))]
            assert [p["name"] for p in parts] == alternating, number
            assert sample["start"] <= parts[0]["start"] and parts[-1]["end"] <= sample["end"]
            assert all(a["end"] <= b["start"] for a, b in pairwise(parts))
            assert all(chat["attrs"]["gen_ai.operation.name"] == "chat" for chat in chats)
            for call in calls:
                assert call["attrs"]["gen_ai.operation.name"] == "execute_tool"
                assert call["attrs"]["gen_ai.tool.name"] == name
                assert call["end"] - call["start"] >= latency * 1e9
            # num_turns = tool responses + model turns + 1; a call whose response overflows
            # the response length ends the trajectory with no tool response
            assert len(calls) - (turns - 1 - len(chats)) in (0, 1), (turns, len(chats))
            (score,) = [e for n, e in sample["events"] if n == "gen_ai.evaluation.result"]
            assert score["gen_ai.evaluation.score.value"] >= 0  # the toy reward's range
            shapes[len(chats), len(calls)] += 1
    figure("tool run: samples by (model turns, tool calls):", sorted(shapes.items()))
    assert any(calls for _, calls in shapes), shapes  # the toy model called its tool


@pytest.mark.parametrize("mode_run", ["colocate_async"], indirect=True)
def test_groups_verl_evicts_are_the_async_bias_reference(mode_run: tuple[str, Path]) -> None:
    """verl's buffer evicts stale groups (`training/off_policy/evicted_samples`) and groups
    DAPO's filter finds without signal (`training/filter_groups/evicted_samples`), counted in
    groups; rlotel counted each of their trajectories as discarded (`stale`, `filtered`: a
    group both stale and filtered once, as stale), and the steps that evicted compare what
    they trained with what was generated: a KS above 0."""
    _, work = mode_run
    keys = {"stale": "training/off_policy/evicted_samples"}
    keys["filtered"] = "training/filter_groups/evicted_samples"
    evicted = {
        reason: {n: d.get(key, 0) for n, d in trained(work).items()} for reason, key in keys.items()
    }
    assert all(any(counts.values()) for counts in evicted.values()), evicted
    group = next(
        int(o.split("=")[1]) for o in overrides(Path(), work, STEPS) if o.startswith(ROLLOUT_N)
    )
    run = ("run", EXPERIMENT)
    scraped: dict[int, dict] = {}  # step → the last scrape of the trainer showing it
    for path in sorted((work / "scrapes").glob("*.txt")):
        series = parse_exposition(path.read_text())
        number = series.get(("rlotel_step", frozenset({run})))
        if number:
            scraped[int(number)] = series
    last = max(scraped)
    discarded, expected = {}, {}
    for reason, counts in evicted.items():
        series = ("rlotel_samples_discarded_total", frozenset({run, ("reason", reason)}))
        discarded[reason] = scraped[last].get(series, 0)
        expected[reason] = group * sum(count for n, count in counts.items() if n <= last)
    # verl's sets may overlap and each of its counts takes a group in both; rlotel counts
    # each trajectory once, under the first reason: stale exactly, filtered less the overlap
    assert discarded["stale"] == expected["stale"] > 0, (last, evicted, discarded)
    overlap = expected["filtered"] - discarded["filtered"]
    assert discarded["filtered"] > 0 and 0 <= overlap <= expected["stale"], (last, evicted)
    ks = {
        n: {dict(k[1])["quantity"]: v for k, v in s.items() if k[0] == "rlotel_async_bias_ks"}
        for n, s in scraped.items()
        if any(counts.get(n) for counts in evicted.values())
    }
    assert ks and all(max(figures.values()) > 0 for figures in ks.values()), ks
    figure(f"evicted groups by step {evicted}; discarded {discarded}; KS {ks}")


ASYNC_PANELS = ("Idle ratio by role", "Replay-buffer evictions by reason")


@pytest.mark.parametrize("mode_run", ["colocate_async"], indirect=True)
def test_async_panels_answer_on_the_colocate_async_run(
    mode_run: tuple[str, Path], tmp_path: Path
) -> None:
    """The step-breakdown panels a synchronous run and the demo leave empty answer on
    verl's colocate_async run, scraped by a real Prometheus as shipped, each query over the
    run's window: the idle ratio of the trainer and of the rollout, within [0, 1], and the
    groups verl's buffer evicted by reason, each at least its largest count of a step."""
    from tests.test_dashboards import VARIABLES, step_panel

    _, work = mode_run
    variables = {**VARIABLES, "$run": EXPERIMENT, "${run}": EXPERIMENT}

    def substituted(promql: str) -> str:
        for name, value in variables.items():
            promql = promql.replace(name, value)
        return promql

    with run_tsdb(work, tmp_path) as over_the_run:
        answers = {}
        for title in ASYNC_PANELS:
            (target,) = step_panel(title)["targets"]
            answers[title] = over_the_run(substituted(target["expr"]))
        (seen,) = over_the_run(f'rlotel_step{{run="{EXPERIMENT}"}}')
    idle = {
        series["metric"]["role"]: [float(v) for _, v in series["values"]]
        for series in answers["Idle ratio by role"]
    }
    assert set(idle) == {"trainer", "rollout"}, idle
    assert all(0 <= v <= 1 for values in idle.values() for v in values), idle
    last = max(int(float(v)) for _, v in seen["values"])  # the last step Prometheus saw
    logged: dict[str, list[float]] = {}  # reason → verl's count at each step that had one
    for number, data in trained(work).items():
        for key, count in data.items():
            reason = voc.eviction_reason(key)
            if reason is not None and number <= last:
                logged.setdefault(reason, []).append(float(count))
    peaks = {
        series["metric"]["reason"]: max(float(v) for _, v in series["values"])
        for series in answers["Replay-buffer evictions by reason"]
    }
    assert logged and set(peaks) == set(logged), (peaks, logged)
    assert all(peaks[reason] >= max(counts) for reason, counts in logged.items()), (peaks, logged)
    ranges = {role: (round(min(v), 3), round(max(v), 3)) for role, v in idle.items()}
    figure(f"async panels: idle ratio by role (min, max) {ranges}; evictions peak {peaks}")
