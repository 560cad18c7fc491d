"""Trace and span ids from a generator of rlotel's own.

Training code seeds Python's global `random` for reproducibility — verl seeds every worker
and rollout server alike — so ids drawn from it repeat across processes: a rollout server's
span got the very id of the agent-loop span that called it (a span its own parent). This
generator is seeded from the OS at import and again in every forked child.
"""

from __future__ import annotations

import os
import random

_generator = random.Random()  # seeded from os.urandom
os.register_at_fork(after_in_child=_generator.seed)
_bits = _generator.getrandbits


def span_id() -> int:
    return _bits(64) or 1


def trace_id() -> int:
    return _bits(128) or 1
