"""`rlotel report`: the HTML's data and offline-ness here; the page itself in real Chromium."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import rlotel
from rlotel.cli import commands as cli
from rlotel.offline.report import MAX_POINTS, PLOTLY_JS, write_report
from tests.helpers import span_rows

PHASES = ["gen", "reward", "old_log_prob", "update_actor", "update_weights"]
WORKER = """
import json, sys, rlotel
carrier = json.loads(sys.argv[2])
tel = rlotel.init(run="mp", service_name="rollout-worker", prometheus_port=None,
                  traces_file=sys.argv[1])
with tel.phase("generate_remote", context=carrier):
    sum(range(200_000))
    tel.record_samples(generate_sequences=[0.2, 0.5], response_length=[7, 30], context=carrier)
tel.shutdown()
"""
# A fused worker process (its resource says `critic`) serving an actor call: the call's root
# span says `actor` (as verl_workers stamps it), its child inherits it, a plain call does not.
FUSED_WORKER = """
import json, sys, rlotel
carrier = json.loads(sys.argv[2])
tel = rlotel.init(run="mp", service_name="fused-worker", prometheus_port=None,
                  traces_file=sys.argv[1], resource_attributes={"rl.role": "critic"})
call = tel.phase("update_actor", context=carrier)
call.__enter__()
call.trace.role = "actor"
with tel.phase("forward_backward"):
    sum(range(50_000))
call.__exit__(None, None, None)
with tel.phase("update_critic", context=carrier):
    sum(range(50_000))
tel.shutdown()
"""


def page_data(path: Path) -> dict:
    """The JSON blob the page draws from (as the browser's JSON.parse would read it)."""
    text = path.read_text()
    match = re.search(
        r'<script type="application/json" id="rlotel-data">(.*?)</script>', text, re.S
    )
    assert match, "no data blob in the page"
    return json.loads(match.group(1).replace("<\\/", "</"))


def traced_run(path: Path, steps: int = 4, slow_step: int = 3) -> None:
    """A real rlotel traces file: phases, samples, tokens and MFU; one step slower (its `gen`
    waits half a second on top of the work every phase does: slower than any other step by
    far more than a busy machine's stalls, which flipped a 12× CPU-work margin under load)."""
    tel = rlotel.init(run="rep", prometheus_port=None, traces_file=path)
    for number in range(1, steps + 1):
        with tel.step(number) as step:
            for phase in PHASES:
                with tel.phase(phase):
                    sum(range(60_000))
                    if phase == "gen" and number == slow_step:
                        time.sleep(0.5)  # the engine's answer, late
                    if phase == "gen":
                        tel.record_samples(
                            generate_sequences=[0.01 * number, 0.02, 0.5 * number],
                            tool_calls=[0.0, 0.01, 0.1],
                            compute_score=[0.001, 0.001, 0.002],
                            prompt_length=[4, 4, 4],
                            response_length=[10, 20, 90],
                        )
            step.set_tokens(prompt=[4, 4, 4], response=[10, 20, 90])
            step.set_mfu(actor=0.2 + 0.01 * number)
        tel.flush()  # one export batch per step: a truncated line costs one step
    tel.shutdown()


def test_report_from_traces_file(tmp_path) -> None:
    traces = tmp_path / "traces.jsonl"
    traced_run(traces)
    result = write_report(traces, tmp_path / "out" / "report.html")
    html = result.path.read_text()
    assert result.steps == 4 and result.skipped_lines == 0
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", html)  # all inline
    plotly_js = PLOTLY_JS.read_text()
    own = html.replace(plotly_js, "")  # plotly.js names CDNs it never fetches unasked
    assert plotly_js in html and "http://" not in own and "https://" not in own
    assert len(html.encode()) < 1_400_000  # plotly.js's basic bundle, not the 4.8 MB full one
    data = page_data(result.path)
    assert data["x"] == [1, 2, 3, 4]
    assert data["phases"] == PHASES
    assert set(data["share"]) == {*PHASES, "unaccounted"}
    assert sum(data["share"].values()) == pytest.approx(1.0, abs=0.02)
    # the slowest step's tree is shown first: step 3 (half a second late) unless a loaded
    # machine stalled another longer (a clean-clone run beside a CPU hog saw step 2)
    seconds = dict(zip(data["x"], data["step_seconds"], strict=True))
    assert data["default_step"] == max(seconds, key=seconds.get)
    rows = span_rows(data, 3)
    assert [r["name"] for r in rows[:2]] == ["step", "gen"] and rows[0]["depth"] == 0
    assert {r["name"] for r in rows} >= {*PHASES, "sample"}
    assert data["mfu"]["actor"] == pytest.approx([0.21, 0.22, 0.23, 0.24])
    assert all(v > 0 for v in data["throughput"])
    # the tail from the sample spans: total = generate + tools + score of each sample
    totals = [0.04 + 0.0 + 0.001, 0.02 + 0.01 + 0.001, 2.0 + 0.1 + 0.002]  # step 4
    assert data["tail"]["p99"][3] == pytest.approx(np.percentile(totals, 99), rel=1e-4)
    assert data["tail"]["p50"][3] == pytest.approx(np.percentile(totals, 50), rel=1e-4)
    assert data["tail"]["basis"] == ["sample"]  # 3 sample spans = 3 sequences: every sample
    slowest = data["slowest_samples"][0]
    assert slowest["step"] == 4 and slowest["response_length"] == 90
    assert data["tail"]["slowest_span"][3] == pytest.approx(slowest["total_s"])
    assert re.fullmatch(r"[0-9a-f]{16}", slowest["span_id"])
    label, confidence, share = data["verdicts"]["points"][0]
    assert data["verdicts"]["next_reads"][data["verdicts"]["labels"][label]]
    assert confidence in ("low", "medium", "high") and 0 < share <= 1


def test_verdicts_are_the_live_ones_read_from_the_step_spans(tmp_path) -> None:
    """Each step's verdict in the page (the chart's points, the tree's card) is the live
    one — label, confidence, evidence — from the facts the step span recorded, though the
    spans hold 2 samples of 10; the step span's tree row does not repeat that record."""
    from rlotel.derive.diagnose import FACTS
    from tests.test_analyze import _tailed_run

    traces = tmp_path / "traces.jsonl"
    live = [step.verdict for step in _tailed_run(traces)]
    data = page_data(write_report(traces, tmp_path / "report.html").path)
    verdicts = data["verdicts"]
    points = [(verdicts["labels"][i], confidence) for i, confidence, _ in verdicts["points"]]
    assert points == [(v.label, v.confidence) for v in live]
    for number, verdict in enumerate(live, 1):
        card = data["trees"][str(number)]["verdict"]
        assert (card["label"], card["confidence"]) == (verdict.label, verdict.confidence)
        assert card["evidence"] == verdict.evidence and card["trends"] == verdict.trends
        assert all(FACTS not in row["attributes"] for row in span_rows(data, number))


def test_truncated_file_renders_what_is_valid(tmp_path, capsys) -> None:
    traces = tmp_path / "traces.jsonl"
    traced_run(traces)
    lines = traces.read_text().splitlines(keepends=True)
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("".join(lines[:-1]) + "{garbage\n" + lines[-1][: len(lines[-1]) // 3])
    out = tmp_path / "report.html"
    assert cli.main(["report", str(damaged), "-o", str(out)]) == 0
    assert "2 unreadable line(s) skipped" in capsys.readouterr().out
    data = page_data(out)
    assert data["skipped_lines"] == 2 and data["x"] == [1, 2, 3]


@pytest.mark.slow
@pytest.mark.slow  # a subprocess interpreter: what the user sees, traceback or not
@pytest.mark.parametrize(
    ("content", "message"),
    [("", "is empty"), ('{"hello": 1}\n[1]\n', "no steps found"), ("\x00\x01\n", "no steps")],
)
def test_empty_or_unknown_input_is_one_line_and_non_zero(
    tmp_path, content: str, message: str
) -> None:
    source = tmp_path / "input.jsonl"
    source.write_text(content)
    process = subprocess.run(
        [sys.executable, "-m", "rlotel.cli", "report", str(source)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert process.returncode != 0
    assert "Traceback" not in process.stderr
    assert message in process.stderr and len(process.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "report.html").exists()


def test_missing_input(tmp_path, capsys) -> None:
    assert cli.main(["report", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_verl_file_logger_with_goodput_and_staleness(tmp_path) -> None:
    """verl's FileLogger lines; keys of the goodput/async issues are drawn when present."""
    log = tmp_path / "exp.jsonl"
    with log.open("w") as out:
        for number in range(1, 4):
            data = {
                "timing_s/gen": 2.0 + number,
                "timing_s/update_actor": 1.5,
                "timing_s/step": 4.0 + number,
                "perf/mfu/actor": 0.3,
                "agent_loop/generate_sequences/mean": 1.0,
                "agent_loop/generate_sequences/max": 3.0,
                "rlotel/goodput": 0.6,
                "rlotel/idle_ratio/trainer": 0.2,
                "training/off_policy/trajectory_staleness/mean": 1.5,
            }
            out.write(json.dumps({"step": number, "data": data}) + "\n")
    result = write_report(log, tmp_path / "report.html")
    data = page_data(result.path)
    assert data["phases"] == ["gen", "update_actor"]
    assert data["unaccounted"] == pytest.approx([0.5, 0.5, 0.5])
    assert data["efficiency"] == {
        "rlotel/goodput": [0.6] * 3,
        "rlotel/idle_ratio/trainer": [0.2] * 3,
    }
    assert data["staleness"] == {"training/off_policy/trajectory_staleness/mean": [1.5] * 3}
    assert data["tail"]["verl_max"] == [3.0] * 3
    assert data["trees"]["3"]["rows"] == []  # a log has no spans: details only


def test_long_run_is_downsampled(tmp_path) -> None:
    log = tmp_path / "long.jsonl"
    steps = 2 * MAX_POINTS
    with log.open("w") as out:
        for number in range(1, steps + 1):
            gen = 10.0 if number == 777 else 1.0
            out.write(
                json.dumps(
                    {"step": number, "data": {"timing_s/gen": gen, "timing_s/step": gen + 1}}
                )
                + "\n"
            )
    data = page_data(write_report(log, tmp_path / "report.html").path)
    assert len(data["x"]) == MAX_POINTS and data["steps_per_point"] == 2
    assert data["step_count"] == steps and data["default_step"] == 777
    assert max(data["seconds"]["gen"]) == pytest.approx((10.0 + 1.0) / 2)  # bucket means
    assert len(data["trees"]) <= 200 + 3 and "777" in data["trees"]


@pytest.mark.slow
@pytest.mark.slow  # a worker process of its own
def test_processes_across_files(tmp_path) -> None:
    """A directory of per-process traces: a worker's spans join the driver's step tree."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tel = rlotel.init(run="mp", prometheus_port=None, traces_file=run_dir / "driver.jsonl")
    with tel.step(1):
        with tel.phase("gen"):
            carrier = json.dumps(tel.current_context())
            subprocess.run(
                [sys.executable, "-c", WORKER, str(run_dir / "worker.jsonl"), carrier],
                check=True,
                timeout=120,
            )
        with tel.phase("update_actor"):
            sum(range(10_000))
    tel.shutdown()
    data = page_data(write_report(run_dir, run_dir / "report.html").path)
    assert sorted(data["processes"]) == ["rlotel", "rollout-worker"]
    rows = span_rows(data, 1)
    worker = data["processes"].index("rollout-worker")
    remote = [r for r in rows if r["process"] == worker]
    assert {r["name"] for r in remote} == {"generate_remote", "sample"}
    gen_depth = next(r["depth"] for r in rows if r["name"] == "gen")
    assert next(r["depth"] for r in remote if r["name"] == "generate_remote") == gen_depth + 1
    assert data["slowest_samples"][0]["process"] == "rollout-worker"


def test_a_worker_groups_calls_fold_past_a_few_keeping_the_slowest_and_the_failed(
    tmp_path,
) -> None:
    """A worker group's calls under one window, each rank's span in its own file (as verl's
    ranks write them): past `FOLD_CALLS` the waterfall draws the slowest few and any that
    failed, and one row for the rest with their count and spread — at 1,024 ranks a step's
    tree is a dozen rows, not 2,048 (and the report stays under its size goal)."""
    from rlotel.offline.report import FOLD_CALLS, SHOWN_SLOWEST

    ranks, slow, failed = 16, (5, 9, 11, 13), 3  # as many slow ranks as are shown
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tel = rlotel.init(run="group", prometheus_port=None, traces_file=run_dir / "driver.jsonl")
    with tel.step(1), tel.phase("update_actor"):
        carrier = tel.current_context()
    tel.shutdown()
    for rank in range(ranks):  # each rank's own rlotel, one after another
        worker = rlotel.init(
            run="group",
            prometheus_port=None,
            traces_file=run_dir / f"rank-{rank}.jsonl",
            resource_attributes={"rl.role": "actor", "rl.rank": rank},
        )
        try:
            with worker.phase("update_actor", context=carrier):
                sum(range(2_000_000 if rank in slow else 1_000))  # the slow ranks' work
                if rank == failed:
                    raise RuntimeError("a rank's call failed")
        except RuntimeError:
            pass
        worker.shutdown()
    data = page_data(write_report(run_dir, run_dir / "report.html").path)
    rows = span_rows(data, 1)
    calls = [r for r in rows if r["name"] == "update_actor" and r["depth"] == 2]
    processes = data["processes"]
    shown = {int(processes[r["process"]].rsplit(" ", 1)[1]) for r in calls}
    assert ranks > FOLD_CALLS and len(slow) == SHOWN_SLOWEST
    assert shown == {*slow, failed}, shown
    (folded,) = [r for r in rows if r["name"].startswith("update_actor ×")]
    assert folded["name"] == f"update_actor ×{ranks - len(calls)} more"
    assert folded["attributes"]["folded calls"] == folded["attributes"]["processes"]
    assert folded["attributes"]["ms max"] <= min(r["duration_ms"] for r in calls if not r["error"])
    assert len(rows) == 3 + len(calls)  # the step, the window, the calls shown, the folded row


def test_unknowns_are_unknown_not_zero(tmp_path) -> None:
    """verl's MFU 0.0 (no peak FLOPs known, e.g. CPU) and preemptions -1 ("not available")
    are unknown in the page: no MFU line, no number in the preempted column."""
    traces = tmp_path / "traces.jsonl"
    tel = rlotel.init(run="unknown", prometheus_port=None, traces_file=traces)
    for number in (1, 2):
        with tel.step(number) as step:
            with tel.phase("gen"):
                tel.record_samples(
                    generate_sequences=[0.1, 0.2], num_preempted=[-1, 3], response_length=[5, 6]
                )
            step.set_tokens(prompt=[4, 4], response=[5, 6])
            step.set_mfu(actor=0.0, actor_infer=0.1 * (number - 1))  # known at step 2 only
    tel.shutdown()
    data = page_data(write_report(traces, tmp_path / "report.html").path)
    assert data["mfu_unknown"] == ["actor"]
    assert data["mfu"] == {"actor_infer": [None, pytest.approx(0.1)]}
    preempted = {
        round(row["generate_sequences_s"], 3): row["num_preempted"]
        for row in data["slowest_samples"]
    }
    assert preempted == {0.1: None, 0.2: 3}


def test_tail_from_every_trajectory_not_the_slowest_spans(tmp_path) -> None:
    """10 samples a step, 2 sample spans (the slowest): the quantiles come from the 10
    trajectory spans where they exist, and from nothing where only the slowest 2 do."""
    traces = tmp_path / "traces.jsonl"
    tel = rlotel.init(run="tail", prometheus_port=None, traces_file=traces, max_sample_spans=2)
    for number in (1, 2):
        with tel.step(number) as step:
            with tel.phase("gen"):
                if number == 1:  # verl V1's agent loop: one trajectory span per sample
                    for work in range(1, 11):
                        with tel.phase("trajectory"):
                            sum(range(20_000 * work))
                tel.record_samples(generate_sequences=[0.1 * k for k in range(1, 11)])
            step.set_tokens(prompt=[4] * 10, response=[8] * 10)
    tel.shutdown()
    from rlotel.offline.analyze import load_run

    run = load_run(traces)
    first = next(s for s in run.steps if s.number == 1).span
    seconds = [
        s.seconds for s in run.spans if s.name == "trajectory" and s.trace_id == first.trace_id
    ]
    assert len(seconds) == 10
    data = page_data(write_report(traces, tmp_path / "report.html").path)
    tail = data["tail"]
    assert tail["basis"] == ["trajectory"] and tail["samples_per_step"] == [10, None]
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99)):
        assert tail[name][0] == pytest.approx(np.percentile(seconds, q), abs=2e-6), name
        assert tail[name][1] is None, name  # step 2: only the slowest 2 of 10 have spans
    assert tail["steps_without_every_sample"] == 1
    # one after another on one replica: one in flight at a time, the peak → occupancy 1
    assert data["replica_occupancy"]["ratio"] == {"replica 0": [pytest.approx(1.0), None]}
    assert data["replica_occupancy"]["tail_seconds"] == {"replica 0": [0.0, None]}
    assert tail["slowest_span"][1] == pytest.approx(1.0)  # the drill-down is still there
    assert {row["step"] for row in data["slowest_samples"]} == {1, 2}


def test_weight_sync_stages_and_empty_sections(tmp_path) -> None:
    """The leaf spans under update_weights become stages; a run without validation,
    checkpoints or stalls has none of those sections' data (nothing drawn as if it were)."""
    traces = tmp_path / "traces.jsonl"
    tel = rlotel.init(run="sync", prometheus_port=None, traces_file=traces)
    for number in (1, 2, 3):
        with tel.step(number):
            with tel.phase("update_weights"):
                for stage in ("wake_up", "collective_rpc"):
                    with tel.phase(stage):
                        sum(range(30_000))
    tel.shutdown()
    data = page_data(write_report(traces, tmp_path / "report.html").path)
    assert list(data["weight_sync"]) == ["wake_up", "collective_rpc"]
    assert all(0 < v < 1 for series in data["weight_sync"].values() for v in series)
    assert data["occasional"] == [] and data["stalls"] == []
    assert data["tail"]["basis"] == [] and data["mfu"] == {} == data["efficiency"]


def test_checkpoints_validation_and_unfinished_steps_have_sections(tmp_path) -> None:
    """A step that raised is listed as unfinished; checkpoint and validation windows from
    verl's log are listed by step."""
    traces = tmp_path / "traces.jsonl"
    tel = rlotel.init(run="events", prometheus_port=None, traces_file=traces)
    with tel.step(1), tel.phase("gen"):
        sum(range(10_000))
    with pytest.raises(RuntimeError), tel.step(2), tel.phase("update_actor"):
        raise RuntimeError("the update failed")
    tel.shutdown()
    data = page_data(write_report(traces, tmp_path / "report.html").path)
    assert [(r["name"], r["step"], r["stalled"]) for r in data["stalls"]] == [("step", 2, False)]
    log = tmp_path / "exp.jsonl"
    with log.open("w") as out:
        for number in (1, 2):
            timing = {"timing_s/gen": 1.0, "timing_s/step": 3.0}
            if number == 2:
                timing |= {"timing_s/save_checkpoint": 1.5, "timing_s/testing": 0.5}
            out.write(json.dumps({"step": number, "data": timing}) + "\n")
    data = page_data(write_report(log, tmp_path / "log.html").path)
    assert data["occasional"] == [
        {"name": "testing", "step": 2, "seconds": 0.5},
        {"name": "save_checkpoint", "step": 2, "seconds": 1.5},
    ]
    assert data["stalls"] == [] and data["weight_sync"] == {}


@pytest.mark.slow  # a worker process of its own
def test_roles_per_span_not_per_process(tmp_path) -> None:
    """A fused worker process (resource role `critic`) serving an actor call: the tree and
    its legend say `actor` for that call and what it opened, `critic` for a plain call."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tel = rlotel.init(run="mp", prometheus_port=None, traces_file=run_dir / "driver.jsonl")
    with tel.step(1):
        with tel.phase("update_actor"):
            carrier = json.dumps(tel.current_context())
            subprocess.run(
                [sys.executable, "-c", FUSED_WORKER, str(run_dir / "worker.jsonl"), carrier],
                check=True,
                timeout=120,
            )
    tel.shutdown()
    data = page_data(write_report(run_dir, run_dir / "report.html").path)
    rows = span_rows(data, 1)
    worker = data["processes"].index("fused-worker critic")
    roles = {r["name"]: data["roles"][r["role"]] for r in rows if r["process"] == worker}
    assert roles == {
        "update_actor": "actor", "forward_backward": "actor", "update_critic": "critic",
    }  # fmt: skip


# --- in a real browser ---------------------------------------------------------------------


def _pixels_are_not_blank(png: bytes) -> tuple[int, float]:
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    colors = image.getcolors(maxcolors=1 << 20) or []
    background = max(colors)[1] if colors else (255, 255, 255)
    differing = sum(count for count, color in colors if color != background)
    return len(colors), differing / (image.width * image.height)


# The charts whose box is in the window (ids), and those of them not drawn yet: a chart is
# drawn once plotly put its SVG in, or the page its note that there is nothing to draw.
IN_WINDOW = """[...document.querySelectorAll('.chart')].filter((e) => {
  const r = e.getBoundingClientRect(); return r.width > 0 && r.top < innerHeight && r.bottom >= 0;
}).map((e) => e.id)"""
IN_WINDOW_UNDRAWN = IN_WINDOW.replace(
    ".map(", ".filter((e) => !e.querySelector('.main-svg, p.note')).map("
)
# Both, read the moment the page sets its ready mark (before any later draw can run).
AT_READY = f"""new MutationObserver((records, observer) => {{
  if (document.body.dataset.ready !== '1') return;
  observer.disconnect();
  window.atReady = {{ inWindow: {IN_WINDOW}, undrawn: {IN_WINDOW_UNDRAWN} }};
}}).observe(document, {{ attributes: true, subtree: true, attributeFilter: ['data-ready'] }});"""


@pytest.mark.slow
def test_demo_report_in_headless_chromium(demo_run: Path, tmp_path) -> None:
    from tests.chromium import Chromium, chromium_binary, file_url

    if chromium_binary() is None:
        pytest.fail("chromium is not installed: `make system-deps` installs Debian's")
    report = demo_run / "report.html"
    data = page_data(report)
    with Chromium(height=800) as browser:  # a laptop's window: the waterfall is below it
        browser.call("Page.addScriptToEvaluateOnNewDocument", session=True, source=AT_READY)
        load = browser.open(file_url(report), "document.body.dataset.ready === '1'")
        assert load.console_errors == []
        assert load.requests == []  # and every host resolves to nowhere: it rendered anyway
        # ready: every chart in the window drawn (the rest may still be waiting)
        at_ready = browser.evaluate("JSON.stringify(window.atReady)")
        browser.wait_for("document.body.dataset.drawn === '1'")  # then every chart (below)
        # the waterfall, below the window at first: scrolled to, its own pixels
        waterfall = json.loads(
            browser.evaluate(
                """(() => { const chart = document.getElementById('chart-waterfall');
                  chart.scrollIntoView();
                  const r = chart.querySelector('.main-svg').getBoundingClientRect();
                  return JSON.stringify({ x: r.x, y: r.y + scrollY, width: r.width,
                                          height: r.height, top: chart.offsetTop }); })()"""
            )
        )
        shot = browser.call(
            "Page.captureScreenshot",
            session=True,
            format="png",
            clip={**{k: waterfall[k] for k in ("x", "y", "width", "height")}, "scale": 1},
        )
        waterfall_png = base64.b64decode(shot["data"])
        browser.evaluate("scrollTo(0, 0)")
        dom = browser.evaluate(
            """JSON.stringify({
              charts: document.querySelectorAll('.js-plotly-plot .main-svg').length,
              plots: [...document.querySelectorAll('.js-plotly-plot')].map(e => e.id),
              legend: [...document.querySelectorAll('#chart-phases .legendtext')]
                        .map(e => e.textContent),
              options: [...document.querySelectorAll('#step-select option')].map(e => e.value),
              selected: document.getElementById('step-select').value,
              bars: document.querySelectorAll('#chart-waterfall .bars .point').length,
              verdict: document.getElementById('step-verdict').textContent,
              captures: [...document.querySelectorAll('#capture-table a')]
                          .map(a => a.getAttribute('href')),
              samples: document.querySelectorAll('#slowest-samples tr').length,
              skipped: !!document.getElementById('skipped-lines'),
              mfuTicks: [...document.querySelectorAll('#chart-throughput .y2tick text')]
                          .map(e => e.textContent),
              shareTicks: [...document.querySelectorAll('#chart-efficiency .ytick text')]
                            .map(e => e.textContent),
            })"""
        )
        dom = json.loads(dom)
        png = browser.screenshot()
        # another step from the selector redraws the waterfall
        other = next(n for n in dom["options"] if n != dom["selected"])
        browser.evaluate(
            f"(() => {{ const s = document.getElementById('step-select'); s.value = '{other}';"
            "s.dispatchEvent(new Event('change')); })()"
        )
        redrawn = browser.evaluate("document.getElementById('step-verdict').textContent")
    assert set(dom["plots"]) >= {
        "chart-phases", "chart-share", "chart-throughput", "chart-tail", "chart-verdicts",
        "chart-waterfall",
    }  # fmt: skip
    assert dom["charts"] >= 6
    phases = ["gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"]
    assert sorted(dom["legend"]) == sorted([*phases, "unaccounted"])
    assert dom["options"] == ["1", "2", "3", "4"]
    assert dom["selected"] == str(data["default_step"])
    assert dom["bars"] == len(data["trees"][dom["selected"]]["rows"]) >= 8
    assert dom["verdict"].startswith(data["trees"][dom["selected"]]["verdict"]["label"])
    assert redrawn.startswith(data["trees"][other]["verdict"]["label"])
    assert len(dom["captures"]) == 1 and (demo_run / dom["captures"][0]).is_file()
    assert dom["samples"] > 1 and not dom["skipped"]
    # ratio axes are bounded: MFU (the demo has it; verl's real CPU run has none) from 0 to at
    # most 100 %, and the goodput share of the step from 0 % to 100 %
    assert data["mfu"] and dom["mfuTicks"][0] == "0.0%", dom["mfuTicks"]
    assert all(0 <= float(tick.rstrip("%")) <= 100 for tick in dom["mfuTicks"]), dom["mfuTicks"]
    assert dom["shareTicks"][0] == "0%" and dom["shareTicks"][-1] == "100%", dom["shareTicks"]
    colors, coverage = _pixels_are_not_blank(png)
    assert colors > 50 and coverage > 0.05, (colors, coverage)
    at_ready = json.loads(at_ready)
    assert at_ready["undrawn"] == [], at_ready
    assert {"chart-phases", "chart-share"} <= set(at_ready["inWindow"]), at_ready
    assert waterfall["top"] > 800 and "chart-waterfall" not in at_ready["inWindow"]
    colors, coverage = _pixels_are_not_blank(waterfall_png)
    assert colors > 20 and coverage > 0.05, (colors, coverage)


ROOT = Path(__file__).resolve().parents[1]
# benchmarks/report_size.py's lines: `<what> <value> <unit>  (goal ≤ <budget> <unit>) ok|OVER`
FIGURE = re.compile(r"^(render|HTML size|interactive, cold browser) +([\d.]+) (s|MB)  \(goal ≤ ")
SIZE_GOAL_MB = 4.0  # issue 34; its time goals (render ≤ 5 s, interactive ≤ 1 s) are the
# benchmark's to judge (`make bench`), printed here: a CPU hog beside the suite made a cold
# load 1.03 s


@pytest.mark.slow  # a 10,000-step traces file, rendered and loaded in Chromium (~1 min)
def test_a_10k_step_report_renders_small_and_loads_clean():
    """The report of a 10,000-step run (benchmarks/report_size.py: real rlotel traces, the
    render, a fresh headless Chromium): ≤ 4 MB with plotly.js, every chart drawn with no
    console error or network request; its render and load times printed."""
    from tests.chromium import chromium_binary

    if chromium_binary() is None:
        pytest.fail("chromium is not installed: `make system-deps` installs Debian's")
    bench = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "report_size.py")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(bench.stdout)  # the figures, for a reader of the run
    figures = {
        match.group(1): float(match.group(2))
        for match in map(FIGURE.match, bench.stdout.splitlines())
        if match
    }
    assert len(figures) == 3, bench.stdout + bench.stderr[-3000:]
    assert "console errors or network requests: none" in bench.stdout, bench.stdout
    assert figures["HTML size"] <= SIZE_GOAL_MB, figures
