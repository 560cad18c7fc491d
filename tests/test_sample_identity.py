"""Sample spans that say which trajectory they are: identity, real times, the generating
step (a span link), weight versions and staleness — read only for the samples with spans."""

from __future__ import annotations

import time

import numpy as np

import rlotel
from tests.helpers import file_spans

GENERATE = [0.5, 3.0, 1.0, 2.0]  # samples 1, 3, 2 are the three slowest


def _record(tel, **extra):
    now = time.time_ns()
    fields = dict(
        generate_sequences=GENERATE,
        prompt_length=[10, 11, 12, 13],
        response_length=[20, 21, 22, 23],
        uid=["a", "b", "c", "d"],
        session=[0, 1, 0, 1],
        turns=np.array([2, 4, 2, 6]),
        start_time_ns=[now - 9_000_000_000 + i for i in range(4)],
        end_time_ns=[now - 1_000_000_000 + i for i in range(4)],
        generated_step=[1, 1, 3, 2],
        min_weight_version=[0, 0, 2, 1],
        max_weight_version=[1, 0, 2, 2],
    )
    fields.update(extra)
    return tel.record_samples(**fields), fields


def test_sample_spans_carry_identity_real_times_and_a_link_to_the_generating_step(tmp_path):
    tel = rlotel.init(
        run="id", prometheus_port=None, traces_file=tmp_path / "t.jsonl", max_sample_spans=3
    )
    for number in (1, 2):
        with tel.step(number), tel.phase("gen"):
            pass
    with tel.step(3), tel.phase("gen"):
        span_ids, fields = _record(tel)
    tel.shutdown()
    spans = file_spans(tmp_path / "t.jsonl", run="id")
    steps = {s["attrs"]["rl.step"]: s for s in spans if s["name"] == "step"}
    samples = {s["attrs"]["rl.sample.index"]: s for s in spans if s["name"] == "sample"}
    assert sorted(samples) == [1, 2, 3]
    assert {int(samples[i]["id"], 16) for i in samples} == {int(v, 16) for v in span_ids.values()}
    for index, span in samples.items():
        attrs = span["attrs"]
        assert attrs["rl.sample.uid"] == fields["uid"][index]
        assert attrs["rl.sample.session"] == fields["session"][index]
        assert attrs["rl.sample.turns"] == int(fields["turns"][index])
        assert attrs["gen_ai.usage.input_tokens"] == fields["prompt_length"][index]
        assert attrs["gen_ai.usage.output_tokens"] == fields["response_length"][index]
        assert attrs["rl.sample.weight_version.min"] == fields["min_weight_version"][index]
        assert attrs["rl.sample.weight_version.max"] == fields["max_weight_version"][index]
        assert attrs["rl.sample.staleness"] == (3 - 1) - fields["max_weight_version"][index]
        assert attrs["rl.sample.generated_step"] == fields["generated_step"][index]
        assert span["start"] == fields["start_time_ns"][index]  # real times, not durations
        assert span["end"] == fields["end_time_ns"][index]
        assert span["trace"] == steps[3]["trace"]  # consumed in step 3: its trace
    # generated in steps 1 and 2: linked to them; generated in step 3 itself: no link
    for index, generated in ((1, 1), (3, 2)):
        ((trace, span_id, link_attrs),) = samples[index]["links"]
        assert (trace, span_id) == (steps[generated]["trace"], steps[generated]["id"])
        assert link_attrs == {"rl.link.relation": "generated_in", "rl.step": generated}
    assert samples[2]["links"] == []


def test_caller_may_reuse_its_arrays_once_record_samples_returns(tmp_path):
    tel = rlotel.init(
        run="reuse", prometheus_port=None, traces_file=tmp_path / "t.jsonl", max_sample_spans=1
    )
    low, high = np.array([0, 0, 2, 1]), np.array([1, 0, 2, 2])
    with tel.step(3) as step, tel.phase("gen"):
        _record(tel, min_weight_version=low, max_weight_version=high)
        low[:], high[:] = 7, 9  # the caller's buffer, reused in place
    tel.shutdown()
    (sample,) = [s for s in file_spans(tmp_path / "t.jsonl") if s["name"] == "sample"]
    assert sample["attrs"]["rl.sample.weight_version.max"] == 0  # sample 1, as recorded
    assert step.metrics["training/off_policy/trajectory_staleness/max"] == 2 - 0
    assert step.metrics["training/off_policy/trajectory_spans/mean"] == (2 + 1 + 1 + 2) / 4


def test_bad_identity_and_times_are_counted_and_the_span_stays(tmp_path):
    tel = rlotel.init(
        run="bad", prometheus_port=None, traces_file=tmp_path / "t.jsonl", max_sample_spans=2
    )
    now = time.time_ns()
    with tel.step(3), tel.phase("gen"):
        _record(
            tel,
            uid=[1.5, "b", "c", "d"],  # sample 0 is not among the slowest: never read
            session=[0, -1, 0, 1],  # sample 1: negative
            end_time_ns=[now, now - 10_000_000_000, now, now],  # sample 1 ends before start
            turns=[1, 2],  # does not pair with the batch
        )
    tel.shutdown()
    reasons = {key[1]: n for key, n in tel.drops.snapshot().items() if key[0] == "samples"}
    assert reasons == {"bad_identity": 1, "bad_time": 1, "length_mismatch": 1}
    spans = file_spans(tmp_path / "t.jsonl")
    (gen,) = [s for s in spans if s["name"] == "gen"]
    samples = {s["attrs"]["rl.sample.index"]: s for s in spans if s["name"] == "sample"}
    assert sorted(samples) == [1, 3]
    assert "rl.sample.session" not in samples[1]["attrs"]
    assert "rl.sample.turns" not in samples[1]["attrs"]
    assert samples[1]["attrs"]["rl.sample.uid"] == "b"
    # placed by its stage seconds inside the phase, as without times
    assert gen["start"] <= samples[1]["start"] <= samples[1]["end"] <= gen["end"]
    assert samples[3]["end"] == now  # its real end time kept
