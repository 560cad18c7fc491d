"""verl on a Ray cluster it did not start (`ray start --head`, then `ray job submit`).

Where a variable reaches, measured on Ray 2.60 (docs/verl.md, "Submitting to a running Ray
cluster"): the `ray start` shell reaches that node's processes (the raylet's environment is
inherited), the `ray job submit` shell nothing, the job's `--runtime-env-json` env_vars the
entrypoint and every worker, a prefix in the entrypoint (`-- env RLOTEL_ENABLE=1 python -m
...`) the entrypoint only, and `ray.init(runtime_env=...)` (verl's
`ray_kwargs.ray_init.runtime_env`) the workers only. Ray merges the job's runtime env with
the one `ray.init` gets inside the job and refuses (ValueError) a variable named in both.

Two things rlotel does about it:

- `patch_runtime_env` (a post-import hook on `verl.trainer.constants_ppo`): verl's
  `main_ppo` builds its runtime env with `get_ppo_ray_runtime_env()`, a fixed list of
  variables without RLOTEL_* and OTEL_*, so where the entrypoint alone has them the trainer
  (verl's `TaskRunner` actor) and every worker run without rlotel. With the plugin on in
  the entrypoint, its RLOTEL_* and OTEL_* variables are added to that runtime env — except
  those the job's runtime env names already (they reach the workers anyway, and naming
  them twice is Ray's conflict) and the per-process ones (`PER_PROCESS`).
- `excluded_by_verl` / `warn_if_excluded`: `import verl` loads the `verl.plugins` entry
  points `VERL_USE_EXTERNAL_PLUGINS` allows (`auto`, the default: all; `none`: none; else a
  comma list of entry-point names, an empty value allowing none) and imports the modules
  `VERL_USE_EXTERNAL_MODULES` names whatever the policy. With `RLOTEL_ENABLE=1` and neither
  reaching the plugin, nothing of rlotel's runs in verl's processes; what still runs (the
  `opentelemetry-instrument` hook, before verl is imported) says so once.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from rlotel.base import env
from rlotel.integrations import guard
from rlotel.integrations.registered import RUNTIME_ENV

log = logging.getLogger("rlotel")

FORWARDED_PREFIXES = ("RLOTEL_", "OTEL_")
# One process's own identity or a test's node clock: never copied onto every worker.
PER_PROCESS = frozenset({env.RLOTEL_ROLE, env.RLOTEL_TEST_CLOCK_SHIFT_S})
# What `ray job submit` hands the entrypoint: {"runtime_env": {...}, "metadata": {...}}
# (ray._private.runtime_env.constants.RAY_JOB_CONFIG_JSON_ENV_VAR spells it the same).
RAY_JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"
VERL_PLUGINS_POLICY = "VERL_USE_EXTERNAL_PLUGINS"  # read by verl/__init__.py
VERL_MODULES = "VERL_USE_EXTERNAL_MODULES"  # modules verl/__init__.py imports, whatever the policy
PLUGIN_NAME = "rlotel"  # the entry point's name in the `verl.plugins` group
PLUGIN_MODULE = "rlotel.integrations.verl"  # what that entry point loads
RUNTIME_ENV_FACTORY = "get_ppo_ray_runtime_env"


# --- forwarding --------------------------------------------------------------------------


def job_env_vars(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The env_vars of the runtime env this process's Ray job was submitted with ({} outside
    a submitted job, or when Ray's hand-over cannot be read)."""
    try:
        config = json.loads(environ.get(RAY_JOB_CONFIG) or "{}")
        env_vars = (config.get("runtime_env") or {}).get("env_vars") or {}
    except (ValueError, AttributeError):
        return {}
    return {str(k): str(v) for k, v in env_vars.items()} if isinstance(env_vars, dict) else {}


def forwarded(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The RLOTEL_* and OTEL_* variables of this process that the job's runtime env does
    not carry already: what verl's runtime env must add for every worker to see them."""
    carried = job_env_vars(environ)
    return {
        name: value
        for name, value in sorted(environ.items())
        if name.startswith(FORWARDED_PREFIXES) and name not in PER_PROCESS and name not in carried
    }


def with_forwarded(runtime_env: Any, environ: Mapping[str, str] = os.environ) -> Any:
    """`runtime_env` (verl's dict) with `forwarded()` added under env_vars; what verl put
    there already stays as it is."""
    extra = forwarded(environ)
    if not extra or not isinstance(runtime_env, dict):
        return runtime_env
    env_vars = runtime_env.setdefault("env_vars", {})
    for name, value in extra.items():
        env_vars.setdefault(name, value)
    return runtime_env


def forwarding_runtime_env(original: Callable[..., Any]) -> Callable[..., Any]:
    """`verl.trainer.constants_ppo.get_ppo_ray_runtime_env` (looked up by `main_ppo` and the
    recipes when they import it, after the hook attached) returns its runtime env with
    `forwarded()` added."""

    def get_ppo_ray_runtime_env(*args: Any, **kwargs: Any) -> Any:
        runtime_env = original(*args, **kwargs)
        with RUNTIME_ENV.guarded():  # else verl's own runtime env, unchanged
            RUNTIME_ENV.fault()
            RUNTIME_ENV.fired()
            return with_forwarded(runtime_env)
        return runtime_env

    get_ppo_ray_runtime_env.__wrapped__ = original  # type: ignore[attr-defined]
    return get_ppo_ray_runtime_env


# --- VERL_USE_EXTERNAL_PLUGINS -----------------------------------------------------------


def verl_loads_plugin(environ: Mapping[str, str] = os.environ, name: str = PLUGIN_NAME) -> bool:
    """Whether `import verl` loads the `verl.plugins` entry point `name`, as verl 0.9.1's
    `verl/__init__.py` decides it (policy stripped and lower-cased; names compared as
    written) — or imports the plugin module anyway, named in `VERL_USE_EXTERNAL_MODULES`
    (split on commas, nothing stripped, as verl does)."""
    if PLUGIN_MODULE in (environ.get(VERL_MODULES) or "").split(","):
        return True
    policy = environ.get(VERL_PLUGINS_POLICY, "auto").strip().lower()
    if policy == "auto":
        return True
    if policy == "none":
        return False
    return name in {part.strip() for part in policy.split(",") if part.strip()}


def excluded_by_verl(environ: Mapping[str, str] = os.environ) -> str | None:
    """The warning when `RLOTEL_ENABLE=1` asks for the plugin and verl will not load it;
    None otherwise."""
    if not env.enabled(environ) or verl_loads_plugin(environ):
        return None
    given = environ.get(VERL_PLUGINS_POLICY, "")
    return (
        f"rlotel: {env.RLOTEL_ENABLE}=1 but {VERL_PLUGINS_POLICY}={given!r} leaves the "
        f"{PLUGIN_NAME!r} verl plugin out: verl will not load it and this run records "
        f"nothing. Add {PLUGIN_NAME} to the list (e.g. "
        f"{VERL_PLUGINS_POLICY}={_suggested(given)}), unset it, or name the module in "
        f"{VERL_MODULES}={PLUGIN_MODULE}"
    )


def _suggested(given: str) -> str:
    names = [part.strip() for part in given.split(",") if part.strip()]
    if not names or given.strip().lower() == "none":
        return PLUGIN_NAME
    return ",".join([*names, PLUGIN_NAME])


def warn_if_excluded(
    environ: Mapping[str, str] = os.environ, warn: Callable[[str], None] | None = None
) -> bool:
    """Log `excluded_by_verl()` once per process; True when it applies."""
    message = excluded_by_verl(environ)
    if message is None:
        return False
    if guard.once(message):
        (warn or log.warning)(message)
    return True
