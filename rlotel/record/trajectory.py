"""What a sample batch says about its trajectories beyond their stage columns, read when
it is built: why it was never trained (`discarded`), every trajectory's real start and end
(occupancy), the replica it ran on, and tokens × oldest weight version (verl#7569).

Only what the caller passed is read; bad entries are counted once, and every valid one is
kept. Copies are made of the times only (the caller may reuse its arrays after the call).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from rlotel.base.drops import Drops, encodable
from rlotel.schema import vocabulary as voc

INVALID_VERSION = -1


def annotate(
    batch: Any,
    drops: Drops,
    *,
    size: int | None,
    discarded: str | None = None,
    replica: Any = None,
    times: tuple[Any, Any] = (None, None),
    oldest: np.ndarray | None = None,
    response: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Set the batch's `discarded`, `replica`, `times` and `token_versions`; returns the
    cleaned times (0 where invalid) for the per-sample span fields, or None."""
    if discarded is not None:
        if isinstance(discarded, str) and discarded in voc.DISCARD_REASONS:
            batch.discarded = discarded
        else:
            drops.add("samples", "bad_reason", f"discarded={discarded!r}: counted as 'other'")
            batch.discarded = "other"
    if replica is not None:
        batch.replica = _replica(replica, size, drops)
    if oldest is not None and response is not None and oldest.size == response.size:
        valid = (oldest != INVALID_VERSION) & ~np.isnan(response)
        tokens = response[valid]
        batch.token_versions = (float(tokens.sum()), float(np.dot(tokens, oldest[valid])))
    start, end = times
    if start is None or end is None:
        return None
    cleaned = _times(start, end, drops)
    if cleaned is not None:
        batch.times = cleaned
    return cleaned


def _replica(value: Any, size: int | None, drops: Drops) -> str | np.ndarray | None:
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        label = str(value)
        if encodable(label):
            return label
    elif isinstance(value, Iterable) and not isinstance(value, (bytes, dict)):
        labels = [str(v) for v in value]
        if len(labels) == size and all(encodable(label) for label in labels):
            return np.asarray(labels)
    drops.add("samples", "bad_replica", f"replica={value!r} ignored (one label or one a sample)")
    return None


def _as_int64(values: Any) -> np.ndarray | None:
    if hasattr(values, "detach") and hasattr(values, "numpy"):  # torch tensor
        values = values.detach().cpu().numpy()
    try:
        array = np.asarray(values)
    except (TypeError, ValueError):
        return None
    if array.ndim != 1 or array.dtype.kind not in "iu":
        return None
    return array.astype(np.int64)  # a copy: the caller may reuse its arrays


def _times(start: Any, end: Any, drops: Drops) -> tuple[np.ndarray, np.ndarray] | None:
    """Whole non-negative Unix ns with end >= start, as int64; 0 and 0 where not."""
    starts, ends = _as_int64(start), _as_int64(end)
    if starts is None or ends is None:
        starts, ends = _item_by_item(start), _item_by_item(end)
    if starts.size != ends.size:
        return None  # the span fields' own length check counts this
    bad = (starts < 0) | (ends < starts)
    n_bad = int(np.count_nonzero(bad))
    if n_bad:
        drops.add("samples", "bad_time", f"{n_bad} trajectory time pair(s) invalid", n_bad)
        starts, ends = np.where(bad, 0, starts), np.where(bad, 0, ends)
    return starts, ends


def _item_by_item(values: Any) -> np.ndarray:
    """Slow path (floats, None, strings): a whole non-negative number, else -1 (invalid)."""
    if hasattr(values, "detach") and hasattr(values, "numpy"):
        values = values.detach().cpu().numpy()
    items = values.ravel().tolist() if isinstance(values, np.ndarray) else list(values)
    out = np.empty(len(items), np.int64)
    for index, item in enumerate(items):
        whole = -1
        if isinstance(item, int) and not isinstance(item, bool):
            whole = item if item >= 0 else -1
        elif isinstance(item, float) and item.is_integer() and item >= 0:
            whole = int(item)
        try:
            out[index] = whole
        except OverflowError:
            out[index] = -1
    return out
