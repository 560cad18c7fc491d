"""Counted, rate-limited accounting of telemetry inputs that had to be dropped.

Bad input must never raise into training, and must never vanish silently either: every
drop increments `rlotel_telemetry_dropped_total{signal,reason}` and the first drop of each
kind (then at most one per interval) gets a log line that says what was wrong.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from numbers import Real
from typing import Any

import numpy as np

log = logging.getLogger("rlotel")

LOG_INTERVAL_S = 60.0


class Drops:
    """Thread-safe drop counters keyed by (signal, reason): the health of the telemetry
    itself."""

    def __init__(self, log_interval_s: float = LOG_INTERVAL_S) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()
        self.total = 0  # every drop so far; only grows (a cheap "changed?" check for readers)
        self._last_logged: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._log_interval_s = log_interval_s

    def add(self, signal: str, reason: str, detail: str, count: int = 1) -> None:
        key = (signal, reason)
        now = time.monotonic()
        with self._lock:
            self._counts[key] += count
            self.total += count
            total = self._counts[key]
            last = self._last_logged.get(key)
            if last is not None and now - last < self._log_interval_s:
                return
            self._last_logged[key] = now
        log.warning(
            "rlotel dropped %d %s input(s) (%s): %s [%d dropped so far for this reason]",
            count,
            signal,
            reason,
            detail,
            total,
        )

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)


class HookFailures:
    """Failures of rlotel's own part of a zero-code hook, by hook, for the whole process
    (`rlotel_integration_failures_total{hook}`): the hooks are the process's patches, and
    one can fail before, or while, the process's telemetry starts."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.total = 0  # only grows (a cheap "changed?" check for readers)

    def add(self, hook: str) -> int:
        """Count one failure of `hook`; returns how many it has had."""
        with self._lock:
            self._counts[hook] += 1
            self.total += 1
            return self._counts[hook]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


HOOK_FAILURES = HookFailures()


def describe(value: Any) -> str:
    """How a rejected value is named in a log line: never its text (it could be a prompt
    or a response), only its type and size."""
    if isinstance(value, (str, bytes)):
        return f"<{type(value).__name__} of length {len(value)}>"
    try:
        text = repr(value)
    except Exception:  # a user object whose __repr__ raises must not raise here
        return f"<unprintable {type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def as_finite_float(value: Any) -> tuple[float | None, str]:
    """A finite float from a Python, numpy or one-element torch scalar, else (None, reason).

    Text is refused even inside numpy arrays; ints beyond float range are non-finite."""
    if isinstance(value, Real):
        try:
            number = float(value)
        except OverflowError:  # an int no float can hold
            return None, "non_finite"
    else:
        item = getattr(value, "item", None)  # numpy 0-d arrays, torch one-element tensors
        if not callable(item) or isinstance(value, (str, bytes)):
            return None, "non_numeric"
        try:
            inner = item()
        except (TypeError, ValueError, RuntimeError):
            return None, "non_numeric"
        if inner is value or not isinstance(inner, Real):
            return None, "non_numeric"  # str/bytes/object payloads: never parsed as text
        return as_finite_float(inner)
    if not math.isfinite(number):
        return None, "non_finite"
    return number, ""


def clean_counts(values: Any) -> tuple[np.ndarray, int, str]:
    """Non-negative finite counts as float64, invalid items removed.

    Returns (valid counts, number of items dropped, the first reason seen). Numeric numpy
    arrays and tensors take a vectorised path; other sequences are checked item by item so
    that strings are refused rather than parsed.
    """
    if values is None:
        return np.empty(0), 0, ""
    if hasattr(values, "numpy") and hasattr(values, "detach"):  # torch tensor
        values = values.detach().cpu().numpy()
    if isinstance(values, np.ndarray) and values.dtype.kind in "iufb":
        array = values.astype(np.float64, copy=False).ravel()
        reason = ""
    else:
        if isinstance(values, np.ndarray):
            values = values.ravel().tolist()  # object/str arrays, 0-d included: item by item
        elif isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            values = [values]
        parsed = [as_finite_float(item) for item in values]
        array = np.array([np.nan if n is None else n for n, _ in parsed], dtype=np.float64)
        reason = next((r for _, r in parsed if r), "")
    valid = np.isfinite(array) & (array >= 0)
    n_bad = int(array.size - np.count_nonzero(valid))
    if not n_bad:
        return array, 0, ""
    if not reason:
        reason = "non_finite" if not np.all(np.isfinite(array)) else "negative"
    return array[valid], n_bad, reason


def encodable(text: str) -> bool:
    """Label values and span names must be valid UTF-8 (no lone surrogates): one bad label
    would otherwise break every later scrape."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
