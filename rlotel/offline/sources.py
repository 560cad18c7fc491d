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
from typing import Any, NamedTuple

from rlotel.offline.analyze import StepRecord
from rlotel.schema import attributes as attr

# The arrays every step with figures has, in SourceStep's order (the p90 is optional).
_ARRAYS = (
    attr.DATA_SOURCE_SAMPLES,
    attr.DATA_SOURCE_REWARDED,
    attr.DATA_SOURCE_REWARD_SUM,
    attr.DATA_SOURCE_RESPONSE_SUM,
)


class SourceStep(NamedTuple):
    """One data source's trained samples in one step, as its step span says."""

    samples: int
    rewarded: int  # of them with a reward
    reward_sum: float
    response_tokens: float
    generate_p90_s: float | None  # p90 of the samples' generate_sequences seconds

    @property
    def reward_mean(self) -> float | None:
        return self.reward_sum / self.rewarded if self.rewarded else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def step_sources(step: StepRecord) -> dict[str, SourceStep]:
    """A step's figures by data source; {} for a step without them (or not read)."""
    attributes = step.span.attributes if step.span is not None else {}
    names = attributes.get(attr.DATA_SOURCES)
    if not isinstance(names, (list, tuple)) or not names:
        return {}
    columns = [attributes.get(key) for key in _ARRAYS]
    p90 = attributes.get(attr.DATA_SOURCE_GENERATE_P90)
    if p90 is not None:
        columns.append(p90)
    if any(not isinstance(c, (list, tuple)) or len(c) != len(names) for c in columns):
        return {}
    numbers = [[_number(v) for v in column] for column in columns]
    if any(v is None for column in numbers for v in column):
        return {}
    figures = {}
    for index, name in enumerate(names):
        samples, rewarded, reward_sum, response, *rest = (column[index] for column in numbers)
        figures[str(name)] = SourceStep(
            int(samples), int(rewarded), reward_sum, response, rest[0] if rest else None
        )
    return figures


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
    per_source: dict[str, list[tuple[int, SourceStep]]] = {}
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
