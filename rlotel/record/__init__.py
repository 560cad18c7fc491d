"""record: see docs/architecture.md."""
