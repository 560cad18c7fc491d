"""metrics: see docs/architecture.md."""
