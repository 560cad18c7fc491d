"""derive: see docs/architecture.md."""
