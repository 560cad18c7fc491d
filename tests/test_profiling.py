"""torch.profiler captures on flagged steps, linked from step spans (real profiler, CPU)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

import rlotel
from rlotel import ProfileConfig
from rlotel.integrations import verl_captures
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
