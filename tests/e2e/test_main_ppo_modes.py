"""verl's other trainers through the real `main_ppo`, plugin on: V0 (`trainer.use_v1=false`)
and V1's `colocate_async` mode. Each trains ≥ 3 steps; verl's logged windows equal
rlotel's, and the trace has the workers' spans under the trainer's phases."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlotel.offline import analyze
from rlotel.schema import vocabulary as voc
from tests.e2e.test_main_ppo import STEPS, main_ppo, spans_by_role, verl_log
from tests.helpers import parse_exposition

pytestmark = pytest.mark.slow

# V0 times `start_profile` and `stop_profile` into the step dict around its `step` timer:
# rlotel records each as a root span of its own, outside the step ledger.
OUTSIDE_STEP = {"start_profile", "stop_profile"}
UNREACHABLE = "http://127.0.0.1:9"  # nothing listens there in the run's own network namespace
MODES = {
    # V0 also meets a collector that refuses every connection, in every process, asked for
    # in OTLP/JSON (a value OpenTelemetry's spec allows), and another program on the
    # trainer's documented /metrics port
    "v0": [
        "trainer.use_v1=false",
        *("--otlp-endpoint", UNREACHABLE, "--otlp-protocol", "http/json", "--hold-port"),
    ],
    "colocate_async": ["trainer.v1.trainer_mode=colocate_async"],
}


@pytest.fixture(scope="module", params=sorted(MODES))
def mode_run(request, e2e_assets: Path) -> Iterator[tuple[str, Path]]:
    for work in main_ppo(e2e_assets, *MODES[request.param]):
        yield request.param, work


def test_windows_equal_verl_and_workers_nest(mode_run: tuple[str, Path]) -> None:
    mode, work = mode_run
    logged = verl_log(work)
    assert len(logged) >= STEPS, mode
    ours = {step.number: step for step in analyze.load_steps(work / "traces")}
    assert sorted(ours) == sorted(logged), mode
    roles = spans_by_role(work)
    before_step = sorted(
        (s for s in roles["trainer"] if s["name"] in OUTSIDE_STEP and not s["parent"]),
        key=lambda s: s["start"],
    )
    for number, data in logged.items():
        timing = voc.timing_from_metrics(data)
        assert {"step", "gen", "update_actor"} <= set(timing), (mode, sorted(timing))
        for name, seconds in timing.items():
            if name in OUTSIDE_STEP:  # a root span of its own, just before the step's
                span = before_step.pop(0)
                assert span["name"] == name
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
