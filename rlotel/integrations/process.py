"""The process's telemetry for the zero-code integrations, started on first use.

The verl plugin's timers, Tracking backend, agent-loop and V1 patches all record into the
telemetry `rlotel.init` made (or, in a Ray worker, the worker's own), configured from the
environment (`rlotel.base.env`). A module of its own so that the patches need not import
each other.

The *driver* is the process that runs verl's trainer loop, wherever it runs: verl's
`main_ppo` runs it inside its `TaskRunner` Ray actor. The trainer's `fit` declares it
(`declare_driver`) before anything is recorded, so that process gets the run's name, the
documented `/metrics` address and the profiler links, not a worker's telemetry.

The telemetry starts as every zero-code start-up does (`rlotel.integrations.startup`):
never raising; a `/metrics` port another run holds moves to one registered for discovery.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlotel.base import env
from rlotel.integrations import service

if TYPE_CHECKING:
    from rlotel.profile.config import ProfileConfig
    from rlotel.telemetry import Telemetry

log = logging.getLogger("rlotel")


@dataclass(frozen=True)
class Driver:
    """What the trainer's configuration says about the run (verl's `trainer.*`)."""

    run: str | None = None
    profile: ProfileConfig | None = None
    n_gpus: int | None = None  # verl's throughput denominator


_driver: Driver | None = None  # set once this process is known to run the trainer loop


def declare_driver(driver: Driver) -> None:
    """This process runs the trainer loop: its telemetry, made on first use, is the
    driver's (run name, `/metrics` at OTEL_EXPORTER_PROMETHEUS_HOST/PORT, captures)."""
    global _driver
    from rlotel.integrations import verl_workers

    _driver = driver
    verl_workers.CLOCK.declare_reference()


def declare_verl_driver(config: Any, n_gpus: int | None = None) -> None:
    """`declare_driver` from verl's trainer config (`trainer.experiment_name`, and
    `global_profiler.steps`/`save_path`: the captures verl writes get linked) and the GPU
    count verl divides throughput by."""
    trainer = setting(config, "trainer")
    run = setting(trainer, "experiment_name")
    declare_driver(Driver(str(run) if run else None, verl_profile_config(config), n_gpus))


def verl_profile_config(config: Any) -> ProfileConfig | None:
    from pathlib import Path

    from rlotel.profile.config import ProfileConfig

    profiler = setting(config, "global_profiler")
    try:
        steps = tuple(int(s) for s in (setting(profiler, "steps") or ()))
    except (TypeError, ValueError):
        return None
    save_path = setting(profiler, "save_path")
    if not steps or not save_path:
        return None
    continuous = bool(setting(profiler, "profile_continuous_steps"))
    # the rollout engines' token window (vLLM's delay/max iterations): on their captures' links
    rollout = setting(setting(setting(config, "actor_rollout_ref"), "rollout"), "profiler")
    tool = setting(setting(rollout, "tool_config"), str(setting(profiler, "tool")))
    start, end = setting(tool, "profile_token_start"), setting(tool, "profile_token_end")
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end):
        start = end = None  # both or neither (verl allows one: then only the workers say)
    return ProfileConfig(
        steps=steps,
        discover_dir=Path(save_path),
        continuous=continuous,
        token_start=start,
        token_end=end,
    )


def setting(config: Any, key: str) -> Any:
    """`config.key` of an OmegaConf node, a dict or a dataclass; None when absent."""
    if config is None:
        return None
    if isinstance(config, dict):
        return config.get(key)
    try:
        return getattr(config, key, None)
    except Exception:  # an OmegaConf struct node raises for a missing key
        return None


def flush_driver() -> None:
    """The trainer loop returned: export its last steps now (bounded). verl's TaskRunner
    actor may be ended by Ray without exit handlers before the export thread's next turn."""
    import rlotel

    tel = rlotel.current()
    if tel is not None:
        service.of(tel).flush_captures()  # verl stopped its profilers: the last captures
        tel.flush()


def is_driver() -> bool:
    return _driver is not None


def telemetry(run: str | None = None, serve: bool = False, **kwargs: Any) -> Telemetry:
    """The process's telemetry, created on first use from the environment: the driver's
    (declared, or any process outside Ray), else a Ray worker's with its role, rank and
    node (`verl_workers.worker_telemetry`). `serve` opens the driver's `/metrics`."""
    import rlotel

    tel = rlotel.current()
    if tel is not None:
        return tel
    from rlotel.integrations import verl_workers

    if _driver is None and verl_workers.in_ray_actor():
        return verl_workers.worker_telemetry()
    declared = _driver or Driver()
    if _driver is not None:
        from rlotel.schema import attributes as attr
        from rlotel.schema import vocabulary

        identity = verl_workers.process_identity()
        kwargs.setdefault("resource_attributes", {**identity, attr.ROLE: vocabulary.TRAINER_ROLE})
    environment = env.Environment.read()
    port: int | None = None
    if serve or _driver is not None:
        port = environment.metrics_port
    if declared.profile is not None:
        kwargs.setdefault("profile", declared.profile)
    profile = kwargs.get("profile")
    if profile is not None and profile.discover_dir is not None:  # verl's own captures
        from rlotel.integrations import verl_captures

        kwargs.setdefault("step_hooks", (verl_captures.discover,))
    if declared.n_gpus:
        kwargs.setdefault("n_gpus", declared.n_gpus)
    from rlotel.integrations import startup

    tel = startup.start(
        moved=_register_moved,
        environment=environment,
        run=environment.run or declared.run or run or "verl",
        prometheus_addr=environment.metrics_addr,
        prometheus_port=port,
        traces_file=environment.traces_file,
        **kwargs,
    )
    if _driver is not None and tel.metrics_url:
        _serve_cluster_targets(tel)
    return tel


def _register_moved(tel: Telemetry) -> str:
    """Prometheus scrapes the configured port statically: the one taken instead goes where
    it discovers rlotel's other targets (`RLOTEL_PROMETHEUS_SD_DIR`); says where."""
    from rlotel.integrations import ray as ray_integration
    from rlotel.schema import attributes as attr
    from rlotel.schema import vocabulary

    resource = service.of(tel).resource
    labels = {
        key.removeprefix(attr.NAMESPACE): str(resource[key])
        for key in (attr.ROLE, attr.RANK, attr.NODE)
        if key in resource
    }
    labels.setdefault("role", vocabulary.TRAINER_ROLE)
    labels["run"] = service.of(tel).run
    try:
        path = ray_integration.write_target(tel.metrics_url, labels)
    except OSError as error:  # discovery is never worth failing training for
        return f", not registered for discovery: {error}"
    return f", registered in {path}" if path is not None else ""


def _serve_cluster_targets(tel: Telemetry) -> None:
    """The trainer's `/metrics` listener also serves `/targets`: every rlotel process of
    the Ray job, for Prometheus HTTP service discovery (`rlotel.integrations.ray`)."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    try:
        from rlotel.integrations import ray as ray_integration

        ray_integration.serve_targets(tel)
    except Exception as error:  # discovery is never worth failing the trainer for
        log.warning("rlotel: /targets not served: %r", error)
