"""What users install is what is tested: `python -m build` makes the sdist and, from it, the
wheel; the wheel's metadata is what pyproject.toml declares; installed into a fresh venv, its
`rlotel stack DIR` writes the repository's top-level collector/ and dashboards/*.json (the
stack's one source, mapped into the wheel by setup.py), byte for byte, and promtool and
amtool accept them where they land. The real runs refuse an engine wheel older than the
tree (`tests.e2e.wheel_sources`)."""

from __future__ import annotations

import email
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from rlotel.cli import commands as cli
from rlotel.integrations.registered import HOOKS
from rlotel.integrations.verl import SINCE
from tests.e2e import wheel_sources

ROOT = Path(__file__).resolve().parents[1]
# In the wheel, the stack sits in the package; in the repository, at the top level.
PACKAGED = "rlotel/offline/stack/"


def repo_stack() -> dict[str, bytes]:
    """The repository's shipped files by path under the stack: collector/ but the discovery
    files a local stack writes into engines/ and workers/, dashboards/*.json but the builder
    beside them, the compose file and the runbooks (spelled out here, not taken from the code
    under test)."""
    collector = [
        path
        for path in (ROOT / "collector").rglob("*")
        if path.is_file()
        and not (path.parent.name in ("engines", "workers") and path.suffix == ".json")
    ]
    dashboards = list((ROOT / "dashboards").glob("*.json"))
    beside = [ROOT / "docker-compose.yml", ROOT / "docs" / "runbooks.md"]
    return {
        path.relative_to(ROOT).as_posix(): path.read_bytes()
        for path in sorted(collector + dashboards + beside)
    }


def outside(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A command run away from the checkout, so nothing imports this tree by accident."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        args, cwd=cwd, env=environ, capture_output=True, text=True, timeout=timeout
    )


def checkout(destination: Path) -> Path:
    """This tree's files as a fresh clone with its edits would hold them (tracked, and
    untracked but not ignored): no stale build state, such as an old
    rlotel.egg-info/SOURCES.txt that puts back files the config no longer ships."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # not one deleted but still in the index
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)
    return destination


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheel, sdist), built in an isolated environment from pyproject's build floor."""
    source = checkout(tmp_path_factory.mktemp("checkout"))
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "-q", "--outdir", str(out), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("rlotel-*.whl")
    (sdist,) = out.glob("rlotel-*.tar.gz")
    return wheel, sdist


@pytest.fixture(scope="module")
def installed(dists: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel and the dependencies it declares; its bin/."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", str(dists[0])],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return venv / "bin"


@pytest.mark.slow
def test_the_wheel_carries_the_declared_metadata_and_only_the_package(dists):
    wheel, _ = dists
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA")).rpartition("/")[0]
        metadata = email.message_from_bytes(archive.read(f"{info}/METADATA"))
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert metadata["License-Expression"] == "Apache-2.0"
    assert {name.split("/")[0] for name in names} == {"rlotel", info}
    stack = {name.removeprefix(PACKAGED) for name in names if name.startswith(PACKAGED)}
    assert stack == {"__init__.py", *repo_stack()}  # no builder, no discovery file
    assert "[verl.plugins]\nrlotel = rlotel.integrations.verl" in entry_points
    assert "rlotel = rlotel.cli.commands:main" in entry_points


@pytest.mark.slow
def test_the_installed_stack_command_writes_the_shipped_files(installed, tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = outside(
        str(installed / "python"), "-c", "import rlotel; print(rlotel.__file__)", cwd=work
    )
    assert Path(where.stdout.strip()).is_relative_to(installed.parent), where.stdout + where.stderr

    result = outside(str(installed / "rlotel"), "stack", "stack", cwd=work)
    assert result.returncode == 0, result.stdout + result.stderr
    out = work / "stack"
    written = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert written == repo_stack()
    for name in ("rl-step-breakdown.json", "rl-rollout-tail.json"):
        assert json.loads(written[f"dashboards/{name}"])["uid"].startswith("rlotel-")

    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is missing: `make system-deps` installs it"
    rules = outside(promtool, "check", "rules", "collector/rules/rlotel.rules.yml", cwd=out)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    config = outside(
        promtool, "check", "config", str(out / "collector" / "prometheus.yml"), cwd=work
    )
    assert config.returncode == 0, config.stdout + config.stderr
    assert "SUCCESS: 1 rule files found" in config.stdout  # rules/ resolved beside the config
    amtool = shutil.which("amtool")
    assert amtool is not None, "amtool is missing: `make system-deps` installs it"
    alerts = outside(amtool, "check-config", "collector/alertmanager.yml", cwd=out)
    assert alerts.returncode == 0, alerts.stdout + alerts.stderr


@pytest.mark.slow
def test_the_installed_doctor_says_plainly_what_is_missing(installed, tmp_path):
    """`pip install rlotel` and nothing else: `rlotel doctor` runs (every module it imports
    is a declared dependency: `packaging` was not, a ModuleNotFoundError) and says that verl,
    Ray and vLLM are not there, `ok: false`, exit 1 (it was green, exit 0, "these versions are
    the ones rlotel's tests run")."""
    table = outside(str(installed / "rlotel"), "doctor", cwd=tmp_path)
    assert table.returncode == 1 and "Traceback" not in table.stderr, table.stdout + table.stderr
    said = " ".join(table.stdout.split())
    hooks = sum(hook.library in ("verl", "ray", "vllm") for hook in HOOKS)
    assert f"not installed here: verl, ray, vllm ({hooks} of rlotel's hooks" in said, said
    assert "tests run" not in said and "every hook that applies attached" not in said
    result = outside(str(installed / "rlotel"), "doctor", "--json", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    facts = json.loads(result.stdout)
    assert facts["missing"] == ["verl", "ray", "vllm"] and not facts["ok"]
    assert facts["versions"] == dict.fromkeys(("verl", "ray", "vllm", "torch", "transferqueue"))
    assert {row["state"] for row in facts["hooks"]} == {"not_applicable"}


@pytest.mark.slow
def test_the_first_commands_from_the_wheel_need_nothing_more(installed, tmp_path):
    """`pip install rlotel`, then what a Python user types first: `--version`, `python -m
    rlotel --help` (every command), and `rlotel demo` without torch: one line naming the
    install, exit 2, no traceback, no `metrics at` URL (it printed one, then a traceback)."""
    version = outside(str(installed / "rlotel"), "--version", cwd=tmp_path)
    assert (version.returncode, version.stdout) == (0, "rlotel 0.1.0\n"), version.stderr
    usage = outside(str(installed / "python"), "-m", "rlotel", "--help", cwd=tmp_path)
    assert usage.returncode == 0, usage.stderr
    listed = usage.stdout.split("\ncommands:\n", 1)[1]
    for name in ("demo", "analyze", "replay", "report", "perfetto", "compare", "stack", "hangs"):
        assert f"\n    {name} " in listed, name
    assert "\n    doctor " in listed
    demo = outside(str(installed / "rlotel"), "demo", "--port", "0", cwd=tmp_path)
    assert demo.returncode == 2 and demo.stdout == "", demo.stdout + demo.stderr
    assert demo.stderr == (
        "rlotel demo: needs torch, not installed here: pip install 'rlotel[demo]' "
        "--extra-index-url https://download.pytorch.org/whl/cpu\n"
    )
    assert not (tmp_path / "runs").exists()


def test_the_published_extras_fit_a_users_environment():
    """`rlotel[verl]` takes any verl from the plugin's floor on (it pinned 0.9.1 and would
    downgrade a newer verl); what only development needs is in dependency groups, which the
    published metadata leaves out (`dev` was a public extra); `make` installs what exists."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    assert set(extras) == {"demo", "torch", "nvtx", "ray", "verl", "instrument"}
    assert extras["verl"] == [f"verl>={SINCE['verl']}"]
    assert extras["demo"] == ["torch>=2.1"]
    pinned = [r for rs in extras.values() for r in rs if "==" in r or "<" in r]
    assert pinned == []  # no ceiling a user's newer release would be downgraded to
    groups = project["dependency-groups"]
    makefile = (ROOT / "Makefile").read_text()
    (named_extras,) = re.findall(r"^EXTRAS := (.*)$", makefile, re.M)
    (named_groups,) = re.findall(r"^GROUPS := (.*)$", makefile, re.M)
    assert set(named_extras.split(",")) <= set(extras)
    assert set(re.findall(r"--group (\S+)", named_groups)) == set(groups)
    assert "'.[nvtx]' --group dev" in makefile  # the engine venv's rlotel
    assert "verl==0.9.1" in groups["fidelity"]  # the tests still run the tested verl


@pytest.mark.slow
def test_the_wheel_publishes_no_development_extra(dists):
    with zipfile.ZipFile(dists[0]) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_bytes(archive.read(name))
    assert set(metadata.get_all("Provides-Extra")) == {
        "demo", "torch", "nvtx", "ray", "verl", "instrument"
    }  # fmt: skip
    requires = metadata.get_all("Requires-Dist")
    assert f'verl>={SINCE["verl"]}; extra == "verl"' in requires
    specifiers = [requirement.partition(";")[0] for requirement in requires]
    assert not [r for r in specifiers if "pytest" in r or "==" in r or "<" in r]


def test_stack_refuses_to_replace_files_unless_forced(tmp_path, capsys):
    assert cli.main(["stack", str(tmp_path)]) == 0
    prometheus = tmp_path / "collector" / "prometheus.yml"
    prometheus.write_text("# edited\n")
    assert cli.main(["stack", str(tmp_path)]) == 1
    assert prometheus.read_text() == "# edited\n"
    assert "--force" in capsys.readouterr().err
    assert cli.main(["stack", "--force", str(tmp_path)]) == 0
    assert prometheus.read_bytes() == (ROOT / "collector" / "prometheus.yml").read_bytes()
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert written == set(repo_stack())  # the editable install reads the checkout's stack


def test_the_real_runs_refuse_a_wheel_older_than_the_tree(tmp_path):
    """The record `make engine-venv` writes holds while the tree is unchanged; an edit to the
    package or its stack makes it stale, naming the file and `make engine-venv`; files the
    wheel does not carry (the dashboards' builder, discovery files, caches) do not."""
    shutil.copytree(ROOT / "rlotel" / "offline" / "stack", tmp_path / "rlotel/offline/stack")
    files = {
        "pyproject.toml": "[project]\n",
        "setup.py": "",
        "README.md": "# r\n",
        "rlotel/base/ids.py": "A = 1\n",
        "collector/prometheus.yml": "global: {}\n",
        "dashboards/board.json": "{}",
        "dashboards/build.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    record = tmp_path / "record.sha256"
    assert "run `make engine-venv`" in wheel_sources.stale(tmp_path, record)  # none yet
    record.write_text(wheel_sources.render(wheel_sources.digests(tmp_path)))
    assert wheel_sources.stale(tmp_path, record) is None

    (tmp_path / "dashboards/build.py").write_text("# edited\n")
    (tmp_path / "collector/workers").mkdir()
    (tmp_path / "collector/workers/rlotel-1.json").write_text("[]")
    (tmp_path / "rlotel/base/__pycache__").mkdir()
    (tmp_path / "rlotel/base/__pycache__/ids.cpython-311.pyc").write_bytes(b"\0")
    assert wheel_sources.stale(tmp_path, record) is None

    for name in ("rlotel/base/ids.py", "collector/prometheus.yml", "dashboards/board.json"):
        before = (tmp_path / name).read_text()
        (tmp_path / name).write_text(before + " ")
        stale = wheel_sources.stale(tmp_path, record)
        assert stale is not None and name in stale and "run `make engine-venv`" in stale
        (tmp_path / name).write_text(before)
    (tmp_path / "rlotel/base/new.py").write_text("")
    assert "rlotel/base/new.py" in wheel_sources.stale(tmp_path, record)
