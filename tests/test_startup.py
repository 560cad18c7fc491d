"""Start-up in a process rlotel was not asked to own (verl's trainer and workers, Ray
workers): whatever cannot start as configured is left out with one warning, nothing raises;
the same configuration in `rlotel.init` from the user's own code raises `ConfigError`."""

from __future__ import annotations

import json
import logging
import os
import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

import rlotel
from rlotel.base import env
from rlotel.integrations import process, ray, startup, verl_workers
from rlotel.integrations.clock_exchange import ClockExchange
from tests.helpers import parse_exposition, scrape
from tests.otlp_receiver import HttpReceiver

RECEIVER = "<the receiver's endpoint>"  # a test's variables: spans go to a real receiver


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No rlotel variable from outside, no driver declared, no telemetry left running."""
    for name in list(os.environ):
        if name.startswith(("OTEL_", "RLOTEL_")) or name in (env.RANK, env.WORLD_SIZE):
            monkeypatch.delenv(name)
    monkeypatch.setenv(env.RLOTEL_PROMETHEUS_SD_DIR, str(tmp_path / "sd"))
    monkeypatch.setattr(process, "_driver", None)
    monkeypatch.setattr(
        verl_workers, "CLOCK", ClockExchange(lambda: not verl_workers.in_ray_actor())
    )
    yield
    tel = rlotel.current()
    if tel is not None:
        tel.shutdown()


@pytest.fixture(scope="module")
def receiver() -> Iterator[HttpReceiver]:
    """An OTLP/HTTP receiver: spans exported in a test are taken, none retried past it."""
    receiver = HttpReceiver()
    yield receiver
    receiver.stop()


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another run's trainer is listening on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "rlotel" and record.levelno >= logging.WARNING
    ]


def test_a_taken_port_moves_the_trainer_where_prometheus_discovers_it(
    held_port, monkeypatch, tmp_path, caplog
):
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(held_port))
    process.declare_driver(process.Driver(run="second"))
    tel = process.telemetry(serve=True)  # what verl's first timer does in the trainer
    port = urllib.parse.urlsplit(tel.metrics_url).port
    assert port not in (None, held_port)
    with tel.step(1), tel.phase("gen"):
        pass
    assert tel.flush(5) is True
    series = parse_exposition(scrape(tel.metrics_url))
    assert any(dict(labels).get("run") == "second" for _, labels in series)
    (warning,) = warnings_of(caplog)
    assert f":{held_port}: " in warning and f":{port}/metrics" in warning
    (found,) = (tmp_path / "sd").glob("*.json")
    (group,) = json.loads(found.read_text())
    assert group["targets"] == [f"127.0.0.1:{port}"]
    assert group["labels"]["role"] == "trainer" and group["labels"]["run"] == "second"
    assert str(found) in warning


def test_a_free_port_is_served_as_configured_and_not_registered(monkeypatch, tmp_path, caplog):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(free))
    process.declare_driver(process.Driver(run="first"))
    tel = process.telemetry(serve=True)
    assert urllib.parse.urlsplit(tel.metrics_url).port == free
    assert not warnings_of(caplog)
    assert not list((tmp_path / "sd").glob("*.json"))  # Prometheus scrapes it statically


def test_http_json_is_sent_as_http_protobuf_with_one_warning(monkeypatch, caplog):
    receiver = HttpReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    env._json_as_protobuf.cache_clear()  # once per process: this test's own
    try:
        tel = rlotel.init(run="json", prometheus_port=None)  # accepted in user code too
        assert tel.config.environment.otlp_traces == "http/protobuf"
        with tel.step(1), tel.phase("gen"):
            pass
        assert tel.flush(5) is True
        assert {span.name for span, _ in receiver.spans()} == {"step", "gen"}
        env.Environment.read()  # read again (verl's processes read it often): no new warning
        (warning,) = warnings_of(caplog)
        assert "http/json is sent as http/protobuf" in warning
    finally:
        receiver.stop()


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            ("http://c:4318/v1/traces", "http/protobuf"),
        ),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"}, ("http://c:4318/v1/traces", "http/protobuf")),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, ("http://c:4318", "grpc")),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:x"}, None),
    ],
)
def test_vllm_gets_the_endpoint_rlotel_exports_to(environ, expected):
    assert env.otlp_traces_endpoint(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", **environ}
    ) == (expected)


def blocked_dir(tmp_path: Path) -> Path:
    """A directory that cannot be created: a file stands where its parent should be."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    return blocker / "traces"


# (variables, the same configuration in the user's `rlotel.init`, what the warning names)
BAD = {
    "unknown protocol": (
        {"OTEL_EXPORTER_OTLP_ENDPOINT": RECEIVER, "OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"},
        {},
        "'thrift'",
    ),
    "bad port": ({"OTEL_EXPORTER_PROMETHEUS_PORT": "ninety"}, {}, "OTEL_EXPORTER_PROMETHEUS_PORT"),
    "port out of range": (
        {"OTEL_EXPORTER_PROMETHEUS_PORT": "70000"},
        {},
        "OTEL_EXPORTER_PROMETHEUS_PORT",
    ),
    "bad interval": ({"OTEL_METRIC_EXPORT_INTERVAL": "soon"}, {}, "OTEL_METRIC_EXPORT_INTERVAL"),
    "bad span delay": ({"OTEL_BSP_SCHEDULE_DELAY": "-1"}, {}, "OTEL_BSP_SCHEDULE_DELAY"),
    "unwritable traces dir": ({"RLOTEL_TRACES_DIR": blocked_dir}, {}, "RLOTEL_TRACES_DIR"),
    "unwritable traces file": (
        {"RLOTEL_TRACES_FILE": lambda tmp: blocked_dir(tmp) / "t.jsonl"},
        {"traces_file": lambda tmp: blocked_dir(tmp) / "t.jsonl"},
        "traces_file",
    ),
    "malformed endpoint": (
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1"},
        {},
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ),
    "malformed traces endpoint": (
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:port/v1/traces"},
        {},
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ),
}


def apply(monkeypatch, tmp_path: Path, variables: dict, receiver: HttpReceiver) -> None:
    for name, value in variables.items():
        value = receiver.endpoint if value == RECEIVER else value
        monkeypatch.setenv(name, str(value(tmp_path) if callable(value) else value))


@pytest.mark.parametrize("case", BAD)
def test_the_trainer_starts_with_one_warning(case, receiver, monkeypatch, tmp_path, caplog):
    variables, _, named = BAD[case]
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", "0")  # unless the case says otherwise
    apply(monkeypatch, tmp_path, variables, receiver)
    process.declare_driver(process.Driver(run="bad"))
    tel = process.telemetry(serve=True)
    assert rlotel.current() is tel and tel.metrics_url
    with tel.step(1), tel.phase("gen"):
        pass
    (warning,) = warnings_of(caplog)
    assert warning.startswith("rlotel: started without") and named in warning


@pytest.mark.parametrize("case", [case for case in BAD if "traces file" not in case])
def test_a_worker_starts_with_one_warning(case, receiver, monkeypatch, tmp_path, caplog):
    variables, _, named = BAD[case]
    apply(monkeypatch, tmp_path, variables, receiver)
    tel = verl_workers.worker_telemetry()  # what a verl worker's first traced call does
    assert rlotel.current() is tel and tel.metrics_url
    with tel.phase("update_actor"):
        pass
    (warning,) = warnings_of(caplog)
    assert named in warning
    assert list((tmp_path / "sd").glob("*.json"))  # registered for scraping all the same


@pytest.mark.parametrize("case", BAD)
def test_the_same_configuration_raises_in_user_code(case, receiver, monkeypatch, tmp_path):
    variables, options, named = BAD[case]
    apply(monkeypatch, tmp_path, variables, receiver)
    options = {name: value(tmp_path) for name, value in options.items()}
    with pytest.raises(rlotel.ConfigError, match=named.strip("'")):
        rlotel.init(run="mine", prometheus_port=None, **options)


def test_a_ray_worker_hook_starts_with_one_warning(receiver, monkeypatch, caplog):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")
    ray.setup_worker()  # Ray's worker_process_setup_hook
    tel = rlotel.current()
    assert tel is not None and tel.config.environment.otlp_traces == "http/protobuf"
    (warning,) = warnings_of(caplog)
    assert warning.startswith("rlotel: started without") and "'thrift'" in warning


def test_a_busy_port_still_raises_in_user_code(held_port):
    with pytest.raises(rlotel.ConfigError, match="Address already in use"):
        rlotel.init(run="mine", prometheus_port=held_port)


def test_what_nothing_else_covers_falls_back_to_telemetry_that_exports_nothing(caplog):
    tel = startup.start(run="last", n_gpus=-1, prometheus_port=0)
    assert rlotel.current() is tel and tel.metrics_url is None
    with tel.step(1), tel.phase("gen"):
        pass
    (warning,) = warnings_of(caplog)
    assert "n_gpus" in warning and "nothing exported" in warning
