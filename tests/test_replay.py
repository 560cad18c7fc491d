"""`rlotel.offline.replay`: verl's real FileLogger output → backfilled Prometheus and step traces.

Checked with the real tools: promtool builds TSDB blocks from metrics.om, a real
Prometheus serves them back, and the traces file parses as OTLP/JSON lines.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from rlotel.offline import otlp_json
from rlotel.offline.replay import LOG_KEYS, STAGE_ORDER, ReplayResult, _timestamp, replay
from rlotel.schema.vocabulary import VERL_STEP_STAGES
from tests.helpers import file_spans
from tests.promserver import Prometheus

RUN = 'grpo "7b"\\a'  # a quote and a backslash: label values must be escaped
FALLBACK_S = 45.0
STEPS = range(1, 6)
NO_TIMING = 3  # neither timing_s/step nor perf/time_per_step: the fallback applies
PERF_ONLY = 4  # perf/time_per_step without timing_s/step


def _step_data(n: int) -> dict:
    data = {
        "timing_s/gen": 10.5 + 0.25 * n,
        "timing_s/reward": 0.7 * n,
        "timing_s/update_actor": 4.125 + 0.01 * n,
        "timing_s/testing": 2.0,  # not a step stage: a phase gauge, no child span
        "timing_per_token_ms/gen": 0.0123 * n,
        "perf/throughput": 1234.567 + n / 3,
        "perf/total_num_tokens": 100_000 + 17 * n,
        "perf/mfu/actor": 0.31 + 0.01 * n,
        "actor/pg_loss": -0.0123 * n,
        "critic/score/mean": 0.5 + n / 7,
        "val/note": "not a number",
        "actor/grad_norm": float("nan"),
    }
    if n == PERF_ONLY:
        data["perf/time_per_step"] = 19.25
    elif n != NO_TIMING:
        data["timing_s/step"] = data["timing_s/gen"] + data["timing_s/update_actor"] + 1.1 * n
    return data


@pytest.fixture
def verl_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from verl.utils import tracking

    target = tmp_path / "verl.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(target))
    logger = tracking.FileLogger("proj", "exp")
    for n in STEPS:
        logger.log(_step_data(n), step=n)
    logger.finish()
    return target


@pytest.fixture
def replayed(verl_log: Path, tmp_path: Path) -> ReplayResult:
    return replay(verl_log, tmp_path / "out", RUN, step_seconds=FALLBACK_S)


def _duration(n: int) -> float:
    data = _step_data(n)
    return data.get("timing_s/step", data.get("perf/time_per_step", FALLBACK_S))


def test_stage_order_matches_formulas() -> None:
    assert frozenset(STAGE_ORDER) == VERL_STEP_STAGES


def test_clock_and_bad_values(replayed: ReplayResult) -> None:
    assert replayed.steps == len(STEPS)
    assert replayed.dropped == {"non_numeric": len(STEPS), "null": len(STEPS)}  # NaN → null
    times = [replayed.step_timestamps[n] for n in STEPS]
    assert abs(times[-1] - time.time()) < 30  # ends "now" by default
    for n, (before, after) in zip(list(STEPS)[1:], itertools.pairwise(times), strict=True):
        assert abs((after - before) - _duration(n)) <= 0.001  # ms resolution
    assert times[NO_TIMING - 1] - times[NO_TIMING - 2] == pytest.approx(FALLBACK_S, abs=0.001)

    text = replayed.metrics_path.read_text()
    assert text.endswith("# EOF\n")
    assert "val/note" not in text and "grad_norm" not in text
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(samples) == replayed.samples
    assert all(len(line.rsplit(" ", 2)) == 3 for line in samples)  # value and timestamp
    assert "# UNIT rlotel_step_phase_seconds seconds" in text


def test_explicit_start_time(verl_log: Path, tmp_path: Path) -> None:
    result = replay(verl_log, tmp_path / "fixed", "r", start_time=1_700_000_000.0)
    assert result.step_timestamps[1] == pytest.approx(1_700_000_000.0 + _duration(1), abs=0.001)
    assert result.step_timestamps[NO_TIMING] - result.step_timestamps[NO_TIMING - 1] == (
        pytest.approx(60.0, abs=0.001)  # the default fallback
    )


def _promtool_blocks(metrics: Path, tsdb: Path) -> None:
    binary = shutil.which("promtool")
    assert binary, "promtool is not installed: run `make test`"
    done = subprocess.run(
        [binary, "tsdb", "create-blocks-from", "openmetrics", str(metrics), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _at(server: Prometheus, promql: str, seconds: float) -> float | None:
    ms = round(seconds * 1000)
    result = server.api("query", query=promql, time=f"{ms // 1000}.{ms % 1000:03d}")["result"]
    assert len(result) <= 1, result
    return float(result[0]["value"][1]) if result else None


@pytest.mark.slow
def test_prometheus_reads_back_the_file_values(replayed: ReplayResult, tmp_path: Path) -> None:
    workdir = tmp_path / "prom"
    workdir.mkdir()
    _promtool_blocks(replayed.metrics_path, workdir / "data")
    server = Prometheus(workdir, [], config={"global": {"scrape_interval": "1h"}})
    try:
        run = RUN.replace("\\", "\\\\").replace('"', '\\"')  # PromQL string escaping
        for index, n in enumerate(STEPS):
            data = _step_data(n)
            at = replayed.step_timestamps[n]
            expected = {
                f'rlotel_step_phase_seconds{{run="{run}",phase="gen"}}': data["timing_s/gen"],
                f'rlotel_step_phase_seconds{{run="{run}",phase="update_actor"}}': data[
                    "timing_s/update_actor"
                ],
                f'rlotel_step_phase_seconds{{run="{run}",phase="testing"}}': 2.0,
                f'rlotel_phase_time_per_token_seconds{{run="{run}",phase="gen"}}': data[
                    "timing_per_token_ms/gen"
                ]
                / 1000,
                f'rlotel_throughput_tokens_per_second_per_gpu{{run="{run}"}}': data[
                    "perf/throughput"
                ],
                f'rlotel_step_tokens{{run="{run}",kind="unsplit"}}': data["perf/total_num_tokens"],
                f'rlotel_mfu_ratio{{run="{run}",role="actor"}}': data["perf/mfu/actor"],
                f'rlotel_train_metric{{run="{run}",key="actor/pg_loss"}}': data["actor/pg_loss"],
                f'rlotel_train_metric{{run="{run}",key="critic/score/mean"}}': data[
                    "critic/score/mean"
                ],
                f'rlotel_step{{run="{run}"}}': n,
                f'rlotel_steps_total{{run="{run}"}}': index + 1,
                f'rlotel_last_step_timestamp_seconds{{run="{run}"}}': at,
            }
            if n != NO_TIMING:
                expected[f'rlotel_step_time_seconds{{run="{run}"}}'] = _duration(n)
            for promql, value in expected.items():
                assert _at(server, promql, at) == value, (n, promql)
        last = replayed.step_timestamps[STEPS[-1]]
        assert _at(server, f'rlotel_steps_total{{run="{run}"}}', last) == len(STEPS)
        assert _at(server, 'rlotel_train_metric{key="actor/grad_norm"}', last) is None
        dropped = f'rlotel_telemetry_dropped_total{{run="{run}",reason="null"}}'
        assert _at(server, dropped, last) == len(STEPS)
        # the raw samples: one per step, at the step timestamps
        raw = server.api("query", query=f'rlotel_step{{run="{run}"}}[1d]', time=str(last + 1))
        ((series,),) = [raw["result"]]
        assert [(at, float(v)) for at, v in series["values"]] == [
            (pytest.approx(replayed.step_timestamps[n], abs=1e-6), float(n)) for n in STEPS
        ]
    finally:
        server.stop()


def test_traces_one_reconstructed_tree_per_step(replayed: ReplayResult) -> None:
    read = otlp_json.read_file(replayed.traces_path)
    assert read.skipped_lines == 0
    assert {span.resource["service.name"] for span in read.spans} == {"rlotel-replay"}

    spans = file_spans(replayed.traces_path, run=RUN)
    roots = sorted(
        (s for s in spans if s["name"] == "step" and not s["parent"]),
        key=lambda s: s["attrs"]["rl.step"],
    )
    assert [r["attrs"]["rl.step"] for r in roots] == list(STEPS)
    assert len({r["trace"] for r in roots}) == len(STEPS)
    for root in roots:
        n = root["attrs"]["rl.step"]
        data = _step_data(n)
        assert root["attrs"]["rl.reconstructed"] is True
        assert root["attrs"]["rl.run"] == RUN
        assert abs((root["end"] - root["start"]) / 1e9 - _duration(n)) <= 1e-6
        assert root["end"] // 1_000_000 == round(replayed.step_timestamps[n] * 1000)
        children = sorted((s for s in spans if s["parent"] == root["id"]), key=lambda s: s["start"])
        assert [c["name"] for c in children] == ["gen", "reward", "update_actor"]
        assert children[0]["start"] == root["start"]
        for before, after in itertools.pairwise(children):
            assert after["start"] == before["end"]  # back to back, in verl's order
        for child in children:
            assert child["trace"] == root["trace"]
            assert child["attrs"]["rl.reconstructed"] is True
            assert child["attrs"]["rl.phase"] == child["name"]
            seconds = (child["end"] - child["start"]) / 1e9
            assert abs(seconds - data[f"timing_s/{child['name']}"]) <= 1e-6


def test_bad_lines_and_key_cap_are_counted(tmp_path: Path) -> None:
    many = {f"custom/k{i}": float(i) for i in range(LOG_KEYS[0] + 44)}
    lines = [
        "{not json",
        json.dumps({"step": -1, "data": {"timing_s/gen": 1.0}}),
        json.dumps({"step": "x", "data": {}}),
        json.dumps(["no", "dict"]),
        json.dumps({"step": 1, "data": {"timing_s/gen": -2.0, "timing_s/step": 3.0, **many}}),
        json.dumps({"step": 2.0, "data": {"timing_s/step": float("inf")}}),  # json: Infinity
    ]
    log = tmp_path / "bad.jsonl"
    log.write_text("\n".join(lines) + "\n")
    result = replay(log, tmp_path / "out", "r", start_time=1_700_000_000.0, step_seconds=7.0)
    assert result.steps == 2
    assert result.dropped == {
        "bad_line": 1,
        "bad_step": 2,
        "bad_record": 1,
        "negative": 1,
        "log_key_cap": 44,
        "non_finite": 1,
    }
    text = result.metrics_path.read_text()
    # labels sorted by name, as prometheus_client (and /metrics) write them
    assert len(re.findall(r'^rlotel_train_metric\{key="[^"]*",run="r"\}', text, re.M)) == (
        LOG_KEYS[0] * 2
    )
    assert result.step_timestamps == {1: 1_700_000_003.0, 2: 1_700_000_010.0}  # inf: fallback


def test_timestamps_read_back_as_the_intended_millisecond() -> None:
    """Prometheus' parser truncates `float(text) * 1000`; every ms must survive that."""
    for start in (1_000, 1_024_000, 1_790_000_000_000):  # near 1970 plain decimals truncate
        for ms in range(start, start + 20_000):
            assert int(float(_timestamp(ms)) * 1000) == ms


def test_replay_command(tmp_path, capsys):
    from rlotel.cli import commands as cli

    source = tmp_path / "exp.jsonl"
    source.write_text(
        '{"step": 1, "data": {"timing_s/gen": 2.0, "timing_s/step": 3.0}}\n'
        '{"step": 2, "data": {"timing_s/gen": 2.5, "timing_s/step": 3.5}}\n'
    )
    assert cli.main(["replay", str(source), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "replayed 2 steps of run 'exp'" in out and "create-blocks-from openmetrics" in out
    assert (tmp_path / "out" / "metrics.om").read_text().rstrip().endswith("# EOF")
    assert cli.main(["replay", str(tmp_path / "missing.jsonl")]) == 2


def test_a_timer_rlotel_has_no_word_for_is_a_window_of_the_replayed_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's next data plane logs `timing_s/dataplane/prefetch_gen`: replayed as a window of
    its own name after verl's known ones, and covered time, not unaccounted."""
    from verl.utils import tracking

    log = tmp_path / "verl.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(log))
    logger = tracking.FileLogger("proj", "exp")
    data = {
        "timing_s/gen": 2.0,
        "timing_s/dataplane/prefetch_gen": 0.5,
        "timing_s/update_actor": 1.0,
        "timing_s/step": 4.0,
    }
    logger.log(data, step=1)
    logger.finish()
    result = replay(log, tmp_path / "out", "r", start_time=1_700_000_000.0)
    spans = file_spans(result.traces_path, run="r")
    (root,) = [s for s in spans if s["name"] == "step"]
    children = sorted((s for s in spans if s["parent"] == root["id"]), key=lambda s: s["start"])
    assert [c["name"] for c in children] == ["gen", "update_actor", "dataplane/prefetch_gen"]
    assert root["attrs"]["rl.unaccounted_s"] == pytest.approx(0.5)  # 4 - (2 + 1 + 0.5)
