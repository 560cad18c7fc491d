"""Agent-loop per-sample timings: validated columns, verl's aggregates, slowest-sample picks.

verl reduces each batch to min/max/mean and one slowest sample; rlotel keeps every sample
(histograms, vectorised with numpy) and still produces verl's `agent_loop/*` keys exactly.
Invalid entries become NaN in their column: they are counted as drops and excluded, and
everything valid is kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np

from rlotel.base import ids
from rlotel.base.drops import Drops, as_finite_float
from rlotel.base.tally import Tally, ordered_pairs
from rlotel.record import trajectory
from rlotel.record.propagation import parse
from rlotel.schema import attributes as attr
from rlotel.schema import vocabulary as voc

DURATION_FIELDS = voc.AGENT_LOOP_STAGES
PREEMPTED = voc.NUM_PREEMPTED
LENGTH_KINDS = {voc.PROMPT_LENGTH: "prompt", voc.RESPONSE_LENGTH: "response"}
MIN_VERSION, MAX_VERSION = "min_weight_version", "max_weight_version"
VERSION_FIELDS = (MIN_VERSION, MAX_VERSION)  # verl's min/max_global_steps per trajectory
REWARD = voc.SAMPLE_REWARD  # per sample, any sign: async bias and the span's evaluation event
FIELDS = (*DURATION_FIELDS, PREEMPTED, *LENGTH_KINDS, *VERSION_FIELDS, REWARD)
INTEGER_FIELDS = frozenset({PREEMPTED, *LENGTH_KINDS, *VERSION_FIELDS})
INVALID_VERSION = -1  # in a version column: dropped (counted) when the batch was built
# Per-sample facts only the samples that get a span need: read for those, never copied.
IDENTITY_FIELDS = {  # field → span attribute
    "uid": attr.SAMPLE_UID,
    "session": attr.SAMPLE_SESSION,
    "output": attr.SAMPLE_OUTPUT,
    "turns": attr.SAMPLE_TURNS,
    "data_source": attr.SAMPLE_DATA_SOURCE,
}
TEXTUAL = frozenset({"uid", "data_source"})  # the rest are whole numbers
REWARD_PREFIX = REWARD + "."  # columns of reward components: `reward.<name>`, any sign
TIME_FIELDS = ("start_time_ns", "end_time_ns")  # real Unix times of the trajectory
GENERATED_STEP = "generated_step"
TRAJECTORY = "trajectory_context"  # carrier of the span the trajectory ran under (worker)
TURN_TIMES = "turn_times_ns"  # per sample: (start, end) Unix ns of each model turn
TOOL_TIMES = "tool_times_ns"  # per sample: (tool name, start, end) of each tool call
PART_FIELDS = (TURN_TIMES, TOOL_TIMES)  # one entry per sample, itself a sequence
MAX_PARTS = 256  # turns, and tool calls, kept per trajectory span (the rest counted)
SPAN_FIELDS = (*IDENTITY_FIELDS, *TIME_FIELDS, GENERATED_STEP, TRAJECTORY, REWARD, *PART_FIELDS)
UNKNOWN_PREEMPTIONS = -1.0  # verl's AgentLoopMetrics default: "not available"


class SampleSpan(NamedTuple):
    """One sample that gets its own span and serves as the exemplar of its buckets; its
    values stay in the batch's columns (read there, off the training thread)."""

    index: int
    span_id: int


class Versions(NamedTuple):
    """A batch's weight versions, tallied when it is built (no per-sample copies kept)."""

    low: Tally  # oldest version each trajectory used (verl's min_global_steps)
    high: Tally  # newest (max_global_steps)
    spans: Tally  # high - low + 1


class SpanExtras(NamedTuple):
    """What one sample's span says beyond its columns."""

    attributes: dict[str, Any]
    start_ns: int = 0  # Unix ns; 0: placed by its stage seconds
    end_ns: int = 0
    generated_step: int | None = None
    trajectory: tuple[int, int] | None = None  # (trace id, span id) where it ran
    reward: float | None = None
    turns: tuple[tuple[int, int], ...] = ()  # (start, end) Unix ns of each model turn
    tools: tuple[tuple[str, int, int], ...] = ()  # (tool name, start, end) of each call


class SampleBatch:
    """One `record_samples` call: columns of equal meaning, NaN where a value was invalid;
    weight versions as tallies, and per sample only for the samples that get spans."""

    __slots__ = (
        "_pending",
        "_totals",
        "columns",
        "discarded",
        "end_ns",
        "exported_elsewhere",
        "parent",
        "parent_span_id",
        "replica",
        "sources",
        "span_extras",
        "spans",
        "times",
        "token_versions",
        "trace_id",
        "turns",
        "versions",
    )

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        self.columns = columns
        self.versions: Versions | None = None
        self.span_extras: dict[int, SpanExtras] = {}  # by sample index, samples with spans
        self._pending: tuple[dict[str, Any], Drops] | None = None  # the caller's per-sample
        self.spans: list[SampleSpan] = []
        self.trace_id = 0
        self.parent: Any = None  # the Phase open when the samples were recorded
        self.parent_span_id = 0  # or a remote parent, from a propagated context
        self.exported_elsewhere = False  # spans made by the worker that measured them
        self.end_ns = 0
        self._totals: np.ndarray | None = None
        self.discarded: str | None = None  # generated, never trained: why (async bias)
        self.times: tuple[np.ndarray, np.ndarray] | None = None  # every sample's Unix ns
        self.turns: list | None = None  # every sample's model turns, with `times` (occupancy)
        self.replica: str | np.ndarray | None = None  # the rollout replica(s) it ran on
        self.sources: np.ndarray | None = None  # each sample's data-source label (capped)
        self.token_versions: tuple[float, float] | None = None  # Σ tokens, Σ tokens × oldest

    @property
    def size(self) -> int:
        sizes = [column.size for column in self.columns.values()]
        if not sizes and self.versions is not None:
            return self.versions.low.size
        return max(sizes, default=0)

    def settle(self) -> None:
        """End of the `record_samples` call: keep what the samples with spans need from
        the caller's per-sample arrays (identity, times, versions), and every sample's model
        turns for occupancy, and let go of them."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        per_sample, drops = pending
        turns = per_sample.get(TURN_TIMES)
        if turns is not None and self.times is not None:
            self.turns = list(turns)  # read at the step's end, off the training thread
        for span in self.spans:
            extras = _extras(per_sample, span.index, drops)
            if self.replica is not None:  # as given: one label, or one a sample
                replica = self.replica
                label = replica if isinstance(replica, str) else str(replica[span.index])
                extras.attributes[attr.REPLICA] = label
            self.span_extras[span.index] = extras

    def valid(self, field: str) -> np.ndarray:
        column = self.columns[field]
        return column[~np.isnan(column)]

    def totals(self) -> np.ndarray | None:
        """Per-sample sum of the duration stages present (-inf where any is invalid)."""
        if self._totals is not None:
            return self._totals
        present = [self.columns[f] for f in DURATION_FIELDS if f in self.columns]
        if len({column.size for column in present}) != 1:  # none, or of different lengths
            return None
        total = present[0]
        for column in present[1:]:
            total = total + column  # verl's order: (generate + tools) + score
        self._totals = np.where(np.isnan(total), -np.inf, total)
        return self._totals


def build_batch(
    records: Any,
    fields: Mapping[str, Any],
    drops: Drops,
    discarded: str | None = None,
    replica: Any = None,
) -> SampleBatch | None:
    """Columns from keyword arrays and/or verl's per-sample dicts (flat or per worker chunk)."""
    raw: dict[str, Any] = {}
    span_values = {name: fields[name] for name in SPAN_FIELDS if name in fields}
    if records is not None:
        raw.update(_columns_from_records(records, drops))
    for name, values in fields.items():
        if name in FIELDS or name.startswith(REWARD_PREFIX):  # a column (and reward a span field)
            if values is not None:
                raw[name] = values
        elif name not in SPAN_FIELDS:  # span-only fields are read below
            drops.add("samples", "unknown_field", f"record_samples({name}=...) is not a field")
    version_values = {name: raw.pop(name) for name in VERSION_FIELDS if name in raw}
    columns = {name: _column(name, values, drops) for name, values in raw.items()}
    columns = {name: column for name, column in columns.items() if column.size}
    sizes = {column.size for column in columns.values()}
    pair = _version_pair(version_values, sizes, drops) if version_values else None
    if not columns and pair is None:
        return None
    batch = SampleBatch(columns)
    per_sample = _span_fields(span_values, sizes, drops)
    if pair is not None:
        per_sample[MIN_VERSION], per_sample[MAX_VERSION], tallies = pair
        if tallies is not None:
            low, high, spans = tallies
            batch.versions = Versions(low, high, spans.shifted(1))
    cleaned = trajectory.annotate(
        batch,
        drops,
        size=next(iter(sizes)) if len(sizes) == 1 else None,
        discarded=discarded,
        replica=replica,
        times=(per_sample.get(TIME_FIELDS[0]), per_sample.get(TIME_FIELDS[1])),
        oldest=per_sample.get(MIN_VERSION),
        response=columns.get(voc.RESPONSE_LENGTH),
    )
    if cleaned is not None:  # checked and counted once: spans read the clean pairs
        per_sample[TIME_FIELDS[0]], per_sample[TIME_FIELDS[1]] = cleaned
    if per_sample:
        batch._pending = (per_sample, drops)
    if len(sizes) > 1:
        drops.add(
            "samples",
            "length_mismatch",
            f"columns of different lengths {sorted(sizes)}: each kept for its histogram, "
            "no slowest-sample pick across them",
        )
    return batch


def _columns_from_records(records: Any, drops: Drops) -> dict[str, list]:
    """verl shapes: list[dict] per sample, or list[list[dict]] per worker chunk."""
    try:
        items = list(records)
    except TypeError:
        drops.add("samples", "bad_records", f"records of type {type(records).__name__}")
        return {}
    if items and all(isinstance(item, (list, tuple)) for item in items):
        items = [sample for chunk in items for sample in chunk]
    columns: dict[str, list] = {}
    for position, sample in enumerate(items):
        for name in FIELDS:
            if isinstance(sample, Mapping):
                value = sample.get(name, _MISSING)
            else:
                value = getattr(sample, name, _MISSING)  # pydantic AgentLoopMetrics
            if value is not _MISSING:
                columns.setdefault(name, [None] * position).append(value)
        for column in columns.values():
            if len(column) < position + 1:
                column.append(None)  # a sample without this field: invalid, counted
    return columns


_MISSING = object()


def _length(values: Any) -> int:
    return len(_items(values))


def _items(values: Any) -> list:
    if isinstance(values, np.ndarray):
        return values.ravel().tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        return [values]
    return list(values)


def _numeric(items: list) -> np.ndarray | None:
    """The fast path: a flat list of plain numbers as one float64 array, else None."""
    try:
        array = np.asarray(items)
    except (ValueError, TypeError):
        return None
    if array.ndim != 1 or array.dtype.kind not in "iufb":
        return None
    return array.astype(np.float64)


def _column(name: str, values: Any, drops: Drops) -> np.ndarray:
    """float64 column; invalid entries NaN and counted. -1 preemptions stay (unknown)."""
    if hasattr(values, "detach") and hasattr(values, "numpy"):  # torch tensor
        values = values.detach().cpu().numpy()
    reason = ""
    integral = isinstance(values, np.ndarray) and values.dtype.kind in "iub"  # whole already
    if isinstance(values, np.ndarray) and values.dtype.kind in "iufb":
        column = values.astype(np.float64).ravel()
    else:
        items = _items(values)
        column = _numeric(items)
        if column is None:
            # Item by item on the original objects: numpy would turn [1.0, "x"] into two
            # strings (losing the number) and refuses ragged lists outright.
            parsed = [as_finite_float(item) for item in items]
            column = np.array([np.nan if v is None else v for v, _ in parsed], dtype=np.float64)
            reason = next((r for _, r in parsed if r), "")
    finite = np.isfinite(column)
    if name in INTEGER_FIELDS and name not in LENGTH_KINDS:
        valid = finite & (column >= 0)
        if name == PREEMPTED:
            valid |= column == UNKNOWN_PREEMPTIONS
        if not integral:
            whole = np.floor(np.where(finite, column, 0)) == np.where(finite, column, 0)
            if not reason and not whole.all():
                reason = "non_integer"
            valid &= whole
    elif name == REWARD or name.startswith(REWARD_PREFIX):
        valid = finite
    else:
        valid = finite & (column >= 0)
    n_bad = column.size - int(np.count_nonzero(valid))
    if n_bad:
        if not reason:
            reason = "non_finite" if not finite.all() else "negative"
        drops.add("samples", reason, f"{n_bad} invalid {name} value(s) of {column.size}", n_bad)
        column = np.where(valid, column, np.nan)
    return column


def _version_pair(
    values: dict[str, Any], sizes: set[int], drops: Drops
) -> tuple[np.ndarray, np.ndarray, tuple[Tally, Tally, Tally] | None] | None:
    """(min, max) version columns as int64, INVALID_VERSION where dropped (counted), and
    the valid pairs' tallies (min, max, max - min). Versions come in pairs of the batch's
    length; a sample whose oldest version is newer than its newest has neither."""
    if len(values) == 1:
        ((name, only),) = values.items()
        drops.add("samples", "missing_version", f"{name} without its pair: dropped", _length(only))
        return None
    low = _version_column(MIN_VERSION, values[MIN_VERSION], drops)
    high = _version_column(MAX_VERSION, values[MAX_VERSION], drops)
    if low.size != high.size or (sizes and {low.size} != sizes):
        drops.add(
            "samples",
            "length_mismatch",
            f"weight versions of {low.size}/{high.size} sample(s) do not pair with the "
            f"batch's {sorted(sizes)}: versions dropped",
            max(low.size, high.size),
        )
        return None
    if not low.size:
        return None
    tallies = ordered_pairs(low, high)
    if tallies is not None:
        return low, high, tallies  # the common case: every pair valid, nothing copied
    invalid = (low < 0) | (high < 0)
    inverted = ~invalid & (high < low)
    n_inverted = int(np.count_nonzero(inverted))
    if n_inverted:
        drops.add(
            "samples", "min_over_max", f"{n_inverted} sample(s) with min > max version", n_inverted
        )
    keep = ~(invalid | inverted)
    tallies = ordered_pairs(low[keep], high[keep]) if keep.any() else None
    return np.where(keep, low, INVALID_VERSION), np.where(keep, high, INVALID_VERSION), tallies


def _version_column(name: str, values: Any, drops: Drops) -> np.ndarray:
    """Whole non-negative numbers as int64 (a view of integer arrays), else INVALID_VERSION
    (counted: non-integer, negative, non-finite, not a number)."""
    if hasattr(values, "detach") and hasattr(values, "numpy"):  # torch tensor
        values = values.detach().cpu().numpy()
    if not isinstance(values, np.ndarray):
        items = _items(values)
        try:
            values = np.asarray(items)
        except (ValueError, TypeError):
            values = np.asarray(items, dtype=object)
    if values.dtype.kind in "iu" and values.ndim == 1:
        column = values.astype(np.int64, copy=False)
        n_negative = int(np.count_nonzero(column < 0)) if int(column.min(initial=0)) < 0 else 0
        if n_negative:
            drops.add("samples", "negative", f"{n_negative} invalid {name} value(s)", n_negative)
            column = np.where(column < 0, INVALID_VERSION, column)
        return column
    floats = _column(name, values if values.dtype.kind in "iufb" else values.tolist(), drops)
    return np.where(np.isnan(floats), INVALID_VERSION, floats).astype(np.int64)


def _span_fields(values: dict[str, Any], sizes: set[int], drops: Drops) -> dict[str, Any]:
    """The span-only fields that pair with the batch (one entry per sample), else dropped."""
    kept = {}
    for name, column in values.items():
        if column is None:
            continue
        sized = hasattr(column, "__len__")  # a field of sequences: samples on its first axis
        size = (len(column) if sized else None) if name in PART_FIELDS else _length(column)
        if size is None or (sizes and {size} != sizes):
            drops.add(
                "samples",
                "length_mismatch",
                f"{name} of {size} sample(s) does not pair with the batch's {sorted(sizes)}",
            )
            continue
        kept[name] = column if hasattr(column, "__getitem__") else list(column)
    return kept


def _extras(per_sample: dict[str, Any], index: int, drops: Drops) -> SpanExtras:
    """One sample's identity, real times, generating step, reward, turns and tool calls
    (bad entries dropped and counted; the span keeps the rest)."""
    attributes: dict[str, Any] = {}
    for name, key in IDENTITY_FIELDS.items():
        if name in per_sample:
            value = _item(per_sample[name], index)
            if name in TEXTUAL and isinstance(value, (str, int)) and not isinstance(value, bool):
                attributes[key] = str(value)
            elif name not in TEXTUAL and (whole := _whole(value)) is not None:
                attributes[key] = whole
            elif value is not None:
                drops.add("samples", "bad_identity", f"{name}={value!r} of sample {index}")
    if attr.SAMPLE_UID in attributes:  # verl V1's trajectory key `{uid}_{session}_{index}`
        attributes[attr.CONVERSATION_ID] = "_".join(
            str(attributes[key])
            for key in (attr.SAMPLE_UID, attr.SAMPLE_SESSION, attr.SAMPLE_OUTPUT)
            if key in attributes
        )
    if MIN_VERSION in per_sample:
        low, high = int(per_sample[MIN_VERSION][index]), int(per_sample[MAX_VERSION][index])
        if low != INVALID_VERSION:
            attributes[attr.SAMPLE_VERSION_MIN] = low
            attributes[attr.SAMPLE_VERSION_MAX] = high
    given = [_item(per_sample.get(name), index) for name in TIME_FIELDS]
    start, end = (_whole(value) for value in given)
    if start is None or end is None or end < start:
        if any(value is not None for value in given):  # None: not measured, not bad
            drops.add("samples", "bad_time", f"sample {index}: start {given[0]}, end {given[1]}")
        start = end = 0
    generated = _whole(_item(per_sample.get(GENERATED_STEP), index))
    trajectory = _item(per_sample.get(TRAJECTORY), index)
    ran_under = parse(trajectory)
    if trajectory is not None and ran_under is None:
        drops.add("samples", "bad_context", f"sample {index}: trajectory context {trajectory!r}")
    reward = None
    if REWARD in per_sample:
        given_reward = _item(per_sample[REWARD], index)
        # A bad reward is counted once, by its column (it is also the async-bias input):
        # here the span only goes without its evaluation event.
        reward, _ = as_finite_float(given_reward) if given_reward is not None else (None, "")
    turns = _parts(per_sample, TURN_TIMES, index, drops)
    tools = _parts(per_sample, TOOL_TIMES, index, drops)
    return SpanExtras(attributes, start, end, generated, ran_under, reward, turns, tools)


def _parts(per_sample: dict[str, Any], name: str, index: int, drops: Drops) -> tuple:
    """One sample's turns ((start, end) Unix ns) or tool calls ((name, start, end)): the
    well-formed entries, at most MAX_PARTS; the others dropped with one counted line."""
    column = per_sample.get(name)
    value = None if column is None else column[index]
    if value is None:
        return ()  # not measured, not bad
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # torch tensor
        value = value.detach().cpu().numpy()
    if hasattr(value, "tolist"):
        value = value.tolist()
    named = name == TOOL_TIMES
    reason = "bad_tool" if named else "bad_turn"
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        drops.add("samples", reason, f"sample {index}: {name} {value!r} is not a list")
        return ()
    entries = list(value)
    kept = [part for part in (_part(entry, named) for entry in entries) if part is not None]
    bad = len(entries) - len(kept)
    kept = kept[:MAX_PARTS]
    dropped = len(entries) - len(kept)
    if dropped:
        shape = "(tool name, start_ns, end_ns)" if named else "(start_ns, end_ns)"
        over = f", {dropped - bad} beyond the {MAX_PARTS} kept" if dropped > bad else ""
        drops.add(
            "samples",
            reason,
            f"sample {index}: {bad} of {len(entries)} {name} entries not {shape} with "
            f"0 <= start <= end{over}",
            dropped,
        )
    return tuple(kept)


def _part(entry: Any, named: bool) -> tuple | None:
    if hasattr(entry, "tolist"):
        entry = entry.tolist()
    if not isinstance(entry, (tuple, list)) or len(entry) != 2 + named:
        return None
    if named:
        tool, *times = entry
        if not isinstance(tool, str) or not tool:
            return None
    else:
        times = entry
    start, end = (_whole(value.item() if hasattr(value, "item") else value) for value in times)
    if start is None or end is None or end < start:
        return None
    return (tool, start, end) if named else (start, end)


def _item(column: Any, index: int) -> Any:
    if column is None:
        return None
    value = column[index]
    return value.item() if hasattr(value, "item") else value  # numpy / torch scalars


def _whole(value: Any) -> int | None:
    """A non-negative whole number as int, else None."""
    if value is None or isinstance(value, bool):
        return None
    number, _ = as_finite_float(value)
    if number is None or number < 0 or not number.is_integer():
        return None
    return int(value) if isinstance(value, int) else int(number)


def pick_sample_spans(batch: SampleBatch, limit: int) -> None:
    """The `limit` slowest samples (by total stage seconds) get span ids and exemplars."""
    totals = batch.totals()
    if limit <= 0 or totals is None:
        return
    if totals.size > limit:
        candidates = np.argpartition(totals, totals.size - limit)[-limit:]
    else:
        candidates = np.arange(totals.size)
    candidates = candidates[np.isfinite(totals[candidates])]
    order = candidates[np.argsort(-totals[candidates], kind="stable")]
    batch.spans.extend(SampleSpan(index, ids.span_id()) for index in order.tolist())


def verl_aggregates(batches: list[SampleBatch]) -> dict[str, float]:
    """verl 0.9.1 `AgentLoopManager._performance_metrics`, over every sample of a step.

    min/max/mean per field (num_preempted keeps verl's -1 for unknown); the slowest sample
    is the first argmax of generate_sequences + tool_calls + compute_score, as in verl.
    """
    metrics: dict[str, float] = {}
    for name in (PREEMPTED, *DURATION_FIELDS):
        values = [b.valid(name) for b in batches if name in b.columns]
        if not values or not sum(v.size for v in values):
            continue
        column = values[0] if len(values) == 1 else np.concatenate(values)
        low, high = column.min(), column.max()
        if name == PREEMPTED:
            low, high = int(low), int(high)
        metrics[f"{voc.AGENT_LOOP}{name}/min"] = low
        metrics[f"{voc.AGENT_LOOP}{name}/max"] = high
        metrics[f"{voc.AGENT_LOOP}{name}/mean"] = column.mean()
    aligned = [b for b in batches if b.totals() is not None]
    if not aligned:
        return metrics
    totals = np.concatenate([b.totals() for b in aligned])
    if not np.isfinite(totals).any():
        return metrics
    slowest = int(np.argmax(totals))
    for batch in aligned:
        size = batch.totals().size
        if slowest >= size:
            slowest -= size
            continue
        for name in (*DURATION_FIELDS, PREEMPTED, *LENGTH_KINDS):
            column = batch.columns.get(name)
            if column is None or slowest >= column.size or np.isnan(column[slowest]):
                continue
            value = column[slowest]
            integral = name == PREEMPTED or name in LENGTH_KINDS
            metrics[f"{voc.AGENT_LOOP_SLOWEST}{name}"] = int(value) if integral else value
        break
    return metrics


def use_remote_spans(batch: SampleBatch, span_ids: Mapping[Any, Any]) -> int:
    """Adopt spans another process created for some samples (index → span id, hex or int)
    as this batch's exemplars. Returns how many entries were unusable."""
    bad = 0
    batch.exported_elsewhere = True
    for index, span_id in span_ids.items():
        try:
            position = int(index)
            value = int(span_id, 16) if isinstance(span_id, str) else int(span_id)
        except (TypeError, ValueError):
            bad += 1
            continue
        measured = any(
            0 <= position < column.size and not np.isnan(column[position])
            for column in batch.columns.values()
        )
        if not measured or not value:
            bad += 1
            continue
        batch.spans.append(SampleSpan(position, value))
    return bad
