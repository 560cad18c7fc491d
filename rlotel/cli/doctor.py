"""`rlotel doctor`: which of rlotel's hooks work on the verl, Ray, vLLM and torch installed here.

It switches the verl plugin on in this process, imports every module a hook targets (as a
training job's processes would), and reads the registry: each hook attached, not attached
(why, and what telemetry is lost) or not applicable. With `--metrics URL` (a running job's
/metrics) or `--traces DIR` (a job's traces directory, after it ended) it also says which
hooks fired, which failed and which did not attach in that job's processes. Exit 0 when every
hook the installed libraries need attached, 1 otherwise.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import sys
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

from rlotel.schema import catalogue as cat

# what each of the run's series counts, by family
KINDS = {cat.INTEGRATION_EVENTS.name: "events", cat.INTEGRATION_FAILURES.name: "failures"}


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
    from rlotel.integrations.hooks import State, absence
    from rlotel.integrations.registered import LIBRARIES, REGISTRY, installed_version

    versions = {library: installed_version(library) for library in LIBRARIES}
    plugin.install()
    failed_imports = []
    hooks = REGISTRY.hooks.values()
    modules = dict.fromkeys(
        t.module for h in hooks if versions.get(h.library) is not None for t in h.targets
    )
    for module in modules:
        if absence(module) is not None:
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


def tested(versions: dict[str, str | None]) -> list[str]:
    """The installed libraries outside the versions rlotel's tests run (empty: all tested)."""
    from rlotel.integrations.verl import TESTED, versions_outside

    return versions_outside({k: v for k, v in TESTED.items() if versions.get(k)})


def run_counts(url: str) -> dict[str, Counter]:
    """`{"events": {hook: n}, "failures": {hook: n}, "not_attached": {hook: processes}}`
    from a live /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = io.TextIOWrapper(response, encoding="utf-8").read()
    counts = _counts()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            hook, kind = sample.labels.get("hook", ""), KINDS.get(family.name)
            if kind is not None and not sample.name.endswith("_total"):
                continue  # a counter's `_created`
            if family.name == cat.INTEGRATION_HOOKS.name:
                kind = "not_attached" if sample.labels.get("state") == "not_attached" else None
            if kind is not None:
                counts[kind][hook] += sample.value
    return counts


def traces_counts(directory: str) -> dict[str, Counter]:
    """The same counts from the `*.hooks.json` every process of a run leaves in its traces
    directory (`RLOTEL_TRACES_DIR`): what fired and failed after the run has ended."""
    from rlotel.sinks.traces import hooks_file

    processes = hooks_file.read(Path(directory))
    if not processes:
        raise FileNotFoundError(f"no *{hooks_file.SUFFIX} in {directory}: not a traces directory")
    counts = _counts()
    for process in processes:
        counts["events"].update(process.get("events", {}))
        counts["failures"].update(process.get("failures", {}))
        states = process.get("states", {}).items()
        counts["not_attached"].update(hook for hook, state in states if state == "not_attached")
    return counts


def _counts() -> dict[str, Counter]:
    return {"events": Counter(), "failures": Counter(), "not_attached": Counter()}


def report(metrics_urls: list[str], traces_dirs: list[str] = ()) -> dict[str, Any]:
    """Everything the command prints, as data (`--json`). The job's counts are read first:
    an unreachable /metrics or a directory without hook files raises (OSError) before
    anything is imported."""
    sources = [run_counts(url) for url in metrics_urls]
    sources += [traces_counts(directory) for directory in traces_dirs]
    logging.getLogger("rlotel").setLevel(logging.ERROR)  # the table says it, once
    with contextlib.redirect_stdout(sys.stderr):  # what the imported libraries print
        versions, rows, failed_imports = examine()
    facts: dict[str, Any] = {
        "versions": versions,
        "untested": tested(versions),
        "hooks": [row._asdict() for row in rows],
        "failed_imports": failed_imports,
    }
    if sources:
        run = _counts()
        for counts in sources:
            for kind, by_hook in counts.items():
                run[kind].update(by_hook)
        facts["run"] = run
    facts["ok"] = all(row.state != "not_attached" for row in rows)
    return facts
