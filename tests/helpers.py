"""Helpers the tests import: span, exposition and OTLP/JSON readers, a recording NVTX backend.

Fixtures live in conftest.py (pytest finds them there); plain functions and classes live here,
so tests import them from `tests.helpers`, never from `tests.conftest`.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import threading
import urllib.request
from collections.abc import Iterator

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import rlotel


class RecordingNvtx:
    """NVTX backend that remembers every push and pop, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str | None, str | None]] = []
        self.depth = 0

    def push(self, name: str, color: str | None) -> None:
        self.events.append(("push", name, color))
        self.depth += 1

    def pop(self) -> None:
        self.events.append(("pop", None, None))
        self.depth -= 1

    @property
    def pushed(self) -> list[str]:
        return [name for kind, name, _ in self.events if kind == "push"]


def finished_spans(tel: rlotel.Telemetry, exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    assert tel.flush(10)
    return list(exporter.get_finished_spans())


def scrape(url: str, accept: str | None = None) -> str:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


def parse_exposition(text: str) -> dict[tuple[str, frozenset], float]:
    """Samples of a classic text exposition by (name, labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


HEX = re.compile(r"^[0-9a-f]+$")


def _attributes(item: dict) -> dict:
    """OTLP/JSON key-value list → plain dict (intValue strings as ints)."""
    attrs = {}
    for a in item.get("attributes", []):
        ((kind, value),) = a["value"].items()
        attrs[a["key"]] = int(value) if kind == "intValue" else value
    return attrs


def file_spans(path, run: str | None = None) -> list[dict]:
    """Spans of an OTLP/JSON lines file as flat dicts, checking the encoding rules."""
    spans = []
    for line in path.read_text().splitlines():
        request = json.loads(line)  # one ExportTraceServiceRequest per line
        for resource_spans in request["resourceSpans"]:
            resource = {a["key"]: a["value"] for a in resource_spans["resource"]["attributes"]}
            if run is not None:
                assert resource["rl.run"] == {"stringValue": run}
            for scope_spans in resource_spans["scopeSpans"]:
                for span in scope_spans["spans"]:
                    assert len(span["traceId"]) == 32 and HEX.match(span["traceId"])
                    assert len(span["spanId"]) == 16 and HEX.match(span["spanId"])
                    assert isinstance(span["kind"], int)
                    attrs = _attributes(span)
                    spans.append(
                        {
                            "name": span["name"],
                            "trace": span["traceId"],
                            "id": span["spanId"],
                            "parent": span.get("parentSpanId", ""),
                            "start": int(span["startTimeUnixNano"]),
                            "end": int(span["endTimeUnixNano"]),
                            "attrs": attrs,
                            "status": span.get("status", {}).get("code", 0),
                            "links": [
                                (link["traceId"], link["spanId"], _attributes(link))
                                for link in span.get("links", [])
                            ],
                            "events": [
                                (event["name"], _attributes(event))
                                for event in span.get("events", [])
                            ],
                        }
                    )
    return spans


def serve_engine(engine: str) -> tuple[object, threading.Event, int]:
    """A stand-in engine `/metrics` serving the allowed metrics of one engine in the engine's
    own shapes (prometheus_client, as vLLM and SGLang use), changing every 0.2 s; returns
    the server, the event that stops the feeding, and the port."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

    from rlotel.schema.engine_metrics import ENGINE_METRICS
    from tests.promserver import free_port

    registry = CollectorRegistry()
    kinds = {
        "counter": (Counter, "inc"),
        "gauge": (Gauge, "set"),
        "histogram": (Histogram, "observe"),
    }
    updates = [
        getattr(
            kinds[m.kind][0](m.name, m.help, ["model_name"], registry=registry).labels("tiny"),
            kinds[m.kind][1],
        )
        for m in ENGINE_METRICS
        if m.engine == engine
    ]
    port = free_port()
    server, _ = start_http_server(port, "127.0.0.1", registry=registry)
    stop = threading.Event()

    def feed() -> None:
        while not stop.wait(0.2):
            for update in updates:
                update(0.5)

    threading.Thread(target=feed, daemon=True).start()
    return server, stop, port


def attach_hooks(*names: str) -> None:
    """The named hooks of the registry attached in this process (their modules imported)."""
    from rlotel.integrations.registered import REGISTRY

    for name in names:
        for target in REGISTRY.hooks[name].targets:
            if not target.optional:
                importlib.import_module(target.module)
        assert REGISTRY.attach(name), REGISTRY.status(name)


def detach_hooks(*names: str) -> None:
    """The named hooks undone; every other hook stays as it was."""
    from rlotel.integrations.registered import REGISTRY

    for name in names:
        REGISTRY.detach_hook(name)


@contextlib.contextmanager
def hooks_attached(*names: str) -> Iterator[None]:
    try:
        attach_hooks(*names)
        yield
    finally:
        detach_hooks(*names)


def span_rows(data: dict, step: int | str) -> list[dict]:
    """A report's waterfall rows of `step`, each by the field names the page reads."""
    columns = data["span_columns"]
    return [dict(zip(columns, row, strict=True)) for row in data["trees"][str(step)]["rows"]]
