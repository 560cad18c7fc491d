"""traces: see docs/architecture.md."""
