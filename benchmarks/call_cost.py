"""What the data ledger adds to one worker-group call on the driver.

    python benchmarks/call_cost.py [--ranks 8] [--calls 2000]

verl's own `func_generator` (verl.single_controller.ray.base) builds the call, as a worker
group binds each method: a dispatch that splits a `DataProto` per rank (verl's
`dispatch_dp_compute_data_proto`), an execute that returns real object refs already in
(`ray.put` replies, so nothing waits on workers), verl's `ray.get` and its `collect_fn`
(`collect_dp_compute_data_proto`: concat). The same call is made with rlotel's hook on,
inside a `tel.step` / `tel.phase` (every stage marked, bytes counted, the call recorded,
the replies timed), and with verl's function as it is, alternating 50 calls at a time; the
figure is the difference of the medians of the turns' per-call medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import numpy as np
import ray
import torch
from verl import DataProto
from verl.single_controller.base.decorator import (
    collect_dp_compute_data_proto,
    dispatch_dp_compute_data_proto,
)
from verl.single_controller.base.worker_group import WorkerGroup
from verl.single_controller.ray.base import func_generator

import rlotel
from rlotel.integrations import verl_workers


class Group(WorkerGroup):
    """verl's worker group as its dispatch and collect functions read it: its world size
    (the number of its workers; no actor is started)."""

    def __init__(self, ranks: int) -> None:
        self._workers = [None] * ranks


CHUNK = 50  # calls a turn: verl alone, then watched, alternating


def timed(call, batch: DataProto, calls: int) -> float:
    """Median seconds of one call."""
    seconds = []
    for _ in range(calls):
        started = time.perf_counter()
        call(batch)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = 8 * args.ranks
    batch = DataProto.from_dict(
        tensors={"input_ids": torch.ones(rows, 64, dtype=torch.long)},
        non_tensors={"uid": np.array([str(i) for i in range(rows)], dtype=object)},
    )
    replies = [ray.put(share) for share in batch.chunk(args.ranks)]

    def execute(method_name, *args_, **kwargs):
        return list(replies)

    call = (
        Group(args.ranks),
        "update_actor",
        dispatch_dp_compute_data_proto,
        collect_dp_compute_data_proto,
        execute,
        True,
    )
    plain = func_generator(*call)
    watched = verl_workers.traced_func_generator(func_generator)(*call)
    tel = rlotel.init(run="call-cost", prometheus_port=None)
    offs, ons = [], []
    for chunk in range(args.calls // CHUNK + 1):  # interleaved, the first chunk a warm-up
        off = timed(plain, batch, CHUNK)
        with tel.step(chunk + 1), tel.phase("update_actor"):
            on = timed(watched, batch, CHUNK)
        if chunk:
            offs.append(off)
            ons.append(on)
    off, on = statistics.median(offs), statistics.median(ons)
    tel.shutdown()
    ray.shutdown()
    print(
        f"worker-group call, {args.ranks} ranks, {batch.batch['input_ids'].nbytes} B tensor: "
        f"verl alone {off * 1e6:.0f} µs, with rlotel's data ledger {on * 1e6:.0f} µs, "
        f"added {(on - off) * 1e6:.0f} µs a call (×{on / off:.3f})"
    )


if __name__ == "__main__":
    main()
