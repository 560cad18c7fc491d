"""The verl plugin: loaded by `import verl`, off unless RLOTEL_ENABLE=1, real verl code."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import verl  # noqa: F401  (every test here runs verl: a broken install fails the module)

from rlotel.integrations import registered
from rlotel.integrations.registered import AGENT_LOOP
from tests.helpers import file_spans, parse_exposition, scrape

SCRIPT = textwrap.dedent(
    """
    import json, sys, urllib.request
    import verl  # the entry point loads rlotel's plugin here
    import rlotel.integrations.verl as plugin
    from verl.utils.profiler import marked_timer, simple_timer, performance
    from verl.utils.tracking import Tracking

    report = {"patched": plugin.patched(), "timer_module": performance._timer.__module__,
              "backends": list(Tracking.supported_backend)}
    if plugin.patched():
        tracking = Tracking("proj", "exp", default_backend=["console", "rlotel"])

        class Trainer:
            global_steps = 7

            def step(self):
                timing_raw = {}
                with marked_timer("step", timing_raw):
                    with marked_timer("gen", timing_raw, color="red"):
                        with simple_timer("generate_sequences", timing_raw):
                            sum(range(20000))
                    for _ in range(2):
                        with marked_timer("update_actor", timing_raw):
                            sum(range(20000))
                    try:
                        with marked_timer("update_weights", timing_raw):
                            raise RuntimeError("sync failed")
                    except RuntimeError:
                        pass
                return timing_raw

        timing_raw = Trainer().step()
        tracking.log({**{f"timing_s/{k}": v for k, v in timing_raw.items()},
                      "actor/pg_loss": 0.25, "perf/throughput": 123.0}, step=7)
        import rlotel
        tel = rlotel.current()
        tel.flush()
        report["timing_raw"] = timing_raw
        report["exposition"] = urllib.request.urlopen(tel.metrics_url).read().decode()
        tracking.finish()
    print("REPORT" + json.dumps(report))
    """
)


def run_script(tmp_path, enable: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLOTEL_", "OTEL_"))}
    env |= {"OTEL_EXPORTER_PROMETHEUS_PORT": "0", "RLOTEL_TRACES_FILE": str(tmp_path / "t.jsonl")}
    if enable is not None:
        env["RLOTEL_ENABLE"] = enable
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=180
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("REPORT"))
    return json.loads(line[len("REPORT") :])


@pytest.mark.slow
def test_enabled_plugin_turns_verl_timers_into_spans(tmp_path):
    report = run_script(tmp_path, "1")
    assert report["patched"] and report["timer_module"] == "rlotel.integrations.verl"
    assert "rlotel" in report["backends"]
    timing_raw = report["timing_raw"]
    assert set(timing_raw) == {
        "step",
        "gen",
        "generate_sequences",
        "update_actor",
        "update_weights",
    }
    spans = file_spans(tmp_path / "t.jsonl", run="exp")
    by_id = {s["id"]: s for s in spans}
    (root,) = [s for s in spans if s["name"] == "step"]
    assert root["attrs"]["rl.step"] == 7  # read from the trainer's global_steps
    parents = {s["name"]: by_id[s["parent"]]["name"] for s in spans if s["parent"]}
    assert parents == {
        "gen": "step",
        "generate_sequences": "gen",
        "update_actor": "step",
        "update_weights": "step",
    }
    for name, seconds in timing_raw.items():  # verl's dict: same sums as the span tree
        total = sum(s["end"] - s["start"] for s in spans if s["name"] == name) / 1e9
        assert abs(total - seconds) < 2e-6, name
    failed = next(s for s in spans if s["name"] == "update_weights")
    assert failed["status"] == 2 and timing_raw["update_weights"] > 0  # verl would lose it
    series = parse_exposition(report["exposition"])
    run = ("run", "exp")
    assert series[("rlotel_train_metric", frozenset({run, ("key", "actor/pg_loss")}))] == 0.25
    assert series[("rlotel_throughput_tokens_per_second_per_gpu", frozenset({run}))] == 123.0
    key = ("rlotel_step_phase_seconds", frozenset({run, ("phase", "gen")}))
    assert series[key] == timing_raw["gen"]


@pytest.mark.slow
@pytest.mark.parametrize("enable", [None, "0"])
def test_without_the_variable_importing_verl_changes_nothing(tmp_path, enable):
    report = run_script(tmp_path, enable)
    assert report == {
        "patched": False,
        "timer_module": "verl.utils.profiler.performance",
        "backends": [b for b in report["backends"] if b != "rlotel"],
    }
    assert "rlotel" not in report["backends"]
    assert not (tmp_path / "t.jsonl").exists()


def test_agent_loop_manager_samples_reach_histograms(make_tel):
    """verl's V0 `AgentLoopManager._performance_metrics`, patched in place, fills rlotel."""
    import torch
    from verl import DataProto
    from verl.experimental.agent_loop import agent_loop

    from rlotel.integrations import verl as plugin

    tel = make_tel(run="agent")
    plugin.install()
    try:

        class Manager(agent_loop.AgentLoopManager):  # a V0-style subclass, as configured
            def __init__(self) -> None:  # no workers needed for the reduction
                pass

        rng = np.random.default_rng(0)
        chunks = [
            [
                {
                    "generate_sequences": float(rng.lognormal()),
                    "tool_calls": float(rng.random()),
                    "compute_score": 0.01,
                    "num_preempted": int(rng.integers(-1, 3)),
                }
                for _ in range(size)
            ]
            for size in (3, 5)
        ]
        mask = torch.ones(8, 12, dtype=torch.int64)
        mask[:, :2] = 0  # left-padded prompts of 4 tokens in a width of 6
        output = DataProto.from_dict(
            tensors={"prompts": torch.zeros(8, 6, dtype=torch.int64), "attention_mask": mask}
        )
        with tel.phase("testing"):  # V0 validation, before and between steps: not recorded
            Manager()._performance_metrics(chunks, output)
        with tel.step(1) as step, tel.phase("gen"):
            expected = Manager()._performance_metrics(chunks, output)
    finally:
        plugin.uninstall()
    ours = {k: v for k, v in step.metrics.items() if k.startswith("agent_loop/")}
    assert ours == expected
    tel.flush(10)
    series = parse_exposition(scrape(tel.metrics_url))
    count = (
        "rlotel_agent_loop_duration_seconds_count",
        frozenset({("run", "agent"), ("stage", "tool_calls")}),
    )
    assert series[count] == 8
    assert agent_loop.AgentLoopManager._performance_metrics.__module__ != "rlotel.integrations.verl"


@pytest.mark.slow
def test_opentelemetry_instrument_switches_rlotel_on(tmp_path):
    """The standard auto-instrumentation command enables the plugin without RLOTEL_ENABLE."""
    command = os.path.join(os.path.dirname(sys.executable), "opentelemetry-instrument")
    assert os.path.exists(command), "no opentelemetry-instrument (the `instrument` extra)"
    script = tmp_path / "main.py"
    script.write_text(
        "import verl, rlotel.integrations.verl as plugin\n"
        "from verl.utils.profiler import performance\n"
        "print('PATCHED', plugin.patched(), performance._timer.__module__)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLOTEL_", "OTEL_"))}
    env |= {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none"}  # fmt: skip
    result = subprocess.run(
        [command, sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=180
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "PATCHED True rlotel.integrations.verl" in result.stdout


def test_verl_nvtx_timer_is_one_range_per_window(make_tel, recording_nvtx, monkeypatch):
    """verl's NVTX `marked_timer` marks its range itself, then `yield from _timer`: rlotel
    times it without a second range of the same name; verl's plain timers get rlotel's."""
    from verl.utils.profiler import nvtx_profile, simple_timer

    from rlotel.integrations import verl as plugin

    def start(message, **kwargs):
        recording_nvtx.push(message, kwargs.get("color"))
        return message

    monkeypatch.setattr(nvtx_profile, "mark_start_range", start)
    monkeypatch.setattr(nvtx_profile, "mark_end_range", lambda mark: recording_nvtx.pop())
    tel = make_tel(run="nvtx")
    plugin.install()
    try:
        timing_raw: dict[str, float] = {}
        with tel.step(1):
            with nvtx_profile.marked_timer("gen", timing_raw, color="red"):
                with simple_timer("generate_sequences", timing_raw):
                    sum(range(1000))
            with nvtx_profile.marked_timer("update_actor", timing_raw):
                sum(range(1000))
    finally:
        plugin.uninstall()
    assert recording_nvtx.pushed == ["step", "gen", "generate_sequences", "update_actor"]
    assert recording_nvtx.depth == 0
    assert set(timing_raw) == {"gen", "generate_sequences", "update_actor"}


def test_a_verl_older_than_supported_gets_nothing_patched(monkeypatch, caplog):
    from verl.utils.profiler import performance

    from rlotel.integrations import verl as plugin

    real = registered.installed_version  # where the plugin reads it
    monkeypatch.setattr(
        registered, "installed_version", lambda name: "0.8.5" if name == "verl" else real(name)
    )
    before = performance._timer
    plugin.install()
    try:
        assert not plugin.patched() and performance._timer is before
        assert "needs verl >= 0.9.0 (found 0.8.5)" in caplog.text
    finally:
        plugin.uninstall()


@pytest.mark.parametrize("version", ["0.9.7", "0.10.0.dev0", "0.12.0"])
def test_an_untested_later_verl_attaches_with_one_warning(version, monkeypatch, caplog):
    """Each hook degrades alone, so a later verl (a build of verl's main included) gets every
    hook whose target is still there, and one line saying it was not tested."""
    from verl.utils.profiler import performance

    from rlotel.integrations import verl as plugin

    real = registered.installed_version  # where the plugin reads it
    monkeypatch.setattr(
        registered, "installed_version", lambda name: version if name == "verl" else real(name)
    )
    before = performance._timer
    plugin.install()
    try:
        assert plugin.patched() and performance._timer is not before
        assert f"not tested with verl {version} (>=0.9.1,<0.9.2)" in caplog.text
        assert "ray" not in caplog.text.split("not tested with")[1].split(";")[0]  # 2.60 tested
    finally:
        plugin.uninstall()


def test_a_hook_whose_target_moved_is_not_attached_and_the_others_are(monkeypatch, caplog):
    from verl.experimental.agent_loop import agent_loop
    from verl.utils import tracking
    from verl.utils.profiler import performance

    from rlotel.integrations import verl as plugin
    from rlotel.integrations.hooks import State
    from rlotel.integrations.registered import REGISTRY

    monkeypatch.delattr(agent_loop.AgentLoopManager, "_performance_metrics")  # verl moved it
    monkeypatch.setattr(plugin, "tracking_finish", lambda original: 1 / 0)  # a patch raising
    before_timer, before_init = performance._timer, tracking.Tracking.__init__
    plugin.install()  # never raises into `import verl`
    try:
        assert plugin.patched() and performance._timer is not before_timer
        states = REGISTRY.statuses()
        assert states["verl_agent_loop_metrics"] == (
            State.NOT_ATTACHED,
            f"{agent_loop.__name__}.AgentLoopManager._performance_metrics is missing",
        )
        assert states["verl_tracking"].state == State.NOT_ATTACHED
        assert "its patch raised ZeroDivisionError" in states["verl_tracking"].why
        # the tracking hook is all or nothing: its __init__ (patched before finish) is back
        assert tracking.Tracking.__init__ is before_init
        assert "rlotel" not in tracking.Tracking.supported_backend
        assert states["verl_timer"].state == State.ATTACHED
        assert plugin.not_attached().keys() == {"verl_agent_loop_metrics", "verl_tracking"}
        assert "the verl_agent_loop_metrics hook is not attached" in caplog.text
        assert "lost: V0 agent-loop per-sample timings" in caplog.text
    finally:
        plugin.uninstall()
    assert performance._timer is before_timer


def test_patched_agent_loop_workers_still_pickle_for_ray():
    """Ray pickles an actor class made at run time (`ray.remote(AgentLoopWorker)`, V0) by
    value, methods included: rlotel's replacements must pickle (by reference), or verl's
    agent-loop workers never start."""
    import ray
    from ray import cloudpickle
    from verl.experimental.agent_loop import agent_loop

    from rlotel.integrations import verl as plugin

    plugin.install()
    try:
        actor = ray.remote(agent_loop.AgentLoopWorker)
        modified = actor.__ray_metadata__.modified_class
        assert modified._compute_score.__module__ == "rlotel.integrations.verl_v1"
        restored = cloudpickle.loads(cloudpickle.dumps(modified))
        assert restored._run_agent_loop.__qualname__ == "run_agent_loop"
    finally:
        plugin.uninstall()


def test_warnings_stay_visible_when_the_host_silences_the_root_logger(capfd, monkeypatch):
    """vLLM's API server (a dependency of it) sets the root logger and its handlers to
    ERROR in verl's trainer: rlotel's hook-failure and start-up warnings still reach stderr,
    once, and never twice while the root logger shows them."""
    import logging

    from rlotel.integrations import verl as plugin

    logger = logging.getLogger("rlotel")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    root_handler = logging.StreamHandler()  # stderr, as verl's basicConfig leaves it
    monkeypatch.setattr(logging.getLogger(), "handlers", [root_handler])
    plugin.install()
    try:
        logger.warning("rlotel: shown by the root handler")
        root_handler.setLevel(logging.ERROR)
        monkeypatch.setattr(logging.getLogger(), "level", logging.ERROR)
        logger.warning("rlotel: shown by rlotel's own")
    finally:
        plugin.uninstall()
    err = capfd.readouterr().err
    assert err.count("rlotel: shown by the root handler") == 1
    assert err.count("rlotel: shown by rlotel's own") == 1


def test_v0_trajectories_count_for_their_replicas_and_leave_verls_batch_as_verls(make_tel):
    """V0 copies every `extra_fields` entry of a trajectory into `non_tensor_batch`: verl's
    `_performance_metrics`, patched in place, takes rlotel's stamps out (the batch the
    trainer gets is verl's own) and measures each replica's occupancy from the
    trajectories its server served."""
    import torch
    from verl import DataProto
    from verl.experimental.agent_loop import agent_loop

    from rlotel.integrations import verl as plugin
    from rlotel.integrations import verl_engines, verl_v1

    class Replica:  # what rlotel reads of verl's RolloutReplica
        def __init__(self, rank: int, address: str) -> None:
            self.replica_rank, self._server_address = rank, address

    replicas = [Replica(0, "10.0.0.1:80"), Replica(1, "10.0.0.2:80")]
    for replica in replicas:
        verl_engines.note_replica(replica)
    tel = make_tel(run="v0rep")
    plugin.install()
    t0, s = 1_700_000_000_000_000_000, 1_000_000_000
    stamps = np.empty(4, dtype=object)  # as verl's `_postprocess` builds the column
    stamps[:] = [[t0, t0 + s, 1], [t0, t0 + s, 1], [t0, t0 + s, 1], [t0, t0 + 2 * s, 1]]
    servers = np.array(["10.0.0.2:80", "10.0.0.1:80", "10.0.0.1:80", "10.0.0.2:80"], dtype=object)
    output = DataProto.from_dict(
        tensors={
            "prompts": torch.zeros(4, 2, dtype=torch.int64),
            "attention_mask": torch.ones(4, 5, dtype=torch.int64),
        },
        non_tensors={"uid": np.array(list("abcd"), dtype=object)},
    )
    output.non_tensor_batch[verl_v1.STAMP_KEY] = stamps
    output.non_tensor_batch[verl_v1.SERVER_KEY] = servers
    chunks = [[{"generate_sequences": 1.0, "tool_calls": 0.0, "compute_score": 0.0,
                "num_preempted": 0} for _ in range(4)]]  # fmt: skip
    try:
        with tel.step(1) as step, tel.phase("gen"):
            agent_loop.AgentLoopManager._performance_metrics(None, chunks, output)
    finally:
        plugin.uninstall()  # forgets the replicas too
    assert sorted(output.non_tensor_batch) == ["uid"]
    assert {name: o.ratio for name, o in step.summary.occupancy.items()} == {
        "0": 1.0,
        "1": pytest.approx(0.75),
    }


class NeoColumns:
    """A stand-in of verl's next data plane's `non_tensor_batch` (NeoProto's `_BatchProxy`,
    `verl/experimental/neoproto/views/data_proto.py` on verl's `neo` branch): dict-like by
    its methods (`keys`, `in`, `[]`, `get`, `pop(key, default, materialize=True)`), neither
    a dict nor a Mapping."""

    _MISSING = object()

    def __init__(self, columns: dict) -> None:
        self._columns = dict(columns)

    def keys(self, original: bool = True):
        return dict.fromkeys(self._columns).keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __contains__(self, key: str) -> bool:
        return key in self._columns

    def __getitem__(self, key: str) -> Any:
        return self._columns[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._columns.get(key, default)

    def pop(self, key: str, default: Any = _MISSING, materialize: bool = True) -> Any:
        if key not in self._columns:
            if default is self._MISSING:
                raise KeyError(key)
            return default
        value = self._columns.pop(key)
        return value if materialize else None


@pytest.mark.parametrize("failing", [False, True], ids=["rlotel working", "rlotel failing"])
@pytest.mark.parametrize("columns", [dict, NeoColumns])
def test_verls_batch_holds_exactly_verls_columns(columns, failing, make_tel) -> None:
    """V0's agent-loop output carries rlotel's stamp columns (verl copies `extra_fields`
    into `non_tensor_batch`): verl's own call sees exactly the columns it would without
    rlotel, whether rlotel's part works or fails, on a dict or a NeoProto Mapping."""
    from rlotel.base.drops import HOOK_FAILURES
    from rlotel.integrations import guard, verl_v1
    from rlotel.integrations import verl as plugin

    tel = make_tel(run="columns")
    stamp = verl_v1.Stamp(1_000, 5_000, 1, None, [[1_000, 4_000]], None, None)
    output = types.SimpleNamespace(
        non_tensor_batch=columns(
            {
                "uid": ["a"],
                verl_v1.STAMP_KEY: [stamp.wire()],
                verl_v1.SERVER_KEY: ["10.0.0.1:8000"],
            }
        ),
        batch=None,
        meta_info={},
    )
    seen: list[set[str]] = []
    wrapped = plugin.performance_metrics(
        lambda self, metrics, output: seen.append(set(output.non_tensor_batch))
    )
    before = HOOK_FAILURES.snapshot().get(AGENT_LOOP.name, 0)
    guard.inject([AGENT_LOOP.name] if failing else [])
    try:
        with tel.step(1) as step, tel.phase("gen"):
            wrapped(object(), [[{"generate_sequences": 0.004}]], output)
    finally:
        guard.inject([])
    assert seen == [{"uid"}]
    failures = HOOK_FAILURES.snapshot().get(AGENT_LOOP.name, 0) - before
    assert failures == (1 if failing else 0)
    batches = step.trace.samples or []
    assert len(batches) == (0 if failing else 1)
    if not failing:  # the stamp was read: the (only) replica that served it
        assert list(np.atleast_1d(batches[0].replica)) == ["0"]


def test_a_trainer_that_overrides_fit_is_the_driver_from_its_tracking(monkeypatch):
    """verl's one-step-off and separation trainers (or a user's subclass) override `fit`,
    where no hook declares the driver: the process whose trainer makes verl's `Tracking`
    with the `rlotel` logger runs the step loop, and is declared the driver there — its run
    name, the documented /metrics, the GPU count of its trainer."""
    from verl.utils.tracking import Tracking

    import rlotel
    from rlotel.integrations import process
    from tests.helpers import hooks_attached

    with socket.socket() as probe:  # a free loopback port for the documented /metrics
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    monkeypatch.setattr(process, "_driver", None)
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(free_port))

    class OneStepOffTrainer:  # its own fit, as verl's OneStepOffRayTrainer
        resource_pool_manager = types.SimpleNamespace(get_n_gpus=lambda: 3)

        def fit(self) -> Tracking:
            return Tracking(
                project_name="rlotel",
                experiment_name="one-step-off",
                default_backend=["rlotel"],
                config={"trainer": {"experiment_name": "one-step-off"}},
            )

    with hooks_attached("verl_tracking"):
        tracking = OneStepOffTrainer().fit()
        try:
            assert process.is_driver()
            tel = rlotel.current()
            assert tel.config.run == "one-step-off"
            assert tel.metrics_url == f"http://127.0.0.1:{free_port}/metrics"
            assert process._driver.n_gpus == 3
        finally:
            tracking.finish()
    assert rlotel.current() is None


def test_the_driver_says_once_at_start_which_hooks_did_not_attach(monkeypatch, caplog):
    from verl.experimental.agent_loop import agent_loop
    from verl.utils.tracking import Tracking

    from rlotel.integrations import process
    from rlotel.integrations import verl as plugin

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(probe.getsockname()[1]))
    monkeypatch.setattr(process, "_driver", None)
    monkeypatch.delattr(agent_loop.AgentLoopManager, "_performance_metrics")  # verl moved it
    plugin.install()
    try:
        tracking = Tracking(project_name="p", experiment_name="moved", default_backend=["rlotel"])
        tracking.finish()
    finally:
        plugin.uninstall()
    lines = [r.getMessage() for r in caplog.records if "hooks not attached" in r.getMessage()]
    assert lines == [
        "rlotel: hooks not attached in this process: verl_agent_loop_metrics "
        "(`rlotel doctor` says why)"
    ]


def test_a_training_batch_between_steps_is_training_and_validation_is_what_verl_marks(
    make_tel, monkeypatch: pytest.MonkeyPatch
):
    """verl marks validation on the prompts its `AgentLoopManager.generate_sequences` gets
    (`meta_info["validate"]`): one-step-off's next batch, finishing between two steps, is
    recorded; a validation batch inside a step is not."""
    from rlotel.integrations import verl as plugin

    tel = make_tel(run="between")
    recorded: list[int] = []
    batches: list[Any] = []
    monkeypatch.setattr(tel, "record_samples", lambda metrics, **kw: batches.append(metrics))
    performance_metrics = plugin.performance_metrics(lambda self, metrics, output: None)

    def generate_sequences(prompts: Any) -> None:  # verl's caller, as far as rlotel reads it
        performance_metrics(object(), [[{"generate_sequences": 0.01}]], types.SimpleNamespace())

    generate_sequences(types.SimpleNamespace(meta_info={"validate": False}))  # between steps
    recorded.append(len(batches))
    with tel.step(1), tel.phase("gen"):
        generate_sequences(types.SimpleNamespace(meta_info={"validate": True}))
    recorded.append(len(batches))
    assert recorded == [1, 1]  # the batch between steps is training; the marked one is not
