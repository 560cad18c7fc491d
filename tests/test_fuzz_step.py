"""Property-based fuzzing of `step.set_tokens` (hypothesis), then the inputs these properties
found to break `set_tokens` and `set_mfu` (ints beyond float range, object arrays) as
regression tests.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rlotel
from tests.fuzzing import (
    HUGE,
    HUGE_INT,
    NON_FINITE,
    SHAPES,
    Tagged,
    dropped,
    exposition,
    fuzz,
    invalid,
    object_array,
    step_numbers,
    valid,
)

TOKEN_VALID = st.one_of(
    valid(st.integers(0, 2**40)),
    valid(st.integers(0, 2**42).map(lambda k: k / 4)),  # exact in float64: sums are exact
    valid(st.booleans()),
    valid(st.integers(0, 2**40).map(np.int64)),
    valid(st.integers(0, 255).map(np.uint8)),
    valid(st.integers(0, 2**40).map(np.float32)),
    valid(st.integers(0, 10**6).map(np.array), lambda a: float(a.item())),
)
TOKEN_INVALID = st.one_of(
    invalid(st.integers(-(2**40), -1)),
    invalid(st.floats(max_value=0.0, exclude_max=True, allow_nan=False)),
    invalid(NON_FINITE),
    invalid(NON_FINITE.map(np.float32)),
    invalid(st.none()),
    invalid(st.text(max_size=4)),
    invalid(st.sampled_from(["3", "12", "1e3"])),
    invalid(st.binary(max_size=3)),
    invalid(st.complex_numbers()),
    invalid(st.lists(st.integers(0, 9), max_size=3)),
    invalid(st.just({})),
    invalid(hnp.arrays(np.int64, st.integers(2, 3), elements=st.integers(0, 9))),
    invalid(st.sampled_from(["3", b"4"]).map(np.array)),
    invalid(HUGE_INT),
)
TOKEN_ENTRY = TOKEN_VALID | TOKEN_INVALID
TOKEN_SCALAR = TOKEN_ENTRY.filter(
    lambda t: t.value is not None and not isinstance(t.value, (list, dict, np.ndarray))
)
TOKEN_FLOATS = st.one_of(st.integers(-(2**42), 2**42).map(lambda k: k / 4), NON_FINITE)


def array_tags(array: np.ndarray) -> list[Tagged]:
    return [
        Tagged(x, float(x) if math.isfinite(x) and x >= 0 else None)
        for x in map(float, array.ravel().tolist())
    ]


TOKEN_ARRAYS = st.one_of(
    hnp.arrays(np.int64, SHAPES, elements=st.integers(-(2**40), 2**40)),
    hnp.arrays(np.float64, SHAPES, elements=TOKEN_FLOATS),
    hnp.arrays(np.float32, SHAPES, elements=st.integers(-(2**24), 2**24).map(float)),
    hnp.arrays(np.uint8, SHAPES),
    hnp.arrays(np.bool_, SHAPES),
).map(lambda array: (array, array_tags(array)))


def _values(tags: list[Tagged]) -> list:
    return [t.value for t in tags]


def object_array_0d(item: Any) -> np.ndarray:
    array = np.empty((), dtype=object)
    array[()] = item
    return array


def _pairs(pairs: list[tuple[Tagged, Tagged]]) -> list[Tagged]:
    return [tag for pair in pairs for tag in pair]


TOKEN_ARG = st.one_of(
    st.just((None, [])),
    st.lists(TOKEN_ENTRY, max_size=8).map(lambda ts: (_values(ts), ts)),
    st.lists(TOKEN_ENTRY, max_size=8).map(lambda ts: (tuple(_values(ts)), ts)),
    st.lists(TOKEN_ENTRY, max_size=8).map(lambda ts: (iter(_values(ts)), ts)),
    st.lists(TOKEN_ENTRY, max_size=8).map(lambda ts: (object_array(_values(ts)), ts)),
    TOKEN_ENTRY.map(lambda t: (object_array_0d(t.value), [t])),
    st.lists(st.tuples(TOKEN_ENTRY, TOKEN_ENTRY), max_size=4).map(
        lambda pairs: (object_array(_values(_pairs(pairs))).reshape(-1, 2), _pairs(pairs))
    ),
    st.lists(st.text(max_size=3), max_size=4).map(
        lambda xs: (np.array(xs, dtype=str), [Tagged(x, None) for x in xs])
    ),
    TOKEN_ARRAYS,
    TOKEN_SCALAR.map(lambda t: (t.value, [t])),
)


@fuzz(60)
@given(prompt=TOKEN_ARG, response=TOKEN_ARG)
def test_set_tokens_sums_exactly_the_valid_counts(fuzz_tel, prompt, response):
    (prompt_arg, prompt_tags), (response_arg, response_tags) = prompt, response
    before = dropped(exposition(fuzz_tel), "tokens")
    with fuzz_tel.step(next(step_numbers)) as step:
        assert step.set_tokens(prompt=prompt_arg, response=response_arg) is None
    after = dropped(exposition(fuzz_tel), "tokens")

    def total(tags: list[Tagged]) -> float:
        return sum(t.number for t in tags if t.number is not None)

    assert step.prompt_tokens == total(prompt_tags)
    assert step.response_tokens == total(response_tags)
    assert step.metrics["perf/total_num_tokens"] == total(prompt_tags) + total(response_tags)
    n_invalid = sum(t.number is None for t in (*prompt_tags, *response_tags))
    assert n_invalid <= after - before <= n_invalid + 1  # +1: a length mismatch


# --- regressions: bugs these properties found, fixed ----------------------------------


def _huge_token(tel: rlotel.Telemetry) -> None:
    with tel.step(1) as step:
        step.set_tokens(prompt=[1, HUGE], response=[2])
    assert step.metrics.get("perf/total_num_tokens") == 3


def _huge_mfu(tel: rlotel.Telemetry) -> None:
    with tel.step(1) as step:
        step.set_mfu(actor=HUGE, ref=0.5)  # raises OverflowError into the training loop
    assert step.mfu == {"ref": 0.5}


@pytest.mark.parametrize(
    "case",
    [_huge_token, _huge_mfu],
    ids=lambda case: case.__name__.strip("_"),
)
def test_int_beyond_float_range_is_a_counted_drop(fuzz_tel, case):
    case(fuzz_tel)


@pytest.mark.parametrize(
    ("prompt", "response", "total"),
    [
        ([5], np.array(7, dtype=object), 12),
        ([4], np.array("x"), 4),
        (np.array([[1, 2]], dtype=object), [3], 6),
    ],
    ids=["0d-object", "0d-str", "2d-object"],
)
def test_set_tokens_object_arrays_keep_valid_counts(fuzz_tel, prompt, response, total):
    with fuzz_tel.step(1) as step:
        step.set_tokens(prompt=prompt, response=response)
    assert step.metrics.get("perf/total_num_tokens") == total
