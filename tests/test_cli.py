"""The command line a Python user expects: `--version`, `python -m rlotel`, every command
listed from the parser, each option's default in its help; a command whose optional
dependency is missing says in one line what to install and exits 2 (no traceback, no URL
printed for a server that is about to die); the demo offers to keep `/metrics` up after
training, and serves until Ctrl-C with `--serve`. The same journey from the wheel in a bare
venv: tests/test_packaging.py."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys

import pytest

import rlotel
from rlotel.cli import commands as cli
from tests.helpers import scrape
from tests.test_config import free_port
from tests.test_demo import interrupted, wait_for_line, wait_for_url

COMMANDS = {
    "demo", "analyze", "replay", "report", "perfetto", "compare", "stack", "hangs", "doctor"
}  # fmt: skip
CPU_DEMO = "pip install 'rlotel[demo]' --extra-index-url https://download.pytorch.org/whl/cpu"


def subcommands() -> dict[str, str]:
    """Each command the parser has, with its one-line help."""
    (group,) = (action for action in cli.parser()._actions if action.dest == "command")
    helps = {choice.dest: choice.help for choice in group._choices_actions}
    return {name: helps.get(name, "") for name in group.choices}


def test_version_is_the_installed_distributions(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"rlotel {importlib.metadata.version('rlotel')}\n"
    assert rlotel.__version__ == importlib.metadata.version("rlotel")


def test_help_lists_every_command_from_the_parser(capsys):
    """`doctor`, the ninth, was missing from the hand-written list in the description."""
    assert set(subcommands()) == COMMANDS
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    listed = text.split("\ncommands:\n", 1)[1]
    for name, help_line in subcommands().items():
        first_words = " ".join(help_line.split()[:3])
        assert first_words, f"{name} has no one-line help"
        assert re.search(rf"^\s+{name}\s+{re.escape(first_words)}", listed, re.M), name
    description = " ".join(cli.parser().description.split())
    assert not [name for name in COMMANDS if re.search(rf"\b{name}\b", description)]


def test_every_option_shows_its_default(capsys):
    helps = {}
    for name in COMMANDS:
        with pytest.raises(SystemExit):
            cli.main([name, "--help"])
        helps[name] = " ".join(capsys.readouterr().out.split())
    assert "--steps STEPS training steps (default: 60)" in helps["demo"]
    assert "(default: runs)" in helps["demo"] and "(default: 4.48e+11)" in helps["demo"]
    assert "bootstrap resamples (default: 2000)" in helps["compare"]
    assert "(default: 0)" in helps["analyze"]
    for name, text in helps.items():  # a default that says nothing is left out
        for empty in ("None", "False", "[]", "()"):
            assert f"(default: {empty})" not in text, name
        assert text.count("(default: 2000)") <= 1
    assert "$OTEL_EXPORTER_PROMETHEUS_PORT, else 9464" in helps["demo"]


def test_python_dash_m_rlotel_is_the_command_line():
    for module in ("rlotel", "rlotel.cli"):
        result = subprocess.run(
            [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("usage: rlotel ") and "doctor" in result.stdout


@pytest.mark.parametrize(
    ("argv", "missing", "says"),
    [
        (["demo"], "torch", f"rlotel demo: needs torch, not installed here: {CPU_DEMO}"),
        (
            ["demo", "--ray"],
            "ray",
            "rlotel demo --ray: needs ray, not installed here: pip install 'rlotel[ray]'",
        ),
    ],
)
def test_the_demo_without_its_dependency_says_what_to_install(
    argv, missing, says, monkeypatch, tmp_path, capsys
):
    """It printed `metrics at http://...`, then a ModuleNotFoundError traceback."""
    monkeypatch.setitem(sys.modules, missing, None)  # as if not installed: import raises
    code = cli.main([*argv, "--steps", "1", "--port", "0", "--runs-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.splitlines() == [says]
    assert "metrics at" not in out and not any(tmp_path.rglob("*"))


@pytest.mark.parametrize(
    ("module", "install"),
    [
        ("torch", CPU_DEMO),
        ("ray.util", "pip install 'rlotel[ray]'"),
        ("nvtx", "pip install 'rlotel[nvtx]'"),
    ],
)
def test_any_command_that_reaches_a_missing_extra_says_what_to_install(
    module, install, monkeypatch, tmp_path, capsys
):
    def needs(args):
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)

    monkeypatch.setattr(cli, "_stack", needs)
    assert cli.main(["stack", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"rlotel stack: needs {module.split('.')[0]}, not installed here: ")
    assert line.endswith(install)


def test_a_missing_module_that_is_no_extra_is_a_bug_and_raises(monkeypatch, tmp_path):
    def broken(args):
        raise ModuleNotFoundError("No module named 'rlotel.gone'", name="rlotel.gone")

    monkeypatch.setattr(cli, "_stack", broken)
    with pytest.raises(ModuleNotFoundError):
        cli.main(["stack", str(tmp_path)])


def test_serving_for_seconds_and_until_ctrl_c_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--serve", "--serve-seconds", "5"])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.slow
def test_the_demo_offers_serving_and_serves_until_ctrl_c_where_the_variable_says(tmp_path):
    """The URL line says how long /metrics stays up and how to keep it; `--serve` keeps it
    until Ctrl-C (exit 0); no --port: OTEL_EXPORTER_PROMETHEUS_PORT places it, as
    `rlotel.init`."""
    port = free_port()
    command = [sys.executable, "-m", "rlotel", "demo", "--steps", "1", "--runs-dir", str(tmp_path)]
    env = {**os.environ, "OTEL_EXPORTER_PROMETHEUS_PORT": str(port), "COLUMNS": "80"}
    env["PYTHONFAULTHANDLER"] = "1"  # a hang after Ctrl-C shows its stacks
    env.pop("OTEL_EXPORTER_PROMETHEUS_HOST", None)
    plain = subprocess.run(
        [*command, "--port", "0"], capture_output=True, text=True, timeout=300, env=env
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    first = plain.stdout.splitlines()[0]  # one line, however narrow the terminal
    assert first.endswith("(while training; --serve-seconds N or --serve keeps it up after)")
    assert f":{port}/" not in first  # --port 0 given: an ephemeral port

    process = subprocess.Popen(
        [*command, "--serve"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        url = wait_for_url(process, timeout_s=120)
        assert url == f"http://127.0.0.1:{port}/metrics"
        assert wait_for_line(process, "serving until Ctrl-C").strip() == (
            f"metrics: {url} — serving until Ctrl-C"
        )
        assert 'rlotel_steps_total{run="demo"} 1.0' in scrape(url)  # still up after training
        code, lines, err = interrupted(process)
        assert code == 0, err
        assert lines[-1] == "stopped serving (Ctrl-C)" and "Traceback" not in err
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
