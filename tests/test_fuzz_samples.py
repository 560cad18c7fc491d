"""Property-based fuzzing of `tel.record_samples` (hypothesis), then the inputs these
properties found to break it (ints beyond float range, mixed and ragged sample lists) as
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
    INF,
    NAN,
    SHAPES,
    Samples,
    as_number,
    dropped,
    exposition,
    fuzz,
    object_array,
    series,
    step_numbers,
)

DURATION_FIELDS = ("generate_sequences", "tool_calls", "compute_score")
LENGTH_FIELDS = {"prompt_length": "prompt", "response_length": "response"}


SAMPLE_NUMBER = st.one_of(
    st.floats(),
    st.integers(-(2**70), 2**70),
    st.integers(-2, 3),
    st.booleans(),
    st.floats(width=32).map(np.float32),
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.integers(0, 255).map(np.uint8),
    st.booleans().map(np.bool_),
    HUGE_INT,
)
PREEMPTED_NUMBER = st.one_of(
    st.integers(-3, 10**6),
    st.integers(-3, 10**6).map(float),
    st.sampled_from([NAN, INF, -INF, 0.5, 2.5, -1.0, -0.0, -1.5, -2.0]),
    st.booleans(),
    st.integers(-3, 1000).map(np.int64),
    HUGE_INT,
)
SAMPLE_ARRAYS = st.sampled_from(
    [np.float64, np.float32, np.float16, np.int64, np.int32, np.uint8, np.bool_]
).flatmap(lambda dtype: hnp.arrays(dtype, SHAPES))
PREEMPTED_ARRAYS = st.one_of(
    hnp.arrays(np.int64, SHAPES, elements=st.integers(-3, 1000)),
    hnp.arrays(np.float64, SHAPES, elements=st.sampled_from([NAN, INF, -1.0, 0.0, 2.0, 2.5])),
    hnp.arrays(np.bool_, SHAPES),
)


def sample_values(number: st.SearchStrategy, arrays: st.SearchStrategy) -> st.SearchStrategy:
    """One field's argument: numbers mixed with None, text, complex, nested (ragged) lists."""
    entry = number | st.none()
    odd = st.one_of(
        st.text(max_size=4),
        st.binary(max_size=3),
        st.complex_numbers(),
        st.lists(number, max_size=2),
        st.just({}),
    )
    return st.one_of(
        st.none(),
        st.just([]),
        st.lists(entry, max_size=8),
        st.lists(entry, max_size=8).map(tuple),
        st.lists(entry | odd, max_size=8),
        st.lists(entry | odd, max_size=8).map(tuple),
        arrays,
        st.lists(entry | odd, max_size=6).map(object_array),
        st.lists(st.text(max_size=4), max_size=4).map(lambda xs: np.array(xs, dtype=str)),
        number,
        st.text(max_size=4),
    )


def entries(values: Any) -> list:
    """What one argument holds, one item per sample (2-d arrays flattened)."""
    if isinstance(values, np.ndarray):
        return values.ravel().tolist()
    if isinstance(values, (list, tuple)):
        return list(values)
    return [values]


def valid_sample(item: Any, field: str) -> float | None:
    number = as_number(item)
    if number is None or not math.isfinite(number):
        return None
    if field == "num_preempted":  # whole counts; -1 is verl's "unknown"
        return number if number.is_integer() and (number >= 0 or number == -1) else None
    return number if number >= 0 else None


SAMPLE_FIELDS = st.fixed_dictionaries(
    {
        **{f: sample_values(SAMPLE_NUMBER, SAMPLE_ARRAYS) for f in DURATION_FIELDS},
        **{f: sample_values(SAMPLE_NUMBER, SAMPLE_ARRAYS) for f in LENGTH_FIELDS},
        "num_preempted": sample_values(PREEMPTED_NUMBER, PREEMPTED_ARRAYS),
    }
)


def check_histogram(before: Samples, after: Samples, family: str, label: dict, good: list):
    """`_count` grew by the valid values, and each `le` bucket by those <= its bound."""
    count = f"{family}_count"
    grown = (series(after, count, **label) or 0.0) - (series(before, count, **label) or 0.0)
    assert grown == len(good), f"{label}: {grown} counted, {len(good)} valid"
    ((name, value),) = label.items()
    buckets = 0
    for (sample, labels), total in after.items():
        found = dict(labels)
        if sample == f"{family}_bucket" and found.get(name) == value:
            bound = float(found["le"])
            expected = sum(1 for number in good if number <= bound)
            assert total - before.get((sample, labels), 0.0) == expected, (label, bound)
            buckets += 1
    assert buckets or not good


@fuzz(60)
@given(fields=SAMPLE_FIELDS, in_step=st.booleans(), unknown=st.booleans())
def test_record_samples_counts_every_valid_entry(fuzz_tel, fields, in_step, unknown):
    kwargs = {name: values for name, values in fields.items()}
    if unknown:
        kwargs["not_a_field"] = [1.0]
    before = exposition(fuzz_tel)
    if in_step:
        with fuzz_tel.step(next(step_numbers)):
            spans = fuzz_tel.record_samples(**kwargs)
    else:
        spans = fuzz_tel.record_samples(**kwargs)
    after = exposition(fuzz_tel)

    assert isinstance(spans, dict)
    assert all(isinstance(span, str) and int(span, 16) for span in spans.values())
    good: dict[str, list[float]] = {}
    n_invalid, sizes = int(unknown), set()
    for field, values in fields.items():
        if values is None:
            continue
        items = entries(values)
        numbers = [valid_sample(item, field) for item in items]
        good[field] = [n for n in numbers if n is not None]
        n_invalid += len(items) - len(good[field])
        if items:
            sizes.add(len(items))
    for field in DURATION_FIELDS:
        check_histogram(
            before,
            after,
            "rlotel_agent_loop_duration_seconds",
            {"stage": field},
            good.get(field, []),
        )
    for field, kind in LENGTH_FIELDS.items():
        check_histogram(
            before, after, "rlotel_agent_loop_length_tokens", {"kind": kind}, good.get(field, [])
        )
    preempted = "rlotel_agent_loop_preemptions_total"
    grown = (series(after, preempted) or 0.0) - (series(before, preempted) or 0.0)
    assert grown == sum(n for n in good.get("num_preempted", []) if n >= 0)
    n_mismatch = int(len(sizes) > 1)
    assert dropped(after, "samples") - dropped(before, "samples") == n_invalid + n_mismatch


# --- regressions: bugs these properties found, fixed ----------------------------------


def _huge_sample(tel: rlotel.Telemetry) -> None:
    tel.record_samples(generate_sequences=[1.0, HUGE])
    count = "rlotel_agent_loop_duration_seconds_count"
    assert series(exposition(tel), count, stage="generate_sequences") == 1


@pytest.mark.parametrize(
    "case",
    [_huge_sample],
    ids=lambda case: case.__name__.strip("_"),
)
def test_int_beyond_float_range_is_a_counted_drop(fuzz_tel, case):
    case(fuzz_tel)


@pytest.mark.parametrize("values", [[1.0, "x"], [2, b"x"], [3.0, 1j]], ids=repr)
def test_sample_list_mixing_numbers_and_strings_keeps_the_numbers(fuzz_tel, values):
    before = exposition(fuzz_tel)
    fuzz_tel.record_samples(compute_score=values)
    after = exposition(fuzz_tel)
    check_histogram(
        before, after, "rlotel_agent_loop_duration_seconds", {"stage": "compute_score"}, values[:1]
    )


def test_ragged_sample_field_keeps_the_other_fields(fuzz_tel):
    before = exposition(fuzz_tel)
    fuzz_tel.record_samples(generate_sequences=[1.0, 2.0], tool_calls=[1.0, [2.0, 3.0]])
    after = exposition(fuzz_tel)
    family = "rlotel_agent_loop_duration_seconds"
    check_histogram(before, after, family, {"stage": "generate_sequences"}, [1.0, 2.0])
    check_histogram(before, after, family, {"stage": "tool_calls"}, [1.0])


SOURCE_ENTRY = st.one_of(
    st.sampled_from(["a", "b", "", "other", "unknown"]),
    st.text(max_size=5),
    st.none(),
    st.integers(),
    st.binary(max_size=3),
    st.lists(st.text(max_size=2), max_size=2),
)
SOURCES = st.one_of(
    st.none(),
    st.lists(SOURCE_ENTRY, max_size=8),
    st.lists(SOURCE_ENTRY, max_size=8).map(object_array),
    st.lists(SOURCE_ENTRY, max_size=8).map(tuple).map(iter),
    st.text(max_size=3),
    st.integers(),
)
EXTRA = st.one_of(
    st.none(),
    st.dictionaries(
        st.text(max_size=3),
        st.lists(SAMPLE_NUMBER | st.none() | st.text(max_size=2), max_size=8),
        max_size=3,
    ),
    st.lists(st.integers(), max_size=2),
    st.integers(),
)


@fuzz(40)
@given(
    source=SOURCES,
    rewards=st.lists(st.floats(-10, 10) | st.none(), min_size=1, max_size=8),
    extra=EXTRA,
)
def test_record_samples_by_source_counts_each_sample_once_whatever_it_is_given(
    fuzz_tel, source, rewards, extra
):
    """Whatever `data_source` and `reward_extra_info` hold, the call never fails (no
    internal error); where the sources pair with the batch every sample counts under
    exactly one source, its name or `unknown` or `other`; elsewhere none does."""
    given_source = list(source) if isinstance(source, type(iter(()))) else source
    if isinstance(source, type(iter(()))):
        source = iter(given_source)
    before = exposition(fuzz_tel)
    with fuzz_tel.step(next(step_numbers)), fuzz_tel.phase("gen"):
        fuzz_tel.record_samples(reward=rewards, data_source=source, reward_extra_info=extra)
    after = exposition(fuzz_tel)
    assert dropped(after, reason="internal_error") == dropped(before, reason="internal_error")

    def labelled(samples: Samples) -> float:
        return sum(
            value for (name, _), value in samples.items() if name == "rlotel_source_samples_total"
        )

    size = len(rewards)
    if isinstance(extra, dict):
        named = [values for name, values in extra.items() if name][:8]
        size = max([size, *(len(values) for values in named if values)])
    if given_source is None:
        pairs = False
    elif isinstance(given_source, (str, int)):  # one sample's
        pairs = size == 1
    else:
        pairs = len(given_source) == size
    assert labelled(after) - labelled(before) == (size if pairs else 0)
