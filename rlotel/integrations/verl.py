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
import time
from collections.abc import Callable, Iterator
from types import FrameType, ModuleType
from typing import Any

from rlotel.base import env
from rlotel.integrations import guard
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


TIMER_HOOK = "verl_timer"


def _caller_global_step(frame: FrameType | None) -> int | None:
    """verl's trainers keep the step on `self.global_steps`; read it from the callers of
    verl's timer (`frame`: contextlib's `__enter__`, then the trainer)."""
    frame = frame.f_back if frame is not None else None
    for _ in range(4):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        step = getattr(owner, "global_steps", None)
        if isinstance(step, int):
            return step
        frame = frame.f_back
    return None


def traced_timer(original: Callable[..., Iterator[None]]) -> Callable[..., Iterator[None]]:
    """Drop-in for `verl.utils.profiler.performance._timer` (a generator verl's timers
    `yield from`), recording into the ledger; `original` is verl's own, which runs instead
    when rlotel's part fails or verl passes arguments rlotel does not know."""

    def _timer(name: str, timing_raw: dict[str, float], *args: Any, **kwargs: Any):
        if args or kwargs:
            guard.unexpected(TIMER_HOOK, args, kwargs)
            return (yield from original(name, timing_raw, *args, **kwargs))
        started = time.perf_counter()
        try:
            scope, record = _open_timer(name, sys._getframe(1))
            scope.__enter__()
        except Exception as error:
            guard.failed(TIMER_HOOK, error)
            return (yield from original(name, timing_raw))
        try:
            yield
        except BaseException as raised:  # a raising body keeps its timing (verl's loses it)
            _close_timer(name, timing_raw, scope, record, started, raised)
            raise
        _close_timer(name, timing_raw, scope, record, started, None)

    return _timer


def _open_timer(name: str, timer_frame: FrameType) -> tuple[Any, Any]:
    """(the context to enter, the record that times it): the `step` timer opens the
    ledger step, any other a phase (summed into timing_raw once, like verl, on close)."""
    tel = telemetry()
    guard.fault(TIMER_HOOK)
    caller_marks = timer_frame.f_globals.get("__name__", "").endswith(RANGE_MARKING_TIMERS)
    if name == "step" and tel.current_step is None:
        number = _caller_global_step(timer_frame)
        if number is None:
            number = (tel.ledger.last_step_number or 0) + 1
        scope = tel.step(number)
        record = scope.record
    else:
        import rlotel

        scope = rlotel.marked_timer(name, {})
        record = scope
    if caller_marks:  # verl's NVTX/MSTX timer pushed this range: one range, not two
        record.marks_nvtx = False
    return scope, record


def _close_timer(
    name: str,
    timing_raw: dict[str, float],
    scope: Any,
    record: Any,
    started: float,
    raised: BaseException | None,
) -> None:
    """verl's `timing_raw[name]` gains the window's seconds whatever rlotel's close does."""
    seconds = time.perf_counter() - started
    if guard.exit_context(TIMER_HOOK, scope, raised):
        try:
            seconds = record.seconds
        except Exception as error:
            guard.failed(TIMER_HOOK, error)
    timing_raw[name] = timing_raw.get(name, 0) + seconds
    _count_codetiming(name, seconds)
    try:
        tel = telemetry()
        tel.drops.fired(TIMER_HOOK)
        # a step that raised (fully async's last, around an ended queue) owes no samples
        if (
            record is not scope
            and raised is None
            and voc.GEN in timing_raw
            and not scope.trace.samples
        ):
            _warn_once(
                "no_samples",
                "rlotel: step %s ran gen but no per-sample metrics were captured (verl's agent "
                "loop or replay buffer hook did not fire): the tail histograms stay empty",
                scope.number,
            )
    except Exception as error:
        guard.failed(TIMER_HOOK, error)


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


TRACKING_HOOK = "verl_tracking"
TRACKING_LOG_HOOK = "verl_tracking_log"
AGENT_LOOP_HOOK = "verl_agent_loop_metrics"
FIT_HOOK = "verl_fit"


class RlotelBackend:
    """The `rlotel` logger of `verl.utils.tracking.Tracking`: verl calls it in its own
    loop over loggers, so nothing of it may raise there."""

    def __init__(self, project_name: str, experiment_name: str, config: Any = None) -> None:
        self.tel = telemetry(run=experiment_name, serve=True, profile=verl_profile_config(config))
        self.tel.expect_logs()  # each step's MFU and tokens arrive here, after its timers
        log.info("rlotel: verl run %r, metrics at %s", experiment_name, self.tel.metrics_url)

    def log(self, *args: Any, **kwargs: Any) -> None:
        try:
            guard.fault(TRACKING_LOG_HOOK)
            data, step = (
                guard.argument(args, kwargs, 0, "data"),
                guard.argument(args, kwargs, 1, "step"),
            )
            self.tel.drops.fired(TRACKING_LOG_HOOK)
            self.tel.log(data, step)
        except Exception as error:
            guard.failed(TRACKING_LOG_HOOK, error)

    def finish(self, *args: Any, **kwargs: Any) -> None:
        try:
            guard.fault(TRACKING_HOOK)
            self.tel.shutdown()
        except Exception as error:
            guard.failed(TRACKING_HOOK, error)


def _patch_tracking(tracking_module: Any) -> None:
    tracking = tracking_module.Tracking
    if BACKEND not in tracking.supported_backend:
        tracking.supported_backend.append(BACKEND)
    _patches.replace(tracking, "__init__", tracking_init(tracking.__init__))
    _patches.replace(tracking, "finish", tracking_finish(tracking.finish))


def tracking_init(original: Callable[..., None]) -> Callable[..., None]:
    """`Tracking.__init__`: verl's loggers first, then the `rlotel` one when named."""
    parameters = inspect.signature(original)

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            given = parameters.bind(self, *args, **kwargs)
            given.apply_defaults()
            options = given.arguments
            backends = options.get("default_backend") or ()
            backends = [backends] if isinstance(backends, str) else list(backends)
            if BACKEND in backends:
                backend = RlotelBackend(
                    options.get("project_name"),
                    options.get("experiment_name"),
                    options.get("config"),
                )
                guard.fault(TRACKING_HOOK)
                self.logger[BACKEND] = backend
        except Exception as error:  # verl's loggers work on without this one
            guard.failed(TRACKING_HOOK, error)

    return __init__


def tracking_finish(original: Callable[..., Any]) -> Callable[..., Any]:
    """`Tracking.finish`: verl's loggers finish first, then rlotel's (once)."""

    def finish(self, *args, **kwargs):
        backend = getattr(self, "logger", {}).get(BACKEND)
        result = original(self, *args, **kwargs)
        if backend is not None and not getattr(self, "_rlotel_finished", False):
            self._rlotel_finished = True
            backend.finish()
        return result

    return finish


# --- agent loop --------------------------------------------------------------------------


def _patch_agent_loop(agent_loop_module: Any) -> None:
    manager = agent_loop_module.AgentLoopManager
    _patches.replace(
        manager, "_performance_metrics", performance_metrics(manager._performance_metrics)
    )


def performance_metrics(original: Callable[..., Any]) -> Callable[..., Any]:
    """`AgentLoopManager._performance_metrics(metrics, output)`: the per-sample metrics
    are recorded before verl reduces them."""

    def _performance_metrics(self, *args, **kwargs):
        try:
            tel = telemetry()
            guard.fault(AGENT_LOOP_HOOK)
            metrics = guard.argument(args, kwargs, 0, "metrics")
            output = guard.argument(args, kwargs, 1, "output")
            tel.drops.fired(AGENT_LOOP_HOOK)
            stamped = _trajectories(output)
            if _is_validation(tel, output):  # `testing`: never in the training histograms
                tel.drops.fired("verl_agent_loop_validation")
            else:
                tel.record_samples(metrics, **_sample_lengths(output), **stamped)
        except Exception as error:
            guard.failed(AGENT_LOOP_HOOK, error)
        return original(self, *args, **kwargs)

    return _performance_metrics


def _is_validation(tel: Any, output: Any) -> bool:
    """V0 validation (`_validate`, under `testing` and outside any step, its batches marked
    `meta_info["validate"]`) goes through the same agent-loop manager as training."""
    meta_info = getattr(output, "meta_info", None) or {}
    return bool(meta_info.get("validate")) or tel.current_step is None


def _trajectories(output: Any) -> dict[str, Any]:
    """What rlotel's agent-loop workers stamped on each trajectory (`verl_v1.compute_score`):
    its real times, model turns and the replica that served it; taken out of verl's batch
    (verl copies every `extra_fields` entry into `non_tensor_batch`), so the trainer's data
    is verl's own."""
    from rlotel.integrations import verl_v1

    columns = getattr(output, "non_tensor_batch", None)
    if not isinstance(columns, dict):
        return {}
    stamps = columns.pop(verl_v1.STAMP_KEY, None)
    servers = columns.pop(verl_v1.SERVER_KEY, None)
    if stamps is None:
        return {}
    parsed = [verl_v1._stamp({verl_v1.STAMP_KEY: stamp}) for stamp in stamps]
    return {
        "start_time_ns": [stamp.start_ns for stamp in parsed],
        "end_time_ns": [stamp.end_ns for stamp in parsed],
        "turn_times_ns": [stamp.turn_times_ns for stamp in parsed],
        "replica": verl_v1.replicas(list(servers)) if servers is not None else None,
    }


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
    _patches.replace(trainer, "fit", v0_fit(trainer.fit))


def v0_fit(original: Callable[..., Any]) -> Callable[..., Any]:
    def fit(self, *args, **kwargs):
        try:
            guard.fault(FIT_HOOK)
            declare_verl_driver(self.config, self.resource_pool_manager.get_n_gpus())
        except Exception as error:
            guard.failed(FIT_HOOK, error)
        try:
            return original(self, *args, **kwargs)
        finally:  # its last steps go out now; an exception of the loop itself propagates
            guard.attempt(FIT_HOOK, flush_driver)

    return fit


# --- install -----------------------------------------------------------------------------


# [low, high): what the e2e and unit tests run (constraints.txt, tests/e2e/engine-constraints.txt)
TESTED = {"verl": ("0.9.1", "0.9.2"), "ray": ("2.60.0", "2.61.0")}
# Outside these the plugin steps aside: another minor series of verl may move the trainers.
SUPPORTED = {"verl": ("0.9.0", "0.10.0"), "ray": ("2.41.0", "3.0.0")}


def versions_outside(ranges: dict[str, tuple[str, str]]) -> list[str]:
    """`name version (range)` of each installed package outside its range."""
    from importlib import metadata

    from packaging.version import Version

    outside = []
    for name, (low, high) in ranges.items():
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # verl imports Ray lazily where it is not installed
        if not Version(low) <= Version(version) < Version(high):
            outside.append(f"{name} {version} (>={low},<{high})")
    return outside


def install() -> None:
    """Patch verl's timer hook, Tracking, the agent-loop manager, the trainers and Ray's
    actor calls (idempotent). Versions rlotel was not tested with: every patch is drift-
    safe, so it installs, with one warning; outside the supported series nothing is
    patched. A failure part-way undoes what was already patched."""
    if "hooks" in _installed:
        return
    unsupported = versions_outside(SUPPORTED)
    if unsupported:
        log.warning(
            "rlotel: the verl plugin does not support %s; nothing patched, training runs "
            "without rlotel",
            ", ".join(unsupported),
        )
        return
    untested = versions_outside(TESTED)
    if untested:
        log.warning(
            "rlotel: the verl plugin was not tested with %s; it installs, and any hook that "
            "no longer fits runs verl's call untraced (rlotel_integration_failures_total)",
            ", ".join(untested),
        )
    _own_log_lines()
    try:
        _install()
    except Exception:
        uninstall()
        raise


def _own_log_lines() -> None:
    """rlotel's warnings reach stderr whatever the process does to the root logger: in
    verl's trainer, vLLM's API server (through a dependency it imports) sets the root
    logger and its handlers to ERROR, which would swallow every hook-failure and start-up
    warning. A level or handler the user gave the `rlotel` logger is left as it is."""
    logger = logging.getLogger("rlotel")
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)
    if not logger.handlers:
        handler = _Unheard(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s:%(asctime)s:%(message)s"))
        logger.addHandler(handler)


class _Unheard(logging.StreamHandler):
    """Writes only the records no root handler would (lines are never doubled)."""

    def emit(self, record: logging.LogRecord) -> None:
        if not any(record.levelno >= handler.level for handler in logging.getLogger().handlers):
            super().emit(record)


def _install() -> None:
    """Register a post-import hook per module to patch: each runs when verl (or Ray) itself
    imports that module — at once if it is imported already — so a process pays for what
    its own role loads, nothing more (`import verl` with the plugin on stays cheap)."""
    import wrapt

    _installed["hooks"] = set()  # modules patched so far
    for module, patch in _hooks().items():
        wrapt.register_post_import_hook(_guarded(module, patch), module)


def _hooks() -> dict[str, Callable[[ModuleType], None]]:
    from rlotel.integrations import verl_cluster, verl_engines, verl_v1, verl_workers

    return {
        # a job submitted to a running cluster: the entrypoint's RLOTEL_*/OTEL_* reach workers
        "verl.trainer.constants_ppo": verl_cluster.patch_runtime_env,
        "verl.utils.profiler.performance": _patch_timer,
        "verl.utils.profiler.profile": _patch_profiler,  # its finish hook's runs recorded
        "verl.utils.tracking": _patch_tracking,
        "ray.actor": verl_workers.install_actor_calls,
        "ray._private.function_manager": verl_workers.install_worker,
        "verl.single_controller.ray.base": verl_workers.install_worker_groups,
        # before V1's `@ray.remote class AgentLoopWorkerTQ` copies its inherited methods
        "verl.experimental.agent_loop.agent_loop": _patch_agent_loop_module,
        "verl.trainer.ppo.ray_trainer": _patch_v0_fit,
        "verl.trainer.ppo.v1.trainer_base": verl_v1.patch_trainer,
        "verl.trainer.ppo.v1.replay_buffer": verl_v1.patch_replay_buffer,
        "verl.experimental.fully_async_policy.fully_async_trainer": _patch_fully_async,
        "verl.checkpoint_engine.base": _patch_weight_sync,  # the weight sync's stages
        # verl's `rollout.prometheus` writer: its engine targets get a replica and the run
        "verl.workers.rollout.replica": verl_engines.patch_replica,
        "verl.workers.rollout.utils": verl_engines.patch_writer,
        **{module: verl_engines.patch_importer for module in verl_engines.IMPORTERS},
        # after the writer's importer patch of the same module: the rollouter's run
        "verl.experimental.fully_async_policy.fully_async_rollouter": _patch_rollouter,
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
    _patches.replace(performance, "_timer", traced_timer(performance._timer))


def _patch_profiler(profile: ModuleType) -> None:
    from rlotel.integrations import verl_captures

    verl_captures.patch_profiler(profile, _patches)


def _patch_weight_sync(base: ModuleType) -> None:
    from rlotel.integrations import verl_weights

    verl_weights.patch_manager(base, _patches)


def _patch_fully_async(trainer: ModuleType) -> None:
    from rlotel.integrations import verl_fully_async

    verl_fully_async.patch_trainer(trainer, _patches)


def _patch_rollouter(rollouter: ModuleType) -> None:
    from rlotel.integrations import verl_engines, verl_fully_async

    verl_engines.patch_importer(rollouter)
    verl_fully_async.patch_rollouter(rollouter, _patches)


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
    from rlotel.integrations import verl_cluster, verl_engines, verl_v1, verl_workers

    verl_cluster.uninstall()
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
