"""schema: see docs/architecture.md."""
