"""Test stand-in: a user's reward that calls something slow (a sandbox, a judge) — where real
runs hang. Each call takes `sleep_s` and one runs at a time (the one sandbox); from call
`block_after` + 1 on it blocks forever, and the first blocked call writes the time it
blocked to `mark`. verl passes these as `reward.custom_reward_function.reward_kwargs`; the
score is the dense toy reward's (`rlotel_test_reward`)."""

from __future__ import annotations

import json
import threading
import time

_one_at_a_time = threading.Lock()
_calls = [0]


def compute_score(
    data_source,
    solution_str,
    ground_truth,
    extra_info=None,
    sleep_s: float = 0.0,
    block_after: int | None = None,
    mark: str | None = None,
    **kwargs,
) -> float:
    with _one_at_a_time:
        _calls[0] += 1
        if block_after is not None and _calls[0] > block_after:
            if mark:
                with open(mark, "w") as out:
                    json.dump({"blocked_unix_s": time.time(), "call": _calls[0]}, out)
            threading.Event().wait()  # the sandbox never answers
        time.sleep(sleep_s)
    text = solution_str or ""
    digits = sum(c.isdigit() for c in text) / max(1, len(text))
    return digits + (1.0 if str(ground_truth) in text else 0.0)
