"""`rlotel doctor`: which of rlotel's hooks work on the verl, Ray, vLLM and torch installed here.

It switches the verl plugin on in this process, imports every module a hook targets (as a
training job's processes would), and reads the registry: each hook attached, not attached
(why, and what telemetry is lost) or not applicable. With `--metrics URL` (a running job's
/metrics) or `--traces DIR` (a job's traces directory, after it ended) it also says which
hooks fired, which failed and which did not attach in that job's processes. It compares
every version it names with the ones rlotel's tests run. Exit 0 when verl, Ray and vLLM are
here, the plugin attached and every hook the installed libraries need attached; 1 otherwise,
each reason said in plain words (`problems` in `--json`).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import sys
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

from rlotel.schema import catalogue as cat

# what each of the run's series counts, by family
KINDS = {cat.INTEGRATION_EVENTS.name: "events", cat.INTEGRATION_FAILURES.name: "failures"}
# Without these rlotel has nothing to trace a verl job by: the trainer, its actors, its rollout.
NEEDED = ("verl", "ray", "vllm")
# how the table shows each state (every `State`; one it does not know shows plain)
STYLES = {
    "attached": "green",
    "not_attached": "red",
    "not_applicable": "dim",
    "pending": "yellow",
}


class Row(NamedTuple):
    hook: str
    library: str
    state: str
    why: str
    gives: str
    targets: list[str]


class Examined(NamedTuple):
    versions: dict[str, str | None]  # as installed_version reads them; None: not installed
    rows: list[Row]
    failed_imports: list[str]  # "module: error" of each hooked module that did not import
    refused: str | None  # why the verl plugin stepped aside: "it needs verl >= 0.9.0 (...)"


def examine() -> Examined:
    """The installed versions, a row per hook, the modules that failed to import and why
    the plugin refused (None: it did not)."""
    from rlotel.integrations import verl as plugin
    from rlotel.integrations.hooks import State, absence
    from rlotel.integrations.registered import LIBRARIES, REGISTRY, installed_version

    versions = {library: installed_version(library) for library in LIBRARIES}
    # a library that imports though its version cannot be read is examined as any other
    here = {
        library
        for library, version in versions.items()
        if version is not None or plugin.unreadable(library) is not None
    }
    refused = None
    try:
        plugin.install()
    except Exception as error:  # said, as the plugin's own guard logs it in a job
        refused = f"its install raised {error!r}"
    if refused is None and not plugin.patched():
        too_old = plugin.too_old_for(plugin.SINCE)
        refused = f"it needs {', '.join(too_old)}" if too_old else "it attached nothing"
    failed_imports = []
    hooks = REGISTRY.hooks.values()
    modules = dict.fromkeys(t.module for h in hooks if h.library in here for t in h.targets)
    for module in modules:
        if absence(module) is not None:
            continue
        try:
            importlib.import_module(module)
        except Exception as error:  # one broken module must not hide the others' state
            failed_imports.append(f"{module}: {error!r}")
    for hook in hooks:
        if hook.on_demand and hook.library in here and refused is None:
            REGISTRY.attach(hook.name)
    rows = []
    for hook in hooks:
        status = REGISTRY.status(hook.name)
        state, why = status.state.value, status.why
        broken = [
            f for f in failed_imports if any(f.startswith(t.module + ":") for t in hook.targets)
        ]
        if status.state == State.PENDING and refused is not None:
            state, why = State.NOT_ATTACHED.value, f"the verl plugin refused: {refused}"
        elif status.state == State.PENDING and broken:
            state, why = State.NOT_ATTACHED.value, f"its module failed to import ({broken[0]})"
        rows.append(
            Row(hook.name, hook.library, state, why, hook.gives, [t.where for t in hook.targets])
        )
    return Examined(versions, rows, failed_imports, refused)


def tested() -> list[str]:
    """The libraries here outside the versions rlotel's tests run, or whose version cannot
    be read (empty: all tested)."""
    from rlotel.integrations.verl import TESTED, versions_outside

    return versions_outside(TESTED)


def problems(facts: dict[str, Any]) -> list[str]:
    """Each reason the doctor cannot say rlotel works here, in plain words (none: ok)."""
    said = []
    hooks_of = Counter(row["library"] for row in facts["hooks"])
    if missing := facts["missing"]:
        said.append(
            f"not installed here: {', '.join(missing)} ("
            f"{sum(hooks_of[library] for library in missing)} of rlotel's hooks have nothing "
            "to attach to; run `rlotel doctor` where the training job runs)"
        )
    if facts["refused"] is not None:
        said.append(
            f"the verl plugin refused: {facts['refused']}; nothing attached, training runs "
            "without rlotel"
        )
    elif not_attached := [row["hook"] for row in facts["hooks"] if row["state"] == "not_attached"]:
        said.append(f"not attached: {', '.join(not_attached)}")
    if pending := [row["hook"] for row in facts["hooks"] if row["state"] == "pending"]:
        said.append(
            f"pending, neither attached nor reported once what they hook was imported: "
            f"{', '.join(pending)}"
        )
    return said


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
    from rlotel.integrations import verl as plugin

    sources = [run_counts(url) for url in metrics_urls]
    sources += [traces_counts(directory) for directory in traces_dirs]
    logger = logging.getLogger("rlotel")
    level = logger.level
    logger.setLevel(logging.ERROR)  # the table says it, once
    try:
        with contextlib.redirect_stdout(sys.stderr):  # what the imported libraries print
            examined = examine()
    finally:
        logger.setLevel(level)  # as it was for the rest of the process (a test's)
    versions = examined.versions
    facts: dict[str, Any] = {
        "versions": versions,
        # installed, its version unreadable: what stands for it ("(none)": no version at all)
        "unreadable": {
            name: text for name in versions if (text := plugin.unreadable(name)) is not None
        },
        "untested": tested(),
        "refused": examined.refused,
        "hooks": [row._asdict() for row in examined.rows],
        "failed_imports": examined.failed_imports,
    }
    facts["missing"] = [  # the libraries rlotel traces a verl job by that are not here
        name for name in NEEDED if versions[name] is None and name not in facts["unreadable"]
    ]
    if sources:
        run = _counts()
        for counts in sources:
            for kind, by_hook in counts.items():
                run[kind].update(by_hook)
        facts["run"] = run
    facts["problems"] = problems(facts)
    facts["ok"] = not facts["problems"]
    return facts


def main(metrics_urls: list[str], traces_dirs: list[str], as_json: bool) -> int:
    """The command: the facts as a table (or JSON); 0 when ok, 1 otherwise, 2 when the job
    named cannot be read."""
    from rich.console import Console

    import rlotel

    console, errors = Console(), Console(stderr=True, soft_wrap=True)
    try:
        facts = report(metrics_urls, traces_dirs)
    except OSError as error:  # an unreachable /metrics, a directory without hook files
        errors.print(f"rlotel: {error}", style="red", markup=False)
        return 2
    if as_json:
        print(json.dumps(facts, indent=2))
        return 0 if facts["ok"] else 1
    for line in lines(facts, rlotel.__version__):
        console.print(line)
    return 0 if facts["ok"] else 1


def lines(facts: dict[str, Any], version: str) -> list[Any]:
    """What the command prints, in order: rich renderables, none read as markup (a state,
    a reason or a module's error prints as it is, brackets included)."""
    from rich.table import Table
    from rich.text import Text

    def named(name: str, found: str | None) -> str:
        if name in facts["unreadable"]:
            return f"{name} {facts['unreadable'][name]} (a version it cannot read)"
        return f"{name} {found or 'not installed'}"

    said: list[Any] = [
        Text(f"rlotel {version}; " + ", ".join(named(k, v) for k, v in facts["versions"].items()))
    ]
    if facts["untested"]:
        said.append(
            Text(
                f"not tested with {', '.join(facts['untested'])}: each hook attaches where its "
                "target is there (the table says which)",
                style="yellow",
            )
        )
    elif here := [k for k, v in facts["versions"].items() if v is not None]:
        said.append(Text(f"{', '.join(here)}: the versions rlotel's tests run"))
    run = facts.get("run")
    table = Table(title="rlotel's hooks")
    for column in (
        "hook",
        "library",
        "state",
        "why / what is lost",
        *(("fired", "failed", "not attached in") if run else ()),
    ):
        table.add_column(column)
    for row in facts["hooks"]:
        state = row["state"]
        why = (
            row["why"]
            if state == "not_applicable"
            else f"{row['why']}; lost: {row['gives']}"
            if state in ("not_attached", "pending")
            else row["gives"]
        )
        cells = [Text(row["hook"]), Text(row["library"]), Text(state, STYLES.get(state, ""))]
        cells.append(Text(why))
        if run:
            cells += [
                Text(f"{run['events'].get(row['hook'], 0):g}"),
                Text(f"{run['failures'].get(row['hook'], 0):g}"),
                Text(f"{n:g} processes" if (n := run["not_attached"].get(row["hook"])) else ""),
            ]
        table.add_row(*cells)
    said.append(table)
    said += [Text(f"module failed to import: {f}", style="yellow") for f in facts["failed_imports"]]
    said += [Text(problem, style="red") for problem in facts["problems"]]
    if not facts["problems"]:
        said.append(Text("every hook that applies attached"))
    return said
