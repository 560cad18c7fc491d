"""offline: see docs/architecture.md."""
