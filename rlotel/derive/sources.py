"""Samples by verl's `data_source`: bounded labels, the series by source, the step's figures.

A mean reward per source over several steps must weigh each step by how many samples the
source had in it (verl #3785), so rlotel keeps sums and counts (counters, the step span's
arrays) and lets the reader divide. The first MAX_DATA_SOURCES sources a process sees keep
their names for its lifetime (a source's series never change label); later ones are labelled
`other` and counted. A reward can be negative and a counter cannot go down: sums are kept as
the positive and the negative part.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from rlotel.base.drops import Drops
from rlotel.record.samples import DURATION_FIELDS, LENGTH_KINDS, REWARD, REWARD_PREFIX, SampleBatch
from rlotel.schema import attributes as attr
from rlotel.schema import catalogue as cat
from rlotel.schema import vocabulary as voc

log = logging.getLogger("rlotel")

MAX_DATA_SOURCES = 10  # distinct names a process labels; later sources are `other`
MAX_REWARD_COMPONENTS = 8  # reward_extra_info components kept per call (the rest dropped)
OTHER = "other"
UNKNOWN = "unknown"  # a sample whose data_source is missing or not a non-empty string
SIGNS = ("positive", "negative")


class SourceLabels:
    """Each sample's label: its data_source, while the process has seen fewer than `cap`
    names; `other` after that (counted in rlotel_data_sources_folded_samples)."""

    def __init__(
        self, drops: Drops, on_fold: Callable[[int], None], cap: int = MAX_DATA_SOURCES
    ) -> None:
        self._drops, self._on_fold, self._cap = drops, on_fold, cap
        self._named: set[str] = set()
        self._lock = threading.Lock()
        self._warned = False  # one line for the first source labelled other

    def label(self, batch: SampleBatch, data_source: Any) -> None:
        """Sets `batch.sources` from its samples' data sources (one a sample)."""
        if data_source is None or batch.discarded is not None:
            return
        given = np.asarray(data_source, dtype=object).ravel().tolist()
        if len(given) != batch.size:  # counted once, as its spans' field (build_batch)
            return
        try:
            counts = Counter(given)  # in C: the distinct values, in order seen, and how many
        except TypeError:  # an unhashable entry (a list): it has no source
            given = [value if isinstance(value, str) else None for value in given]
            counts = Counter(given)
        names = {value: self._name(_text(value)) for value in counts}
        folded = sum(n for value, n in counts.items() if names[value] == OTHER != _text(value))
        if folded:
            self._on_fold(folded)
        bad = sum(n for value, n in counts.items() if _text(value) is not value)
        if bad:
            self._drops.add(
                "samples", "bad_data_source", f"{bad} sample(s) labelled {UNKNOWN}", bad
            )
        same = all(name is value for value, name in names.items())  # the usual case
        batch.sources = np.array(given if same else [names[v] for v in given], dtype=object)

    def _name(self, name: str) -> str:
        with self._lock:
            if name in self._named or len(self._named) < self._cap:
                self._named.add(name)
                return name
        if not self._warned and name not in (OTHER, UNKNOWN):
            self._warned = True
            log.warning(
                "rlotel: %d data sources named; %r and any later ones are labelled %r",
                self._cap,
                name,
                OTHER,
            )
        return OTHER


def per_sample(data_source: Any) -> Any:
    """`data_source` as a sequence read twice (labels, spans): a string is one sample's, an
    array or list stays as given, another iterable is listed, anything else is one value."""
    if data_source is None or isinstance(data_source, (np.ndarray, list, tuple)):
        return data_source
    if isinstance(data_source, (str, bytes)):
        return [data_source]
    try:
        return list(data_source)
    except TypeError:
        return [data_source]


def _text(value: Any) -> str:
    """A sample's source name; UNKNOWN where it has none."""
    return value if isinstance(value, str) and value else UNKNOWN


def reward_components(extra: Mapping[str, Any] | None, drops: Drops) -> dict[str, Any]:
    """record_samples' `reward_extra_info` (component → one number a sample) as the batch's
    `reward.<component>` columns, at most MAX_REWARD_COMPONENTS (the rest dropped, counted)."""
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        drops.add("samples", "bad_reward_extra_info", f"not a mapping: {type(extra).__name__}")
        return {}
    named = [(name, values) for name, values in extra.items() if isinstance(name, str) and name]
    if len(named) != len(extra):
        drops.add("samples", "bad_reward_extra_info", "a component without a name")
    if len(named) > MAX_REWARD_COMPONENTS:
        left = [name for name, _ in named[MAX_REWARD_COMPONENTS:]]
        drops.add("samples", "reward_component_cap", f"components {left} not kept")
    return {REWARD_PREFIX + name: values for name, values in named[:MAX_REWARD_COMPONENTS]}


def _groups(batch: SampleBatch) -> Iterable[tuple[str, np.ndarray]]:
    """(label, that label's sample indices) of a labelled batch."""
    for name in dict.fromkeys(batch.sources.tolist()):
        yield name, np.flatnonzero(batch.sources == name)


def _at(batch: SampleBatch, field: str, rows: np.ndarray) -> np.ndarray | None:
    """The valid values of `field` at `rows` (None without the column)."""
    column = batch.columns.get(field)
    if column is None or column.size != batch.sources.size:
        return None
    values = column[rows]
    return values[~np.isnan(values)]


Write = tuple[str, cat.MetricSpec, Any, tuple[str, ...]]  # store method, family, value, labels


def series(batch: SampleBatch) -> Iterator[Write]:
    """The writes of a trained, labelled batch's series by data source (else none)."""
    if batch.sources is None or batch.discarded is not None:
        return
    components = [field for field in batch.columns if field.startswith(REWARD_PREFIX)]
    for source, rows in _groups(batch):
        yield "inc", cat.SOURCE_SAMPLES, float(rows.size), (source,)
        for field in (REWARD, *components):
            values = _at(batch, field, rows)
            if values is None:
                continue
            parts = (float(values[values > 0].sum()), float(-values[values < 0].sum()))
            if field == REWARD:
                yield "inc", cat.SOURCE_REWARDED, float(values.size), (source,)
                for sign, part in zip(SIGNS, parts, strict=True):
                    yield "inc", cat.SOURCE_REWARD, part, (source, sign)
                continue
            component = field[len(REWARD_PREFIX) :]
            count = cat.SOURCE_REWARD_COMPONENT_SAMPLES
            yield "inc", count, float(values.size), (component, source)
            for sign, part in zip(SIGNS, parts, strict=True):
                yield "inc", cat.SOURCE_REWARD_COMPONENT, part, (component, source, sign)
        for field, spec, label in (
            *((f, cat.SOURCE_STAGE_DURATION, f) for f in DURATION_FIELDS),
            *((f, cat.SOURCE_LENGTH, kind) for f, kind in LENGTH_KINDS.items()),
        ):
            values = _at(batch, field, rows)
            if values is not None:
                yield "observe", spec, values, (source, label)


class SourceFigures(NamedTuple):
    """One data source's trained samples in one step."""

    samples: int
    rewarded: int  # of them with a reward
    reward_sum: float
    response_tokens: float  # summed over the samples with a response length
    generate_p90_s: float | None  # of generate_sequences seconds (numpy's linear p90)

    @property
    def reward_mean(self) -> float | None:
        return self.reward_sum / self.rewarded if self.rewarded else None


def step_figures(batches: Iterable[SampleBatch]) -> dict[str, SourceFigures]:
    """The step's trained samples by data source (labelled batches only)."""
    labelled = [b for b in batches if b.sources is not None and b.discarded is None]
    if not labelled:
        return {}
    labels = np.concatenate([b.sources for b in labelled])

    reward, response, generate = (
        _joined(labelled, field) for field in (REWARD, voc.RESPONSE_LENGTH, voc.GENERATE_SEQUENCES)
    )
    figures = {}
    for name in sorted(set(labels.tolist())):
        rows = labels == name
        rewards, lengths, seconds = (c[rows] for c in (reward, response, generate))
        rewards, seconds = rewards[~np.isnan(rewards)], seconds[~np.isnan(seconds)]
        figures[name] = SourceFigures(
            int(rows.sum()),
            int(rewards.size),
            float(rewards.sum()),
            float(np.nansum(lengths)),
            float(np.percentile(seconds, 90)) if seconds.size else None,
        )
    return figures


def _joined(batches: list[SampleBatch], field: str) -> np.ndarray:
    """One field of several labelled batches end to end (NaN where a batch lacks it)."""
    parts = []
    for batch in batches:
        column = batch.columns.get(field)
        size = batch.sources.size
        parts.append(
            column if column is not None and column.size == size else np.full(size, np.nan)
        )
    return np.concatenate(parts)


def attributes(figures: Mapping[str, SourceFigures]) -> dict[str, Any]:
    """The step span's arrays, one entry per source (p90 only where every source has one)."""
    if not figures:
        return {}
    values = list(figures.values())
    result: dict[str, Any] = {
        attr.DATA_SOURCES: list(figures),
        attr.DATA_SOURCE_SAMPLES: [f.samples for f in values],
        attr.DATA_SOURCE_REWARDED: [f.rewarded for f in values],
        attr.DATA_SOURCE_REWARD_SUM: [f.reward_sum for f in values],
        attr.DATA_SOURCE_RESPONSE_SUM: [f.response_tokens for f in values],
    }
    if all(f.generate_p90_s is not None for f in values):
        result[attr.DATA_SOURCE_GENERATE_P90] = [f.generate_p90_s for f in values]
    return result


# The step span's arrays in SourceFigures' order (the p90 is optional): `attributes` writes
# them, `from_attributes` reads them back.
_ARRAYS = (
    attr.DATA_SOURCE_SAMPLES,
    attr.DATA_SOURCE_REWARDED,
    attr.DATA_SOURCE_REWARD_SUM,
    attr.DATA_SOURCE_RESPONSE_SUM,
    attr.DATA_SOURCE_GENERATE_P90,
)


def from_attributes(attributes: Mapping[str, Any]) -> dict[str, SourceFigures]:
    """A step span's figures by source; {} where it has none or they do not line up (an
    array of another length, a value that is not a finite number)."""
    names = attributes.get(attr.DATA_SOURCES)
    if not isinstance(names, (list, tuple)) or not names:
        return {}
    columns = [attributes.get(key) for key in _ARRAYS]
    p90 = columns.pop()
    if p90 is not None:
        columns.append(p90)
    if any(not isinstance(c, (list, tuple)) or len(c) != len(names) for c in columns):
        return {}
    numbers = [[_finite(value) for value in column] for column in columns]
    if any(value is None for column in numbers for value in column):
        return {}
    if p90 is None:
        numbers.append([None] * len(names))
    return {
        str(name): SourceFigures(int(samples), int(rewarded), reward_sum, response, p90_s)
        for name, samples, rewarded, reward_sum, response, p90_s in zip(
            names, *numbers, strict=True
        )
    }


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if np.isfinite(value) else None
