"""verl on a running Ray cluster: the RLOTEL_*/OTEL_* variables verl's runtime env must add
for the workers, and the warning when `VERL_USE_EXTERNAL_PLUGINS` leaves the plugin out
(decided as verl 0.9.1's `verl/__init__.py` decides it)."""

from __future__ import annotations

import json
import sys
import types

import pytest

from rlotel.integrations import guard
from rlotel.integrations import verl_cluster as cluster
from rlotel.integrations.registered import RUNTIME_ENV
from tests.helpers import attach_hooks, detach_hooks, hooks_attached

ON = {"RLOTEL_ENABLE": "1"}


def job(env_vars: dict[str, str]) -> str:
    return json.dumps({"runtime_env": {"env_vars": env_vars}, "metadata": {}})


def test_forwards_rlotel_and_otel_variables_but_not_the_per_process_ones() -> None:
    environ = {
        **ON,
        "RLOTEL_TRACES_DIR": "/runs/t",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "RLOTEL_ROLE": "trainer",
        "RLOTEL_TEST_CLOCK_SHIFT_S": "2",
        "PATH": "/bin",
        "NOT_OTEL_X": "1",
    }
    assert cluster.forwarded(environ) == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "RLOTEL_ENABLE": "1",
        "RLOTEL_TRACES_DIR": "/runs/t",
    }


def test_what_the_job_carries_already_is_not_named_twice() -> None:
    """Ray refuses to merge a job's runtime env with ray.init's when both name a variable."""
    environ = {
        **ON,
        "OTEL_SERVICE_NAME": "grpo",
        "RAY_JOB_CONFIG_JSON_ENV_VAR": job({"RLOTEL_ENABLE": "1", "HF_HOME": "/hf"}),
    }
    assert cluster.job_env_vars(environ) == {"RLOTEL_ENABLE": "1", "HF_HOME": "/hf"}
    assert cluster.forwarded(environ) == {"OTEL_SERVICE_NAME": "grpo"}
    for broken in ("{", '"x"', json.dumps({"runtime_env": {"env_vars": ["A"]}})):
        assert cluster.job_env_vars({"RAY_JOB_CONFIG_JSON_ENV_VAR": broken}) == {}


def test_the_runtime_env_keeps_what_verl_put_there() -> None:
    verl_env = {"env_vars": {"TOKENIZERS_PARALLELISM": "true", "OTEL_SERVICE_NAME": "verl"}}
    environ = {**ON, "OTEL_SERVICE_NAME": "mine"}
    merged = cluster.with_forwarded(verl_env, environ)
    assert merged["env_vars"] == {
        "TOKENIZERS_PARALLELISM": "true",
        "OTEL_SERVICE_NAME": "verl",
        "RLOTEL_ENABLE": "1",
    }
    assert cluster.with_forwarded({"working_dir": None}, ON) == {
        "working_dir": None,
        "env_vars": ON,
    }
    assert cluster.with_forwarded({"env_vars": {}}, {"PATH": "/bin"}) == {"env_vars": {}}


def test_the_patched_factory_adds_them_and_uninstall_puts_verl_back(monkeypatch) -> None:
    def get_ppo_ray_runtime_env(config=None):
        return {"env_vars": {"NCCL_DEBUG": "WARN"}, "working_dir": None}

    constants_ppo = types.ModuleType("verl.trainer.constants_ppo")
    constants_ppo.get_ppo_ray_runtime_env = get_ppo_ray_runtime_env
    for name in list(__import__("os").environ):
        if name.startswith(("RLOTEL_", "OTEL_", "RAY_JOB_CONFIG")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("RLOTEL_ENABLE", "1")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setitem(sys.modules, "verl.trainer.constants_ppo", constants_ppo)
    attach_hooks(RUNTIME_ENV.name)
    try:
        assert constants_ppo.get_ppo_ray_runtime_env(config=None) == {
            "env_vars": {
                "NCCL_DEBUG": "WARN",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
                "RLOTEL_ENABLE": "1",
            },
            "working_dir": None,
        }
    finally:
        detach_hooks(RUNTIME_ENV.name)
    assert constants_ppo.get_ppo_ray_runtime_env is get_ppo_ray_runtime_env


def test_a_failing_addition_leaves_verls_runtime_env_as_it_was(monkeypatch) -> None:
    constants_ppo = types.ModuleType("verl.trainer.constants_ppo")
    constants_ppo.get_ppo_ray_runtime_env = lambda config=None: {"env_vars": {"A": "1"}}
    monkeypatch.setitem(sys.modules, "verl.trainer.constants_ppo", constants_ppo)
    monkeypatch.setattr(cluster, "with_forwarded", lambda runtime_env: 1 / 0)
    with hooks_attached(RUNTIME_ENV.name):
        assert constants_ppo.get_ppo_ray_runtime_env() == {"env_vars": {"A": "1"}}


@pytest.mark.parametrize(
    ("policy", "loads"),
    [
        (None, True),  # unset: "auto"
        ("auto", True),
        (" AUTO ", True),
        ("none", False),
        ("None", False),
        ("", False),  # set but empty: verl's allow-list is empty
        ("other", False),
        ("other, rlotel", True),
        ("RLOTEL", True),  # verl lower-cases the policy
        ("rlotel.integrations.verl", False),  # entry-point names, not modules
    ],
)
def test_the_plugin_policy_is_read_as_verl_reads_it(policy: str | None, loads: bool) -> None:
    environ = {} if policy is None else {"VERL_USE_EXTERNAL_PLUGINS": policy}
    assert cluster.verl_loads_plugin(environ) is loads


def test_verl_loads_the_module_anyway_when_it_is_an_external_module() -> None:
    environ = {
        "VERL_USE_EXTERNAL_PLUGINS": "none",
        "VERL_USE_EXTERNAL_MODULES": "my_platform,rlotel.integrations.verl",
    }
    assert cluster.verl_loads_plugin(environ)
    environ["VERL_USE_EXTERNAL_MODULES"] = "my_platform, rlotel.integrations.verl"
    assert not cluster.verl_loads_plugin(environ)  # verl does not strip: that import fails


def test_excluded_says_what_to_do_and_only_when_rlotel_is_asked_for() -> None:
    message = cluster.excluded_by_verl({**ON, "VERL_USE_EXTERNAL_PLUGINS": "other"})
    assert message is not None
    assert "VERL_USE_EXTERNAL_PLUGINS='other'" in message
    assert "VERL_USE_EXTERNAL_PLUGINS=other,rlotel" in message
    assert "VERL_USE_EXTERNAL_MODULES=rlotel.integrations.verl" in message
    none = cluster.excluded_by_verl({**ON, "VERL_USE_EXTERNAL_PLUGINS": "none"})
    assert none is not None and "VERL_USE_EXTERNAL_PLUGINS=rlotel)" in none
    assert cluster.excluded_by_verl({"VERL_USE_EXTERNAL_PLUGINS": "none"}) is None
    assert cluster.excluded_by_verl({**ON, "VERL_USE_EXTERNAL_PLUGINS": "auto"}) is None
    assert cluster.excluded_by_verl(ON) is None


def test_warns_once_per_process(monkeypatch) -> None:
    monkeypatch.setattr(guard, "_said", set())
    said: list[str] = []
    environ = {**ON, "VERL_USE_EXTERNAL_PLUGINS": "none"}
    assert cluster.warn_if_excluded(environ, said.append)
    assert cluster.warn_if_excluded(environ, said.append)
    assert len(said) == 1 and "leaves the 'rlotel' verl plugin out" in said[0]
    assert not cluster.warn_if_excluded(ON, said.append)
    assert len(said) == 1


def test_the_policy_reader_agrees_with_verls_own_code() -> None:
    """Run verl 0.9.1's plugin-discovery block itself on each policy."""
    import inspect

    import verl

    source = inspect.getsource(verl)
    start = source.index("_plugins_policy = ")
    block = source[start : source.index("\n\n\n", start)]
    loaded: list[str] = []

    class EntryPoint:
        def __init__(self, name: str) -> None:
            self.name = name

        def load(self) -> None:
            loaded.append(self.name)

    for policy in ("auto", "none", "", "other", "other,rlotel", "RLOTEL", " rlotel "):
        loaded.clear()

        namespace = {
            "os": types.SimpleNamespace(getenv=lambda key, default, p=policy: p),
            "logging": __import__("logging"),
        }
        code = block.replace(
            "from importlib.metadata import entry_points as _entry_points",
            "_entry_points = lambda group: [EP('rlotel'), EP('other')]",
        )
        exec(code, {**namespace, "EP": EntryPoint})
        environ = {"VERL_USE_EXTERNAL_PLUGINS": policy}
        assert ("rlotel" in loaded) is cluster.verl_loads_plugin(environ), policy
