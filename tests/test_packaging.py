"""What users install is what is tested: `python -m build` makes the sdist and, from it, the
wheel; the wheel's metadata is what pyproject.toml declares; installed into a fresh venv, its
`rlotel stack DIR` writes the repository's dashboards, rules and configs, byte for byte,
and promtool and amtool accept them where they land."""

from __future__ import annotations

import email
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rlotel.cli import commands as cli

ROOT = Path(__file__).resolve().parents[1]
STACK = ROOT / "rlotel" / "offline" / "stack"


def repo_stack() -> dict[str, bytes]:
    """The repository's shipped files by path under the stack (discovery files a local
    stack writes into engines/ and workers/ are not shipped)."""
    return {
        path.relative_to(STACK).as_posix(): path.read_bytes()
        for part in ("collector", "dashboards")
        for path in sorted((STACK / part).rglob("*"))
        if path.is_file()
        and not (path.parent.name in ("engines", "workers") and path.suffix == ".json")
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


def test_stack_refuses_to_replace_files_unless_forced(tmp_path, capsys):
    assert cli.main(["stack", str(tmp_path)]) == 0
    prometheus = tmp_path / "collector" / "prometheus.yml"
    prometheus.write_text("# edited\n")
    assert cli.main(["stack", str(tmp_path)]) == 1
    assert prometheus.read_text() == "# edited\n"
    assert "--force" in capsys.readouterr().err
    assert cli.main(["stack", "--force", str(tmp_path)]) == 0
    assert prometheus.read_bytes() == (STACK / "collector" / "prometheus.yml").read_bytes()
