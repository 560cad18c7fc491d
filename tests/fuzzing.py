"""Shared pieces of the property-based tests (hypothesis) in test_fuzz_*.py and
test_config.py: settings, readers of the exposition, and strategies more than one API uses.

Contract: bad input never raises into training and never breaks `/metrics`; valid input is
never dropped; every invalid input is counted in `rlotel_telemetry_dropped_total`; a bad
configuration raises `ConfigError` at `init`. Each oracle is computed from how the input was
built (never by calling rlotel's own validation).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)

import rlotel
from tests.helpers import parse_exposition, scrape

RUN = "fuzz"
NAN, INF = float("nan"), float("inf")

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
Samples = dict[tuple[str, frozenset], float]


def fuzz(max_examples: int) -> settings:
    """Modest by default (each file runs in well under a minute); RLOTEL_FUZZ_SCALE=20
    searches twenty times deeper."""
    return settings(
        max_examples=max_examples * int(os.environ.get("RLOTEL_FUZZ_SCALE", "1")),
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


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

SHAPES = hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4)

# One counter for every property: a telemetry reused across examples sees rising steps.
step_numbers = itertools.count(1)

HUGE = 10**400  # a Python int no float can hold
