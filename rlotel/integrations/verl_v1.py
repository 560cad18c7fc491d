"""verl's V1 trainer (`trainer.use_v1`, verl 0.9.x): per-sample tails, weight versions, mode.

V1 writes each finished trajectory to TransferQueue from the agent-loop workers and never
reduces the per-sample metrics. rlotel captures them in the *trainer*, when the replay
buffer hands a batch to `_step_once` (`ReplayBuffer._materialize_batch`, shared by the
sync and async buffers and by custom samplers that subclass them): that is the one
process that knows which step consumes a trajectory, so staleness is computed against the
right step, the samples land in the ledger step under `gen` (exemplars and sample spans in
the trainer's trace), and nothing needs rlotel running in the rollout workers. The batch's
tags carry verl's `min_global_steps` / `max_global_steps` and lengths; one extra
TransferQueue read fetches the per-sample `metrics`.

The trainer's mode (`sync`, `colocate_async`, `separate_async`) is read when `fit` starts and
switches the goodput table (V1's `gen` is the trainer waiting in async modes).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("rlotel")

TRAIN_PARTITION = "train"
_installed: dict[str, tuple[Any, str, Any]] = {}


def install() -> None:
    """Patch V1's replay buffer and trainer (idempotent; needs the
    `transferqueue` package: without it V1 cannot run and nothing is patched)."""
    if _installed:
        return
    try:
        from verl.trainer.ppo.v1 import replay_buffer, trainer_base
    except Exception as error:  # V1 needs transferqueue and verl's serving extras
        log.info("rlotel: verl V1 trainer not available (%r); V1 capture off", error)
        return
    _patch(replay_buffer.ReplayBuffer, "_materialize_batch", _materialize_batch)
    _patch(trainer_base.PPOTrainer, "fit", _fit)


def uninstall() -> None:
    for owner, name, original in _installed.values():
        setattr(owner, name, original)
    _installed.clear()


def _patch(owner: Any, name: str, make: Any) -> None:
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    _installed[f"{owner.__name__}.{name}"] = (owner, name, original)


def _materialize_batch(original: Any) -> Any:
    def _materialize_batch(self, partition_id, selected_prompt_uids, partition_snapshot):
        batch = original(self, partition_id, selected_prompt_uids, partition_snapshot)
        if partition_id == TRAIN_PARTITION:
            try:
                record_batch(batch)
            except Exception as error:  # telemetry never stops training
                log.warning("rlotel: V1 samples not recorded: %r", error)
        return batch

    return _materialize_batch


def record_batch(batch: Any, fetch: Any = None) -> dict[int, str]:
    """Per-sample metrics, lengths and weight versions of a V1 `KVBatchMeta` → record_samples.

    `fetch(keys, partition_id)` returns the stored per-sample `metrics` dicts in key order
    (default: one `transfer_queue.kv_batch_get`)."""
    from rlotel.integrations.process import telemetry

    real = [
        (key, tag)
        for key, tag in zip(batch.keys, batch.tags, strict=True)
        if not tag.get("is_padding", False)
    ]
    if not real:
        return {}
    keys, tags = [key for key, _ in real], [tag for _, tag in real]
    metrics = (fetch or _fetch)(keys, batch.partition_id)
    return telemetry().record_samples(
        metrics,
        prompt_length=[tag.get("prompt_len") for tag in tags],
        response_length=[tag.get("response_len") for tag in tags],
        min_weight_version=[tag.get("min_global_steps") for tag in tags],
        max_weight_version=[tag.get("max_global_steps") for tag in tags],
    )


def _fetch(keys: list[str], partition_id: str) -> list[Any]:
    import transfer_queue as tq

    data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["metrics"])
    return [dict(metrics) for metrics in data["metrics"]]


def _fit(original: Any) -> Any:
    def fit(self, *args, **kwargs):
        try:
            set_mode(getattr(self, "trainer_mode", "sync"))
        except Exception as error:
            log.warning("rlotel: V1 trainer mode not read: %r", error)
        return original(self, *args, **kwargs)

    return fit


def set_mode(mode: str) -> None:
    """Goodput buckets for verl's trainer mode (V1's `gen` is waiting in async modes)."""
    from rlotel.integrations.process import telemetry

    ledger = telemetry().ledger
    ledger.phase_buckets = ledger.phase_buckets.for_mode(str(mode))
