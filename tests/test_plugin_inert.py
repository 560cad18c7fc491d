"""Inert when off: with RLOTEL_ENABLE unset, the verl plugin module loads nothing heavy."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each test imports verl in a Python subprocess

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


def test_when_on_it_patches_what_verl_imports_and_loads_nothing_itself():
    report = imported("1")  # no verl import: post-import hooks registered, nothing loaded
    assert report["patched"]
    assert heavy(report["modules"]) == []
    assert "rlotel.integrations.registered" in report["modules"]  # the hooks, declared
    # a hook's wrappers load when verl imports what it wraps, not before
    assert "rlotel.integrations.verl_workers" not in report["modules"]
    assert not any(m.startswith("verl.experimental") for m in report["modules"])
    environ = {**os.environ, "RLOTEL_ENABLE": "1"}
    script = (
        "import verl, sys; from verl.utils.profiler import performance; "
        "print(performance._timer.__module__, 'verl.trainer.ppo.v1.trainer_base' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env=environ, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    module, v1_loaded = out.stdout.split()[-2:]
    assert module == "rlotel.integrations.verl"  # verl imported it: patched at once
    assert v1_loaded == "False"  # the V1 trainer is patched when verl imports it, not before
