"""torch.profiler captures on flagged steps, linked from step spans (real profiler, CPU)."""

from __future__ import annotations

import os
import sys
import time
import types
from pathlib import Path

import pytest
import torch

import rlotel
from rlotel import ProfileConfig
from rlotel.integrations import verl_captures
from rlotel.integrations.registered import MEMORY_OOM, PROFILE_FINISH
from rlotel.profile.config import sglang_profiler_args, token_window, vllm_profiler_args
from tests.helpers import finished_spans, parse_exposition, scrape


def run(tel: rlotel.Telemetry, steps: int, mini_batches: int = 0) -> list[rlotel.Step]:
    closed = []
    for number in range(1, steps + 1):
        with tel.step(number) as step:
            with tel.phase("gen"):
                a = torch.randn(64, 64)
                (a @ a).sum()
            with tel.phase("update_actor"):
                for _ in range(mini_batches or 1):
                    (a @ a @ a).sum()
                    tel.profile_step()
        closed.append(step)
    return closed


def links_by_step(spans) -> dict[int, list]:
    return {s.attributes["rl.step"]: list(s.links) for s in spans if s.name == "step"}


def test_flagged_steps_capture_and_link(make_tel, span_exporter, tmp_path):
    tel = make_tel(run="prof", profile_steps=[2, 3], profile_dir=tmp_path / "prof")
    run(tel, 4)
    spans = finished_spans(tel, span_exporter)
    files = sorted(p.name for p in (tmp_path / "prof").iterdir())
    assert len(files) == 2
    assert "_step2_rank0_" in files[0] and "_step3_rank0_" in files[1]
    captures = {s.context.span_id: s for s in spans if s.name == "profile.capture"}
    links = links_by_step(spans)
    assert links[1] == [] and links[4] == []
    for number in (2, 3):
        (link,) = links[number]
        capture = captures[link.context.span_id]
        assert capture.parent is None  # a trace of its own
        path = Path(capture.attributes["rl.profile.path"])
        assert path.exists() and path.stat().st_size == capture.attributes["rl.profile.size_bytes"]
        assert capture.attributes["rl.profile.step_first"] == number
        assert link.attributes["rl.profile.path"] == str(path)
        assert any(op.startswith("aten::mm") for op in capture.attributes["rl.profile.top_ops"])
        assert [p.split()[0] for p in capture.attributes["rl.profile.phases"]] == [
            "gen",
            "update_actor",
        ]
    series = parse_exposition(scrape(tel.metrics_url))
    assert (
        series[("rlotel_profile_captures_total", frozenset({("run", "prof"), ("tool", "torch")}))]
        == 2
    )


def test_continuous_mode_one_capture_for_both_steps(make_tel, span_exporter, tmp_path):
    config = ProfileConfig(steps=(2, 3), save_dir=tmp_path, continuous=True)
    tel = make_tel(run="prof", profile=config)
    steps = run(tel, 4)
    spans = finished_spans(tel, span_exporter)
    (capture,) = [s for s in spans if s.name == "profile.capture"]
    assert (
        capture.attributes["rl.profile.step_first"],
        capture.attributes["rl.profile.step_last"],
    ) == (2, 3)
    assert "_step2-3_rank0_" in capture.attributes["rl.profile.path"]
    links = links_by_step(spans)
    assert [link.context.span_id for link in links[2]] == [capture.context.span_id]
    assert [link.context.span_id for link in links[3]] == [capture.context.span_id]
    assert links[1] == links[4] == []
    assert steps[1].captures == steps[2].captures


def test_schedule_windows_name_mini_batches_and_link_the_phase(make_tel, span_exporter, tmp_path):
    config = ProfileConfig(steps=(2,), save_dir=tmp_path, schedule=(1, 1, 2, 2))
    tel = make_tel(run="prof", profile=config)
    run(tel, 3, mini_batches=8)
    spans = finished_spans(tel, span_exporter)
    captures = sorted(
        (s for s in spans if s.name == "profile.capture"),
        key=lambda s: s.attributes["rl.profile.mini_batch_first"],
    )
    ranges = [
        (c.attributes["rl.profile.mini_batch_first"], c.attributes["rl.profile.mini_batch_last"])
        for c in captures
    ]
    assert ranges == [(2, 3), (6, 7)]  # wait 1, warmup 1, active 2, repeated twice
    assert all(
        f"_mb{a}-{b}." in c.attributes["rl.profile.path"]
        for c, (a, b) in zip(captures, ranges, strict=True)
    )
    actor = next(s for s in spans if s.name == "update_actor" and s.attributes["rl.step"] == 2)
    assert {link.context.span_id for link in actor.links} == {c.context.span_id for c in captures}


@pytest.mark.parametrize(
    ("start", "end", "vllm", "sglang"),
    [(0, 128, (0, 128), (0, 128)), (512, 1024, (512, 512), (512, 512))],
)
def test_token_window_mappings(start, end, vllm, sglang):
    assert vllm_profiler_args(start, end) == dict(
        zip(("delay_iterations", "max_iterations"), vllm, strict=True)
    )
    assert sglang_profiler_args(start, end) == dict(
        zip(("start_step", "num_steps"), sglang, strict=True)
    )
    config = ProfileConfig(token_start=start, token_end=end).validated()
    assert config.vllm_args() == vllm_profiler_args(start, end)
    assert config.sglang_args() == sglang_profiler_args(start, end)


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        (10, 10, "is empty"),
        (20, 10, "is empty"),
        (-1, 10, "non-negative integer"),
        (0, 2.5, "non-negative integer"),
        (None, 10, "non-negative integer"),
    ],
)
def test_token_window_rejects_bad_values(start, end, message):
    with pytest.raises(rlotel.ConfigError, match=message):
        token_window(start, end)


def test_a_profiler_that_raises_does_not_stop_training(make_tel, tmp_path, monkeypatch):
    def broken(self):
        raise RuntimeError("kineto unavailable")

    monkeypatch.setattr(torch.profiler.profile, "start", broken)
    tel = make_tel(run="prof", profile_steps=[2], profile_dir=tmp_path)
    steps = run(tel, 3)
    assert [s.number for s in steps] == [1, 2, 3] and steps[1].timing_raw["gen"] > 0
    tel.flush(10)
    drops = parse_exposition(scrape(tel.metrics_url))
    key = (
        "rlotel_telemetry_dropped_total",
        frozenset({("run", "prof"), ("signal", "profile"), ("reason", "profiler_error")}),
    )
    assert drops[key] == 1
    assert list(tmp_path.iterdir()) == []


def test_finish_hook_gets_env_not_a_shell(make_tel, tmp_path):
    out = tmp_path / "hook-out.txt"
    save = tmp_path / "dir with $(touch pwned) and ;rm"
    script = (
        "import os, pathlib; pathlib.Path(os.environ['HOOK_OUT']).write_text("
        "os.environ['RLOTEL_PROFILE_STEPS'] + '|' + os.environ['RLOTEL_PROFILE_SAVE_PATH'])"
    )
    import os

    os.environ["HOOK_OUT"] = str(out)
    try:
        config = ProfileConfig(
            steps=(1, 2), save_dir=save, finish_hook=[sys.executable, "-c", script]
        )
        tel = make_tel(run="prof", profile=config)
        run(tel, 3)
        tel.shutdown()
    finally:
        del os.environ["HOOK_OUT"]
    assert out.read_text() == f"1,2|{save}"
    assert not (Path.cwd() / "pwned").exists() and not (save / "pwned").exists()


def test_a_hook_that_hangs_is_killed_and_counted(make_tel, tmp_path):
    config = ProfileConfig(
        steps=(1,),
        save_dir=tmp_path,
        finish_hook=[sys.executable, "-c", "import time; time.sleep(60)"],
        hook_timeout_s=1.0,
    )
    tel = make_tel(run="prof", profile=config)
    started = time.monotonic()
    run(tel, 2)
    assert time.monotonic() - started < 20  # training never waits for the hook
    tel._profiler.wait_for_hook(10)
    tel.flush(10)
    drops = parse_exposition(scrape(tel.metrics_url))
    key = (
        "rlotel_telemetry_dropped_total",
        frozenset({("run", "prof"), ("signal", "profile"), ("reason", "hook_timeout")}),
    )
    assert drops[key] == 1


def test_the_verl_integration_injects_its_capture_discovery(clean_env, tmp_path):
    """The core never imports the verl integration: `Config.step_hooks` carries its hook."""
    from rlotel.integrations import process

    config = {"global_profiler": {"steps": [2], "save_path": str(tmp_path)}}
    tel = process.telemetry(run="verl", profile=process.verl_profile_config(config))
    try:
        assert tel.config.step_hooks == (verl_captures.discover,)
        assert [type(hook) for hook in tel.ledger.hooks] == [verl_captures.VerlCaptureDiscovery]
    finally:
        tel.shutdown()


def test_discover_dir_without_a_hook_that_reads_it_is_a_config_error(clean_env, tmp_path):
    with pytest.raises(rlotel.ConfigError, match=r"verl_captures\.discover"):
        rlotel.init(prometheus_port=None, profile=ProfileConfig(steps=(2,), discover_dir=tmp_path))
    with pytest.raises(rlotel.ConfigError, match="step_hooks must be callables"):
        rlotel.init(prometheus_port=None, step_hooks=["not a factory"])


def test_links_verl_captures_found_by_name(make_tel, span_exporter, tmp_path):
    """verl writes its own traces (build_trace_basename); rlotel finds and links them."""
    from verl.utils.profiler import torch_profile

    save = tmp_path / "outputs" / "profile"
    save.mkdir(parents=True)
    tel = make_tel(
        run="verl",
        profile=ProfileConfig(steps=(2,), discover_dir=save),
        step_hooks=[verl_captures.discover],  # what the verl integration injects
    )
    for number in range(1, 4):
        with tel.step(number), tel.phase("update_actor"):
            pass
        if number == 2:  # verl's stop_profile runs after the step: a real torch trace
            with torch.profiler.profile() as profiler:
                (torch.randn(32, 32) @ torch.randn(32, 32)).sum()
            name = torch_profile.build_trace_basename(
                rank=0, role="train", save_file_prefix="actor", topology={"rank": 0}, profile_step=2
            )
            profiler.export_chrome_trace(str(save / f"{name}.json.gz"))
            memory = save / "step2"
            memory.mkdir()
            (memory / "torch_memory_rank0_pid1.pickle").write_bytes(b"\x80\x04N.")
            nsight = save / "nsight"  # Ray's per-worker report: no step in the name
            nsight.mkdir()
            (nsight / "worker_process_4242.nsys-rep").write_bytes(b"nsys")
    spans = finished_spans(tel, span_exporter)
    links = links_by_step(spans)
    assert links[1] == [] and links[3] == []
    tools = sorted(link.attributes["rl.profile.tool"] for link in links[2])
    assert tools == ["nsys", "torch", "torch_memory"]
    assert all(Path(link.attributes["rl.profile.path"]).exists() for link in links[2])


# --- verl's captures where they belong (names as verl 0.9.1 writes them) ---------------------


def verl_trace(save: Path, name: str) -> Path:
    """A real torch trace under one of verl's names."""
    with torch.profiler.profile() as profiler:
        (torch.randn(16, 16) @ torch.randn(16, 16)).sum()
    path = save / name
    path.parent.mkdir(parents=True, exist_ok=True)
    profiler.export_chrome_trace(str(path))
    return path


def verl_name(stage: str, step: int, mini_batches: str = "") -> str:
    from verl.utils.profiler import torch_profile

    base = torch_profile.build_trace_basename(
        rank=0,
        role=stage,
        save_file_prefix="actor_rollout",
        topology={"rank": 0, "world_size": 1},
        profile_step=step,
    )
    return f"{base}{mini_batches}.json.gz"


def test_verl_names_parse_into_writer_stage_step_and_mini_batches():
    parsed = verl_captures.parse_verl_name(
        "actor-rollout_actor-update_step2_rank0-of-1_pid14041_20261202145505801_mb0.json.gz"
    )
    assert parsed == verl_captures.VerlName("actor-rollout", "actor_update", 2, 0, 14041, (0, 0))
    assert parsed.role == "actor"
    whole = verl_captures.parse_verl_name(verl_name("train", 3))
    assert (whole.stage, whole.step, whole.mini_batches) == ("train", 3, None)
    window = verl_captures.parse_verl_name(verl_name("actor_update", 2, "_mb2-5"))
    assert window.mini_batches == (2, 5)
    assert verl_captures.parse_verl_name("1796-rank-0.1796.pt.trace.json.gz") is None
    assert verl_captures.parse_verl_name("profiler_out_0.txt") is None


def span_named(spans, name: str, step: int):
    return next(s for s in spans if s.name == name and s.attributes.get("rl.step") == step)


def test_discrete_captures_link_from_the_phase_they_were_written_in(
    make_tel, span_exporter, tmp_path
):
    """verl's discrete mode: each worker stage writes its trace inside the trainer phase that
    called it; each replica's engine writes one in `gen` (the token window on its link)."""
    save = tmp_path / "profile"
    config = ProfileConfig(steps=(2,), discover_dir=save, token_start=1, token_end=4)
    traces = tmp_path / "traces.jsonl"
    tel = make_tel(
        run="verl", profile=config, step_hooks=[verl_captures.discover], traces_file=traces
    )
    for number in (1, 2, 3):
        with tel.step(number):
            with tel.phase("gen"):
                if number == 2:
                    verl_trace(
                        save, "agent_loop_rollout_replica_0/1796-rank-0.1796.pt.trace.json.gz"
                    )
                    verl_trace(save, "rollout-replica1_1797-rank-0.1797.pt.trace.json.gz")
            with tel.phase("old_log_prob"):
                if number == 2:
                    verl_trace(save, verl_name("actor_compute_log_prob", 2))
            with tel.phase("update_actor"):
                if number == 2:
                    verl_trace(save, verl_name("actor_update", 2, "_mb0"))
    spans = finished_spans(tel, span_exporter)
    captures = {s.context.span_id: s for s in spans if s.name == "profile.capture"}
    assert len(captures) == 4
    step = span_named(spans, "step", 2)
    assert {link.context.span_id for link in step.links} == set(captures)
    by_stage = {}
    for phase in ("gen", "old_log_prob", "update_actor"):
        for link in span_named(spans, phase, 2).links:
            capture = captures[link.context.span_id]
            assert link.attributes["rl.profile.path"] == capture.attributes["rl.profile.path"]
            by_stage.setdefault(phase, []).append(capture.attributes)
    (log_prob,) = by_stage["old_log_prob"]
    assert (log_prob["rl.profile.role"], log_prob["rl.profile.rank"]) == ("actor", 0)
    assert log_prob["rl.profile.stage"] == "actor_compute_log_prob"
    (update,) = by_stage["update_actor"]
    assert (update["rl.profile.mini_batch_first"], update["rl.profile.mini_batch_last"]) == (0, 0)
    assert update["rl.profile.step_first"] == update["rl.profile.step_last"] == 2
    engines = sorted(by_stage["gen"], key=lambda a: a["rl.profile.replica"])
    assert [(a["rl.profile.role"], a["rl.profile.replica"]) for a in engines] == [
        ("rollout", 0),
        ("rollout", 1),
    ]
    assert all((a["rl.profile.token_start"], a["rl.profile.token_end"]) == (1, 4) for a in engines)
    for number in (1, 3):
        assert all(not span_named(spans, n, number).links for n in ("step", "gen", "update_actor"))
    # the timeline: each capture's slice names its windows, an arrow from each window to it
    from rlotel.offline import analyze, perfetto

    events = perfetto.timeline(analyze.load_run(traces))[0]["traceEvents"]
    slices = [e for e in events if e.get("name") == "profile.capture" and e["ph"] == "X"]
    windows = sorted(w for e in slices for w in e["args"]["linked_from"])
    assert [w.split()[-1] for w in windows] == sorted(
        ["gen", "gen", "old_log_prob", "update_actor"] + ["step"] * 4
    )
    flows = [e for e in events if e.get("cat") == "rl.profile" and e["ph"] in ("s", "f")]
    assert len(flows) == 2 * len(windows)


def test_a_continuous_verl_capture_links_from_every_step_it_covers(
    make_tel, span_exporter, tmp_path
):
    """profile_continuous_steps: one `train` trace, named by its first step, written when
    the last one stops."""
    save = tmp_path / "profile"
    config = ProfileConfig(steps=(2, 3), discover_dir=save, continuous=True)
    tel = make_tel(run="verl", profile=config, step_hooks=[verl_captures.discover])
    for number in (1, 2, 3, 4):
        with tel.step(number), tel.phase("update_actor"):
            pass
        if number == 3:
            path = verl_trace(save, verl_name("train", 2))
    spans = finished_spans(tel, span_exporter)
    (capture,) = [s for s in spans if s.name == "profile.capture"]
    attributes = capture.attributes
    assert (attributes["rl.profile.step_first"], attributes["rl.profile.step_last"]) == (2, 3)
    assert attributes["rl.profile.path"] == str(path)
    for number, linked in ((1, False), (2, True), (3, True), (4, False)):
        links = [link.context.span_id for link in span_named(spans, "step", number).links]
        assert links == ([capture.context.span_id] if linked else []), number


class _Worker:
    """A verl worker as far as capture linking sees it: its `DistProfiler` (verl's own)."""

    def __init__(self, save: Path, finish_hook: str | None = None) -> None:
        from verl.utils.profiler import DistProfiler, ProfilerConfig
        from verl.utils.profiler.config import TorchProfilerToolConfig

        config = ProfilerConfig(
            tool="torch", enable=True, all_ranks=True, save_path=str(save),
            finish_hook_cmd=finish_hook,
        )  # fmt: skip
        self.profiler = DistProfiler(
            0, config, TorchProfilerToolConfig(discrete=True), "actor_rollout"
        )


def worker_call(tel: rlotel.Telemetry, worker: _Worker, name: str, body) -> None:
    """One traced worker call as `verl_workers` makes it: a phase under the caller's."""
    carrier = {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"}
    with tel.phase(name, context=carrier) as phase:
        watch = verl_captures.watch_call(worker, name)
        body()
        watch.end(phase)


def test_a_worker_call_links_what_its_process_wrote_during_it(make_tel, span_exporter, tmp_path):
    from rlotel.record.capture import capture_ids

    tel = make_tel(run="verl")
    save = tmp_path / "profile"
    worker = _Worker(save)
    worker.profiler.start(profile_step=2)
    mine = f"actor-rollout_actor-update_step2_rank0-of-1_pid{os.getpid()}_2026120214550_mb0.json.gz"
    worker_call(tel, worker, "update_actor", lambda: verl_trace(save, mine))
    worker_call(tel, worker, "compute_log_prob", lambda: None)
    worker.profiler.stop(run_command=False)
    spans = finished_spans(tel, span_exporter)
    (link,) = next(s for s in spans if s.name == "update_actor").links
    assert (link.context.trace_id, link.context.span_id) == capture_ids(save / mine)
    assert link.attributes["rl.profile.stage"] == "actor_update"
    assert link.attributes["rl.profile.mini_batch_first"] == 0
    assert link.attributes["rl.profile.size_bytes"] == (save / mine).stat().st_size
    assert not next(s for s in spans if s.name == "compute_log_prob").links


def test_the_finish_hook_run_is_an_event_without_its_arguments(make_tel, span_exporter, tmp_path):
    from tests.helpers import attach_hooks, detach_hooks

    script = tmp_path / "upload"
    script.write_text("#!/bin/sh\nexit 3\n")
    script.chmod(0o755)
    attach_hooks(PROFILE_FINISH.name)
    try:
        tel = make_tel(run="verl")
        worker = _Worker(tmp_path / "profile", f"TOKEN=s3cret {script} --key=s3cret")
        worker.profiler.start(profile_step=2)
        worker_call(tel, worker, "stop_profile", lambda: worker.profiler.stop(run_command=True))
    finally:
        detach_hooks(PROFILE_FINISH.name)
    spans = finished_spans(tel, span_exporter)
    stop = next(s for s in spans if s.name == "stop_profile")
    (event,) = [e for e in stop.events if e.name == "rl.profile.finish_hook"]
    assert event.attributes["rl.profile.finish_hook.command"] == "upload"
    assert event.attributes["rl.profile.finish_hook.exit_status"] == 3
    assert 0 < event.attributes["rl.profile.finish_hook.duration_s"] < 30
    assert stop.start_time <= event.timestamp <= stop.end_time
    assert not any("s3cret" in repr(dict(s.attributes)) + repr(s.events) for s in spans)
    drops = parse_exposition(scrape(tel.metrics_url))
    key = frozenset({("run", "verl"), ("signal", "profile"), ("reason", "hook_failed")})
    assert drops[("rlotel_telemetry_dropped_total", key)] == 1


class _RolloutServer:
    """A rollout server as capture linking sees it: verl's profiler controller of a replica."""

    def __init__(self, save: Path, replica: int) -> None:
        from verl.utils.profiler import ProfilerConfig, build_rollout_dist_profiler
        from verl.utils.profiler.config import TorchProfilerToolConfig

        config = ProfilerConfig(tool="torch", enable=True, all_ranks=True, save_path=str(save))
        tool = TorchProfilerToolConfig(discrete=True, profile_token_start=2, profile_token_end=6)
        self.replica_rank = replica
        self.profiler_controller = build_rollout_dist_profiler(replica, 1, config, tool)


def test_a_replica_links_its_engine_trace_from_its_stop_profile(make_tel, span_exporter, tmp_path):
    """vLLM's profiler stops by itself once its token window closed: the trace is written
    between the replica's start_profile and stop_profile, and linked from the latter."""
    from rlotel.record.capture import capture_ids

    tel = make_tel(run="verl")
    save = tmp_path / "profile"
    server = _RolloutServer(save, 1)
    other = save / "agent_loop_rollout_replica_0" / "9-rank-0.9.pt.trace.json.gz"
    worker_call(tel, server, "start_profile", lambda: None)
    worker_call(tel, server, "generate", lambda: verl_trace(save, str(other.relative_to(save))))
    mine = verl_trace(save, "agent_loop_rollout_replica_1/7-rank-0.7.pt.trace.json.gz")
    worker_call(tel, server, "stop_profile", lambda: None)
    worker_call(tel, server, "stop_profile", lambda: None)  # linked once
    spans = finished_spans(tel, span_exporter)
    stops = [s for s in spans if s.name == "stop_profile"]
    (link,) = stops[0].links
    assert not stops[1].links
    assert (link.context.trace_id, link.context.span_id) == capture_ids(mine)
    attributes = dict(link.attributes)
    assert (attributes["rl.profile.role"], attributes["rl.profile.replica"]) == ("rollout", 1)
    assert (attributes["rl.profile.token_start"], attributes["rl.profile.token_end"]) == (2, 6)
    assert "rl.profile.step_first" not in attributes  # the trainer's `gen` link says the step


def test_an_oom_snapshot_is_an_event_of_the_worker_call_it_was_written_in(
    make_tel, span_exporter, tmp_path
):
    """verl's OOM observer dumps the allocator under `oom_{time}/`: the snapshot is an event
    of the worker call that was running (its path and size), whatever else fails."""
    from tests.helpers import hooks_attached

    tel = make_tel(run="verl")
    save = tmp_path / "profile"
    worker = _Worker(save)
    snapshot = (
        save / "oom_20261204-210000-000001" / f"torch_memory_oom_rank0_pid{os.getpid()}.pickle"
    )

    class Profiler:  # verl's TorchMemoryProfiler, as far as its OOM callback goes
        config = types.SimpleNamespace(save_path=str(save))

        def _on_out_of_memory(self, device, alloc, device_total, device_free):
            snapshot.parent.mkdir(parents=True)
            snapshot.write_bytes(b"snapshot")

    from verl.utils.profiler import torch_memory_profile

    with hooks_attached(MEMORY_OOM.name):
        on_oom = torch_memory_profile.TorchMemoryProfiler._on_out_of_memory
        assert (
            on_oom.__name__ == "_on_out_of_memory" and on_oom.__module__ == verl_captures.__name__
        )
        worker.profiler.start(profile_step=2)
        traced = verl_captures.traced_oom(Profiler._on_out_of_memory)
        worker_call(tel, worker, "update_actor", lambda: traced(Profiler(), 0, 1 << 30, 1 << 34, 0))
        worker.profiler.stop(run_command=False)
    spans = finished_spans(tel, span_exporter)
    (event,) = [e for e in next(s for s in spans if s.name == "update_actor").events
                if e.name == "rl.profile.oom_snapshot"]  # fmt: skip
    assert event.attributes["rl.profile.path"] == str(snapshot)
    assert event.attributes["rl.profile.size_bytes"] == len(b"snapshot")


def test_a_memory_snapshot_window_is_found_at_its_last_step(tmp_path):
    """`memory_snapshot_num_steps=2`: verl writes `steps2-3/` when step 3 stops."""
    window = tmp_path / "steps2-3"
    window.mkdir()
    pickle = window / "torch_memory_rank0_pid7.pickle"
    pickle.write_bytes(b"x")
    assert verl_captures.find_verl_captures(tmp_path, 3) == [("torch_memory", pickle)]
    assert verl_captures.find_verl_captures(tmp_path, 2) == []
