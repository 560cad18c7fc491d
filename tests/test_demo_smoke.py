"""`rlotel demo` runs end to end on CPU and writes a traces file with every phase."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
from rlotel import cli

VERL_PHASES = {"gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"}


def test_demo_runs_and_exports(tmp_path, capsys):
    code = cli.main(["demo", "--steps", "3", "--port", "0", "--runs-dir", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "Step ledger over 3 steps" in out
    names = set()
    for line in (tmp_path / "demo" / "traces.jsonl").read_text().splitlines():
        for resource_spans in json.loads(line)["resourceSpans"]:
            for scope_spans in resource_spans["scopeSpans"]:
                names.update(span["name"] for span in scope_spans["spans"])
    assert names == VERL_PHASES | {"step"}


def test_demo_reports_busy_port(tmp_path, capsys):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        code = cli.main(["demo", "--steps", "1", "--port", str(port), "--runs-dir", str(tmp_path)])
    assert code == 2
    assert "Address already in use; choose a free prometheus_port" in capsys.readouterr().err
