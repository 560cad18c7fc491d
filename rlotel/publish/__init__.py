"""publish: see docs/architecture.md."""
