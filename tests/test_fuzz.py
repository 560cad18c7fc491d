"""Property-based fuzzing of the public API (hypothesis).

Contract: bad input never raises into training and never breaks `/metrics`; valid input is
never dropped; every invalid input is counted in `rlotel_telemetry_dropped_total`; a bad
configuration raises `ConfigError` at `init`. Each oracle is computed here from how the
input was built (never by calling rlotel's own validation).

The last section keeps the inputs these properties found to break rlotel (ints beyond
float range, lone surrogates in labels, mixed and ragged sample lists, object and text
arrays, bad config types, unbounded timeouts, a phase named `step`) as regression tests.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)

import rlotel
from rlotel import catalogue
from tests.conftest import parse_exposition, scrape

RUN = "fuzz"
NAN, INF = float("nan"), float("inf")
RESERVED = ("timing_s/", "timing_per_token_ms/", "perf/", "agent_loop/")
DURATION_FIELDS = ("generate_sequences", "tool_calls", "compute_score")
LENGTH_FIELDS = {"prompt_length": "prompt", "response_length": "response"}
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
Samples = dict[tuple[str, frozenset], float]


def fuzz(max_examples: int) -> settings:
    """Modest by default (the whole file runs in well under a minute); RLOTEL_FUZZ_SCALE=20
    searches twenty times deeper."""
    return settings(
        max_examples=max_examples * int(os.environ.get("RLOTEL_FUZZ_SCALE", "1")),
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@pytest.fixture
def fuzz_tel(make_tel) -> rlotel.Telemetry:
    """One telemetry per test function, reused by every example; the key cap out of reach."""
    return make_tel(run=RUN, max_metric_keys=100_000)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OTLP exporter or SDK switch from the environment."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


def exposition(tel: rlotel.Telemetry) -> Samples:
    """Flush, then scrape both formats: each must parse. Returns the classic one's samples."""
    assert tel.flush(10)
    samples = parse_exposition(scrape(tel.metrics_url))
    for _family in parse_openmetrics(scrape(tel.metrics_url, accept=OPENMETRICS)):
        pass
    return samples


def series(samples: Samples, name: str, run: str = RUN, **labels: str) -> float | None:
    return samples.get((name, frozenset({"run": run, **labels}.items())))


def dropped(samples: Samples, signal: str | None = None, reason: str | None = None) -> float:
    total = 0.0
    for (name, labels), value in samples.items():
        if name != "rlotel_telemetry_dropped_total":
            continue
        found = dict(labels)
        if signal in (None, found["signal"]) and reason in (None, found["reason"]):
            total += value
    return total


class Tagged(NamedTuple):
    """An input value and what it is worth: a float when valid, None when invalid."""

    value: Any
    number: float | None


def valid(strategy: st.SearchStrategy, worth: Callable[[Any], float] = float):
    return strategy.map(lambda value: Tagged(value, worth(value)))


def invalid(strategy: st.SearchStrategy):
    return strategy.map(lambda value: Tagged(value, None))


def object_array(items: list) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    for index, item in enumerate(items):
        array[index] = item
    return array


def as_number(item: Any) -> float | None:
    """The oracle's notion of a number: Python/numpy reals and bools (bools are ints)."""
    if isinstance(item, (bool, int, float, np.bool_, np.integer, np.floating)):
        try:
            return float(item)
        except OverflowError:  # an int beyond float range: not finite
            return INF
    return None


def encodable(text: str) -> bool:
    """Valid UTF-8 (no lone surrogate): what a label value must be."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


FINITE = st.floats(allow_nan=False, allow_infinity=False)
NON_FINITE = st.sampled_from([NAN, INF, -INF])
WIDE_INT = st.integers(-(2**1023), 2**1023)  # every one of these fits in a float
HUGE_INT = st.sampled_from([10**400, -(10**400), 2**1024])  # no float holds these
SURROGATE_TEXT = st.builds(
    "{}{}{}".format,
    st.text(max_size=4),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
    st.text(max_size=4),
)
NESTED = st.lists(
    st.recursive(
        st.none() | FINITE,
        lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner),
        max_leaves=4,
    ),
    max_size=2,
)

# --- 1. tel.log ---------------------------------------------------------------------------

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


# --- 2. tel.record_samples ----------------------------------------------------------------

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
SHAPES = hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4)
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
_step_numbers = itertools.count(1)


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
        with fuzz_tel.step(next(_step_numbers)):
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


# --- 3. step.set_tokens -------------------------------------------------------------------

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
    with fuzz_tel.step(next(_step_numbers)) as step:
        assert step.set_tokens(prompt=prompt_arg, response=response_arg) is None
    after = dropped(exposition(fuzz_tel), "tokens")

    def total(tags: list[Tagged]) -> float:
        return sum(t.number for t in tags if t.number is not None)

    assert step.prompt_tokens == total(prompt_tags)
    assert step.response_tokens == total(response_tags)
    assert step.metrics["perf/total_num_tokens"] == total(prompt_tags) + total(response_tags)
    n_invalid = sum(t.number is None for t in (*prompt_tags, *response_tags))
    assert n_invalid <= after - before <= n_invalid + 1  # +1: a length mismatch


# --- 4. phase names -----------------------------------------------------------------------

PHASE_NAME = st.one_of(
    st.text(max_size=20),
    st.text(min_size=1, max_size=3).map(lambda s: s * 400),
    st.text(alphabet='\\"\n\r\t{}=,# é☃\x00\x7f\x85\u2028', min_size=1, max_size=12),
    st.sampled_from(["", "gen", 'say "hi"', "C:\\dir\\", "\\n", "line\nbreak", "}", "step"]),
    SURROGATE_TEXT,
    st.none(),
    st.integers(),
    st.floats(),
    st.binary(max_size=4),
    st.tuples(st.integers()),
)


class Boom(Exception):
    pass


def is_phase_name(name: Any) -> bool:
    """Non-empty valid UTF-8, and not "step" (the step's own timing key): else refused."""
    return isinstance(name, str) and bool(name) and encodable(name) and name != "step"


@fuzz(60)
@given(
    names=st.lists(PHASE_NAME, min_size=1, max_size=3),
    error=st.sampled_from([None, Boom, ValueError, KeyboardInterrupt, GeneratorExit]),
)
def test_phases_of_any_name_run_once_and_propagate_errors(fuzz_tel, names, error):
    raised = error("inside the phase") if error is not None else None
    entered: list[int] = []

    def nest(depth: int) -> None:
        if depth == len(names):
            entered.append(depth)
            if raised is not None:
                raise raised
            return
        with fuzz_tel.phase(names[depth]):
            entered.append(depth)
            nest(depth + 1)

    before = exposition(fuzz_tel)
    caught: BaseException | None = None
    try:
        with fuzz_tel.step(next(_step_numbers)):
            nest(0)
    except BaseException as exc:
        caught = exc
    after = exposition(fuzz_tel)

    assert caught is raised
    assert entered == list(range(len(names) + 1))
    for name in {name for name in names if is_phase_name(name)}:
        assert series(after, "rlotel_step_phase_seconds", phase=name) is not None, name
        count = "rlotel_phase_duration_seconds_count"
        grown = (series(after, count, phase=name) or 0) - (series(before, count, phase=name) or 0)
        assert grown == 1, name
    n_bad = sum(not is_phase_name(name) for name in names)
    assert dropped(after, "spans", "bad_name") - dropped(before, "spans", "bad_name") == n_bad


@fuzz(25)
@given(
    timeout=st.one_of(
        st.none(),
        st.floats(),
        st.integers(-10, 10),
        st.booleans(),
        st.fractions(-10, 10),
        st.sampled_from(["1", b"1", [1]]),
    )
)
def test_flush_with_any_timeout_returns_a_bool(fuzz_tel, timeout):
    fuzz_tel.log({"flushed": 1.0}, step=1)
    assert isinstance(fuzz_tel.flush(timeout), bool)
    assert fuzz_tel.flush(10)
    assert (
        series(parse_exposition(scrape(fuzz_tel.metrics_url)), "rlotel_train_metric", key="flushed")
        == 1.0
    )


# --- 5. configurations --------------------------------------------------------------------


def init_within(seconds: float, **kwargs: Any) -> dict[str, Any]:
    """rlotel.init in a thread: a hang fails the test instead of stalling it."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["tel"] = rlotel.init(**kwargs)
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"rlotel.init{kwargs!r} hung"
    return outcome


NOT_A_COUNT = st.one_of(
    st.sampled_from([0, -1]), st.integers(max_value=0), FINITE, st.text(max_size=3), st.none()
)
BUCKETED = "rlotel_agent_loop_duration_seconds"
BAD_BOUNDS = st.one_of(
    st.just([]),
    st.lists(st.floats(0, 100), min_size=2, max_size=6).filter(
        lambda bounds: any(a >= b for a, b in itertools.pairwise(bounds))  # not increasing
    ),
    st.lists(st.floats(0, 100), min_size=1, max_size=3).map(lambda b: [*b, NAN]),
    st.lists(st.floats(0, 100), min_size=1, max_size=3).map(lambda b: [*sorted(b), INF]),
    st.floats(max_value=-1e-9, allow_nan=False).map(lambda low: [low, 1.0]),
    st.sampled_from([[True, 2.0], ["1", "2"], "0.1,1", [None], 5.0, None]),
    st.just(list(range(1, 102))),  # more than 100 bounds
)
VALID_BOUNDS = st.lists(
    st.floats(0, 1e6) | st.integers(0, 10**6), min_size=1, max_size=30, unique=True
).map(sorted)

BAD_CONFIG = {
    "prometheus_port": st.one_of(
        st.sampled_from([-1, 65536]),
        st.integers(max_value=-1),
        st.integers(min_value=65536),
        st.text(max_size=5),
        st.floats(),
        st.booleans(),
        st.just([9464]),
    ),
    "prometheus_addr": st.one_of(
        st.just(""), st.none(), st.integers(), st.binary(max_size=3), SURROGATE_TEXT
    ),
    "traces_file": st.one_of(st.integers(), FINITE, st.lists(st.text(max_size=2), max_size=2)),
    "profile_dir": st.one_of(st.integers(), FINITE, st.binary(min_size=1, max_size=2).map(list)),
    "n_gpus": st.one_of(NOT_A_COUNT, st.booleans(), st.integers(1, 8).map(float)),
    "run": st.one_of(
        st.text(alphabet=" \t\n\r\u3000", max_size=4),
        st.none(),
        st.integers(),
        st.binary(max_size=3),
        st.lists(st.text(max_size=2), max_size=2),
        SURROGATE_TEXT,
    ),
    "max_metric_keys": st.one_of(NOT_A_COUNT, st.booleans()),
    "queue_size": st.one_of(NOT_A_COUNT, st.booleans()),
    "prometheus_port_retries": st.one_of(st.integers(max_value=-1), st.text(max_size=3), FINITE),
    "max_sample_spans": st.one_of(
        st.integers(max_value=-1), st.text(max_size=3), FINITE, st.none()
    ),
    "profile_steps": st.one_of(
        st.lists(st.integers(max_value=-1), min_size=1, max_size=3),
        st.text(min_size=1, max_size=4),
        st.lists(st.text(max_size=3), min_size=1, max_size=3),
        st.lists(st.floats(), min_size=1, max_size=3),
        st.lists(st.booleans(), min_size=1, max_size=2),
        st.integers(),
        st.sampled_from([[None], [[1]], [1, "a"]]),
        st.lists(st.integers(0, 10), min_size=1, max_size=3),  # valid steps, no profile_dir
    ),
    "histogram_buckets": st.one_of(
        st.integers(),
        st.lists(FINITE, min_size=1, max_size=3),  # bounds without a family name
        st.text(min_size=1, max_size=4),
        st.dictionaries(  # not a histogram family
            st.text(max_size=12) | st.sampled_from(["rlotel_step_time_seconds", "le"]),
            st.just([1.0, 2.0]),
            min_size=1,
            max_size=2,
        ),
        st.fixed_dictionaries({BUCKETED: BAD_BOUNDS}),
    ),
    "shutdown_timeout_s": st.one_of(
        st.floats(max_value=0.0),
        st.sampled_from([NAN, INF, True, "5", b"5", [5]]),
        st.integers(max_value=0),
        st.none(),
    ),
}


BOUNDARIES = [
    {"prometheus_port": -1},
    {"prometheus_port": 65536},
    {"prometheus_port": True},
    {"prometheus_port": 9464.0},
    {"n_gpus": 0},
    {"run": ""},
    {"run": " "},
    {"max_metric_keys": 0},
    {"queue_size": 0},
    {"max_sample_spans": -1},
    {"profile_steps": [-1]},
    {"shutdown_timeout_s": 0},
    {"shutdown_timeout_s": NAN},
]


def boundaries(test):
    for bad in BOUNDARIES:
        test = example(bad=bad)(test)
    return test


@boundaries
@fuzz(60)
@given(
    bad=st.lists(st.sampled_from(sorted(BAD_CONFIG)), min_size=1, max_size=3, unique=True).flatmap(
        lambda names: st.fixed_dictionaries({n: BAD_CONFIG[n] for n in names})
    )
)
def test_bad_configs_raise_config_error(clean_env, bad):
    kwargs = {"run": RUN, "prometheus_port": None, **bad}
    outcome = init_within(10, **kwargs)
    if "tel" in outcome:
        outcome["tel"].shutdown(1)
        pytest.fail(f"rlotel.init accepted {bad!r}")
    error = outcome["error"]
    assert type(error) is rlotel.ConfigError, repr(error)
    assert isinstance(error, ValueError) and str(error).strip()


@fuzz(25)
@given(
    run=st.text(min_size=1, max_size=30).filter(str.strip),
    n_gpus=st.integers(1, 10**6),
    port=st.sampled_from([0, None]),
    max_metric_keys=st.integers(1, 10**9),
    queue_size=st.integers(1, 10**6),
    max_sample_spans=st.integers(0, 100),
    # init accepts (0, 3600] seconds; beyond is a ConfigError (see BAD_CONFIG)
    shutdown_timeout_s=st.one_of(st.floats(1e-3, 3600.0), st.integers(1, 3600)),
    profile_steps=st.lists(st.integers(0, 10**6), max_size=3),
    exporter=st.booleans(),
    buckets=st.none() | st.fixed_dictionaries({BUCKETED: VALID_BOUNDS}),
)
def test_valid_configs_start_serve_and_shut_down(
    clean_env,
    tmp_path,
    run,
    n_gpus,
    port,
    max_metric_keys,
    queue_size,
    max_sample_spans,
    shutdown_timeout_s,
    profile_steps,
    exporter,
    buckets,
):
    outcome = init_within(
        10,
        run=run,
        n_gpus=n_gpus,
        prometheus_port=port,
        max_metric_keys=max_metric_keys,
        queue_size=queue_size,
        max_sample_spans=max_sample_spans,
        shutdown_timeout_s=shutdown_timeout_s,
        profile_steps=profile_steps,
        profile_dir=tmp_path / "profiles" if profile_steps else None,
        span_exporters=[InMemorySpanExporter()] if exporter else (),
        histogram_buckets=buckets,
    )
    assert "error" not in outcome, repr(outcome.get("error"))
    tel = outcome["tel"]
    try:
        assert rlotel.current() is tel
        tel.log({"fuzz/value": 1.5}, step=1)
        assert tel.flush(10)  # a queue_size of 1 holds one input at a time
        tel.record_samples(generate_sequences=[0.5, 2.0, 700.0])
        if port is None:
            assert tel.metrics_url is None
            assert tel.flush(10)
        else:
            samples = exposition(tel)
            assert series(samples, "rlotel_train_metric", run, key="fuzz/value") == 1.5
            bounds = [float(b) for b in buckets[BUCKETED]] if buckets else None
            found = {
                dict(labels)["le"]: value
                for (name, labels), value in samples.items()
                if name == f"{BUCKETED}_bucket"
            }
            for bound in bounds or ():
                le = repr(bound)  # each configured bound is a bucket, counting its values
                assert found.pop(le) == sum(v <= bound for v in (0.5, 2.0, 700.0))
            assert found.pop("+Inf") == 3
            assert not found if bounds else len(found) == len(catalogue.SAMPLE_DURATION_BUCKETS)
    finally:
        tel.shutdown()
    assert rlotel.current() is None


# --- regressions: bugs these properties found, fixed --------------------------------------

HUGE = 10**400  # a Python int no float can hold


def _huge_log_value(tel: rlotel.Telemetry) -> None:
    tel.log({"huge": HUGE, "after_huge": 2.0}, step=1)
    assert series(exposition(tel), "rlotel_train_metric", key="after_huge") == 2.0


def _huge_log_step(tel: rlotel.Telemetry) -> None:
    tel.log({"with_huge_step": 3.0}, step=HUGE)
    assert series(exposition(tel), "rlotel_train_metric", key="with_huge_step") == 3.0


def _huge_sample(tel: rlotel.Telemetry) -> None:
    tel.record_samples(generate_sequences=[1.0, HUGE])
    count = "rlotel_agent_loop_duration_seconds_count"
    assert series(exposition(tel), count, stage="generate_sequences") == 1


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
    [_huge_log_value, _huge_log_step, _huge_sample, _huge_token, _huge_mfu],
    ids=lambda case: case.__name__.strip("_"),
)
def test_int_beyond_float_range_is_a_counted_drop(fuzz_tel, case):
    case(fuzz_tel)


@pytest.mark.parametrize("where", ["log_key", "phase_name", "mfu_role", "run"])
def test_lone_surrogate_label_keeps_metrics_endpoint_alive(make_tel, where):
    bad = "x\ud800y"
    try:
        tel = make_tel(run=bad if where == "run" else RUN)
    except rlotel.ConfigError:
        return  # refusing the run name is a fine answer too
    tel.log({bad if where == "log_key" else "other": 1.0, "kept": 2.0}, step=1)
    with tel.step(2) as step:
        with tel.phase(bad if where == "phase_name" else "gen"):
            step.set_mfu(**{bad if where == "mfu_role" else "actor": 0.5})
    assert series(exposition(tel), "rlotel_train_metric", tel.config.run, key="kept") == 2.0


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


@pytest.mark.parametrize("text", [np.array("1.5"), np.array([b"2"])], ids=["0d-str", "bytes"])
def test_string_arrays_are_not_read_as_numbers(fuzz_tel, text):
    fuzz_tel.log({"text_array": text}, step=1)
    with fuzz_tel.step(2) as step:
        step.set_mfu(actor=text)
    assert "actor" not in step.mfu
    assert series(exposition(fuzz_tel), "rlotel_train_metric", key="text_array") is None


@pytest.mark.parametrize(
    "bad",
    [
        {"shutdown_timeout_s": "5"},
        {"shutdown_timeout_s": None},
        {"traces_file": 5},
        {"profile_dir": 5},
        {"prometheus_addr": "x\ud800", "prometheus_port": 0},
    ],
    ids=["timeout-str", "timeout-none", "traces_file-int", "profile_dir-int", "addr-surrogate"],
)
def test_bad_config_types_raise_config_error(clean_env, bad):
    outcome = init_within(10, **{"run": RUN, "prometheus_port": None, **bad})
    if "tel" in outcome:
        outcome["tel"].shutdown(1)
    assert type(outcome.get("error")) is rlotel.ConfigError, repr(outcome)


class SlowScalar:
    """A scalar whose conversion keeps the publisher busy, so that flush has to wait."""

    def item(self) -> float:
        time.sleep(0.3)
        return 1.0


@pytest.mark.parametrize("where", ["flush_arg", "config"])
def test_unbounded_timeouts_do_not_raise(clean_env, where):
    try:
        tel = rlotel.init(
            run=RUN,
            prometheus_port=None,
            span_exporters=[InMemorySpanExporter()],
            shutdown_timeout_s=INF if where == "config" else 5.0,
        )
    except rlotel.ConfigError:
        return  # refusing an unbounded shutdown is a fine answer too
    try:
        tel.log({"slow": SlowScalar()}, step=1)
        assert tel.flush(INF if where == "flush_arg" else None)
        tel.log({"slow": SlowScalar()}, step=2)
    finally:
        tel.shutdown()


def test_phase_named_step_is_kept_or_counted(fuzz_tel):
    before = dropped(exposition(fuzz_tel))
    with fuzz_tel.step(1):
        with fuzz_tel.phase("step"):
            pass
    after = exposition(fuzz_tel)
    kept = series(after, "rlotel_step_phase_seconds", phase="step") is not None
    assert kept or dropped(after) > before


# --- more regressions: timeouts and labels -------------------------------------------------


def test_timeout_beyond_timeout_max_shuts_down(clean_env):
    try:
        tel = rlotel.init(
            run=RUN,
            prometheus_port=None,
            span_exporters=[InMemorySpanExporter()],
            shutdown_timeout_s=2e10,
        )
    except rlotel.ConfigError:
        return  # refusing it is a fine answer too
    tel.shutdown()


@pytest.mark.parametrize("method", ["flush", "shutdown"])
def test_int_beyond_float_range_as_a_timeout(fuzz_tel, method):
    getattr(fuzz_tel, method)(HUGE)


def test_unencodable_logged_phase_is_counted_once(fuzz_tel):
    fuzz_tel.log({"timing_s/x\ud800": 1.0}, step=1)
    first = dropped(exposition(fuzz_tel))
    for number in range(2, 5):
        fuzz_tel.log({"timing_s/gen": 1.0}, step=number)
    assert dropped(exposition(fuzz_tel)) == first == 1


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_a_name_whose_repr_raises_still_runs_the_body(fuzz_tel):
    ran = []
    with fuzz_tel.step(1), fuzz_tel.phase(BadRepr()):  # type: ignore[arg-type]
        ran.append(True)
    assert ran == [True]
