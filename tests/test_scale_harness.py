"""benchmarks/scale.py at two small sizes in one run: it completes through rlotel's own
driver-side functions (real Ray refs, GCS KV, /metrics and the traces file), and the
worker-group reply timing grows no faster than the ranks. A ratio, not an absolute time:
the exponent of the traced call across the two sizes, and the traced call against verl's own
`ray.get` of the same refs at the larger size (a wait per reply over every pending ref, the
old quadratic loop, took ~10× that at 256 ranks)."""

from __future__ import annotations

import pytest

from benchmarks import scale

SIZES = [8, 64]


@pytest.mark.slow
def test_the_scale_harness_runs_and_the_reply_timing_is_not_quadratic():
    results = scale.run(SIZES, steps_per_size=2)
    for n in SIZES:
        figures = results[n]
        assert figures["kv_entries"] == n and figures["kv_left"] == 0
        assert figures["spans_step"] == 1 + len(scale.PHASES)
        assert figures["series"] > 0
    wall = [results[n]["call_wall_ms"] for n in SIZES]
    assert scale.exponent(SIZES, wall) < 1.5, wall
    # every reply already in: rlotel's wait is one pass, no slower than verl's get of them
    assert results[SIZES[-1]]["call_wall_ms"] < 2 * results[SIZES[-1]]["ray_get_ms"] + 1, results
    print(scale.table(SIZES, results))
