"""The hook registry: each hook attaches and is undone on its own, a verl that moved a target
loses that hook alone, and `rlotel doctor` says so, on verl 0.9.1 and on verl 0.9.0."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from rlotel.integrations import verl as plugin
from rlotel.integrations.hooks import Hook, Registry, State, Target
from rlotel.integrations.registered import HOOKS, REGISTRY, TIMER

ROOT = Path(__file__).resolve().parents[1]
ENGINE_PYTHON = ROOT / ".venv-engine" / "bin" / "python"
VERL_090 = ROOT / ".venv-engine" / "verl-0.9.0"  # `make test` installs it (Makefile)
VERL_TARGETS = [
    (hook.name, target)
    for hook in HOOKS
    if hook.library == "verl"
    for target in hook.targets
    if not target.optional
]


def wrapped(original: Any) -> Any:
    def replacement(*args: Any, **kwargs: Any) -> Any:
        return ("wrapped", original(*args, **kwargs))

    return replacement


def registry_over(module: types.ModuleType, *hooks: Hook, version: str = "1.0") -> Registry:
    sys.modules[module.__name__] = module
    return Registry(hooks, lambda library: version)


def test_detach_leaves_each_object_exactly_as_it_was() -> None:
    class Base:
        def inherited(self) -> str:
            return "base"

    class Child(Base):
        def own(self) -> str:
            return "own"

    module = types.ModuleType("rlotel_test_target")
    module.Child = Child  # type: ignore[attr-defined]
    here = f"{__name__}:wrapped"
    registry = registry_over(
        module,
        Hook("h", "lib", "test", (Target(module.__name__, "Child.own", here),)),
        Hook("g", "lib", "test", (Target(module.__name__, "Child.inherited", here),)),
    )
    own = vars(Child)["own"]
    try:
        registry.attach_on_import()
        assert Child().own() == ("wrapped", "own") and Child().inherited() == ("wrapped", "base")
        assert registry.original(Child, "own") is own
        registry.detach()
        assert vars(Child)["own"] is own
        assert "inherited" not in vars(Child)  # not shadowed by a copy of Base's
        assert registry.statuses()["h"].state != State.ATTACHED
    finally:
        del sys.modules[module.__name__]


def test_a_missing_target_loses_its_hook_alone_and_older_versions_are_not_applicable() -> None:
    class Thing:
        def there(self) -> str:
            return "there"

    module = types.ModuleType("rlotel_test_moved")
    module.Thing = Thing  # type: ignore[attr-defined]
    here = f"{__name__}:wrapped"
    registry = registry_over(
        module,
        Hook(
            "both",
            "lib",
            "test",
            (
                Target(module.__name__, "Thing.there", here),
                Target(module.__name__, "Thing.gone", here),
            ),
        ),
        Hook("new", "lib", "test", (Target(module.__name__, "Thing.later", here, since="2.0"),)),
        Hook("kept", "lib", "test", (Target(module.__name__, "Thing.there", here),)),
        Hook("spare", "lib", "test", (Target(module.__name__, "Thing.gone", here, optional=True),)),
    )
    try:
        registry.attach_on_import()
        states = registry.statuses()
        assert states["both"] == (State.NOT_ATTACHED, f"{module.__name__}.Thing.gone is missing")
        assert states["new"] == (
            State.NOT_APPLICABLE,
            f"{module.__name__}.Thing.later came with 2.0",
        )
        assert states["kept"].state == State.ATTACHED
        assert states["spare"].state != State.NOT_ATTACHED  # nothing there to lose
        assert Thing().there() == ("wrapped", "there")  # "kept"'s; "both" put its own back
    finally:
        registry.detach()
        del sys.modules[module.__name__]
    assert Thing().there() == "there"


def _verl_modules() -> None:
    for hook in HOOKS:
        if hook.library in ("verl", "ray"):
            for target in hook.targets:
                importlib.import_module(target.module)


@pytest.mark.slow  # a doctor's examination per target: ~1 s each
@pytest.mark.parametrize(
    "hook,target", VERL_TARGETS, ids=[f"{name}:{t.attribute}" for name, t in VERL_TARGETS]
)
def test_a_verl_without_one_target_keeps_every_other_hook(
    hook: str, target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl 0.9.1 with one registered target deleted (as a verl that moved it; a dunder's
    class, renamed, as a dunder is always there): the plugin installs without raising into
    verl, the hooks on what was deleted alone are not attached, and the doctor names them."""
    from rlotel.cli import doctor

    _verl_modules()
    owner: Any = sys.modules[target.module]
    *path, name = target.attribute.split(".")
    if name.startswith("__"):  # the class goes
        path, name = path[:-1], path[-1]
    for part in path:
        owner = getattr(owner, part)
    if target.actor and path:  # from the class Ray made to host verl's, and verl's
        from rlotel.integrations.hooks import actor_class

        hosted = actor_class(owner)
        for cls in (hosted, hosted.__mro__[1]):  # Ray's class copied verl's methods
            if name in vars(cls):
                monkeypatch.delattr(cls, name)
        still_there = hasattr(hosted, name)  # inherited: the hook wraps what verl inherits
    else:
        monkeypatch.delattr(owner, name)
        still_there = False
    deleted = ".".join((*path, name))
    lost = {
        h.name
        for h in HOOKS
        for t in h.targets
        if not t.optional
        and t.module == target.module
        and (t.attribute == deleted or t.attribute.startswith(deleted + "."))
    }
    assert hook in lost
    if still_there:
        lost = set()
    plugin.uninstall()
    try:
        rows = doctor.examine().rows
    finally:
        plugin.uninstall()
    states = {row.hook: row for row in rows}
    for name in lost:
        assert states[name].state == "not_attached", states[name]
        assert states[name].why.endswith(" is missing"), states[name]
    others = {n: row.state for n, row in states.items() if n not in lost and row.library == "verl"}
    assert set(others.values()) == {"attached"}, others


def test_a_verl_without_a_hooked_module_says_not_applicable(monkeypatch) -> None:
    """A module verl no longer has (V1 on verl's next data plane): its hooks are not
    applicable, every other hook attaches."""
    _verl_modules()
    monkeypatch.setitem(sys.modules, "verl.trainer.ppo.v1.replay_buffer", None)
    plugin.uninstall()
    plugin.install()
    try:
        states = REGISTRY.statuses()
    finally:
        plugin.uninstall()
    assert states["verl_v1_replay_batch"] == (
        State.NOT_APPLICABLE,
        "no module verl.trainer.ppo.v1.replay_buffer in this verl",
    )
    assert states["verl_timer"].state == State.ATTACHED


def doctor_json(*pythonpath: Path, args: tuple[str, ...] = ()) -> tuple[int, dict]:
    """`rlotel doctor --json` of this tree in the engine venv (verl, Ray, vLLM, torch)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (*pythonpath, ROOT))}
    result = subprocess.run(
        [str(ENGINE_PYTHON), "-m", "rlotel.cli", "doctor", "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=300,
    )
    return result.returncode, json.loads(result.stdout)


def _states(facts: dict) -> dict[str, tuple[str, str]]:
    return {row["hook"]: (row["state"], row["why"]) for row in facts["hooks"]}


@pytest.mark.slow
def test_doctor_on_verl_0_9_1_every_hook_attached(
    make_tel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every hook attached here; with a finished job's traces directory (two processes'
    files, written by their telemetry) it adds what fired, failed and did not attach there."""
    traces, mine = _a_run_of_two_processes(make_tel, monkeypatch, tmp_path)
    code, facts = doctor_json(args=("--traces", str(traces)))
    assert facts["versions"]["verl"] == "0.9.1" and facts["versions"]["vllm"].startswith("0.27")
    assert facts["untested"] == []
    states = _states(facts)
    assert states.keys() == {hook.name for hook in HOOKS}
    assert {state for state, _ in states.values()} == {"attached"}, states
    assert code == 0 and facts["ok"]
    mine_missing = {hook for hook, state in mine["states"].items() if state == "not_attached"}
    assert facts["run"] == {
        "events": {  # each process's own count, summed
            **mine["events"],
            "verl_timer": mine["events"]["verl_timer"] + 1,
            "verl_tracking": mine["events"].get("verl_tracking", 0) + 1,
        },
        # each process's own count, summed
        "failures": {**mine["failures"], "verl_tracking": mine["failures"]["verl_tracking"] + 1},
        "not_attached": {
            **dict.fromkeys(mine_missing, 1.0),
            "verl_memory_oom": 1.0 + ("verl_memory_oom" in mine_missing),
        },
    }


def _a_run_of_two_processes(
    make_tel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> tuple[Path, dict]:
    """A traces directory as two processes of a job leave it (this one's file as its
    telemetry wrote it, at shutdown; another's beside it), and this process's facts."""
    from rlotel.base.drops import HOOK_FAILURES
    from rlotel.base.hook_states import HOOK_EVENTS
    from rlotel.sinks.traces import hooks_file

    traces = tmp_path / "traces"
    monkeypatch.setenv("RLOTEL_TRACES_DIR", str(traces))
    tel = make_tel(run="doctor", prometheus_port=None)
    fired = HOOK_EVENTS.snapshot()[0].get("verl_timer", 0)  # the process's: every test's so far
    TIMER.fired()
    TIMER.fired()
    before = HOOK_FAILURES.snapshot().get("verl_tracking", 0)
    HOOK_FAILURES.add("verl_tracking")
    tel.shutdown()
    (path,) = traces.glob(f"*{hooks_file.SUFFIX}")
    mine = json.loads(path.read_text())
    assert mine["events"]["verl_timer"] == fired + 2
    assert mine["failures"]["verl_tracking"] == before + 1
    other = {
        "pid": 1,
        "states": {"verl_timer": "attached", "verl_memory_oom": "not_attached"},
        "events": {"verl_timer": 1, "verl_tracking": 1},
        "failures": {"verl_tracking": 1},
    }
    (traces / f"actor-0-1{hooks_file.SUFFIX}").write_text(json.dumps(other))
    return traces, mine


@pytest.mark.slow
def test_doctor_on_verl_0_9_0_every_hook_with_a_target_there_attached() -> None:
    assert (VERL_090 / "verl").is_dir(), "run `make test` (it installs verl 0.9.0 beside 0.9.1)"
    code, facts = doctor_json(VERL_090)
    assert facts["versions"]["verl"] == "0.9.0"
    assert facts["untested"] == ["verl 0.9.0 (>=0.9.1,<0.9.2)"]
    states = _states(facts)
    # verl 0.9.0's profiler has no finish-hook command and no OOM snapshot (both 0.9.1's)
    assert states.pop("verl_profile_finish_hook") == (
        "not_applicable",
        "verl.utils.profiler.profile.subprocess came with 0.9.1",
    )
    assert states.pop("verl_memory_oom") == (
        "not_applicable",
        "verl.utils.profiler.torch_memory_profile.TorchMemoryProfiler._on_out_of_memory came "
        "with 0.9.1",
    )
    assert {state for state, _ in states.values()} == {"attached"}, states
    assert code == 0 and facts["ok"]


def test_doctor_reads_which_hooks_fired_and_failed_from_a_live_metrics(make_tel) -> None:
    from rlotel.base.drops import HOOK_FAILURES
    from rlotel.base.hook_states import HOOK_EVENTS
    from rlotel.cli import doctor

    tel = make_tel(run="doctor", prometheus_port=0)
    fired = HOOK_EVENTS.snapshot()[0].get("verl_timer", 0)
    TIMER.fired()
    TIMER.fired()
    before = HOOK_FAILURES.snapshot().get("verl_tracking", 0)
    HOOK_FAILURES.add("verl_tracking")
    tel.flush()
    counts = doctor.run_counts(tel.metrics_url)
    assert counts["events"]["verl_timer"] == fired + 2
    assert counts["failures"]["verl_tracking"] == before + 1


def test_a_module_whose_package_does_not_import_is_said_so(tmp_path, monkeypatch) -> None:
    """A hooked module is missing, or present in a package that fails to import (verl's V1
    without TransferQueue): the reason says which, without importing the module itself."""
    from rlotel.integrations.hooks import absence

    package = tmp_path / "rlotel_test_broken"
    package.mkdir()
    (package / "__init__.py").write_text("import rlotel_test_not_installed\n")
    (package / "hooked.py").write_text("raise AssertionError('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert absence("json.decoder") is None
    assert absence("rlotel_test_absent.hooked") == "no module rlotel_test_absent.hooked"
    assert absence("json.rlotel_test_absent") == "no module json.rlotel_test_absent"
    assert absence("rlotel_test_broken.hooked") == (
        "module rlotel_test_broken.hooked: its package does not import "
        "(No module named 'rlotel_test_not_installed')"
    )


def test_a_verl_tree_on_the_path_is_known_by_its_own_version(tmp_path, monkeypatch) -> None:
    """A verl source tree ahead on PYTHONPATH (a build of verl's main) is what imports: its
    version is the tree's own (`verl/version/version`, which `verl.__version__` reads), not
    the installed distribution's."""
    from rlotel.integrations.registered import installed_version

    installed = installed_version("verl")
    tree = tmp_path / "verl"
    (tree / "version").mkdir(parents=True)
    (tree / "__init__.py").write_text("")
    (tree / "version" / "version").write_text("0.10.0.dev\n")
    for name in [m for m in sys.modules if m == "verl" or m.startswith("verl.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert installed == "0.9.1" and installed_version("verl") == "0.10.0.dev"
    assert installed_version("rlotel_test_not_installed") is None


def test_doctor_says_in_one_line_when_the_job_cannot_be_read(tmp_path, capsys) -> None:
    """A directory without hook files, or a /metrics nobody answers: one line, exit 2,
    before anything is imported."""
    from rlotel.cli import commands as cli

    assert cli.main(["doctor", "--traces", str(tmp_path)]) == 2
    assert cli.main(["doctor", "--metrics", "http://127.0.0.1:9/metrics"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "not a traces directory" in lines[0], lines
    assert "Connection refused" in lines[1], lines


def _owners() -> dict[tuple[int, str], tuple[Any, Any]]:
    """Every object a hook's target names here, and its attribute as its own `__dict__`
    holds it (absent: inherited), by (id of the owner, attribute)."""
    from rlotel.integrations.hooks import actor_class

    found: dict[tuple[int, str], tuple[Any, Any]] = {}
    for hook in HOOKS:
        for target in hook.targets:
            module = sys.modules.get(target.module)
            if module is None:
                continue
            *path, name = target.attribute.split(".")
            owner: Any = module
            try:
                for part in path:
                    owner = getattr(owner, part)
            except AttributeError:
                continue
            for each in (owner, actor_class(owner)) if target.actor else (owner,):
                found[(id(each), name)] = (each, vars(each).get(name, "absent"))
    return found


def test_uninstall_puts_back_every_patch_rlotel_made() -> None:
    """Every hook attached (the on-demand collectives too) and an actor class loaded through
    Ray while they are: after `uninstall()` each target, and each of the actor class's
    methods, is exactly the object it was."""
    import torch.distributed
    from ray._private import function_manager

    _verl_modules()
    importlib.import_module("torch.distributed.distributed_c10d")

    class Worker:
        def update_actor(self) -> str:
            return "verl's"

    plugin.uninstall()
    before, method = _owners(), vars(Worker)["update_actor"]
    plugin.install()
    try:
        assert REGISTRY.attach("torch_collective") and torch.distributed.all_reduce
        function_manager._inject_tracing_into_class(Worker)  # as Ray loads an actor's class
        patched = [key for key, (owner, value) in _owners().items() if before[key][1] != value]
        assert len(patched) >= len([t for h in HOOKS for t in h.targets]) // 2, patched
        rays = REGISTRY.original(Worker, "update_actor")  # Ray's own wrapper of verl's
        assert rays is not method and vars(Worker)["update_actor"] is not rays  # and rlotel's
    finally:
        plugin.uninstall()
    after = _owners()
    moved = [key for key in before if after[key][1] is not before[key][1]]
    assert not moved, [(before[k][0], k[1]) for k in moved]
    assert vars(Worker)["update_actor"] is rays
    assert Worker().update_actor() == "verl's"


def test_a_hook_travels_by_reference() -> None:
    """A wrapper that closes over its hook pickles (Ray sends some by value): the receiving
    process gets its own registered hook, not a copy."""
    import pickle

    assert all(pickle.loads(pickle.dumps(hook)) is hook for hook in HOOKS)


def test_every_hook_label_is_a_registered_hook_by_construction() -> None:
    """The `{hook}` label of the events and failures series is only ever written through a
    `Hook` (`hook.fired`, `hook.failed`, `hook.guarded`, ...): no module of rlotel calls the
    counters or the guard's fault points with a name of its own."""
    import ast

    import rlotel

    package = Path(rlotel.__file__).parent
    counted = {("guard", "fault"), ("guard", "failed"), ("HOOK_EVENTS", "fired")}
    callers = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if (name, node.func.attr) in counted:
                    callers.append(f"{path.relative_to(package)}:{node.lineno}")
    assert callers and all(c.startswith("integrations/hooks.py:") for c in callers), callers


def test_each_hooks_failure_line_stays_its_own_through_rays_log_deduplication(
    monkeypatch, caplog
) -> None:
    """Ray forwards each worker's lines to the driver's console and folds lines of different
    processes that match once their words with a digit are dropped, printing only the last
    (its log deduplication, on by default). The `verl_v1_*` names differ by such words alone:
    the agent-loop worker's turn and score lines were folded into the trainer's replay-batch
    line, `[repeated 3x across cluster]`. Every hook's line must stay its own under that rule."""
    import logging
    import re

    from rlotel.base import drops

    monkeypatch.setattr(drops, "HOOK_FAILURES", drops.HookFailures())  # nothing said yet
    with caplog.at_level(logging.WARNING, logger="rlotel"):
        for hook in HOOKS:
            hook.failed(RuntimeError("rlotel's part raised"))
    lines = [
        record.getMessage() for record in caplog.records if "hook failed" in record.getMessage()
    ]
    assert len(lines) == len(HOOKS)
    # Ray's rule: words containing a number (or hex) are not compared
    folded = {" ".join(w for w in line.split() if not re.search(r"\d", w)) for line in lines}
    assert len(folded) == len(HOOKS), sorted(folded)
