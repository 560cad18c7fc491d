"""A run's samples by verl's `data_source`, read back from its step spans' arrays.

Each closed step's `step` span carries parallel arrays, one entry per data source (names,
samples, samples with a reward, the reward's sum, the response tokens' sum and, where every
source had generation seconds, each source's p90 of them). They are sums and counts so
that a mean over several steps weighs each step by its volume: a source's mean reward over
a run is Σ reward sum ÷ Σ rewarded samples, not the mean of its per-step means (verl
#3785: a step with 6 samples of a source and one with 2 do not count the same). Its mean
response length is Σ response tokens ÷ Σ samples. `rlotel report` and `rlotel compare`
show these; a step whose arrays do not line up (lengths differ, a value not a number) is
not read.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rlotel.derive.sources import SourceFigures, from_attributes
from rlotel.offline.analyze import StepRecord


def step_sources(step: StepRecord) -> dict[str, SourceFigures]:
    """A step's figures by data source; {} for a step without them (or not read)."""
    return from_attributes(step.span.attributes if step.span is not None else {})


@dataclass(frozen=True)
class SourceTotals:
    """One data source over a run's steps (those given): volume-weighted means."""

    name: str
    steps: int  # steps the source had samples in
    samples: int
    rewarded: int
    reward_sum: float
    response_tokens: float
    generate_p90_s: float | None  # median over its steps of the step's p90 (those that had one)
    last_step: int  # the last step the source had samples in
    last_reward_mean: float | None  # that step's mean reward

    @property
    def reward_mean(self) -> float | None:
        """Σ reward sum ÷ Σ rewarded samples: each step weighs as many samples as it had."""
        return self.reward_sum / self.rewarded if self.rewarded else None

    @property
    def response_mean(self) -> float | None:
        """Σ response tokens ÷ Σ samples."""
        return self.response_tokens / self.samples if self.samples else None


def by_source(steps: Iterable[StepRecord]) -> dict[str, SourceTotals]:
    """Every data source of the steps, the most samples first; {} when no step has figures."""
    per_source: dict[str, list[tuple[int, SourceFigures]]] = {}
    for step in steps:
        for name, figures in step_sources(step).items():
            per_source.setdefault(name, []).append((step.number, figures))
    totals = []
    for name, seen in per_source.items():
        figures = [f for _, f in seen]
        p90s = [f.generate_p90_s for f in figures if f.generate_p90_s is not None]
        last_step, last = max(seen, key=lambda pair: pair[0])
        totals.append(
            SourceTotals(
                name,
                len({number for number, _ in seen}),
                sum(f.samples for f in figures),
                sum(f.rewarded for f in figures),
                math.fsum(f.reward_sum for f in figures),
                math.fsum(f.response_tokens for f in figures),
                statistics.median(p90s) if p90s else None,
                last_step,
                last.reward_mean,
            )
        )
    totals.sort(key=lambda t: (-t.samples, t.name))
    return {t.name: t for t in totals}


def total_samples(totals: Mapping[str, SourceTotals]) -> int:
    return sum(t.samples for t in totals.values())
