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
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Any

from rlotel.base import env
from rlotel.integrations import guard, service
from rlotel.integrations.hooks import State
from rlotel.integrations.process import (
    declare_verl_driver,
    flush_driver,
    is_driver,
    telemetry,
    verl_profile_config,
)
from rlotel.integrations.registered import AGENT_LOOP, FIT, TIMER, TRACKING
from rlotel.schema import vocabulary as voc

log = logging.getLogger("rlotel")

BACKEND = "rlotel"
# verl's timers that mark their range themselves (NVTX on CUDA, MSTX on Ascend) before
# `yield from _timer(...)`; its default `marked_timer` and `simple_timer` do not.
RANGE_MARKING_TIMERS = ("profiler.nvtx_profile", "profiler.mstx_profile")


# --- timers ------------------------------------------------------------------------------


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
    when rlotel's part fails, and inside rlotel's window when verl passes arguments rlotel
    does not know."""

    def _timer(name: str, timing_raw: dict[str, float], *args: Any, **kwargs: Any):
        started = time.perf_counter()
        try:
            scope, record = _open_timer(name, timing_raw, sys._getframe(1))
            scope.__enter__()
        except Exception as error:
            TIMER.failed(error)
            return (yield from original(name, timing_raw, *args, **kwargs))
        # options rlotel does not know (a newer verl): verl's own timer runs with them,
        # inside rlotel's window, and keeps timing_raw itself
        verl_times = bool(args or kwargs)
        try:
            if verl_times:
                yield from original(name, timing_raw, *args, **kwargs)
            else:
                yield
        except BaseException as raised:  # a raising body keeps its timing (verl's loses it)
            _close_timer(name, timing_raw, scope, record, started, raised, verl_times)
            raise
        _close_timer(name, timing_raw, scope, record, started, None, verl_times)

    return _timer


def _open_timer(name: str, timing_raw: dict, timer_frame: FrameType) -> tuple[Any, Any]:
    """(the context to enter, the record that times it): the `step` timer opens the
    ledger step, any other a phase (summed into timing_raw once, like verl, on close)."""
    tel = telemetry()
    TIMER.fault()
    caller_marks = timer_frame.f_globals.get("__name__", "").endswith(RANGE_MARKING_TIMERS)
    if name == "step" and tel.current_step is None:
        number = _caller_global_step(timer_frame)
        if number is None:
            number = service.of(tel).next_step_number()
        scope = tel.step(number)
        record = scope.record
    else:
        import rlotel

        scope = rlotel.marked_timer(name, {})
        record = scope
    if caller_marks:  # verl's NVTX/MSTX timer pushed this range: one range, not two
        record.marks_nvtx = False
    tel.timed_into(scope, timing_raw)  # the step verl credits with it: whose dict gets it
    return scope, record


def _close_timer(
    name: str,
    timing_raw: dict[str, float],
    scope: Any,
    record: Any,
    started: float,
    raised: BaseException | None,
    verl_times: bool = False,
) -> None:
    """verl's `timing_raw[name]` gains the window's seconds whatever rlotel's close does
    (unless verl's own timer ran and counted them)."""
    seconds = time.perf_counter() - started
    if TIMER.exit_context(scope, raised):
        with TIMER.guarded():
            seconds = record.seconds
    if not verl_times:
        timing_raw[name] = timing_raw.get(name, 0) + seconds
        _count_codetiming(name, seconds)
    with TIMER.guarded():
        TIMER.fired()
        # a step that raised (fully async's last, around an ended queue) owes no samples
        if (
            record is not scope
            and raised is None
            and voc.GEN in timing_raw
            and not scope.trace.samples
        ):
            guard.warn_once(
                "no_samples",
                "rlotel: step %s ran gen but no per-sample metrics were captured (verl's agent "
                "loop or replay buffer hook did not fire): the tail histograms stay empty",
                scope.number,
            )


def _count_codetiming(name: str, seconds: float) -> None:
    """verl's timer also accumulates into codetiming's process-global registry."""
    try:
        from codetiming import Timer

        Timer.timers.add(name, seconds)
    except Exception:  # codetiming is verl's dependency; never fail training over it
        pass


# --- Tracking backend --------------------------------------------------------------------


class RlotelBackend:
    """The `rlotel` logger of `verl.utils.tracking.Tracking`: verl calls it in its own
    loop over loggers, so nothing of it may raise there."""

    def __init__(self, project_name: str, experiment_name: str, config: Any = None) -> None:
        self.tel = telemetry(run=experiment_name, serve=True, profile=verl_profile_config(config))
        self.tel.expect_logs()  # each step's MFU and tokens arrive here, after its timers
        log.info("rlotel: verl run %r, metrics at %s", experiment_name, self.tel.metrics_url)
        missing = not_attached()
        if missing:  # at the run's start, in its driver: one line for what is lost
            log.warning(
                "rlotel: hooks not attached in this process: %s (`rlotel doctor` says why)",
                ", ".join(sorted(missing)),
            )

    def log(self, *args: Any, **kwargs: Any) -> None:
        with TRACKING.guarded():
            TRACKING.fault()
            data, step = (
                guard.argument(args, kwargs, 0, "data"),
                guard.argument(args, kwargs, 1, "step"),
            )
            TRACKING.fired()
            self.tel.log(data, step)

    def finish(self, *args: Any, **kwargs: Any) -> None:
        with TRACKING.guarded():
            TRACKING.fault()
            self.tel.shutdown()


def with_rlotel_backend(supported: list[str]) -> list[str]:
    """`Tracking.supported_backend`, with `rlotel` among the loggers verl accepts."""
    return supported if BACKEND in supported else [*supported, BACKEND]


def tracking_init(original: Callable[..., None]) -> Callable[..., None]:
    """`Tracking.__init__`: verl's loggers first, then the `rlotel` one when named. The
    process that makes it is the one running the step loop: the driver, declared here when
    no hook on its trainer's `fit` did (one-step-off, separation, a user's subclass)."""
    parameters = inspect.signature(original)

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        with TRACKING.guarded():  # verl's loggers work on without this one
            TRACKING.fault()
            given = parameters.bind(self, *args, **kwargs)
            given.apply_defaults()
            options = given.arguments
            backends = options.get("default_backend") or ()
            backends = [backends] if isinstance(backends, str) else list(backends)
            if BACKEND in backends:
                if not is_driver():  # a trainer whose `fit` no hook wraps: it logs the steps
                    declare_verl_driver(options.get("config"), _trainer_gpus(sys._getframe(1)))
                backend = RlotelBackend(
                    options.get("project_name"),
                    options.get("experiment_name"),
                    options.get("config"),
                )
                self.logger[BACKEND] = backend

    return __init__


def _trainer_gpus(frame: FrameType | None) -> int | None:
    """The GPU count verl divides throughput by, from the trainer that made the Tracking
    (`frame`: its caller, a trainer's `fit`)."""
    for _ in range(4):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        count = getattr(owner, "_get_n_gpus_for_throughput", None)
        if callable(count):
            return count()
        pools = getattr(owner, "resource_pool_manager", None)
        if pools is not None:
            return pools.get_n_gpus()
        frame = frame.f_back
    return None


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


def performance_metrics(original: Callable[..., Any]) -> Callable[..., Any]:
    """`AgentLoopManager._performance_metrics(metrics, output)`: the per-sample metrics
    are recorded before verl reduces them."""

    def _performance_metrics(self, *args, **kwargs):
        columns = _take_rlotel_columns(args, kwargs)  # whatever else fails: verl's data only
        with AGENT_LOOP.guarded():
            tel = telemetry()
            AGENT_LOOP.fault()
            metrics = guard.argument(args, kwargs, 0, "metrics")
            output = guard.argument(args, kwargs, 1, "output")
            AGENT_LOOP.fired()
            stamped = _trajectories(*columns)
            # validation (verl marks it; `testing`) never goes into the training histograms
            if not _is_validation(tel, output, sys._getframe(1)):
                tel.record_samples(metrics, **_sample_lengths(output), **stamped)
        return original(self, *args, **kwargs)

    return _performance_metrics


def _is_validation(tel: Any, output: Any, caller: FrameType | None) -> bool:
    """Validation batches go through the same agent-loop manager as training. verl marks
    them on the prompts its `generate_sequences` (`caller`) received (`meta_info["validate"]`);
    without them at hand (another caller), a batch outside any step is validation (V0's
    `_validate`, under `testing`). A training batch finishing between steps (one-step-off's
    next batch) is training."""
    prompts = caller.f_locals.get("prompts") if caller is not None else None
    meta_info = getattr(prompts, "meta_info", None)
    if isinstance(meta_info, Mapping):
        return bool(meta_info.get("validate"))
    meta_info = getattr(output, "meta_info", None) or {}
    return bool(meta_info.get("validate")) or tel.current_step is None


def _take_rlotel_columns(args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """(stamps, servers): the columns rlotel's agent-loop workers added to each trajectory
    (`verl_v1.compute_score`), taken out of verl's batch — verl copies every `extra_fields`
    entry into `non_tensor_batch` — so the trainer gets exactly verl's columns. Taken by
    `pop(key, default)` alone: verl's next data plane (NeoProto) hands a dict-like proxy
    that is neither a dict nor a Mapping."""
    from rlotel.integrations import verl_v1

    try:
        output = guard.argument(args, kwargs, 1, "output")
        pop = getattr(getattr(output, "non_tensor_batch", None), "pop", None)
        if pop is None:
            return None, None
        return pop(verl_v1.STAMP_KEY, None), pop(verl_v1.SERVER_KEY, None)
    except Exception as error:  # verl's call goes on with what it was given
        AGENT_LOOP.failed(error)
        return None, None


def _trajectories(stamps: Any, servers: Any) -> dict[str, Any]:
    """Each trajectory's real times, model turns, the replica that served it, its reward,
    data source and reward components, from the stamps rlotel's agent-loop workers put on it."""
    from rlotel.integrations import verl_v1

    if stamps is None:
        return {}
    parsed = [verl_v1.Stamp.read(stamp) for stamp in stamps]
    return {
        "start_time_ns": [stamp.start_ns for stamp in parsed],
        "end_time_ns": [stamp.end_ns for stamp in parsed],
        "turn_times_ns": [stamp.turn_times_ns for stamp in parsed],
        "replica": verl_v1.replicas(list(servers)) if servers is not None else None,
        **verl_v1.scored(parsed),
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


def v0_fit(original: Callable[..., Any]) -> Callable[..., Any]:
    """V0's `RayPPOTrainer.fit` (`trainer.use_v1=false`) declares its process the driver."""

    def fit(self, *args, **kwargs):
        with FIT.guarded():
            FIT.fault()
            declare_verl_driver(self.config, self.resource_pool_manager.get_n_gpus())
        try:
            return original(self, *args, **kwargs)
        finally:  # its last steps go out now; an exception of the loop itself propagates
            FIT.fired()  # counted where the loop's telemetry now is
            FIT.attempt(flush_driver)

    return fit


# --- install -----------------------------------------------------------------------------


# [low, high): what the e2e and unit tests run (constraints.txt, tests/e2e/engine-constraints.txt,
# the Makefile's engine venv). `rlotel doctor` compares every version it names with these.
TESTED = {
    "verl": ("0.9.1", "0.9.2"),
    "ray": ("2.60.0", "2.61.0"),
    "vllm": ("0.27.1", "0.27.2"),
    "torch": ("2.13.0", "2.13.1"),
    "transferqueue": ("0.1.11", "0.1.12"),
}
# The one floor: a release older than this and the plugin steps aside (verl's plugin entry
# point and Ray's tracing hook came then). From it on, each hook attaches where its target is
# there: a moved one is reported as not attached (`rlotel doctor`), the rest keep working. So
# too, with the "not tested" line, for a build on the way to the floor's release (0.9.0.dev,
# 0.9.0rc1: PEP 440 orders them below 0.9.0) and for a version that cannot be read.
SINCE = {"verl": "0.9.0", "ray": "2.41.0"}


def _parsed(version: str) -> Any:
    """`packaging.version.Version(version)`, None when it is not a PEP 440 version."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version)
    except InvalidVersion:
        return None


def unreadable(name: str) -> str | None:
    """What stands for `name`'s version where `name` imports here but its version cannot be
    read: the text of a version that is not PEP 440, or "(none)" (an empty version file; a
    tree without one and no distribution); None when it reads (or `name` is not installed)."""
    from rlotel.integrations.hooks import absence
    from rlotel.integrations.registered import installed_version

    version = installed_version(name)
    if version is None:
        return "(none)" if absence(name) is None else None
    return None if _parsed(version) is not None else version or "(none)"


def versions_outside(ranges: dict[str, tuple[str, str]]) -> list[str]:
    """`name version (range)` of each installed package outside its range, or whose
    version cannot be read."""
    from rlotel.integrations.registered import installed_version

    outside = []
    for name, (low, high) in ranges.items():
        cannot_read = unreadable(name)
        version = installed_version(name)
        if cannot_read is not None:
            outside.append(f"{name} {cannot_read} (a version it cannot read; >={low},<{high})")
        elif version is None:
            continue  # verl imports Ray lazily where it is not installed
        elif not _parsed(low) <= _parsed(version) < _parsed(high):
            outside.append(f"{name} {version} (>={low},<{high})")
    return outside


def too_old_for(since: dict[str, str]) -> list[str]:
    """`name >= low (found version)` of each installed package clearly older than it needs:
    a release before `low` (a build on the way to `low`, 0.9.0.dev, is not; nor is a
    version that cannot be read)."""
    from rlotel.integrations.registered import installed_version

    old = []
    for name, low in since.items():
        version = installed_version(name)
        parsed = None if version is None else _parsed(version)
        if parsed is not None and _parsed(parsed.base_version) < _parsed(low):
            old.append(f"{name} >= {low} (found {version})")
    return old


def install() -> None:
    """Attach every hook as its module is imported (idempotent), each on its own: a hook
    whose target moved is reported and the others work. Versions rlotel was not tested
    with (a dev build of a supported one, one it cannot read): one warning; a release older
    than the floor (`SINCE`): nothing attached."""
    from rlotel.integrations.registered import REGISTRY

    if REGISTRY.active:
        return
    too_old = too_old_for(SINCE)
    if too_old:
        log.warning(
            "rlotel: the verl plugin needs %s; nothing attached, training runs without rlotel",
            ", ".join(too_old),
        )
        return
    untested = versions_outside(TESTED)
    if untested:
        log.warning(
            "rlotel: the verl plugin was not tested with %s; each hook attaches where its "
            "target is there (`rlotel doctor` says which), and a call it cannot read runs "
            "verl's code untraced (rlotel_integration_failures_total)",
            ", ".join(untested),
        )
    _own_log_lines()
    REGISTRY.attach_on_import()


def not_attached() -> dict[str, str]:
    """The hooks of this process that could not attach, with why."""
    from rlotel.integrations.registered import REGISTRY

    return {
        name: status.why
        for name, status in REGISTRY.statuses().items()
        if status.state == State.NOT_ATTACHED
    }


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


def uninstall() -> None:
    """Undo every hook, each patched object as it was (tests; a process that wants verl
    back), and forget what the hooks held."""
    from rlotel.integrations.registered import REGISTRY

    REGISTRY.detach()


def patched() -> bool:
    from rlotel.integrations.registered import REGISTRY

    return REGISTRY.active


if env.enabled():
    try:
        install()
    except Exception:
        log.exception("rlotel: the verl plugin failed to install; training continues without it")
