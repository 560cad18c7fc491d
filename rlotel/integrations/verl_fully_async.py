"""verl's fully async policy (`verl.experimental.fully_async_policy`): its trainer is the driver.

verl runs a `FullyAsyncRollouter` and a `FullyAsyncTrainer` as Ray actors of their own, a
MessageQueue between them, and syncs parameters every `trigger_parameter_sync_step` trainer
steps. The trainer builds its `Tracking` in its actor's `__init__` and never goes through a
patched `fit`, so rlotel declares that process the driver there, before the `rlotel` logger
starts its telemetry: the experiment as the run, `/metrics` at the documented address,
`/targets`, the profiler links, role trainer, mode `fully_async`. Its `fit` flushes at the end.

- Windows: verl's timers, as everywhere; its `marked_timer("timing_s/param_sync", ...)` opens
  rlotel's `param_sync` window, verl's `timing_raw` keeps its own key and seconds.
- Samples: each `RolloutSample` the trainer takes from the queue carries its agent-loop
  per-sample metrics, lengths, weight versions and rlotel's trajectory stamp; they are
  recorded inside the trainer's `gen` (`assemble_batch_from_rollout_samples`), before verl
  reduces them to `fully_async/processing_time/*`. Staleness is verl's own: the versions are
  parameter syncs, so a sample's staleness is the trainer's `current_param_version` less
  its newest version, as verl counts `fully_async/count/stale_trajectory_processed`.
- Logs: verl logs a sync cycle's steps aggregated (`MetricsAggregator`), keyed by the
  parameter version, when the next cycle ends. rlotel takes each step's own metrics when
  verl hands them to the aggregator (`_fit_postprocess_step`), keyed by the step; verl's
  other logs of the fit (the rollouter's `fully_async/rollouter/*` at each sync) go with the
  next step's, and verl's aggregates are not taken twice.

Ray exports the trainer class by value, its methods and their globals as they are then, so
the replacements are module-level functions of this module (exported by reference), put in
place where verl imports the trainer's module, before the class is exported; in the actor
they find verl's originals through the same patches.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

from rlotel.integrations import guard, process, verl_workers
from rlotel.integrations.hooks import Hook, actor_class
from rlotel.integrations.registered import (
    FULLY_ASYNC_FIT,
    FULLY_ASYNC_INIT,
    FULLY_ASYNC_LOG,
    FULLY_ASYNC_PARAM_SYNC,
    FULLY_ASYNC_SAMPLES,
)
from rlotel.schema import vocabulary as voc

MODULE = "verl.experimental.fully_async_policy.fully_async_trainer"
ROLLOUTER_MODULE = "verl.experimental.fully_async_policy.fully_async_rollouter"
MODE = "fully_async"
VERL_PARAM_SYNC = voc.TIMING_S + voc.PARAM_SYNC  # verl's name for the sync's window (its key)
AGGREGATED_KEY = voc.TRAINING + "global_step"  # in every aggregate verl logs per cycle
BACKEND = "rlotel"


def _original(hook: Hook, name: str) -> Any:
    """verl's own `FullyAsyncTrainer.name` (this process's module, patched or not)."""
    from verl.experimental.fully_async_policy import fully_async_trainer as module

    return _verl_original(hook, actor_class(module.FullyAsyncTrainer), name)


def _module_original(hook: Hook, name: str) -> Any:
    from verl.experimental.fully_async_policy import fully_async_trainer as module

    return _verl_original(hook, module, name)


def _verl_original(hook: Hook, owner: Any, name: str) -> Any:
    """What `owner.name` was before the plugin patched it; as it is where nothing was (an
    uninstalled plugin put verl's own back)."""
    original = hook.original(owner, name)
    if getattr(original, "__module__", None) == __name__:
        raise RuntimeError(f"verl's own {name} is not known in this process")
    return original


# --- the rollouter actor -----------------------------------------------------------------


def rollouter_init(self, *args, **kwargs):
    """`FullyAsyncRollouter.__init__(config, ...)`: the run is the experiment, and the
    worker telemetry starts before verl's `__init__` makes the agent-loop and reward workers
    (an actor call carries the run only from a process whose telemetry runs)."""
    with FULLY_ASYNC_INIT.guarded():  # the rollouter's processes stay under the run `verl`
        FULLY_ASYNC_INIT.fault()
        run = guard.argument(args, kwargs, 0, "config").trainer.experiment_name
        verl_workers.hear_run(str(run) if run else None)
        verl_workers.worker_telemetry()  # now: the calls it makes from here carry the run
    from verl.experimental.fully_async_policy import fully_async_rollouter as module

    rollouter = actor_class(module.FullyAsyncRollouter)
    _verl_original(FULLY_ASYNC_INIT, rollouter, "__init__")(self, *args, **kwargs)


# --- the trainer actor -------------------------------------------------------------------


def trainer_init(self, *args, **kwargs):
    """`FullyAsyncTrainer.__init__(config, tokenizer, role_worker_mapping,
    resource_pool_manager, ...)`: the process is the driver before verl's `Tracking` starts
    the `rlotel` logger's telemetry."""
    with FULLY_ASYNC_INIT.guarded():  # the trainer starts with a worker's telemetry instead
        FULLY_ASYNC_INIT.fault()
        config = guard.argument(args, kwargs, 0, "config")
        pools = guard.argument(args, kwargs, 3, "resource_pool_manager")
        process.declare_verl_driver(config, pools.get_n_gpus())
    _original(FULLY_ASYNC_INIT, "__init__")(self, *args, **kwargs)
    FULLY_ASYNC_INIT.attempt(_started, self)


def _started(trainer: Any) -> None:
    if not process.is_driver():
        return
    process.telemetry().set_mode(MODE)
    FULLY_ASYNC_INIT.fired()
    loggers = trainer.logger.logger
    if BACKEND in loggers and not isinstance(loggers[BACKEND], StepLogs):
        loggers[BACKEND] = StepLogs(loggers[BACKEND])


async def trainer_fit(self, *args, **kwargs):
    """`FullyAsyncTrainer.fit`: verl's logs during it go with the steps; at its end, what is
    left of them goes out and the driver's last steps are exported."""
    FULLY_ASYNC_FIT.attempt(_fitting, self, True)
    try:
        return await _original(FULLY_ASYNC_FIT, "fit")(self, *args, **kwargs)
    finally:  # an exception of the loop itself propagates
        FULLY_ASYNC_FIT.attempt(_fitting, self, False)
        FULLY_ASYNC_FIT.fired()
        FULLY_ASYNC_FIT.attempt(process.flush_driver)


def _fitting(trainer: Any, fitting: bool) -> None:
    logs = _step_logs(trainer)
    if logs is not None:
        logs.fitting(fitting)


def postprocess_step(self, *args, **kwargs):
    """`_fit_postprocess_step`: verl hands the step's metrics to its aggregator and counts
    the step; rlotel logs them under that step."""
    result = _original(FULLY_ASYNC_LOG, "_fit_postprocess_step")(self, *args, **kwargs)
    FULLY_ASYNC_LOG.attempt(_log_step, self)
    return result


def _log_step(trainer: Any) -> None:
    logs = _step_logs(trainer)
    if logs is not None:
        FULLY_ASYNC_LOG.fault()
        logs.step(dict(trainer.metrics), trainer.global_steps - 1)


def _step_logs(trainer: Any) -> StepLogs | None:
    backend = trainer.logger.logger.get(BACKEND)
    return backend if isinstance(backend, StepLogs) else None


class StepLogs:
    """The `rlotel` logger of the fully async trainer's `Tracking`: each step's own metrics
    (`step`), verl's other logs of the fit with the next step's, verl's aggregates of steps
    already logged dropped. Outside `fit` verl's logs pass as they are (its sync and
    validation before training, at step 0). Never raises into verl's loop over loggers."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._fitting = False
        self._pending: dict[str, Any] = {}
        self._pending_step: Any = None

    def fitting(self, fitting: bool) -> None:
        self._fitting = fitting
        if not fitting and self._pending:
            self._send(self._pending_step)

    def log(self, *args: Any, **kwargs: Any) -> None:
        with FULLY_ASYNC_LOG.guarded():
            FULLY_ASYNC_LOG.fault()
            data = guard.argument(args, kwargs, 0, "data")
            step = guard.argument(args, kwargs, 1, "step")
            if AGGREGATED_KEY in data:  # the steps of a sync cycle, each logged already
                FULLY_ASYNC_LOG.fired()
                return
            if not self._fitting:
                self.backend.log(data=data, step=step)
                return
            self._pending.update(data)
            self._pending_step = step

    def step(self, metrics: dict[str, Any], number: int) -> None:
        """Step `number`'s metrics, with verl's logs since the last step."""
        self._pending.update(metrics)
        self._send(number)

    def _send(self, step: Any) -> None:
        data, self._pending = self._pending, {}
        self.backend.log(data=data, step=step)

    def finish(self, *args: Any, **kwargs: Any) -> None:
        self.backend.finish(*args, **kwargs)


# --- the trainer's module ----------------------------------------------------------------


def marked_timer(name: str, timing_raw: dict[str, float], *args: Any, **kwargs: Any) -> Any:
    """verl's `marked_timer` in the trainer's module; `timing_s/param_sync` as rlotel's
    `param_sync` window (any other name: verl's timer, untouched)."""
    original = _module_original(FULLY_ASYNC_PARAM_SYNC, "marked_timer")
    if name != VERL_PARAM_SYNC:
        return original(name, timing_raw, *args, **kwargs)
    return _param_sync(original, name, timing_raw, args, kwargs)


@contextlib.contextmanager
def _param_sync(
    original: Any, name: str, timing_raw: dict[str, float], args: tuple, kwargs: dict
) -> Iterator[None]:
    """verl's timer under rlotel's name, into verl's own dict (the step's: rlotel credits a
    window timed into another dict to the step that dict is merged into); its seconds then
    move to `timing_raw[name]`, as verl's, and `timing_raw` is left otherwise as it was."""
    renamed = True
    before = timing_raw.get(voc.PARAM_SYNC)
    try:
        FULLY_ASYNC_PARAM_SYNC.fault()
        timer = original(voc.PARAM_SYNC, timing_raw, *args, **kwargs)
        FULLY_ASYNC_PARAM_SYNC.fired()
    except Exception as error:
        FULLY_ASYNC_PARAM_SYNC.failed(error)
        renamed, timer = False, original(name, timing_raw, *args, **kwargs)
    try:
        with timer:
            yield
    finally:
        if renamed:
            seconds = timing_raw.pop(voc.PARAM_SYNC, 0) - (before or 0)
            if before is not None:
                timing_raw[voc.PARAM_SYNC] = before
            timing_raw[name] = timing_raw.get(name, 0) + seconds


def assemble_batch(rollout_samples: Any, *args: Any, **kwargs: Any) -> Any:
    """`assemble_batch_from_rollout_samples(rollout_samples, ...)` in the trainer's `gen`:
    the samples' per-sample metrics recorded before verl pops and reduces them."""
    with FULLY_ASYNC_SAMPLES.guarded():  # telemetry never stops training
        FULLY_ASYNC_SAMPLES.fault()
        record(rollout_samples, _caller_param_version(sys._getframe(1)))
    original = _module_original(FULLY_ASYNC_SAMPLES, "assemble_batch_from_rollout_samples")
    return original(rollout_samples, *args, **kwargs)


def _caller_param_version(frame: FrameType | None) -> int | None:
    """The trainer's `current_param_version`, read from the caller (`_get_samples_from_queue`)."""
    for _ in range(3):
        if frame is None:
            return None
        version = getattr(frame.f_locals.get("self"), "current_param_version", None)
        if isinstance(version, int):
            return version
        frame = frame.f_back
    return None


def record(rollout_samples: Sequence[Any], param_version: int | None) -> None:
    """The per-sample fields of the queue's `RolloutSample`s → `record_samples`."""
    tel = process.telemetry()
    step = tel.current_step
    fields = sample_fields(
        [sample.full_batch for sample in rollout_samples],
        step.number if step is not None else None,
        param_version,
    )
    if fields is not None:
        records = fields.pop("records")
        FULLY_ASYNC_SAMPLES.fired()
        tel.record_samples(records, **fields)


def sample_fields(
    outputs: Sequence[Any], step: int | None, param_version: int | None
) -> dict[str, Any] | None:
    """`record_samples`' arguments from the agent loop's outputs (one DataProto a prompt,
    a row a sample): verl's per-sample metric dicts (`records`), lengths, identity, weight
    versions re-based so that staleness is verl's, and what rlotel's agent-loop workers
    stamped (taken out: verl's batch stays its own). None: no per-sample metrics."""
    from rlotel.integrations import verl_v1

    records: list[dict] = []
    prompt: list[int] = []
    response: list[int] = []
    uids: list[str] = []
    outputs_index: list[int] = []
    low: list[Any] = []
    high: list[Any] = []
    stamps: list[Any] = []
    servers: list[Any] = []
    for output in outputs:
        metrics = list((getattr(output, "meta_info", None) or {}).get("metrics") or ())
        columns = output.non_tensor_batch
        rows = len(metrics)
        records.extend(metrics)
        batch = getattr(output, "batch", None)
        if batch is not None and "attention_mask" in batch and "prompts" in batch:
            mask, width = batch["attention_mask"], batch["prompts"].shape[1]  # as verl counts
            prompt.extend(int(n) for n in mask[:, :width].sum(-1))
            response.extend(int(n) for n in mask[:, width:].sum(-1))
        uids.extend(str(uid) for uid in columns.get("uid", [None] * rows))
        outputs_index.extend(range(rows))
        low.extend(columns.get("min_global_steps", [None] * rows))
        high.extend(columns.get("max_global_steps", [None] * rows))
        stamps.extend(columns.pop(verl_v1.STAMP_KEY, [None] * rows))
        servers.extend(columns.pop(verl_v1.SERVER_KEY, [None] * rows))
    if not records:
        return None
    fields: dict[str, Any] = {"records": records, "uid": uids, "output": outputs_index}
    if len(prompt) == len(records):
        fields[voc.PROMPT_LENGTH], fields[voc.RESPONSE_LENGTH] = prompt, response
    versions = rebased_versions(low, high, step, param_version)
    if versions is not None:
        fields["min_weight_version"], fields["max_weight_version"] = versions
    parsed = [verl_v1.Stamp.read(stamp) for stamp in stamps]
    if all(stamp.start_ns is not None for stamp in parsed):
        fields["start_time_ns"] = [stamp.start_ns for stamp in parsed]
        fields["end_time_ns"] = [stamp.end_ns for stamp in parsed]
        fields["turns"] = [stamp.turns for stamp in parsed]
        fields["turn_times_ns"] = [stamp.turn_times_ns for stamp in parsed]
        fields["tool_times_ns"] = [stamp.tool_times_ns for stamp in parsed]
        fields["trajectory_context"] = [stamp.context for stamp in parsed]
    fields.update(verl_v1.scored(parsed))
    replica = verl_v1.replicas(servers)
    if replica is not None:
        fields["replica"] = replica
    return fields


def rebased_versions(
    low: Sequence[Any], high: Sequence[Any], step: int | None, param_version: int | None
) -> tuple[list[int], list[int]] | None:
    """verl's per-sample `min/max_global_steps` (parameter versions) shifted so that rlotel's
    staleness, (step − 1) − newest, is verl's: `current_param_version` − newest (they are
    the same versions when the parameters sync after every step). None: a version missing."""
    if any(v is None for v in (*low, *high)):
        return None
    shift = 0 if step is None or param_version is None else (step - 1) - param_version
    return [int(v) + shift for v in low], [int(v) + shift for v in high]
