"""Metrics: a backend-neutral series store and the recorder that fills it.

Exporters (the Prometheus exposition, the OTLP metrics push, replay) read the store's
snapshots; only the recorder knows how steps, samples and verl keys become series.
"""
