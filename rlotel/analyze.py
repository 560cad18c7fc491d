"""Read a run back: rlotel's OTLP/JSON traces file or verl's FileLogger JSONL.

Both become per-step (timing_raw, metrics) records, so `rlotel analyze` prints the same
ledger table as the demo. Sample spans and phases outside steps are ignored.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rlotel import formulas
from rlotel.diagnose import StepFacts


@dataclass
class StepRecord:
    number: int
    timing_raw: dict[str, float]
    metrics: dict[str, float]
    facts: StepFacts


def load_steps(path: Path) -> list[StepRecord]:
    """Steps from a file, or from every `*.jsonl` file of a directory; sorted by step."""
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    spans: list[dict] = []
    logged: dict[int, dict[str, float]] = {}
    for file in files:
        for line in file.read_text().splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            if "resourceSpans" in record:
                spans.extend(_spans(record))
            elif "step" in record and isinstance(record.get("data"), dict):
                logged.setdefault(int(record["step"]), {}).update(record["data"])
    steps = _steps_from_spans(spans) + _steps_from_verl_log(logged)
    return sorted(steps, key=lambda s: s.number)


def _spans(request: dict) -> Iterator[dict]:
    for resource_spans in request["resourceSpans"]:
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                attributes = {}
                for attribute in span.get("attributes", []):
                    ((kind, value),) = attribute["value"].items()
                    attributes[attribute["key"]] = (
                        int(value)
                        if kind == "intValue"
                        else float(value)
                        if kind == "doubleValue"
                        else value
                    )
                yield {
                    "name": span["name"],
                    "trace": span["traceId"],
                    "id": span["spanId"],
                    "parent": span.get("parentSpanId", ""),
                    "start": int(span["startTimeUnixNano"]),
                    "seconds": (int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"]))
                    / 1e9,
                    "attributes": attributes,
                }


def _steps_from_spans(spans: list[dict]) -> list[StepRecord]:
    by_trace: dict[str, list[dict]] = defaultdict(list)
    for span in spans:
        by_trace[span["trace"]].append(span)
    steps = []
    for trace in by_trace.values():
        root = next((s for s in trace if s["name"] == "step" and not s["parent"]), None)
        if root is None:
            continue
        timing: dict[str, float] = {}
        for span in sorted(trace, key=lambda s: s["start"]):  # phases in the order they ran
            if span is not root and "rl.phase" in span["attributes"]:
                timing[span["name"]] = timing.get(span["name"], 0) + span["seconds"]
        timing["step"] = root["seconds"]
        attributes = root["attributes"]
        prompt = attributes.get("rl.tokens.prompt")
        response = attributes.get("rl.tokens.response")
        metrics = formulas.timing_metrics(timing, prompt, response)
        number = int(attributes.get("rl.step", -1))
        facts = StepFacts(
            number,
            timing,
            unaccounted=attributes.get("rl.unaccounted_s"),
            response_tokens=response,
            sequences=attributes.get("rl.sequences"),
            mfu={k[len("rl.mfu.") :]: v for k, v in attributes.items() if k.startswith("rl.mfu.")},
            agent_loop=_slowest_from_samples(trace),
        )
        steps.append(StepRecord(number, timing, metrics, facts))
    return steps


def _slowest_from_samples(trace: list[dict]) -> dict[str, float]:
    """The slowest exported sample's stages, as verl's agent_loop/slowest/* keys."""
    samples = [s for s in trace if s["name"] == "sample"]
    if not samples:
        return {}
    stages = ("generate_sequences", "tool_calls", "compute_score")

    def total(span: dict) -> float:
        return sum(span["attributes"].get(f"rl.sample.{stage}_s", 0.0) for stage in stages)

    slowest = max(samples, key=total)
    keys = {
        f"agent_loop/slowest/{stage}": slowest["attributes"].get(f"rl.sample.{stage}_s", 0.0)
        for stage in stages
    }
    if "gen_ai.usage.output_tokens" in slowest["attributes"]:
        keys["agent_loop/slowest/response_length"] = slowest["attributes"][
            "gen_ai.usage.output_tokens"
        ]
    return keys


def _steps_from_verl_log(logged: dict[int, dict[str, float]]) -> list[StepRecord]:
    steps = []
    for number, data in logged.items():
        timing = {
            key[len("timing_s/") :]: float(value)
            for key, value in data.items()
            if key.startswith("timing_s/") and "/" not in key[len("timing_s/") :]
        }
        if "step" not in timing:
            continue
        metrics = {k: float(v) for k, v in data.items() if isinstance(v, (int, float))}
        facts = StepFacts.from_metrics(number, timing, metrics)
        steps.append(StepRecord(number, timing, metrics, facts))
    return steps
