"""The data half of the ledger: where a worker-group call's time went besides compute.

verl's single controller makes each call as dispatch (split the batch per rank) → submit
(pickle each rank's share, put it in Ray's object store, submit) → the ranks' replies →
fetch (`ray.get`: transfer and unpickle the replies) → collect (`concat`), then removes the
padding. The pickling of verl's batches (`DataProto.__getstate__`) is carved out of submit
as serialize, their unpickling (`__setstate__`) out of fetch as deserialize; the slowest
rank's unpickling of its arguments and pickling of its result are carved out of transfer
(as deserialize and serialize).

While the driver waits for the replies, the slowest rank (the one whose call took longest)
reports its call's seconds: TransferQueue reads (V1's data path), work and TransferQueue
writes; what is left of the wait is transfer (the batch's way to the rank and back:
object-store puts and transfer, scheduling), or wait where the call
carried no batch (V1 passes metadata: what is left is Ray's scheduling). A call whose ranks
report nothing keeps its wait whole. The driver's marks are contiguous, so the stages add
up to the call's wall time; `other` is what lies between verl's steps (padding removal,
glue). Bytes are what the batches hold (tensor and array `nbytes`), never a second pickling.
"""

from __future__ import annotations

from collections.abc import Mapping

DISPATCH, SUBMIT, FETCH, COLLECT, OTHER = "dispatch", "submit", "fetch", "collect", "other"
SERIALIZE, DESERIALIZE = "serialize", "deserialize"  # DataProto's pickling, either way
WAIT = "wait"  # the replies' wait not otherwise accounted for: not moving data
TRANSFER, READ, WORK, WRITE = "transfer", "read", "work", "write"  # the wait, split
STAGES = (
    DISPATCH, SERIALIZE, SUBMIT, WAIT, TRANSFER, DESERIALIZE, READ, WORK, WRITE, FETCH, COLLECT,
    OTHER,
)  # fmt: skip
MOVING = (DISPATCH, SERIALIZE, SUBMIT, TRANSFER, DESERIALIZE, READ, WRITE, FETCH, COLLECT)
SENT, RETURNED = "sent", "returned"  # to and from the ranks, with the call
DIRECTIONS = (SENT, RETURNED, READ, WRITE)  # read, write: the ranks' TransferQueue bytes


class DataMoves:
    """One phase's worker-group calls, summed call by call: seconds by stage, bytes by
    direction and the calls' wall time on the driver."""

    __slots__ = ("bytes", "calls", "phase", "seconds", "wall_s")

    def __init__(self, phase: str) -> None:
        self.phase = phase
        self.calls = 0
        self.wall_s = 0.0
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.bytes = dict.fromkeys(DIRECTIONS, 0)

    def add(self, call: Mapping[str, float]) -> None:
        """One call: `{stage: seconds, "<direction>_bytes": bytes, "wall_s": seconds}`."""
        self.calls += 1
        self.wall_s += call.get("wall_s", 0.0)
        for stage in STAGES:
            self.seconds[stage] += call.get(stage, 0.0)
        for direction in DIRECTIONS:
            self.bytes[direction] += int(call.get(f"{direction}_bytes", 0))

    @property
    def moving_s(self) -> float:
        """Seconds spent moving data: the stages that are neither waiting nor glue."""
        return sum(self.seconds[stage] for stage in MOVING)

    def facts(self) -> dict[str, float]:
        """What a verdict reads: seconds by stage, bytes by direction, calls, wall."""
        facts: dict[str, float] = {f"{stage}_s": value for stage, value in self.seconds.items()}
        facts.update({f"{direction}_bytes": value for direction, value in self.bytes.items()})
        facts.update(calls=self.calls, wall_s=self.wall_s)
        return facts


def moving_seconds(facts: Mapping[str, float]) -> float:
    """A phase's data-movement seconds from its `DataMoves.facts()`."""
    return sum(facts.get(f"{stage}_s", 0.0) for stage in MOVING)
