"""Samples by verl's `data_source`: series of sums and counts by source, the step span's
arrays, sample spans' source and reward components, bounded labels, bad input counted."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from rlotel.derive import sources
from rlotel.integrations import verl_v1
from tests.helpers import parse_exposition, scrape

RUN = "by-source"


def series(tel, name: str) -> dict[frozenset, float]:
    """The family's series on /metrics, by their labels other than `run`."""
    return {
        frozenset(pair for pair in labels if pair[0] != "run"): value
        for (series_name, labels), value in parse_exposition(scrape(tel.metrics_url)).items()
        if series_name == name
    }


def of(**labels: str) -> frozenset:
    return frozenset(labels.items())


def two_steps(tel) -> list[dict]:
    """Step 1: 6 samples of A, 2 of B; step 2: 2 of A, 6 of B (rewards of both signs)."""
    rng = np.random.default_rng(3)
    steps = []
    for number, (a, b) in enumerate(((6, 2), (2, 6)), start=1):
        source = np.array(["A"] * a + ["B"] * b, dtype=object)
        rng.shuffle(source)
        given = {
            "generate_sequences": rng.uniform(0.1, 3.0, a + b),
            "response_length": rng.integers(1, 500, a + b),
            "reward": rng.normal(0.0, 1.0, a + b),
            "data_source": source,
            "reward_extra_info": {"acc": rng.integers(0, 2, a + b), "penalty": -rng.random(a + b)},
        }
        with tel.step(number), tel.phase("gen"):
            tel.record_samples(**given)
        steps.append(given)
    assert tel.flush(10)
    return steps


def test_series_by_source_are_sums_and_counts_of_every_sample(make_tel) -> None:
    tel = make_tel(run=RUN)
    steps = two_steps(tel)
    source = np.concatenate([s["data_source"] for s in steps])
    reward = np.concatenate([s["reward"] for s in steps])
    length = np.concatenate([s["response_length"] for s in steps])
    acc = np.concatenate([s["reward_extra_info"]["acc"] for s in steps])
    penalty = np.concatenate([s["reward_extra_info"]["penalty"] for s in steps])
    samples = series(tel, "rlotel_source_samples_total")
    rewards = series(tel, "rlotel_source_reward_total")
    rewarded = series(tel, "rlotel_source_rewarded_samples_total")
    components = series(tel, "rlotel_source_reward_component_total")
    lengths = series(tel, "rlotel_source_length_tokens_sum")
    for name in ("A", "B"):
        mine = source == name
        assert samples[of(data_source=name)] == mine.sum() == rewarded[of(data_source=name)] == 8
        positive = rewards[of(data_source=name, sign="positive")]
        negative = rewards[of(data_source=name, sign="negative")]
        assert positive >= 0 and negative >= 0
        assert positive - negative == pytest.approx(reward[mine].sum())  # the signed sum
        assert positive == pytest.approx(reward[mine & (reward > 0)].sum())
        assert lengths[of(data_source=name, kind="response")] == length[mine].sum()
        acc_sum = components[of(component="acc", data_source=name, sign="positive")]
        assert acc_sum == acc[mine].sum()
        minus = components[of(component="penalty", data_source=name, sign="negative")]
        assert minus == pytest.approx(-penalty[mine].sum())
    stages = series(tel, "rlotel_source_stage_duration_seconds_count")
    assert stages == {
        of(data_source="A", stage="generate_sequences"): 8,
        of(data_source="B", stage="generate_sequences"): 8,
    }


def test_the_step_span_says_each_sources_sums_and_counts(make_tel, span_exporter) -> None:
    tel = make_tel(run=RUN)
    steps = two_steps(tel)
    spans = {
        s.attributes["rl.step"]: s for s in span_exporter.get_finished_spans() if s.name == "step"
    }
    for number, given in enumerate(steps, start=1):
        attrs = spans[number].attributes
        names = list(attrs["rl.data_source.names"])
        assert names == ["A", "B"]
        for index, name in enumerate(names):
            mine = given["data_source"] == name
            assert attrs["rl.data_source.samples"][index] == mine.sum()
            assert attrs["rl.data_source.reward.count"][index] == mine.sum()
            assert attrs["rl.data_source.reward.sum"][index] == pytest.approx(
                given["reward"][mine].sum()
            )
            assert (
                attrs["rl.data_source.response_length.sum"][index]
                == given["response_length"][mine].sum()
            )
            p90 = np.percentile(given["generate_sequences"][mine], 90)
            assert attrs["rl.data_source.generate_sequences.p90_s"][index] == pytest.approx(p90)
        read = sources.from_attributes(dict(attrs))  # what the report and analyze read back
        assert list(read) == names
        assert [f.samples for f in read.values()] == list(attrs["rl.data_source.samples"])
        assert [f.generate_p90_s for f in read.values()] == list(
            attrs["rl.data_source.generate_sequences.p90_s"]
        )


def test_sample_spans_carry_their_source_and_reward_components(make_tel, span_exporter) -> None:
    tel = make_tel(run=RUN, max_sample_spans=4)
    steps = two_steps(tel)
    samples = [s for s in span_exporter.get_finished_spans() if s.name == "sample"]
    assert len(samples) == 8
    given = {1: steps[0], 2: steps[1]}
    for span in samples:
        attrs = span.attributes
        index = attrs["rl.sample.index"]
        step = given[attrs["rl.step"]]
        assert attrs["rl.sample.data_source"] == step["data_source"][index]
        assert attrs["rl.sample.reward.acc"] == step["reward_extra_info"]["acc"][index]
        assert attrs["rl.sample.reward.penalty"] == pytest.approx(
            step["reward_extra_info"]["penalty"][index]
        )


def test_sources_past_the_cap_are_labelled_other_and_counted_once_logged(make_tel, caplog) -> None:
    tel = make_tel(run=RUN)
    names = [f"source-{n:02d}" for n in range(sources.MAX_DATA_SOURCES + 3)]
    with caplog.at_level(logging.WARNING, logger="rlotel"), tel.step(1), tel.phase("gen"):
        tel.record_samples(reward=[1.0] * len(names), data_source=names)
        tel.record_samples(reward=[1.0] * 4, data_source=names[-2:] * 2)  # still other
    assert tel.flush(10)
    samples = series(tel, "rlotel_source_samples_total")
    kept = {of(data_source=name): 1.0 for name in names[: sources.MAX_DATA_SOURCES]}
    assert samples == {**kept, of(data_source=sources.OTHER): 3.0 + 4.0}
    assert series(tel, "rlotel_data_sources_folded_samples_total") == {frozenset(): 7.0}
    folded = [r for r in caplog.records if "labelled 'other'" in r.getMessage()]
    assert len(folded) == 1, [r.getMessage() for r in caplog.records]


def test_bad_sources_and_components_are_counted_and_the_rest_kept(make_tel) -> None:
    tel = make_tel(run=RUN)
    with tel.step(1), tel.phase("gen"):
        tel.record_samples(reward=[1.0, 2.0, 3.0], data_source=["A", None, 7])
        tel.record_samples(reward=[1.0, 2.0], data_source=["A"])  # does not pair: no labels
        tel.record_samples(reward=[1.0], data_source=["A"], reward_extra_info=[1.0])
        many = {f"c{n}": [1.0] for n in range(sources.MAX_REWARD_COMPONENTS + 2)}
        tel.record_samples(reward=[1.0], data_source=["A"], reward_extra_info=many)
        tel.record_samples(reward=[1.0], data_source=["A"], reward_extra_info={"x": ["text"]})
        tel.record_samples(reward=[5.0, 5.0], data_source=["A", "A"], discarded="stale")
    assert tel.flush(10)
    assert series(tel, "rlotel_source_samples_total") == {
        of(data_source="A"): 1.0 + 3.0,
        of(data_source=sources.UNKNOWN): 2.0,
    }
    components = series(tel, "rlotel_source_reward_component_samples_total")
    assert {dict(k)["component"] for k in components} == {
        f"c{n}" for n in range(sources.MAX_REWARD_COMPONENTS)
    } | {"x"}
    assert components[of(component="x", data_source="A")] == 0.0  # "text" is no number
    dropped = {
        dict(labels)["reason"]: value
        for labels, value in series(tel, "rlotel_telemetry_dropped_total").items()
        if dict(labels)["signal"] == "samples"
    }
    assert dropped["bad_data_source"] == 2
    assert dropped["length_mismatch"] == 1
    assert dropped["bad_reward_extra_info"] == 1
    assert dropped["reward_component_cap"] == 1
    assert dropped["non_numeric"] == 1  # the text component's one entry


def test_verl_stamps_give_reward_source_and_the_components_every_sample_has() -> None:
    stamps = [
        verl_v1.Stamp(1, 2, 1, None, None, 0.5, None, "A", {"score": 0.5, "acc": 1.0}),
        verl_v1.Stamp(1, 2, 1, None, None, 1.5, None, "B", {"score": 1.5, "acc": 0.0, "x": 1.0}),
    ]
    assert verl_v1.scored(stamps) == {
        "reward": [0.5, 1.5],
        "data_source": ["A", "B"],
        "reward_extra_info": {"score": [0.5, 1.5], "acc": [1.0, 0.0]},
    }
    read = verl_v1.Stamp.read(stamps[0].wire())
    assert read == stamps[0]
    older = verl_v1.Stamp.read(list(stamps[0])[:7])  # a worker of the last release
    assert verl_v1.scored([older]) == {"reward": [0.5]}
    assert verl_v1._numbers({"acc": True, "pred": "42", "score": np.float32(0.25)}) == {
        "acc": 1.0,
        "score": 0.25,
    }
