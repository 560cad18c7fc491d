"""What timing torch.distributed's collectives adds to each call (rlotel.integrations.collectives).

Two gloo ranks (processes) on loopback, one-element tensors, so the collective itself is as
cheap as it gets and the ratio is the worst case. Per call, side by side in interleaved
rounds (the same sequence on both ranks, which the collectives keep in step):

- off:    torch.distributed unwrapped;
- idle:   wrapped, no traced worker call open (every call outside worker phases);
- open:   wrapped, inside a traced worker call's account (what a worker phase pays).

For `all_reduce` (sync), `all_reduce(async_op=True).wait()`, `all_gather_into_tensor`
(deprecated → `all_gather_single`: one count for two wrapped calls) and `barrier`.
Also the driver's reply path of a worker-group call (the request, unwrapping the replies).
Prints the median of round medians per call and each variant's ratio to `off`. On a
loaded machine two processes' loopback round trips vary by more than the wrapper costs, so
the wrapper's own CPU per call is also measured alone, in-process (timeit, best of rounds):
the same wrapper around a function that does nothing, idle and with an account open.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import timeit
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROUNDS, CALLS = 9, 300


def operations() -> dict:
    tensor, gathered = torch.ones(1), torch.zeros(2)
    return {
        "all_reduce": lambda: dist.all_reduce(tensor),
        "all_reduce async+wait": lambda: dist.all_reduce(tensor, async_op=True).wait(),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(gathered, tensor),
        "barrier": lambda: dist.barrier(),
    }


def per_call_us(operation, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        operation()
    return (time.perf_counter() - started) / calls * 1e6


def rank_main(rank: int, world: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", FutureWarning)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from rlotel.integrations import collectives

    times: dict[tuple[str, str], list[float]] = {}
    variants = ("off", "idle", "open")
    for round_ in range(ROUNDS):
        order = variants[round_ % 3 :] + variants[: round_ % 3]  # no variant always first
        for name, operation in operations().items():
            for variant in order:
                if variant == "off":
                    collectives.uninstall()
                else:
                    collectives.install()
                tally = collectives.open_tally() if variant == "open" else None
                per_call_us(operation, 20)  # warm
                us = per_call_us(operation, CALLS)
                if tally is not None:
                    collectives.close_tally(tally)
                times.setdefault((name, variant), []).append(us)
    if rank == 0:
        results.update({key: statistics.median(values) for key, values in times.items()})
    dist.destroy_process_group()


def wrapper_us() -> dict[str, float]:
    """The wrapper's own added CPU per call (µs), around a function that does nothing."""
    from rlotel.integrations import collectives

    def noop(*args, **kwargs):
        return None

    def noop_wait(self, *args, **kwargs):
        return True

    timed, timed_wait, work = collectives._timed(noop), collectives._timed_wait(noop_wait), object()
    tensor = torch.ones(1)
    n = 20000

    def best(function) -> float:
        return min(timeit.repeat(function, number=n, repeat=ROUNDS)) / n * 1e6

    base = best(lambda: noop(tensor))
    base_wait = best(lambda: noop_wait(work))
    result = {
        "call, idle": best(lambda: timed(tensor)) - base,
        "wait, idle": best(lambda: timed_wait(work)) - base_wait,
    }
    tally = collectives.open_tally()
    result["call, open"] = best(lambda: timed(tensor)) - base
    result["wait, open"] = best(lambda: timed_wait(work)) - base_wait
    collectives.close_tally(tally)
    return result


def reply_path_us(ranks: int = 8) -> dict[str, float]:
    """The driver's side of a blocking worker-group call on `ranks` ranks that send their
    compute seconds back: the reply request on each submit's carrier, and unwrapping the
    replies (recording them into the open phase) before verl collects them."""
    import rlotel
    from rlotel.integrations import verl_workers
    from rlotel.integrations.data_moves import RankReply

    tel = rlotel.init(run="bench", prometheus_port=None)
    carrier = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    replies = [RankReply(rank, 0.1 * rank, 0.5) for rank in range(ranks)]
    plain = list(range(ranks))
    n = 5000

    def best(function) -> float:
        return min(timeit.repeat(function, number=n, repeat=ROUNDS)) / n * 1e6

    def request() -> None:
        token = verl_workers._replies_wanted.set(True)
        for _ in range(ranks):
            if verl_workers._replies_wanted.get():
                {**carrier, verl_workers.REPLY_KEY: "1"}  # noqa: B018 — what each submit adds
        verl_workers._replies_wanted.reset(token)

    try:
        with tel.step(1), tel.phase("update_actor"):
            result = {
                f"request on {ranks} submits": best(request),
                f"unwrap {ranks} replies": best(lambda: verl_workers.open_replies(list(replies))),
                f"unwrap {ranks} plain": best(lambda: verl_workers.open_replies(list(plain))),
            }
    finally:
        tel.shutdown()
    return result


def main() -> None:
    added = wrapper_us()
    print("wrapper's own CPU per call (in-process, best of rounds):")
    print("  " + "   ".join(f"{name} +{us:.2f} µs" for name, us in added.items()))
    print("driver's reply path per blocking worker-group call:")
    print("  " + "   ".join(f"{name} {us:.2f} µs" for name, us in reply_path_us().items()))
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(rank_main, args=(2, 29400 + os.getpid() % 500, results), nprocs=2)
        results = dict(results)
    print(f"collective timing, 2 gloo ranks, 1-element tensors, {ROUNDS} rounds x {CALLS} calls")
    for name in operations():
        off, idle, opened = (results[name, variant] for variant in ("off", "idle", "open"))
        print(
            f"  {name:24s} off {off:7.1f} µs   idle {idle:7.1f} µs ({idle / off:.3f}x, "
            f"{idle - off:+.2f} µs)   open {opened:7.1f} µs ({opened / off:.3f}x, "
            f"{opened - off:+.2f} µs)   wrapper alone: {added['call, open'] / off:.4f}x"
        )


if __name__ == "__main__":
    main()
