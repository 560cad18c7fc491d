"""`rlotel doctor`: which of rlotel's hooks work on the verl, Ray, vLLM and torch installed here.

It switches the verl plugin on in this process, imports every module a hook targets (as a
training job's processes would), and reads the registry: each hook attached, not attached
(why, and what telemetry is lost) or not applicable. With `--metrics URL` (a running job's
/metrics) it also says which hooks fired and which failed in that job. Exit 0 when every
hook the installed libraries need attached, 1 otherwise.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import sys
import urllib.request
from typing import Any, NamedTuple

EVENTS = "rlotel_integration_events_total"
FAILURES = "rlotel_integration_failures_total"


class Row(NamedTuple):
    hook: str
    library: str
    state: str
    why: str
    gives: str
    targets: list[str]


def examine() -> tuple[dict[str, str | None], list[Row], list[str]]:
    """(installed versions, a row per hook, the modules that failed to import)."""
    from rlotel.integrations import verl as plugin
    from rlotel.integrations.hooks import State
    from rlotel.integrations.registered import LIBRARIES, REGISTRY, installed_version

    versions = {library: installed_version(library) for library in LIBRARIES}
    plugin.install()
    failed_imports = []
    hooks = REGISTRY.hooks.values()
    modules = dict.fromkeys(
        t.module for h in hooks if versions.get(h.library) is not None for t in h.targets
    )
    for module in modules:
        if not _exists(module):
            continue
        try:
            importlib.import_module(module)
        except Exception as error:  # one broken module must not hide the others' state
            failed_imports.append(f"{module}: {error!r}")
    for hook in hooks:
        if hook.on_demand and versions.get(hook.library) is not None:
            REGISTRY.attach(hook.name)
    rows = []
    for hook in hooks:
        status = REGISTRY.status(hook.name)
        state, why = status.state.value, status.why
        broken = [
            f for f in failed_imports if any(f.startswith(t.module + ":") for t in hook.targets)
        ]
        if status.state == State.PENDING and broken:
            state, why = State.NOT_ATTACHED.value, f"its module failed to import ({broken[0]})"
        rows.append(
            Row(hook.name, hook.library, state, why, hook.gives, [t.where for t in hook.targets])
        )
    return versions, rows, failed_imports


def _exists(module: str) -> bool:
    from importlib.util import find_spec

    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def tested(versions: dict[str, str | None]) -> list[str]:
    """The installed libraries outside the versions rlotel's tests run (empty: all tested)."""
    from rlotel.integrations.verl import TESTED, versions_outside

    return versions_outside({k: v for k, v in TESTED.items() if versions.get(k)})


def run_counts(url: str) -> dict[str, dict[str, float]]:
    """`{"events": {hook: n}, "failures": {hook: n}}` from a live /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = io.TextIOWrapper(response, encoding="utf-8").read()
    counts: dict[str, dict[str, float]] = {"events": {}, "failures": {}}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            kind = {EVENTS: "events", FAILURES: "failures"}.get(sample.name)
            if kind is not None:
                hook = sample.labels.get("hook", "")
                counts[kind][hook] = counts[kind].get(hook, 0.0) + sample.value
    return counts


def report(metrics_urls: list[str]) -> dict[str, Any]:
    """Everything the command prints, as data (`--json`)."""
    logging.getLogger("rlotel").setLevel(logging.ERROR)  # the table says it, once
    with contextlib.redirect_stdout(sys.stderr):  # what the imported libraries print
        versions, rows, failed_imports = examine()
    facts: dict[str, Any] = {
        "versions": versions,
        "untested": tested(versions),
        "hooks": [row._asdict() for row in rows],
        "failed_imports": failed_imports,
    }
    if metrics_urls:
        events: dict[str, float] = {}
        failures: dict[str, float] = {}
        for url in metrics_urls:
            counts = run_counts(url)
            for hook, n in counts["events"].items():
                events[hook] = events.get(hook, 0.0) + n
            for hook, n in counts["failures"].items():
                failures[hook] = failures.get(hook, 0.0) + n
        facts["run"] = {"events": events, "failures": failures}
    facts["ok"] = all(row.state != "not_attached" for row in rows)
    return facts
