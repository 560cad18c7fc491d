"""What rlotel tells vLLM inside verl's rollout server: where to export, and whether it does."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult

from rlotel.base import env
from rlotel.integrations.vllm_engine import DeliveryCheck


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"},
            ("http://c:4318/v1/traces", "http/protobuf"),
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            ("http://c:4317", "grpc"),
        ),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4318/custom"},
            ("http://t:4318/custom", "http/protobuf"),
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, None),
    ],
)
def test_the_engine_exports_where_the_other_processes_do(environ, expected) -> None:
    assert env.otlp_traces_endpoint(environ) == expected


def test_resource_attributes_are_added_not_overridden() -> None:
    environ = {"OTEL_RESOURCE_ATTRIBUTES": "service.name=mine"}
    env.add_resource_attribute("service.name", "vllm", environ)
    env.add_resource_attribute("rl.role", "rollout", environ)
    assert environ["OTEL_RESOURCE_ATTRIBUTES"] == "service.name=mine,rl.role=rollout"


class Exporter:
    def __init__(self, result: SpanExportResult) -> None:
        self.result = result
        self.shut = False

    def export(self, spans):
        return self.result

    def shutdown(self) -> None:
        self.shut = True


@pytest.mark.parametrize(
    ("result", "level", "says"),
    [
        (SpanExportResult.SUCCESS, logging.INFO, "arrive at"),
        (SpanExportResult.FAILURE, logging.WARNING, "do not arrive at"),
    ],
)
def test_delivery_is_checked_once(caplog, result, level, says) -> None:
    inner = Exporter(result)
    check = DeliveryCheck(inner, "http://c:4318/v1/traces")
    with caplog.at_level(logging.INFO, logger="rlotel"):
        assert check.export([]) is result
        assert check.export([]) is result
    lines = [r for r in caplog.records if "vLLM request spans" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == level and says in lines[0].getMessage()
    check.shutdown()
    assert inner.shut
