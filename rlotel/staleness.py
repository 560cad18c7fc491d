"""Off-policy staleness of the samples a step consumes: verl 0.9.1's V1 formulas, per sample.

A trajectory is generated across weight versions [min, max] (verl's `min_global_steps` /
`max_global_steps`; version v = the weights after step v). Consumed in step N, verl's
`PPOTrainer._compute_metrics` logs, over the step's trajectories:
spans = max − min + 1, staleness = (N − 1) − max, worst = (N − 1) − min, each as
`training/off_policy/trajectory_{spans,staleness,staleness_worst}/{mean,max,min}`.
rlotel keeps every sample (histograms) and produces the same keys.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from rlotel.samples import MAX_VERSION, MIN_VERSION, SampleBatch
from rlotel.vocabulary import OFF_POLICY


def versions(batches: Iterable[SampleBatch]) -> tuple[np.ndarray, np.ndarray]:
    """(min, max) weight versions of every sample that has a valid pair."""
    lows, highs = [], []
    for batch in batches:
        low, high = batch.columns.get(MIN_VERSION), batch.columns.get(MAX_VERSION)
        if low is None or high is None:
            continue
        valid = ~(np.isnan(low) | np.isnan(high))
        lows.append(low[valid])
        highs.append(high[valid])
    if not lows:
        return np.empty(0), np.empty(0)
    return np.concatenate(lows), np.concatenate(highs)


def per_sample(
    step: int, low: np.ndarray, high: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(spans, staleness, worst staleness) of each sample consumed in global step `step`."""
    return high - low + 1, (step - 1) - high, (step - 1) - low


def off_policy_metrics(step: int, batches: Iterable[SampleBatch]) -> dict[str, float]:
    """verl's `training/off_policy/*` keys for the samples of one step (none without versions)."""
    low, high = versions(batches)
    if not low.size:
        return {}
    metrics: dict[str, float] = {}
    spans, staleness, worst = per_sample(step, low, high)
    for name, values in (
        ("trajectory_spans", spans),
        ("trajectory_staleness", staleness),
        ("trajectory_staleness_worst", worst),
    ):
        prefix = f"{OFF_POLICY}{name}/"
        metrics[prefix + "mean"] = float(values.mean())
        metrics[prefix + "max"] = int(values.max())
        metrics[prefix + "min"] = int(values.min())
    return metrics
