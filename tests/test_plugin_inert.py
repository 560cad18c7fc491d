"""Inert when off: with RLOTEL_ENABLE unset, the verl plugin module loads nothing heavy."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HEAVY = (
    "opentelemetry.sdk.trace",
    "opentelemetry.sdk.metrics",
    "opentelemetry.exporter",
    "prometheus_client",
    "numpy",
    "google.protobuf",
    "orjson",
)

SCRIPT = """
import json, sys
import rlotel.integrations.verl as plugin
print(json.dumps({"patched": plugin.patched(), "modules": sorted(sys.modules)}))
"""


def imported(enable: str | None) -> dict:
    environ = {k: v for k, v in os.environ.items() if k != "RLOTEL_ENABLE"}
    if enable is not None:
        environ["RLOTEL_ENABLE"] = enable
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=environ, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m.startswith(HEAVY)]


def test_the_plugin_module_loads_no_sdk_prometheus_or_numpy_when_off():
    for enable in (None, "0", ""):
        report = imported(enable)
        assert not report["patched"]
        assert heavy(report["modules"]) == []
        rlotel_modules = {m for m in report["modules"] if m.startswith("rlotel")}
        assert "rlotel.telemetry" not in rlotel_modules
        assert "rlotel.integrations.verl_workers" not in rlotel_modules


def test_the_same_check_sees_them_when_on():
    report = imported("1")  # installs into verl: verl (numpy, torch) and rlotel's hooks load
    assert report["patched"]
    assert "numpy" in heavy(report["modules"])
    assert "rlotel.integrations.verl_workers" in report["modules"]
