"""Where closed steps go: spans (OTLP, file) and Prometheus series."""
