"""verl plugin: `import verl` loads it (entry point group `verl.plugins`) in every process.

Nothing happens unless `RLOTEL_ENABLE=1`: importing verl stays side-effect free for users
who did not ask. When enabled it
- routes every verl timer (`marked_timer`, `simple_timer`, NVTX/NPU variants) through the
  ledger: they all call `verl.utils.profiler.performance._timer`, looked up at call time;
  verl's `timing_raw` keeps verl's semantics (repeated names summed), and a raising body
  keeps its timing (verl's own timer loses it);
- adds an `rlotel` backend to `verl.utils.tracking.Tracking`
  (`trainer.logger='["console","rlotel"]'`), which feeds `tel.log` and links verl's
  profiler outputs of `global_profiler.steps`;
- records agent-loop per-sample metrics before verl reduces them
  (`AgentLoopManager._performance_metrics`, V0 path).

Configuration uses the OpenTelemetry variables (`OTEL_EXPORTER_OTLP_*`,
`OTEL_SERVICE_NAME`, `OTEL_EXPORTER_PROMETHEUS_HOST`/`_PORT` for the driver's /metrics);
`RLOTEL_TRACES_FILE` writes OTLP/JSON lines. verl logs plugin load errors at debug level
only, so failures here are logged loudly.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from rlotel import env
from rlotel.integrations.patches import Patches
from rlotel.integrations.process import (
    declare_verl_driver,
    flush_driver,
    telemetry,
    verl_profile_config,
)
from rlotel.schema import vocabulary as voc

log = logging.getLogger("rlotel")

BACKEND = "rlotel"
# verl's timers that mark their range themselves (NVTX on CUDA, MSTX on Ascend) before
# `yield from _timer(...)`; its default `marked_timer` and `simple_timer` do not.
RANGE_MARKING_TIMERS = ("profiler.nvtx_profile", "profiler.mstx_profile")
_installed: dict[str, Any] = {}  # "hooks": the modules patched since install
_patches = Patches()  # what was replaced, with the originals (for uninstall)


# --- timers ------------------------------------------------------------------------------


def _caller_global_step() -> int | None:
    """verl's trainers keep the step on `self.global_steps`; read it from the caller."""
    frame = sys._getframe(3)
    for _ in range(4):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        step = getattr(owner, "global_steps", None)
        if isinstance(step, int):
            return step
        frame = frame.f_back
    return None


def _timer(name: str, timing_raw: dict[str, float]) -> Iterator[None]:
    """Drop-in for `verl.utils.profiler.performance._timer` (a generator verl's timers
    `yield from`), recording into the ledger. The `step` timer opens the ledger step."""
    tel = telemetry()
    caller_marks = sys._getframe(1).f_globals.get("__name__", "").endswith(RANGE_MARKING_TIMERS)
    if name == "step" and tel.current_step is None:
        number = _caller_global_step()
        if number is None:
            number = (tel.ledger.last_step_number or 0) + 1
        scope = tel.step(number)
        record = scope.record
    else:
        import rlotel

        scope = rlotel.marked_timer(name, {})  # summed below, once, like verl
        record = scope
    if caller_marks:  # verl's NVTX/MSTX timer pushed this range: one range, not two
        record.marks_nvtx = False
    try:
        with scope:
            yield
    finally:  # a raising body keeps its timing (verl's own timer loses it)
        seconds = record.seconds
        timing_raw[name] = timing_raw.get(name, 0) + seconds
        _count_codetiming(name, seconds)
        tel.drops.fired("verl_timer")
        if record is not scope and voc.GEN in timing_raw and not scope.trace.samples:
            _warn_once(
                "no_samples",
                "rlotel: step %s ran gen but no per-sample metrics were captured (verl's agent "
                "loop or replay buffer hook did not fire): the tail histograms stay empty",
                scope.number,
            )


_warned: set[str] = set()


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def _count_codetiming(name: str, seconds: float) -> None:
    """verl's timer also accumulates into codetiming's process-global registry."""
    try:
        from codetiming import Timer

        Timer.timers.add(name, seconds)
    except Exception:  # codetiming is verl's dependency; never fail training over it
        pass


# --- Tracking backend --------------------------------------------------------------------


class RlotelBackend:
    """The `rlotel` logger of `verl.utils.tracking.Tracking`."""

    def __init__(self, project_name: str, experiment_name: str, config: Any = None) -> None:
        self.tel = telemetry(run=experiment_name, serve=True, profile=verl_profile_config(config))
        self.tel.expect_logs()  # each step's MFU and tokens arrive here, after its timers
        log.info("rlotel: verl run %r, metrics at %s", experiment_name, self.tel.metrics_url)

    def log(self, data: dict, step: int) -> None:
        self.tel.drops.fired("verl_tracking_log")
        self.tel.log(data, step)

    def finish(self) -> None:
        self.tel.shutdown()


def _patch_tracking(tracking_module: Any) -> None:
    tracking = tracking_module.Tracking
    if BACKEND not in tracking.supported_backend:
        tracking.supported_backend.append(BACKEND)
    original_init, original_finish = tracking.__init__, tracking.finish

    parameters = inspect.signature(original_init)

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        try:
            given = parameters.bind(self, *args, **kwargs)
            given.apply_defaults()
            options = given.arguments
            backends = options.get("default_backend") or ()
            backends = [backends] if isinstance(backends, str) else list(backends)
            if BACKEND in backends:
                self.logger[BACKEND] = RlotelBackend(
                    options.get("project_name"),
                    options.get("experiment_name"),
                    options.get("config"),
                )
        except Exception:  # verl's loggers work on without this one
            log.exception("rlotel: the rlotel logger did not start; verl's loggers run on")

    def finish(self, *args, **kwargs):
        backend = getattr(self, "logger", {}).get(BACKEND)
        original_finish(self, *args, **kwargs)
        if backend is not None and not getattr(self, "_rlotel_finished", False):
            self._rlotel_finished = True
            backend.finish()

    _patches.replace(tracking, "__init__", __init__)
    _patches.replace(tracking, "finish", finish)


# --- agent loop --------------------------------------------------------------------------


def _patch_agent_loop(agent_loop_module: Any) -> None:
    manager = agent_loop_module.AgentLoopManager
    original = manager._performance_metrics

    def _performance_metrics(self, metrics, output, *args, **kwargs):
        try:
            tel = telemetry()
            tel.drops.fired("verl_agent_loop_metrics")
            if _is_validation(tel, output):  # `testing`: never in the training histograms
                tel.drops.fired("verl_agent_loop_validation")
            else:
                tel.record_samples(metrics, **_sample_lengths(output))
        except Exception as error:
            log.warning("rlotel: agent-loop samples not recorded: %r", error)
        return original(self, metrics, output, *args, **kwargs)

    _patches.replace(manager, "_performance_metrics", _performance_metrics)


def _is_validation(tel: Any, output: Any) -> bool:
    """V0 validation (`_validate`, under `testing` and outside any step, its batches marked
    `meta_info["validate"]`) goes through the same agent-loop manager as training."""
    meta_info = getattr(output, "meta_info", None) or {}
    return bool(meta_info.get("validate")) or tel.current_step is None


def _sample_lengths(output: Any) -> dict[str, Any]:
    """Per-sample prompt/response lengths from the attention mask, as verl measures them."""
    batch = getattr(output, "batch", None)
    if batch is None or "attention_mask" not in batch or "prompts" not in batch:
        return {}
    width = batch["prompts"].shape[1]
    mask = batch["attention_mask"]
    return {
        voc.PROMPT_LENGTH: mask[:, :width].sum(-1),
        voc.RESPONSE_LENGTH: mask[:, width:].sum(-1),
    }


# --- the trainer loop's process --------------------------------------------------------


def _patch_v0_fit(ray_trainer: ModuleType) -> None:
    """V0's `RayPPOTrainer.fit` (`trainer.use_v1=false`) declares its process the driver."""
    trainer = ray_trainer.RayPPOTrainer
    original = trainer.fit

    def fit(self, *args, **kwargs):
        try:
            declare_verl_driver(self.config, self.resource_pool_manager.get_n_gpus())
        except Exception as error:
            log.warning("rlotel: verl trainer config not read: %r", error)
        try:
            return original(self, *args, **kwargs)
        finally:
            flush_driver()

    _patches.replace(trainer, "fit", fit)


# --- install -----------------------------------------------------------------------------


SUPPORTED = {"verl": ("0.9.0", "0.10.0"), "ray": ("2.41.0", "3.0.0")}  # [low, high)


def unsupported_versions() -> list[str]:
    """`name version` of each installed package outside the range rlotel was built for."""
    from importlib import metadata

    from packaging.version import Version

    outside = []
    for name, (low, high) in SUPPORTED.items():
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # verl imports Ray lazily where it is not installed
        if not Version(low) <= Version(version) < Version(high):
            outside.append(f"{name} {version} (supported: >={low},<{high})")
    return outside


def install() -> None:
    """Patch verl's timer hook, Tracking, the agent-loop manager, the trainers and Ray's
    actor calls (idempotent), or nothing: outside the supported versions nothing is
    patched, and a failure part-way undoes what was already patched."""
    if "hooks" in _installed:
        return
    outside = unsupported_versions()
    if outside:
        log.warning(
            "rlotel: the verl plugin does not support %s; nothing patched, training runs "
            "without rlotel",
            ", ".join(outside),
        )
        return
    try:
        _install()
    except Exception:
        uninstall()
        raise


def _install() -> None:
    """Register a post-import hook per module to patch: each runs when verl (or Ray) itself
    imports that module — at once if it is imported already — so a process pays for what
    its own role loads, nothing more (`import verl` with the plugin on stays cheap)."""
    import wrapt

    _installed["hooks"] = set()  # modules patched so far
    for module, patch in _hooks().items():
        wrapt.register_post_import_hook(_guarded(module, patch), module)


def _hooks() -> dict[str, Callable[[ModuleType], None]]:
    from rlotel.integrations import verl_engines, verl_v1, verl_workers

    return {
        "verl.utils.profiler.performance": _patch_timer,
        "verl.utils.tracking": _patch_tracking,
        "ray.actor": verl_workers.install_actor_calls,
        "ray._private.function_manager": verl_workers.install_worker,
        "verl.single_controller.ray.base": verl_workers.install_worker_groups,
        # before V1's `@ray.remote class AgentLoopWorkerTQ` copies its inherited methods
        "verl.experimental.agent_loop.agent_loop": _patch_agent_loop_module,
        "verl.trainer.ppo.ray_trainer": _patch_v0_fit,
        "verl.trainer.ppo.v1.trainer_base": verl_v1.patch_trainer,
        "verl.trainer.ppo.v1.replay_buffer": verl_v1.patch_replay_buffer,
        # verl's `rollout.prometheus` writer: its engine targets get a replica and the run
        "verl.workers.rollout.replica": verl_engines.patch_replica,
        "verl.workers.rollout.utils": verl_engines.patch_writer,
        **{module: verl_engines.patch_importer for module in verl_engines.IMPORTERS},
    }


def _guarded(module: str, patch: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    def hook(loaded: ModuleType) -> None:
        patched_modules = _installed.get("hooks")
        if patched_modules is None or module in patched_modules:
            return  # uninstalled since, or a hook of an earlier install
        patched_modules.add(module)
        try:
            patch(loaded)
        except Exception:  # all or nothing: training runs on without rlotel
            log.exception("rlotel: patching %s failed; the verl plugin is off", module)
            uninstall()

    return hook


def _patch_timer(performance: ModuleType) -> None:
    _patches.replace(performance, "_timer", _timer)


def _patch_agent_loop_module(agent_loop: ModuleType) -> None:
    from rlotel.integrations import verl_v1

    verl_v1.patch_agent_loop_worker(agent_loop)
    _patch_agent_loop(agent_loop)


def uninstall() -> None:
    """Undo every patch and stop the hooks (tests; a process that wants verl back)."""
    _installed.pop("hooks", None)
    _patches.undo()
    tracking = sys.modules.get("verl.utils.tracking")
    if tracking is not None and BACKEND in tracking.Tracking.supported_backend:
        tracking.Tracking.supported_backend.remove(BACKEND)
    from rlotel.integrations import verl_engines, verl_v1, verl_workers

    verl_v1.uninstall()
    verl_workers.uninstall()
    verl_engines.uninstall()


def patched() -> bool:
    return "hooks" in _installed


if env.enabled():
    try:
        install()
    except Exception:
        log.exception("rlotel: the verl plugin failed to install; training continues without it")
