"""Samples measured in another process join the driver's trace through a traceparent."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import rlotel
from tests.helpers import finished_spans, parse_exposition, scrape


def test_worker_sample_spans_are_children_of_driver_gen(make_tel, span_exporter):
    driver = make_tel(run="prop")
    worker_spans = InMemorySpanExporter()
    worker = rlotel.init(run="prop", prometheus_port=None, span_exporters=[worker_spans])
    try:
        with driver.step(1), driver.phase("gen"):
            carrier = driver.current_context()
            picked = worker.record_samples(  # as a Ray actor would, with the carrier
                generate_sequences=[0.5, 3.0, 1.0], response_length=[10, 300, 20], context=carrier
            )
            driver.record_samples(
                generate_sequences=[0.5, 3.0, 1.0], response_length=[10, 300, 20],
                exemplar_spans=picked,
            )  # fmt: skip
        worker.flush(10)
        samples = [s for s in worker_spans.get_finished_spans() if s.name == "sample"]
        spans = finished_spans(driver, span_exporter)
    finally:
        worker.shutdown()
    gen = next(s for s in spans if s.name == "gen")
    assert carrier["traceparent"] == f"00-{gen.context.trace_id:032x}-{gen.context.span_id:016x}-01"
    assert len(samples) == 3
    for span in samples:
        assert span.parent.span_id == gen.context.span_id
        assert span.context.trace_id == gen.context.trace_id
    assert picked == {s.attributes["rl.sample.index"]: f"{s.context.span_id:016x}" for s in samples}
    assert not [s for s in spans if s.name == "sample"]  # the driver made none of its own
    text = scrape(driver.metrics_url, accept="application/openmetrics-text; version=1.0.0")
    assert f'span_id="{picked[1]}"' in text  # the driver's exemplar leads to the worker span
    assert (
        parse_exposition(scrape(driver.metrics_url))[
            (
                "rlotel_agent_loop_duration_seconds_count",
                frozenset({("run", "prop"), ("stage", "generate_sequences")}),
            )
        ]
        == 3
    )


def test_bad_carriers_are_counted_not_raised(make_tel):
    tel = make_tel(run="prop")
    assert tel.current_context() == {}  # nothing open
    for carrier in ({"traceparent": "garbage"}, {}, "x", {"traceparent": "00-" + "0" * 32}):
        assert tel.record_samples(generate_sequences=[1.0], context=carrier) == {}
    tel.record_samples(generate_sequences=[1.0], exemplar_spans={"a": "zz", 5: "ff"})
    tel.flush(10)
    drops = parse_exposition(scrape(tel.metrics_url))
    reasons = {
        dict(labels)["reason"]: value
        for (name, labels), value in drops.items()
        if name == "rlotel_telemetry_dropped_total"
    }
    assert reasons["bad_context"] == 4 and reasons["bad_exemplar"] == 1


def test_concurrent_remote_calls_keep_their_own_parents(make_tel, span_exporter) -> None:
    """A worker serving two traced calls at once (asyncio tasks): each call's phase is the
    root of its own trace under its own caller, and what opens inside nests in it."""
    import asyncio

    from rlotel.record.propagation import parse, traceparent

    tel = make_tel(run="remote", span_exporters=[span_exporter])
    callers = [traceparent(0xA1 + n, 0xB1 + n) for n in range(2)]
    inner: dict[int, tuple[int, int] | None] = {}

    async def serve(n: int) -> None:
        with tel.phase("generate", context=callers[n]):
            await asyncio.sleep(0.01)  # the other call opens meanwhile
            with tel.phase("decode"):
                inner[n] = parse(tel.current_context())
                await asyncio.sleep(0.01)

    async def main() -> None:
        await asyncio.gather(serve(0), serve(1))

    asyncio.run(main())
    for n in range(2):
        trace_id, _ = parse(callers[n])
        assert inner[n] is not None and inner[n][0] == trace_id
    assert inner[0][1] != inner[1][1]
    spans = finished_spans(tel, span_exporter)
    by_id = {span.context.span_id: span for span in spans}
    roots = [s for s in spans if s.name == "generate"]
    assert sorted((s.context.trace_id, s.parent.span_id) for s in roots) == [
        (0xA1, 0xB1),
        (0xA2, 0xB2),
    ]
    for decode in (s for s in spans if s.name == "decode"):
        parent = by_id[decode.parent.span_id]
        assert parent.name == "generate" and parent.context.trace_id == decode.context.trace_id
    assert len(spans) == 4  # each once


def test_a_worker_s_samples_are_published_with_their_identity_turns_and_reward(
    monkeypatch,
) -> None:
    """A worker's samples under a remote parent are published at once: the publisher
    thread, however soon it runs, sees them settled (uid, reward, chat turns). Here it runs
    before the call returns (a flush where the call settles its samples); CI saw a loaded
    worker export a batch's spans bare."""
    from rlotel.record.samples import SampleBatch

    exported = InMemorySpanExporter()
    worker = rlotel.init(run="prop", prometheus_port=None, span_exporters=[exported])
    settle = SampleBatch.settle

    def settle_after_the_publisher_ran(batch: SampleBatch) -> None:
        worker.flush(10)  # what the publisher does with what was submitted so far
        settle(batch)

    monkeypatch.setattr(SampleBatch, "settle", settle_after_the_publisher_ran)
    carrier = {"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"}
    try:
        worker.record_samples(
            generate_sequences=[0.5, 3.0],
            uid=["u0", "u1"],
            reward=[1.0, 0.0],
            turn_times_ns=[[(1_000, 2_000)], [(1_000, 3_000)]],
            context=carrier,
        )
        worker.flush(10)
    finally:
        worker.shutdown()
    spans = exported.get_finished_spans()
    samples = [s for s in spans if s.name == "sample"]
    assert sorted(s.attributes["rl.sample.uid"] for s in samples) == ["u0", "u1"]
    assert all([e.name for e in s.events] == ["gen_ai.evaluation.result"] for s in samples)
    assert len([s for s in spans if s.name == "chat"]) == 2
