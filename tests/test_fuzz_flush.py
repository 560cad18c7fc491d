"""Property-based fuzzing of `tel.flush` timeouts (hypothesis), then the timeouts these
properties found to break `flush` and `shutdown` (unbounded, ints beyond float range) as
regression tests.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import rlotel
from tests.fuzzing import (
    HUGE,
    INF,
    RUN,
    fuzz,
    series,
)
from tests.helpers import parse_exposition, scrape


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


# --- regressions: bugs these properties found, fixed ----------------------------------


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


@pytest.mark.parametrize("method", ["flush", "shutdown"])
def test_int_beyond_float_range_as_a_timeout(fuzz_tel, method):
    getattr(fuzz_tel, method)(HUGE)
