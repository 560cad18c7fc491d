"""Test probe, not part of rlotel: the test's own count of what verl's ranks read from and
write to TransferQueue, made where verl itself turns metadata into batches and back
(`verl.utils.transferqueue_utils`: `_async_meta_to_realdata`, `_async_update_meta_with_output`,
which verl's `tqbridge` looks up at call time), one line per hop into
`$RLOTEL_TEST_TQ_PROBE/<pid>.jsonl`. Loaded in every verl process through verl's own hook
(`VERL_USE_EXTERNAL_MODULES=...,rlotel_test_tq_probe`) when the harness asks.

Sizes are counted apart from rlotel: a tensor's elements × element size (a jagged tensor's
values), a non-tensor column's items (each a reference, as a numpy object column holds them).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDictBase
from verl.utils import transferqueue_utils as bridge


def size(value: Any) -> tuple[int, int]:
    """(tensor bytes, non-tensor items) of a batch, walking it key by key."""
    if isinstance(value, torch.Tensor):
        held = value.values() if value.is_nested else value
        return held.numel() * held.element_size(), 0
    if isinstance(value, NonTensorStack):
        return 0, len(value.tolist())
    if isinstance(value, NonTensorData):
        return 0, 0  # one value for the whole batch (verl's meta_info)
    if isinstance(value, TensorDictBase):
        tensors = items = 0
        for key in value.keys():  # noqa: SIM118 (iterating a TensorDict gives its rows)
            more, also = size(value.get(key))
            tensors, items = tensors + more, items + also
        return tensors, items
    return 0, 0


def record(op: str, started: float, batch: Any) -> None:
    tensors, items = size(batch)
    line = {
        "op": op,
        "start": started,
        "end": time.time(),
        "tensor_bytes": tensors,
        "non_tensor_items": items,
        "pid": os.getpid(),
        "rank": os.environ.get("RANK"),
    }
    path = Path(os.environ["RLOTEL_TEST_TQ_PROBE"]) / f"{os.getpid()}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(line) + "\n")


_read, _write = bridge._async_meta_to_realdata, bridge._async_update_meta_with_output


async def _async_meta_to_realdata(meta: Any) -> Any:
    started = time.time()
    batch = await _read(meta)
    record("get", started, batch)
    return batch


async def _async_update_meta_with_output(output: Any, meta: Any, func_name: Any = None) -> Any:
    started = time.time()
    written = await _write(output, meta, func_name)
    fields = [k for k, v in output.items() if isinstance(v, (torch.Tensor, NonTensorStack))]
    record("put", started, output.select(*fields) if fields else None)
    return written


if os.environ.get("RLOTEL_TEST_TQ_PROBE"):
    bridge._async_meta_to_realdata = _async_meta_to_realdata
    bridge._async_update_meta_with_output = _async_update_meta_with_output
