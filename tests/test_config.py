"""Configuration validation, in one place: `rlotel.init` raises `rlotel.ConfigError` (a
`ValueError` with a message that names the fix) for every bad option or environment variable,
and starts, serves and shuts down for every valid one.

First the properties (hypothesis) and the inputs they found to break `init` (bad option types,
a timeout beyond `threading.TIMEOUT_MAX`), then one example per documented message.
"""

from __future__ import annotations

import itertools
import socket
import threading
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import rlotel
from rlotel import ProfileConfig
from rlotel.schema import catalogue
from tests.fuzzing import (
    FINITE,
    INF,
    NAN,
    RUN,
    SURROGATE_TEXT,
    exposition,
    fuzz,
    series,
)


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
    {"profile_steps": 0},  # not a list of steps (it once read as none: falsy)
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


def test_timeout_beyond_timeout_max_is_refused_at_init_and_bounded_at_shutdown(clean_env):
    """2e10 s is past `threading.TIMEOUT_MAX` (~9.2e9 s), where a wait raises OverflowError:
    `init` refuses it, naming the bound; `flush` and `shutdown` given it wait at most the
    bound, and still flush what closed."""
    with pytest.raises(
        rlotel.ConfigError,
        match=r"shutdown_timeout_s must be a number of seconds in \(0, 3600\], got 20000000000\.0",
    ):
        rlotel.init(run=RUN, prometheus_port=None, shutdown_timeout_s=2e10)
    exporter = InMemorySpanExporter()
    tel = rlotel.init(run=RUN, prometheus_port=None, span_exporters=[exporter])
    with tel.step(1):
        pass
    assert tel.flush(2e10) is True
    assert [span.name for span in exporter.get_finished_spans()] == ["step"]
    with tel.step(2):
        pass
    tel.shutdown(2e10)
    assert [span.name for span in exporter.get_finished_spans()] == ["step", "step"]
    assert rlotel.current() is None


# --- one example per message --------------------------------------------------------------

PHASES = "rlotel_phase_duration_seconds"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prometheus_port": 70000}, "prometheus_port must be 0..65535"),
        ({"prometheus_port": "9464"}, "prometheus_port must be"),
        ({"n_gpus": 0}, "n_gpus must be a positive integer"),
        ({"run": ""}, "run must be a non-empty"),
        ({"profile_steps": [1, -2]}, "profile_steps must be non-negative"),
        ({"max_metric_keys": 0}, "max_metric_keys must be an integer ≥ 1"),
        ({"max_sample_spans": -1}, "max_sample_spans must be an integer ≥ 0"),
        ({"histogram_buckets": [1, 2]}, "must map histogram names to upper bounds, e.g."),
        ({"histogram_buckets": {"rlotel_step": [1]}}, "not an rlotel histogram; choose from"),
        ({"histogram_buckets": {PHASES: [5, 1]}}, r"strictly increasing, but 1 follows 5"),
        ({"histogram_buckets": {PHASES: [1, 1]}}, r"strictly increasing, but 1 follows 1"),
        ({"histogram_buckets": {PHASES: [1, float("nan")]}}, "must be finite"),
        ({"histogram_buckets": {PHASES: [1, float("inf")]}}, r"\+Inf is always added"),
        ({"histogram_buckets": {PHASES: [-1, 1]}}, "must be ≥ 0"),
        ({"histogram_buckets": {PHASES: ["1"]}}, "bounds must be numbers, got '1'"),
        ({"histogram_buckets": {PHASES: []}}, "must have 1 to 100 bounds"),
        ({"histogram_buckets": {PHASES: range(1, 200)}}, "must have 1 to 100 bounds"),
        ({"histogram_buckets": {PHASES: "1,2"}}, "must be a list of upper bounds"),
    ],
)
def test_config_errors_raise_at_init(kwargs, message):
    with pytest.raises(rlotel.ConfigError, match=message):
        rlotel.init(**{"prometheus_port": 0, **kwargs})


def test_busy_port_raises_with_fix(monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(rlotel.ConfigError, match="choose a free prometheus_port"):
            rlotel.init(prometheus_port=port)


def test_unwritable_traces_file_raises(tmp_path):
    with pytest.raises(rlotel.ConfigError, match="is a directory"):
        rlotel.init(prometheus_port=None, traces_file=tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(rlotel.ConfigError, match="cannot be created"):
        rlotel.init(prometheus_port=None, traces_file=blocker / "sub" / "t.jsonl")


def test_bad_otlp_protocol_raises(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")
    with pytest.raises(rlotel.ConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        rlotel.init(prometheus_port=0)


def test_port_retries_must_be_a_count():
    with pytest.raises(rlotel.ConfigError, match="prometheus_port_retries must be an integer"):
        rlotel.init(prometheus_port=0, prometheus_port_retries=-1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prometheus_tls": ("/nonexistent/cert.pem", "/nonexistent/key.pem")},
        {"prometheus_tls": "cert.pem"},
        {"prometheus_basic_auth": ("user", "")},
        {"prometheus_basic_auth": ("us:er", "x")},
    ],
)
def test_bad_security_settings_raise_at_init(kwargs):
    with pytest.raises(rlotel.ConfigError):
        rlotel.init(prometheus_port=0, **kwargs)


def test_bad_profile_configs_raise_at_init(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(rlotel.ConfigError, match="profile_dir"):
        rlotel.init(prometheus_port=None, profile_steps=[1], profile_dir=blocker / "sub")
    with pytest.raises(rlotel.ConfigError, match="needs profile_dir"):
        rlotel.init(prometheus_port=None, profile_steps=[1])
    with pytest.raises(rlotel.ConfigError, match="schedule"):
        rlotel.init(
            prometheus_port=None,
            profile=ProfileConfig(steps=(1,), save_dir=tmp_path, schedule=(1, 1, 0, 1)),
        )
    with pytest.raises(rlotel.ConfigError, match="both profile_token_start"):
        rlotel.init(prometheus_port=None, profile=ProfileConfig(token_start=5))


def test_bad_export_interval_raises(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "soon")
    with pytest.raises(rlotel.ConfigError, match="OTEL_METRIC_EXPORT_INTERVAL"):
        rlotel.init(prometheus_port=None)


@pytest.mark.parametrize(
    ("thresholds", "match"),
    [
        ({"dominant_share": 1.5}, "dominant_share is a share"),
        ({"margin": float("nan")}, "margin must be a finite number"),
        ({"tail_ratio": -1.0}, "tail_ratio must be a finite number"),
        ({"window": 0}, "window must be an integer"),
        ({"window": 2.5}, "window must be an integer"),
        ({"growth": "fast"}, "growth must be a finite number"),
        ({"low_mfu": 0.5, "high_mfu": 0.3}, "low_mfu"),
    ],
)
def test_bad_thresholds_raise_at_init(thresholds, match):
    with pytest.raises(rlotel.ConfigError, match=match):
        rlotel.init(prometheus_port=None, bottleneck_thresholds=rlotel.Thresholds(**thresholds))


def test_thresholds_must_be_thresholds():
    with pytest.raises(rlotel.ConfigError, match=r"rlotel\.Thresholds"):
        rlotel.init(prometheus_port=None, bottleneck_thresholds={"margin": 2})


def test_valid_thresholds_start_and_judge_the_steps():
    """The thresholds given are the ones each step's verdict uses: no window can hold the
    whole of its step, so a dominant share of 1.0 leaves every step balanced (the default
    0.40 calls a step of one phase rollout-bound)."""
    thresholds = rlotel.Thresholds(dominant_share=1.0, window=3, margin=1.0)
    tel = rlotel.init(prometheus_port=None, bottleneck_thresholds=thresholds)
    try:
        assert tel.config.bottleneck_thresholds == thresholds
        with tel.step(1) as step, tel.phase("gen"):
            sum(range(100_000))
        assert step.verdict.kind == "balanced"
        assert step.verdict.evidence["window"] == "rollout-bound"
        assert step.verdict.evidence["share"] < 1.0
    finally:
        tel.shutdown()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_init_serves_where_the_otel_prometheus_variables_say(monkeypatch):
    """OTEL_EXPORTER_PROMETHEUS_HOST / _PORT place `/metrics` when `rlotel.init` is given no
    address or port (they were validated, then 127.0.0.1:9464 was bound whatever they said);
    _PORT=0 is an ephemeral port, as `prometheus_port=0`."""
    port = free_port()
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.2")  # loopback, not the default
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(port))
    tel = rlotel.init(run=RUN)
    try:
        assert tel.metrics_url == f"http://127.0.0.2:{port}/metrics"
        with socket.create_connection(("127.0.0.2", port), timeout=5):
            pass  # bound there, really
        with tel.step(1), tel.phase("gen"):
            pass
        assert ("rlotel_steps_total", frozenset({("run", RUN)})) in exposition(tel)  # scraped
    finally:
        tel.shutdown()
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", "0")
    tel = rlotel.init(run=RUN)
    try:
        taken = int(tel.metrics_url.rsplit(":", 1)[1].split("/")[0])
        assert tel.metrics_url.startswith("http://127.0.0.2:") and taken not in (0, 9464)
    finally:
        tel.shutdown()


def test_an_explicit_address_or_port_wins_over_the_variables(monkeypatch):
    env_port = free_port()
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.2")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(env_port))
    for args, kwargs in (
        ((), {"prometheus_addr": "127.0.0.1", "prometheus_port": 0}),
        ((RUN, None, 1, "127.0.0.1", 0), {}),  # positionally, as Config's fields
    ):
        tel = rlotel.init(*args, **kwargs)
        try:
            assert tel.metrics_url.startswith("http://127.0.0.1:"), tel.metrics_url
            assert not tel.metrics_url.endswith(f":{env_port}/metrics")
        finally:
            tel.shutdown()
    tel = rlotel.init(run=RUN, prometheus_port=None)  # None: no endpoint, whatever they say
    try:
        assert tel.metrics_url is None
    finally:
        tel.shutdown()
    tel = rlotel.init(run=RUN, prometheus_port=0)  # the address still from the variable
    try:
        assert tel.metrics_url.startswith("http://127.0.0.2:")
    finally:
        tel.shutdown()
    with pytest.raises(TypeError, match=r"rlotel.init\(\) got an unexpected keyword"):
        rlotel.init(run=RUN, prometheus_host="127.0.0.1")  # OTel's name is not the option's
