"""verl's rollout Prometheus config (`rollout.prometheus.enable`): a replica per engine.

verl's writer, `verl.workers.rollout.utils.update_prometheus_config`, writes a whole
Prometheus config to `rollout.prometheus.file` on every node (Ray's own Prometheus reads
that file; verl then asks it to reload) with a `rollout` job of one static group listing
every engine's address. Those targets carry no `replica` and no `run`, which rlotel's
engine row and engine alerts group by, and nothing in them says which replica an address
is, so no relabelling on the Prometheus side can recover it.

With the plugin on, verl's own writer still does all of its work (its file, on its nodes,
its reload); only the config it writes differs: the `rollout` job gets one static group per
engine, labelled `replica` (verl's `replica_rank` of the replica serving at that address,
the replica rlotel's own per-replica series name) and `run` (the run's name, as the
trainer's series carry it), plus the metric relabelling that stores the engines' documented
`vllm:`/`sglang:` names (`engine_metrics.COLON_NAMES_RELABEL`). It does so by running
verl's function with a `ray` whose `remote(...)` wraps verl's `write_config_file` task: the
task receives the labelled config. Should a later verl write its file another way, its own
config is written unchanged and one warning says the engines have no replica.
"""

from __future__ import annotations

import copy
import functools
import logging
import sys
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlotel.integrations import guard, service
from rlotel.integrations.registered import PROMETHEUS_WRITER, ROLLOUT_REPLICA

log = logging.getLogger("rlotel")

ROLLOUT_JOB = "rollout"  # the job verl's writer lists the engines in
WRITE_TASK = "write_config_file"  # verl's per-node task that writes the file
REPLICAS = "replicas"  # ROLLOUT_REPLICA.state[REPLICAS]: verl's RolloutReplica objects here


# --- what the targets are ----------------------------------------------------------------


def note_replica(replica: Any) -> None:
    """A verl `RolloutReplica` made in this process (its address is known once it serves);
    forgotten when the hooks are detached."""
    ROLLOUT_REPLICA.state.setdefault(REPLICAS, weakref.WeakSet()).add(replica)
    ROLLOUT_REPLICA.fired()


def replica_ranks(addresses: Sequence[str]) -> list[str]:
    """Each address's replica: the `replica_rank` of the replica serving there, else its
    position in the list (verl lists its replicas in rank order from 0; its managers that
    start at a later rank hold replicas this process made, so their addresses are known)."""
    known = {}
    for replica in list(ROLLOUT_REPLICA.state.get(REPLICAS, ())):
        address, rank = (
            getattr(replica, "_server_address", None),
            getattr(replica, "replica_rank", None),
        )
        if isinstance(address, str) and isinstance(rank, int):
            known[address] = str(rank)
    return [known.get(address, str(index)) for index, address in enumerate(addresses)]


def labelled_config(config_data: Mapping[str, Any], run: str) -> dict[str, Any] | None:
    """verl's config with its rollout job as one labelled group per engine; None when it
    has no such job in the shape verl writes (then it is left as it is)."""
    from rlotel.schema import engine_metrics

    labelled = copy.deepcopy(dict(config_data))
    jobs = labelled.get("scrape_configs")
    if not isinstance(jobs, list):
        return None
    for job in jobs:
        if not isinstance(job, dict) or job.get("job_name") != ROLLOUT_JOB:
            continue
        groups = job.get("static_configs")
        if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
            return None
        addresses = [str(a) for group in groups for a in group.get("targets") or ()]
        job["static_configs"] = [
            {"targets": [address], "labels": {"replica": replica, "run": run}}
            for address, replica in zip(addresses, replica_ranks(addresses), strict=True)
        ]
        job["metric_relabel_configs"] = [copy.deepcopy(engine_metrics.COLON_NAMES_RELABEL)]
        return labelled
    return None


def caller_run(depth: int = 4) -> str:
    """The run's name as the trainer's telemetry has it: `RLOTEL_RUN`, else the caller's
    verl config (`self.config.trainer.experiment_name`, where every verl caller of the writer
    keeps it), else the current telemetry's, else verl's default."""
    from rlotel.base import env
    from rlotel.integrations.process import setting

    run = env.Environment.read().run
    if run:
        return run
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            break
        config = setting(frame.f_locals.get("self"), "config")
        name = setting(setting(config, "trainer"), "experiment_name")
        if name:
            return str(name)
        frame = frame.f_back
    import rlotel

    tel = rlotel.current()
    return service.of(tel).run if tel is not None else "verl"


# --- verl's writer, writing the labelled config ------------------------------------------


class _LabellingRay:
    """`ray` for verl's writer: everything is Ray's own, except that the task verl makes
    of `write_config_file` writes the labelled config."""

    def __init__(self, ray: Any, label: Callable[[Any], Any], labelled: list[bool]) -> None:
        self._ray, self._label, self._labelled = ray, label, labelled

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ray, name)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        decorate = self._ray.remote(*args, **kwargs)
        if args and callable(args[0]) and not kwargs:  # bare @ray.remote
            return self._wrap(args[0], decorate)

        def decorator(function: Callable[..., Any]) -> Any:
            return self._wrap(function, decorate(function))

        return decorator

    def _wrap(self, function: Callable[..., Any], task: Any) -> Any:
        if getattr(function, "__name__", "") != WRITE_TASK:
            return task
        return _LabelledTask(task, self._label, self._labelled)


class _LabelledTask:
    def __init__(self, task: Any, label: Callable[[Any], Any], labelled: list[bool]) -> None:
        self._task, self._label, self._labelled = task, label, labelled

    def options(self, *args: Any, **kwargs: Any) -> _LabelledTask:
        return _LabelledTask(self._task.options(*args, **kwargs), self._label, self._labelled)

    def remote(self, config_data: Any, *args: Any, **kwargs: Any) -> Any:
        with PROMETHEUS_WRITER.guarded():  # else verl's own config is written
            PROMETHEUS_WRITER.fault()
            PROMETHEUS_WRITER.fired()
            labelled = self._label(config_data)
            if labelled is not None:
                self._labelled.append(True)
                config_data = labelled
        return self._task.remote(config_data, *args, **kwargs)


def labelling_writer(original: Callable[..., Any]) -> Callable[..., Any]:
    """verl's `update_prometheus_config`, run as it is, writing the labelled config."""

    @functools.wraps(original)
    def update_prometheus_config(*args: Any, **kwargs: Any) -> Any:
        try:
            PROMETHEUS_WRITER.fault()
            run = caller_run()
            labelled: list[bool] = []
            ray = original.__globals__["ray"]
            scope = {
                **original.__globals__,
                "ray": _LabellingRay(ray, lambda c: labelled_config(c, run), labelled),
            }
            writer = types.FunctionType(
                original.__code__,
                scope,
                original.__name__,
                original.__defaults__,
                original.__closure__,
            )
            writer.__kwdefaults__ = original.__kwdefaults__
        except Exception as error:  # verl's writer runs as it is
            PROMETHEUS_WRITER.failed(error)
            return original(*args, **kwargs)
        result = writer(*args, **kwargs)
        if not labelled:
            guard.warn_once(
                "shape",
                "rlotel: verl's Prometheus writer did not write through %s as expected; its "
                "rollout targets have no replica or run label",
                WRITE_TASK,
            )
        return result

    update_prometheus_config.__rlotel_original__ = original  # type: ignore[attr-defined]
    return update_prometheus_config


# --- hooks -------------------------------------------------------------------------------


def traced_replica_init(original: Callable[..., None]) -> Callable[..., None]:
    """`RolloutReplica.__init__`: every replica made is known by its address later."""

    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        ROLLOUT_REPLICA.attempt(note_replica, self)

    return __init__
