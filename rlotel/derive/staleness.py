"""Off-policy staleness of the samples a step consumes: verl 0.9.1's V1 formulas, per sample.

A trajectory is generated across weight versions [min, max] (verl's `min_global_steps` /
`max_global_steps`; version v = the weights after step v). Consumed in step N, verl's
`PPOTrainer._compute_metrics` logs, over the step's trajectories:
spans = max − min + 1, staleness = (N − 1) − max, worst = (N − 1) − min, each as
`training/off_policy/trajectory_{spans,staleness,staleness_worst}/{mean,max,min}`.
rlotel keeps every sample (histograms) and produces the same keys, read from the tallies
each batch made of its versions (`samples.Versions`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from rlotel.base.tally import Tally
from rlotel.record.samples import SampleBatch
from rlotel.schema.vocabulary import OFF_POLICY, STALENESS_WORST_TOKEN_WEIGHTED


class Consumed(NamedTuple):
    """Weight versions of the samples one step consumes."""

    step: int
    low: Tally
    high: Tally
    spans: Tally

    @property
    def staleness(self) -> Tally:
        return self.high.shifted(self.step - 1, -1)

    @property
    def worst(self) -> Tally:
        return self.low.shifted(self.step - 1, -1)


def consumed(step: int, batches: Iterable[SampleBatch]) -> Consumed | None:
    """The step's versions over every batch that has them (None: no versions)."""
    tallied = [batch.versions for batch in batches if batch.versions is not None]
    if not tallied:
        return None
    low, high, spans = (Tally.merge(list(column)) for column in zip(*tallied, strict=True))
    return Consumed(step, low, high, spans)


def off_policy_metrics(versions: Consumed | None) -> dict[str, float]:
    """verl's `training/off_policy/*` keys for the samples of one step (none without versions)."""
    if versions is None:
        return {}
    metrics: dict[str, float] = {}
    for name, tally in (
        ("trajectory_spans", versions.spans),
        ("trajectory_staleness", versions.staleness),
        ("trajectory_staleness_worst", versions.worst),
    ):
        prefix = f"{OFF_POLICY}{name}/"
        metrics[prefix + "mean"] = tally.mean()
        metrics[prefix + "max"] = tally.max()
        metrics[prefix + "min"] = tally.min()
    return metrics


def token_weighted(step: int, batches: Iterable[SampleBatch]) -> dict[str, float]:
    """verl#7569: staleness from the oldest version behind each trajectory, weighted by
    its response tokens: Σ tokens × ((step − 1) − min) ÷ Σ tokens (needs versions and
    response lengths in the same call)."""
    pairs = [batch.token_versions for batch in batches if batch.token_versions is not None]
    tokens = sum(pair[0] for pair in pairs)
    if not tokens:
        return {}
    oldest = sum(pair[1] for pair in pairs) / tokens
    return {STALENESS_WORST_TOKEN_WEIGHTED: (step - 1) - oldest}
