"""Async bias: does the trained batch still look like what the rollout generated?

In async training slow, long, hard problems finish late and are discarded (stale, evicted
from the replay buffer, filtered), so the trainer quietly sees easier ones. Per step, the
samples the step trained are compared with every sample generated in its window (trained
plus those recorded as discarded, `record_samples(..., discarded=reason)`): the two-sample
Kolmogorov-Smirnov statistic of response length and of reward (0: the same distribution,
1: disjoint), and the share of generated samples never trained, per reason. Computed when
the step closes, off the training thread.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlotel.record.samples import SampleBatch
from rlotel.schema import vocabulary as voc


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample KS statistic: the largest gap between the two empirical CDFs (as scipy's
    `ks_2samp(a, b).statistic`). Both samples non-empty."""
    low, high = min(a.min(), b.min()), max(a.max(), b.max())
    if high - low < DENSE_RANGE and _whole(a) and _whole(b):  # token counts: no sort
        offset = int(low)
        size = int(high) - offset + 1
        cdf_a = np.cumsum(np.bincount((a - offset).astype(np.int64), minlength=size)) / a.size
        cdf_b = np.cumsum(np.bincount((b - offset).astype(np.int64), minlength=size)) / b.size
        return float(np.abs(cdf_a - cdf_b).max())
    a, b = np.sort(a), np.sort(b)
    grid = np.sort(np.concatenate([a, b]))  # sorted queries: searchsorted stays in cache
    gap = np.searchsorted(a, grid, side="right") / a.size
    gap -= np.searchsorted(b, grid, side="right") / b.size
    return float(np.abs(gap).max())


DENSE_RANGE = 1 << 20  # whole numbers spread over fewer values than this: counted, not sorted


def _whole(values: np.ndarray) -> bool:
    return bool(np.array_equal(values, np.floor(values)))


def _valid(batches: Sequence[SampleBatch], field: str) -> np.ndarray:
    values = [batch.valid(field) for batch in batches if field in batch.columns]
    if not values:
        return np.empty(0)
    return values[0] if len(values) == 1 else np.concatenate(values)


def bias_metrics(batches: Sequence[SampleBatch], is_async: bool) -> dict[str, float]:
    """`rlotel/async_bias/ks/<quantity>` and `rlotel/samples_discarded/<reason>` of one
    step (in async modes, or wherever samples were recorded as discarded)."""
    trained = [batch for batch in batches if batch.discarded is None]
    discarded = [batch for batch in batches if batch.discarded is not None]
    if not discarded and not is_async:
        return {}
    generated = sum(batch.size for batch in batches)
    if not generated:
        return {}
    metrics: dict[str, float] = {}
    counts = dict.fromkeys(voc.DISCARD_REASONS[:-1], 0)
    for batch in discarded:
        counts[batch.discarded] = counts.get(batch.discarded, 0) + batch.size
    for reason, count in counts.items():
        metrics[f"{voc.SAMPLES_DISCARDED}{reason}"] = count / generated
    for quantity in voc.BIAS_QUANTITIES:
        if not any(quantity in batch.columns for batch in trained):
            continue
        dropped = _valid(discarded, quantity)
        if not dropped.size:  # what was trained is all that was generated
            metrics[f"{voc.ASYNC_BIAS_KS}{quantity}"] = 0.0
            continue
        kept = _valid(trained, quantity)
        if not kept.size:
            continue
        # generated = trained ∪ discarded, so F_generated − F_trained is the discarded
        # share times F_discarded − F_trained: one comparison of the two parts, no union.
        share = dropped.size / (kept.size + dropped.size)
        metrics[f"{voc.ASYNC_BIAS_KS}{quantity}"] = share * ks_statistic(kept, dropped)
    return metrics
