"""Span and trace ids do not follow the global `random` seed the training code sets."""

from __future__ import annotations

import os
import random

from rlotel.base import ids


def test_ids_ignore_the_global_seed() -> None:
    random.seed(0)
    first = [ids.span_id(), ids.trace_id()]
    random.seed(0)
    second = [ids.span_id(), ids.trace_id()]
    assert first[0] != second[0] and first[1] != second[1]
    assert 0 < first[0] < 2**64 and 0 < first[1] < 2**128


def test_a_forked_child_draws_other_ids() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id, as the parent's next would be without a reseed
        os.write(write, ids.span_id().to_bytes(8, "big"))
        os._exit(0)
    os.waitpid(pid, 0)
    child = int.from_bytes(os.read(read, 8), "big")
    assert child != ids.span_id()
