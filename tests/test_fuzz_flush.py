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


def test_an_unbounded_shutdown_timeout_is_refused_at_init(clean_env):
    with pytest.raises(rlotel.ConfigError, match=r"shutdown_timeout_s .* got inf"):
        rlotel.init(run=RUN, prometheus_port=None, shutdown_timeout_s=INF)


def test_an_unbounded_flush_waits_for_the_work_and_returns(clean_env):
    """`flush(inf)` waits for what the publisher still holds (a slow conversion) and
    returns True: it once raised OverflowError."""
    tel = rlotel.init(run=RUN, prometheus_port=0, span_exporters=[InMemorySpanExporter()])
    try:
        tel.log({"slow": SlowScalar()}, step=1)
        assert tel.flush(INF) is True
        assert (
            series(parse_exposition(scrape(tel.metrics_url)), "rlotel_train_metric", key="slow")
            == 1.0
        )
    finally:
        tel.shutdown()


@pytest.mark.parametrize("method", ["flush", "shutdown"])
def test_int_beyond_float_range_as_a_timeout(fuzz_tel, span_exporter, method):
    """An int past float range as the timeout (float() raises OverflowError on it) waits at
    most the bound, and what closed is exported."""
    with fuzz_tel.step(1):
        pass
    assert getattr(fuzz_tel, method)(HUGE) is (True if method == "flush" else None)
    assert [span.name for span in span_exporter.get_finished_spans()] == ["step"]
