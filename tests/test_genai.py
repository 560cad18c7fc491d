"""Trajectories in the OpenTelemetry GenAI conventions: the names checked against the
installed semantic-conventions package, the span shape on both export paths (traces file
and SDK) read back by rlotel's reader, counted bad input, and the demo's own traces."""

from __future__ import annotations

import ast
import gzip
import importlib.metadata
import inspect
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opentelemetry.semconv import schemas
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as semconv

import rlotel
from rlotel.cli import commands as cli
from rlotel.offline import otlp_json
from rlotel.offline.analyze import load_steps
from rlotel.record import samples
from rlotel.schema import attributes as attr
from tests.helpers import finished_spans

ROOT = Path(__file__).resolve().parents[1]
INSTALLED = importlib.metadata.version("opentelemetry-semantic-conventions")
# Attributes that would carry prompts, responses or tool payloads.
CONTENT = {
    semconv.GEN_AI_INPUT_MESSAGES,
    semconv.GEN_AI_OUTPUT_MESSAGES,
    semconv.GEN_AI_SYSTEM_INSTRUCTIONS,
    semconv.GEN_AI_PROMPT,
    semconv.GEN_AI_COMPLETION,
    semconv.GEN_AI_TOOL_CALL_ARGUMENTS,
    semconv.GEN_AI_TOOL_CALL_RESULT,
    semconv.GEN_AI_TOOL_DEFINITIONS,
}


def semconv_attributes() -> dict[str, str]:
    """Each `gen_ai.*` attribute of the installed package → its docstring ("" if none)."""
    tree = ast.parse(inspect.getsource(semconv))
    result: dict[str, str] = {}
    body = tree.body
    for node, after in zip(body, [*body[1:], None], strict=True):
        if isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Constant):
            doc = ""
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                doc = str(after.value.value)
            result[node.value.value] = doc
    return result


def genai_literals(path: Path) -> set[str]:
    """String constants in a source file that are `gen_ai.*` names."""
    tree = ast.parse(path.read_text())
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("gen_ai.")
        and " " not in node.value
    }


def test_every_genai_name_is_published_in_the_installed_conventions() -> None:
    published = semconv_attributes()
    assert attr.GENAI_SCHEMA_URL in {schema.value for schema in schemas.Schemas}, INSTALLED
    for name in attr.GENAI_ATTRIBUTES:
        assert name in published, f"{name} is not in semconv {INSTALLED}"
        # The GenAI names moved to their own repository (still "Development"): moved is
        # fine, a rename ("Replaced by") or a removal is not.
        doc = published[name]
        assert "Replaced by" not in doc and "Removed" not in doc, f"{name}: {doc.strip()}"
    operations = {value.value for value in semconv.GenAiOperationNameValues}
    assert set(attr.GENAI_OPERATIONS) <= operations
    # The Python package generates no event names: the event's namespace must be there.
    namespace = attr.EVALUATION_EVENT.rsplit(".", 1)[0] + "."
    assert {attr.EVALUATION_NAME, attr.EVALUATION_SCORE} <= {
        name for name in published if name.startswith(namespace)
    }


def test_genai_names_are_spelled_once_and_all_are_checked() -> None:
    """Every `gen_ai.*` literal in rlotel lives in rlotel/schema/attributes.py, and each one is
    an attribute checked above (or the evaluation event's name)."""
    owners = {
        path.relative_to(ROOT).as_posix(): names
        for path in sorted((ROOT / "rlotel").rglob("*.py"))
        if (names := genai_literals(path))
    }
    assert set(owners) == {"rlotel/schema/attributes.py"}, owners
    assert owners["rlotel/schema/attributes.py"] == {*attr.GENAI_ATTRIBUTES, attr.EVALUATION_EVENT}


def record_trajectories(tel: rlotel.Telemetry, **extra) -> tuple[int, dict]:
    """Three samples, the slowest two get spans: turns and tool calls at known times
    (inside the `gen` phase, which opened at least 2 ms before `now`)."""
    with tel.step(1), tel.phase("gen"):
        time.sleep(0.002)
        now = time.time_ns()
        fields = trajectory_fields(now, **extra)
        tel.record_samples(**fields)
    return now, fields


def trajectory_fields(now: int, **extra) -> dict:
    fields = dict(
        generate_sequences=[2.0, 0.1, 3.0],
        tool_calls=[0.5, 0.0, 0.0],
        prompt_length=[10, 11, 12],
        response_length=[20, 21, 22],
        uid=["p0", "p1", "p2"],
        session=[0, 1, 2],
        reward=[0.25, 1.0, 0.75],
        turn_times_ns=[
            [(now - 900, now - 700), (now - 500, now - 100)],
            [(now - 50, now - 10)],
            [(now - 800, now - 200)],
        ],
        tool_times_ns=[[("calculator", now - 650, now - 550)], [], []],
    )
    fields.update(extra)
    return fields


def check_trajectories(spans: list[otlp_json.SpanRecord], now: int) -> None:
    """The shape both export paths must produce for `record_trajectories`."""
    by_id = {span.span_id: span for span in spans}
    trajectories = {s.attributes[attr.SAMPLE_INDEX]: s for s in spans if s.name == "sample"}
    assert sorted(trajectories) == [0, 2]
    for index, span in trajectories.items():
        attributes = span.attributes
        assert attributes[attr.OPERATION] == "invoke_agent"
        assert attributes[attr.CONVERSATION_ID] == f"p{index}_{index}"  # uid_session
        assert attributes[attr.SAMPLE_UID] == f"p{index}"  # RL facts stay under rl.*
        assert attributes[attr.INPUT_TOKENS] == 10 + index
        assert attributes[attr.OUTPUT_TOKENS] == 20 + index
        assert attributes["rl.sample.generate_sequences_s"] == [2.0, 0.1, 3.0][index]
        (event,) = span.events
        assert event.name == "gen_ai.evaluation.result"
        assert event.attributes == {
            "gen_ai.evaluation.name": "reward",
            "gen_ai.evaluation.score.value": [0.25, 1.0, 0.75][index],
        }
        assert span.start_ns <= event.time_ns <= span.end_ns
        assert by_id[span.parent_span_id].name == "gen"
    parts = [s for s in spans if s.parent_span_id in {t.span_id for t in trajectories.values()}]
    by_parent: dict[int, list] = {}
    for part in parts:
        parent = by_id[part.parent_span_id]
        by_parent.setdefault(parent.attributes[attr.SAMPLE_INDEX], []).append(part)
        assert parent.start_ns <= part.start_ns <= part.end_ns <= parent.end_ns
        assert part.trace_id == parent.trace_id
        assert part.attributes[attr.CONVERSATION_ID] == parent.attributes[attr.CONVERSATION_ID]
        assert not part.events and attr.PHASE not in part.attributes
    shape = {
        index: sorted(
            (p.name, p.attributes[attr.OPERATION], p.start_ns - now, p.end_ns - now) for p in group
        )
        for index, group in by_parent.items()
    }
    assert shape == {
        0: [
            ("chat", "chat", -900, -700),
            ("chat", "chat", -500, -100),
            ("execute_tool calculator", "execute_tool", -650, -550),
        ],
        2: [("chat", "chat", -800, -200)],
    }
    tools = [p for p in parts if p.name.startswith("execute_tool")]
    assert [p.attributes[attr.TOOL_NAME] for p in tools] == ["calculator"]
    assert all(attr.TOOL_NAME not in p.attributes for p in parts if p.name == "chat")
    names = {key for span in spans for key in span.attributes if key.startswith("gen_ai.")}
    assert names <= set(attr.GENAI_ATTRIBUTES) and not names & CONTENT


def sdk_records(exported) -> list[otlp_json.SpanRecord]:
    """SDK `ReadableSpan`s in the reader's shape (hex ids), for the same checks."""
    return [
        otlp_json.SpanRecord(
            f"{span.context.trace_id:032x}",
            f"{span.context.span_id:016x}",
            f"{span.parent.span_id:016x}" if span.parent else "",
            span.name,
            span.start_time,
            span.end_time,
            dict(span.attributes),
            {},
            events=tuple(
                otlp_json.SpanEvent(e.name, e.timestamp, dict(e.attributes)) for e in span.events
            ),
        )
        for span in exported
    ]


def test_trajectory_spans_on_both_export_paths(make_tel, span_exporter, tmp_path) -> None:
    traces = tmp_path / "traces.jsonl"
    tel = make_tel(prometheus_port=None, traces_file=traces, max_sample_spans=2)
    now, _ = record_trajectories(tel)
    exported = finished_spans(tel, span_exporter)
    tel.shutdown()
    check_trajectories(sdk_records(exported), now)  # the SDK (OTLP) path
    assert {span.instrumentation_scope.schema_url for span in exported} == {attr.GENAI_SCHEMA_URL}
    read = otlp_json.read_file(traces)  # the traces file, through rlotel's reader
    assert read.skipped_lines == 0
    check_trajectories(read.spans, now)
    request = json.loads(traces.read_text().splitlines()[0])
    assert request["resourceSpans"][0]["scopeSpans"][0]["schemaUrl"] == attr.GENAI_SCHEMA_URL


def test_without_turns_or_reward_a_sample_span_is_still_an_agent_run(make_tel, span_exporter):
    tel = make_tel(max_sample_spans=2)
    with tel.step(1), tel.phase("gen"):
        tel.record_samples(generate_sequences=[1.0, 2.0, 3.0], response_length=[4, 5, 6])
    spans = finished_spans(tel, span_exporter)
    trajectories = [s for s in spans if s.name == "sample"]
    assert len(trajectories) == 2 and len(spans) == 4  # step, gen, two samples: no children
    for span in trajectories:
        assert span.attributes[attr.OPERATION] == "invoke_agent"
        assert attr.CONVERSATION_ID not in span.attributes  # no uid given
        assert not span.events


def test_a_span_placed_by_its_stage_seconds_encloses_its_turns(make_tel, span_exporter) -> None:
    tel = make_tel(max_sample_spans=1)
    with tel.step(1), tel.phase("gen"):
        started = time.time_ns()
        time.sleep(0.05)
        tel.record_samples(  # 1 ms of stage seconds, but its turn took 50 ms
            generate_sequences=[0.001], turn_times_ns=[[(started, time.time_ns())]]
        )
    spans = {span.name: span for span in finished_spans(tel, span_exporter)}
    sample, chat = spans["sample"], spans["chat"]
    assert chat.parent.span_id == sample.context.span_id
    assert sample.start_time <= chat.start_time and chat.end_time <= sample.end_time
    assert sample.end_time - sample.start_time >= 50_000_000


BAD_TURNS = [
    (5, 6, 7),  # a triple, not a pair
    (9, 3),  # ends before it starts
    (-1, 4),  # negative
    (1.5, 4),  # not whole
    (float("nan"), 4),
    ("1", "2"),  # text
    None,
    "12",
]
BAD_TOOLS = [
    ("", 1, 2),  # no name
    (7, 1, 2),  # a name that is not text
    ("calculator", 1),  # no end
    ("calculator", 5, 1),  # ends before it starts
]


def test_bad_turns_and_tool_calls_are_counted_and_the_span_stays(
    make_tel, span_exporter, caplog
) -> None:
    tel = make_tel(max_sample_spans=3)
    good_turn, good_tool = (100, 200), ("search", 120, 180)
    with caplog.at_level(logging.WARNING, logger="rlotel"):
        with tel.step(1), tel.phase("gen"):
            tel.record_samples(
                generate_sequences=[3.0, 2.0, 1.0],
                uid=["a", "b", "c"],
                reward=[float("nan"), "high", 0.5],
                turn_times_ns=[[good_turn, *BAD_TURNS], "not a list", None],
                tool_times_ns=[[*BAD_TOOLS, good_tool], None, 42],
            )
    spans = finished_spans(tel, span_exporter)
    drops = {reason: n for (signal, reason), n in tel.drops.snapshot().items()}
    assert drops == {
        "bad_turn": len(BAD_TURNS) + 1,
        "bad_tool": len(BAD_TOOLS) + 1,
        "non_finite": 2,  # the reward column's count: nan and "high", once each
    }
    for reason in ("bad_turn", "bad_tool", "non_finite"):  # one line per reason, not per entry
        assert sum(f"({reason})" in r.getMessage() for r in caplog.records) == 1
    trajectories = {s.attributes[attr.SAMPLE_INDEX]: s for s in spans if s.name == "sample"}
    assert sorted(trajectories) == [0, 1, 2]  # every span stays
    assert [len(trajectories[i].events) for i in range(3)] == [0, 0, 1]
    assert trajectories[2].events[0].attributes[attr.EVALUATION_SCORE] == 0.5
    children = [
        s for s in spans if s.parent and s.parent.span_id == trajectories[0].context.span_id
    ]
    assert sorted((s.name, s.start_time, s.end_time) for s in children) == [
        ("chat", *good_turn),
        ("execute_tool search", 120, 180),
    ]
    assert all(trajectories[i].attributes[attr.CONVERSATION_ID] for i in range(3))


def test_turns_beyond_the_cap_are_counted_and_a_misaligned_field_is_dropped(
    make_tel, span_exporter
) -> None:
    tel = make_tel(max_sample_spans=2)
    many = [(i, i + 1) for i in range(samples.MAX_PARTS + 10)]
    with tel.step(1), tel.phase("gen"):
        tel.record_samples(
            generate_sequences=[2.0, 1.0],
            turn_times_ns=[many, []],
            tool_times_ns=[[("calculator", 1, 2)]],  # one entry for two samples
        )
    spans = finished_spans(tel, span_exporter)
    drops = {reason: n for (_, reason), n in tel.drops.snapshot().items()}
    assert drops == {"bad_turn": 10, "length_mismatch": 1}
    assert sum(s.name == "chat" for s in spans) == samples.MAX_PARTS
    assert not [s for s in spans if s.name.startswith("execute_tool")]


def test_perfetto_and_report_keep_turns_with_their_trajectory(tmp_path) -> None:
    traces = tmp_path / "traces.jsonl"
    tel = rlotel.init(run="g", prometheus_port=None, traces_file=traces, max_sample_spans=2)
    record_trajectories(tel)
    tel.shutdown()
    out = tmp_path / "trace.json.gz"
    assert cli.main(["perfetto", str(traces), "-o", str(out)]) == 0
    events = json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    slices = [e for e in events if e["ph"] == "X"]
    for name in ("sample", "chat", "execute_tool calculator"):
        found = [e for e in slices if e["name"] == name]
        assert found and all(tracks[(e["pid"], e["tid"])].startswith("samples") for e in found)
    assert {tracks[(e["pid"], e["tid"])] for e in slices if e["name"] == "gen"} == {"phases"}
    rewards = [e["args"]["events"] for e in slices if e["name"] == "sample"]
    assert sorted(r[0]["gen_ai.evaluation.score.value"] for r in rewards) == [0.25, 0.75]
    assert cli.main(["analyze", str(traces)]) == 0
    assert cli.main(["report", str(traces), "-o", str(tmp_path / "r.html")]) == 0
    (step,) = load_steps(traces)
    assert set(step.timing_raw) == {"gen", "step"}  # turns and tools are not phases


@pytest.mark.slow
def test_demo_traces_are_genai_trajectories(tmp_path) -> None:
    command = [
        sys.executable, "-m", "rlotel.cli", "demo", "--steps", "2", "--port", "0",
        "--runs-dir", str(tmp_path), "--sample-spans", "256",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    spans = otlp_json.read_file(tmp_path / "demo" / "traces.jsonl").spans
    by_id = {span.span_id: span for span in spans}
    trajectories = [s for s in spans if s.name == "sample"]
    assert len(trajectories) == 2 * 256  # every sample of both steps
    children: dict[str, list] = {t.span_id: [] for t in trajectories}
    for span in spans:
        if span.name == "chat" or span.name.startswith("execute_tool"):
            children[span.parent_span_id].append(span)  # KeyError: not under a trajectory
    with_tool = 0
    for trajectory in trajectories:
        attributes = trajectory.attributes
        assert attributes[attr.OPERATION] == "invoke_agent"
        assert attributes[attr.CONVERSATION_ID] == attributes[attr.SAMPLE_UID]
        assert attributes[attr.OUTPUT_TOKENS] > 0 and attributes[attr.INPUT_TOKENS] > 0
        assert by_id[trajectory.parent_span_id].name == "gen"
        (event,) = trajectory.events
        assert event.name == attr.EVALUATION_EVENT
        assert event.attributes[attr.EVALUATION_NAME] == "reward"
        assert 0.0 <= event.attributes[attr.EVALUATION_SCORE] <= 1.0
        parts = sorted(children[trajectory.span_id], key=lambda s: s.start_ns)
        chats = [p for p in parts if p.name == "chat"]
        tools = [p for p in parts if p.name != "chat"]
        assert chats and all(p.attributes[attr.OPERATION] == "chat" for p in chats)
        for part in parts:
            assert trajectory.start_ns <= part.start_ns <= part.end_ns <= trajectory.end_ns
        # the calculator ran iff the sample spent tool seconds; after each call, a turn
        assert bool(tools) == (attributes["rl.sample.tool_calls_s"] > 0)
        assert len(chats) == len(tools) + 1
        for tool in tools:
            assert tool.name == "execute_tool calculator"
            assert tool.attributes[attr.TOOL_NAME] == "calculator"
            assert tool.attributes[attr.OPERATION] == "execute_tool"
            before = [c for c in chats if c.end_ns <= tool.start_ns]
            after = [c for c in chats if c.start_ns >= tool.end_ns]
            assert before and after  # between two turns, at its real time
        with_tool += bool(tools)
    assert with_tool >= len(trajectories) // 2  # the agent calls it for every checked group
    names = {key for span in spans for key in span.attributes if key.startswith("gen_ai.")}
    assert names <= set(attr.GENAI_ATTRIBUTES) and not names & CONTENT
