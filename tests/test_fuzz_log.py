"""Property-based fuzzing of `tel.log` (hypothesis), then the inputs these properties found
to break it (ints beyond float range, lone surrogates in labels, text arrays, an unencodable
logged phase) as regression tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rlotel
from tests.fuzzing import (
    FINITE,
    HUGE,
    HUGE_INT,
    NON_FINITE,
    SURROGATE_TEXT,
    WIDE_INT,
    Tagged,
    dropped,
    encodable,
    exposition,
    fuzz,
    invalid,
    series,
    valid,
)

RESERVED = ("timing_s/", "timing_per_token_ms/", "perf/", "agent_loop/")


NESTED = st.lists(
    st.recursive(
        st.none() | FINITE,
        lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner),
        max_leaves=4,
    ),
    max_size=2,
)


LOG_VALID = st.one_of(
    valid(FINITE),
    valid(WIDE_INT),
    valid(st.booleans()),
    valid(FINITE.map(np.float64)),
    valid(st.floats(width=32, allow_nan=False, allow_infinity=False).map(np.float32)),
    valid(st.integers(-(2**63), 2**63 - 1).map(np.int64)),
    valid(st.integers(0, 2**64 - 1).map(np.uint64)),
    valid(st.booleans().map(np.bool_)),
    valid(FINITE.map(np.array), lambda a: float(a.item())),  # 0-d array
    valid(FINITE.map(lambda x: np.array([x])), lambda a: float(a.item())),  # one element
    valid(st.fractions(-(10**6), 10**6, max_denominator=10**6)),
)
LOG_INVALID = st.one_of(
    invalid(NON_FINITE),
    invalid(NON_FINITE.map(np.float64)),
    invalid(NON_FINITE.map(np.float32)),
    invalid(NON_FINITE.map(np.array)),
    invalid(st.none()),
    invalid(st.text(max_size=10)),
    invalid(st.sampled_from(["1", "1.5", "nan", "-2", "True", "0x10"])),
    invalid(st.text(max_size=5).map(np.str_)),
    invalid(st.sampled_from(["1.5", "x", b"2"]).map(np.array)),  # text arrays: not parsed
    invalid(st.sampled_from(["1.5", b"2"]).map(lambda text: np.array([text]))),
    invalid(HUGE_INT),
    invalid(st.binary(max_size=6)),
    invalid(st.complex_numbers()),
    invalid(NESTED),
    invalid(st.dictionaries(st.text(max_size=3), FINITE, max_size=2)),
    invalid(st.tuples(FINITE)),
    invalid(hnp.arrays(np.float64, st.integers(2, 4))),
    invalid(st.just(np.array([]))),
    invalid(st.builds(object)),
)
PLAIN_KEY = st.one_of(
    st.text(min_size=1, max_size=30),
    st.text(min_size=1, max_size=3).map(lambda s: s * 700),  # very long
    st.sampled_from(['say "hi"', "C:\\dir\\", "a\nb", "ünï/☃", "{x}", "a=b,c", " ", "\x00"]),
).filter(lambda key: not key.startswith(RESERVED))
RESERVED_KEY = st.builds(
    str.__add__,
    st.sampled_from(
        [*RESERVED, "perf/mfu/", "agent_loop/slowest/", "timing_s/agent_loop/slowest/"]
    ),
    st.one_of(
        st.text(max_size=8),
        st.sampled_from(["step", "gen", "update_actor", "throughput", "time_per_step"]),
        st.sampled_from(["total_num_tokens", "generate_sequences", "prompt_length", "a/b"]),
    ),
)
BAD_KEY = st.one_of(
    st.just(""),
    st.none(),
    st.integers(),
    st.floats(),
    st.binary(max_size=4),
    st.tuples(st.integers(), st.text(max_size=3)),
    st.frozensets(st.integers(), max_size=2),
    SURROGATE_TEXT.filter(lambda key: not key.startswith(RESERVED)),  # refused as a label
)
LOG_ITEMS = st.lists(
    st.tuples(PLAIN_KEY | RESERVED_KEY | BAD_KEY, LOG_VALID | LOG_INVALID), max_size=12
)
LOG_STEP = st.one_of(
    valid(st.integers(0, 2**62)),
    valid(st.integers(0, 2**50).map(float)),
    valid(st.integers(0, 2**31).map(np.int64)),
    invalid(st.integers(-(2**1000), -1)),
    invalid(HUGE_INT),
    invalid(FINITE.filter(lambda x: not x.is_integer() or x < 0)),
    invalid(NON_FINITE),
    invalid(st.none()),
    invalid(st.text(max_size=5)),
)


@fuzz(60)
@given(items=LOG_ITEMS, step=LOG_STEP)
def test_log_keeps_every_valid_value_and_counts_invalid_ones(fuzz_tel, items, step):
    data: dict[Any, Any] = {}
    tags: dict[Any, Tagged] = {}
    for key, tagged in items:  # the same key semantics for both dicts (1 == 1.0 == True)
        data[key] = tagged.value
        tags[key] = tagged
    before = exposition(fuzz_tel)
    assert fuzz_tel.log(data, step.value) is None
    after = exposition(fuzz_tel)

    n_invalid = int(step.number is None)
    n_negative_reserved = 0  # e.g. timing_s/gen=-1: may be refused, whatever the prefix
    for key, tagged in tags.items():
        if not isinstance(key, str) or not key or not encodable(key) or tagged.number is None:
            n_invalid += 1
        elif key.startswith(RESERVED):
            n_negative_reserved += tagged.number < 0
        else:
            got = series(after, "rlotel_train_metric", key=key)
            assert got == tagged.number, f"{key!r}={tagged.value!r} exported as {got!r}"
    delta = dropped(after) - dropped(before)
    assert n_invalid <= delta <= n_invalid + n_negative_reserved


@fuzz(25)
@given(
    data=st.one_of(
        st.none(),
        st.integers(),
        FINITE,
        st.text(max_size=5),
        st.lists(st.integers(), max_size=3),
        st.lists(st.tuples(st.text(min_size=1, max_size=3), FINITE), max_size=3),
    )
)
def test_log_of_a_non_mapping_is_counted_not_raised(fuzz_tel, data):
    try:
        dict(data)
        mapping = True
    except (TypeError, ValueError):
        mapping = False
    before = dropped(exposition(fuzz_tel), "metrics", "bad_dict")
    fuzz_tel.log(data, 1)
    after = dropped(exposition(fuzz_tel), "metrics", "bad_dict")
    assert after - before == (0 if mapping else 1)


# --- regressions: bugs these properties found, fixed ----------------------------------


def _huge_log_value(tel: rlotel.Telemetry) -> None:
    tel.log({"huge": HUGE, "after_huge": 2.0}, step=1)
    assert series(exposition(tel), "rlotel_train_metric", key="after_huge") == 2.0


def _huge_log_step(tel: rlotel.Telemetry) -> None:
    tel.log({"with_huge_step": 3.0}, step=HUGE)
    assert series(exposition(tel), "rlotel_train_metric", key="with_huge_step") == 3.0


@pytest.mark.parametrize(
    "case",
    [_huge_log_value, _huge_log_step],
    ids=lambda case: case.__name__.strip("_"),
)
def test_int_beyond_float_range_is_a_counted_drop(fuzz_tel, case):
    case(fuzz_tel)


@pytest.mark.parametrize("where", ["log_key", "phase_name", "mfu_role"])
def test_lone_surrogate_label_keeps_metrics_endpoint_alive(fuzz_tel, where):
    bad = "x\ud800y"
    fuzz_tel.log({bad if where == "log_key" else "other": 1.0, "kept": 2.0}, step=1)
    with fuzz_tel.step(2) as step:
        with fuzz_tel.phase(bad if where == "phase_name" else "gen"):
            step.set_mfu(**{bad if where == "mfu_role" else "actor": 0.5})
    assert series(exposition(fuzz_tel), "rlotel_train_metric", key="kept") == 2.0


def test_a_lone_surrogate_run_name_is_refused_at_init(make_tel):
    """Every series carries the run: one no exposition can encode is refused up front."""
    with pytest.raises(rlotel.ConfigError, match="run must be a non-empty UTF-8 string"):
        make_tel(run="x\ud800y")


@pytest.mark.parametrize("text", [np.array("1.5"), np.array([b"2"])], ids=["0d-str", "bytes"])
def test_string_arrays_are_not_read_as_numbers(fuzz_tel, text):
    fuzz_tel.log({"text_array": text}, step=1)
    with fuzz_tel.step(2) as step:
        step.set_mfu(actor=text)
    assert "actor" not in step.mfu
    assert series(exposition(fuzz_tel), "rlotel_train_metric", key="text_array") is None


def test_unencodable_logged_phase_is_counted_once(fuzz_tel):
    fuzz_tel.log({"timing_s/x\ud800": 1.0}, step=1)
    first = dropped(exposition(fuzz_tel))
    for number in range(2, 5):
        fuzz_tel.log({"timing_s/gen": 1.0}, step=number)
    assert dropped(exposition(fuzz_tel)) == first == 1
