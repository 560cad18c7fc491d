"""A real rlotel traces file of many steps, for the offline tools' benchmarks: verl's seven
phases around a little work, per-sample timings every step (the slowest few become sample
spans), tokens and MFU. Written through `rlotel.init(traces_file=...)`, untimed.

With `ranks`, the run is a worker group's as well: in `CALLS` the driver records every
rank's seconds (the slowest named on the phase's span) and each rank's own rlotel writes its
traces file — a span for every call made to it, under the driver's phase (the carrier a
worker-group call sends) — as a verl worker does, one process after another."""

from __future__ import annotations

import random
from pathlib import Path

import rlotel
from rlotel.integrations.data_moves import RankReply
from rlotel.record.ranks import RankTime
from rlotel.schema import attributes as attr
from rlotel.schema import data_moves as dm

PHASES = ["gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"]
CALLS = ("old_log_prob", "update_actor")  # a call to every rank each, as verl's actor group
RANKS_A_NODE = 8


def write_traces(
    path: Path, steps: int, samples: int, update_work: int = 200, seed: int = 0, ranks: int = 0
) -> dict[tuple[int, str], dict[str, str]]:
    """`update_work`: the loop length of `update_actor` (the others do 200). Returns the
    carrier of each (step, phase) in `CALLS` when `ranks`, for `write_rank_traces`."""
    rng = random.Random(seed)
    carriers: dict[tuple[int, str], dict[str, str]] = {}
    tel = rlotel.init(run="bench", prometheus_port=None, traces_file=path)
    for number in range(1, steps + 1):
        with tel.step(number) as step:
            for phase in PHASES:
                with tel.phase(phase):
                    sum(range(update_work if phase == "update_actor" else 200))
                    if phase == "gen":
                        tel.record_samples(
                            generate_sequences=[rng.lognormvariate(0, 0.6) for _ in range(samples)],
                            tool_calls=[rng.random() * 0.1 for _ in range(samples)],
                            compute_score=[0.001] * samples,
                            prompt_length=[64] * samples,
                            response_length=[rng.randint(16, 512) for _ in range(samples)],
                        )
                    if ranks and phase in CALLS:
                        carriers[number, phase] = tel.current_context()
                        record_call(tel, rng, ranks)
            step.set_tokens(prompt=[64] * samples, response=[256] * samples)
            step.set_mfu(actor=0.3 + 0.05 * rng.random())
        if number % 100 == 0:
            tel.flush(60)  # untimed: keeps the export queues from dropping spans
    tel.shutdown(120)
    return carriers


def record_call(tel: rlotel.Telemetry, rng: random.Random, ranks: int) -> None:
    """What the verl plugin records on the driver for one worker-group call: every rank's
    seconds to reply and its compute, and the call's data movement by stage and bytes."""
    seconds = {rank: 1 + rng.random() for rank in range(ranks)}
    tel.record_rank_seconds(seconds)
    tel.record_rank_compute(
        {rank: RankReply(None, s * 0.8, s * 0.2) for rank, s in seconds.items()}
    )
    stages = {stage: 1e-6 * rng.random() for stage in dm.STAGES}  # within the µs phase
    tel.record_data_moves(
        {**stages, "wall_s": sum(stages.values()), "sent_bytes": 1 << 26, "returned_bytes": 1 << 20}
    )


def write_rank_traces(
    directory: Path, carriers: dict[tuple[int, str], dict[str, str]], ranks: int
) -> None:
    """`rank-N.jsonl` for each rank: its rlotel (role, rank and node on the resource) with a
    span for every call in `carriers`, under the driver's phase."""
    for rank in range(ranks):
        tel = rlotel.init(
            run="bench",
            prometheus_port=None,
            traces_file=directory / f"rank-{rank}.jsonl",
            resource_attributes={
                attr.ROLE: "actor",
                attr.RANK: rank,
                attr.NODE: f"node-{rank // RANKS_A_NODE}",
            },
        )
        for (_, phase), carrier in carriers.items():
            call = tel.phase(phase, context=carrier)
            with call:  # a rank's compute and collective seconds, as its traced call sends them
                call.trace.rank_time = RankTime(phase, "actor", rank, 0.8, 0.2, 4)
        tel.shutdown(60)
