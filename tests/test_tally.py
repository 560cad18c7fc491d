"""Tallies (counts per distinct integer) against numpy on the expanded values."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from rlotel.base.tally import CHUNK, DENSE_RANGE, Tally, ordered_pairs
from rlotel.schema import catalogue as cat
from rlotel.series.store import _Histogram

integers = arrays(
    np.int64,
    st.integers(1, 300),
    elements=st.one_of(st.integers(-5, 40), st.integers(-(2**40), 2**40)),
)


def _expanded(tally: Tally) -> np.ndarray:
    return np.repeat(tally.values, tally.counts)


@settings(max_examples=200, deadline=None)
@given(integers, integers)
def test_tally_is_the_sorted_values_and_verls_mean(first, second):
    for values in (first, second):
        tally = Tally.of(values)
        assert np.array_equal(_expanded(tally), np.sort(values))
        assert tally.mean() == values.mean()  # exactly numpy's (verl's) float
        assert (tally.min(), tally.max(), tally.size) == (values.min(), values.max(), values.size)
    merged = Tally.merge([Tally.of(first), Tally.of(second)])
    assert np.array_equal(_expanded(merged), np.sort(np.concatenate([first, second])))
    shifted = Tally.of(first).shifted(7, -1)
    assert np.array_equal(_expanded(shifted), np.sort(7 - first))


def test_difference_over_chunks_and_wide_spreads():
    rng = np.random.default_rng(1)
    smaller = rng.integers(0, 50, 3 * CHUNK + 5)
    larger = smaller + rng.integers(0, 4, smaller.size)
    tally = Tally.of_difference(larger, smaller)
    assert np.array_equal(_expanded(tally), np.sort(larger - smaller))
    larger[-1] += 2 * DENSE_RANGE  # one far value: sorted instead of bincount
    tally = Tally.of_difference(larger, smaller)
    assert np.array_equal(_expanded(tally), np.sort(larger - smaller))


@settings(max_examples=100, deadline=None)
@given(arrays(np.int64, st.integers(1, 200), elements=st.integers(-3, 80)))
def test_histogram_from_a_tally_equals_observing_each_value(values):
    by_value, by_tally = (_Histogram(cat.STEP_COUNT_BUCKETS) for _ in range(2))
    by_value.observe(values.astype(np.float64), [])
    by_tally.observe_counts(*Tally.of(values))
    assert np.array_equal(by_value.cumulative, by_tally.cumulative)
    assert (by_value.count, by_value.sum, by_value.min, by_value.max) == (
        by_tally.count,
        by_tally.sum,
        by_tally.min,
        by_tally.max,
    )


@settings(max_examples=200, deadline=None)
@given(
    arrays(np.int64, st.integers(1, 3 * CHUNK // 1000), elements=st.integers(0, 60)),
    arrays(np.int64, st.integers(1, 3 * CHUNK // 1000), elements=st.integers(0, 5)),
    st.booleans(),
)
def test_ordered_pairs_tally_low_high_and_their_difference(low, extra, far):
    size = min(low.size, extra.size)
    low, high = low[:size], low[:size] + extra[:size]
    if far:
        high[-1] += 3 * DENSE_RANGE  # a grid too large: tallied one at a time
    tallies = ordered_pairs(low, high)
    for tally, expected in zip(tallies, (low, high, high - low), strict=True):
        assert np.array_equal(_expanded(tally), np.sort(expected))
    bad = high.copy()
    bad[0] = low[0] - 1  # low > high: not ordered
    assert ordered_pairs(low, bad) is None


def test_ordered_pairs_over_several_chunks():
    rng = np.random.default_rng(2)
    low = rng.integers(100, 140, 2 * CHUNK + 17)
    high = low + rng.integers(0, 3, low.size)
    tallies = ordered_pairs(low, high)
    for tally, expected in zip(tallies, (low, high, high - low), strict=True):
        assert np.array_equal(_expanded(tally), np.sort(expected))
