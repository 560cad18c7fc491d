"""OTLP span exporters chosen by the standard `OTEL_EXPORTER_OTLP_*` variables.

Export is on when an endpoint variable is set. The protocol follows
`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` / `OTEL_EXPORTER_OTLP_PROTOCOL` (spec default
`http/protobuf`); endpoint, headers, timeout, compression and certificates are read by the
exporters themselves, exactly as the OpenTelemetry SDK documents them.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.sdk.trace.export import SpanExporter

from rlotel.config import ConfigError

PROTOCOLS = ("grpc", "http/protobuf")


def otlp_enabled(environ: Mapping[str, str], signal: str) -> bool:
    """`signal` is TRACES or METRICS; `OTEL_{signal}_EXPORTER=none` switches it off."""
    if "none" in environ.get(f"OTEL_{signal}_EXPORTER", "").replace(" ", "").split(","):
        return False
    return bool(
        environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def otlp_protocol(environ: Mapping[str, str], signal: str) -> str:
    protocol = (
        environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol not in PROTOCOLS:
        raise ConfigError(
            f"OTLP protocol {protocol!r} is not supported: set OTEL_EXPORTER_OTLP_PROTOCOL "
            f"to one of {', '.join(PROTOCOLS)}"
        )
    return protocol


def otlp_span_exporter(environ: Mapping[str, str]) -> SpanExporter | None:
    if not otlp_enabled(environ, "TRACES"):
        return None
    if otlp_protocol(environ, "TRACES") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()
