"""Thin adapters at the edge (verl, OpenTelemetry auto-instrumentation) over the public API."""
