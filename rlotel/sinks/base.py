"""`Sink` and `CompositeSink`, where the exporters have always imported them from.

The interface lives in `rlotel.publish.sink` (the pipeline layer), so the metrics recorder and the
pipeline implement and use it without depending on the exporters (`tests/test_architecture.py`).
"""

from __future__ import annotations

from rlotel.publish.sink import CompositeSink, Sink

__all__ = ["CompositeSink", "Sink"]
