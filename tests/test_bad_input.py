"""Bad input never raises into training: it is dropped, counted and logged once."""

from __future__ import annotations

import logging

import numpy as np

import rlotel
from tests.helpers import parse_exposition, scrape

BAD_VALUES = [float("nan"), float("inf"), float("-inf"), None, "12", object(), [1, 2]]


def dropped(tel: rlotel.Telemetry) -> dict[tuple[str, str], float]:
    tel.flush(10)
    samples = parse_exposition(scrape(tel.metrics_url))
    return {
        (labels["signal"], labels["reason"]): value
        for (name, frozen), value in samples.items()
        if name == "rlotel_telemetry_dropped_total"
        for labels in [dict(frozen)]
    }


def test_bad_token_counts_keep_valid_ones(tel, caplog):
    caplog.set_level(logging.WARNING, logger="rlotel")
    with tel.step(1) as step:
        with tel.phase("gen"):
            pass
        step.set_tokens(
            prompt=[10, float("nan"), -3, None, "7", 20, float("inf")],
            response=np.array([5.0, 1.0, np.nan, 2.0]),
        )
    assert step.metrics["perf/total_num_tokens"] == 10 + 20 + 5 + 1 + 2
    drops = dropped(tel)
    assert sum(v for (signal, _), v in drops.items() if signal == "tokens") >= 6
    assert ("tokens", "length_mismatch") in drops
    lines = [r for r in caplog.records if "tokens" in r.getMessage()]
    assert lines and all("rlotel dropped" in r.getMessage() for r in lines)


def test_repeated_drops_log_one_line(tel, caplog):
    caplog.set_level(logging.WARNING, logger="rlotel")
    for number in range(50):
        with tel.step(number) as step:
            step.set_tokens(prompt=[float("nan")], response=[1])
    drops = dropped(tel)
    assert drops[("tokens", "non_finite")] == 50
    assert len([r for r in caplog.records if "non_finite" in r.getMessage()]) == 1


def test_bad_mfu_is_dropped(tel):
    with tel.step(1) as step:
        step.set_mfu(actor=float("nan"), actor_infer="high", critic=-0.1, ref=0.2)
    assert step.metrics["perf/mfu/ref"] == 0.2
    assert not any(k in step.metrics for k in ("perf/mfu/actor", "perf/mfu/critic"))
    assert sum(v for (signal, _), v in dropped(tel).items() if signal == "mfu") == 3


def test_log_bad_values_unknown_keys_and_cap(make_tel):
    tel = make_tel(run="cap", max_log_keys=5)
    data: dict = {f"custom/key_{i}": float(i) for i in range(12)}
    data.update({f"bad_{i}": value for i, value in enumerate(BAD_VALUES)})
    data.update({"timing_s/gen": -1.0, 3: 1.0, "": 2.0, "perf/throughput": 5.0})
    tel.log(data, step=4)
    tel.log("not a dict", step=5)  # type: ignore[arg-type]
    tel.log({"x": 1.0}, step="five")  # type: ignore[arg-type]
    drops = dropped(tel)
    samples = parse_exposition(scrape(tel.metrics_url))
    keys = {dict(labels)["key"] for name, labels in samples if name == "rlotel_train_metric"}
    assert len(keys) == 5 and keys <= {*(f"custom/key_{i}" for i in range(12)), "x"}
    assert drops[("metrics", "log_key_cap")] >= 7
    assert drops[("metrics", "non_finite")] == 3
    assert drops[("metrics", "non_numeric")] == 4
    assert drops[("metrics", "negative")] == 1
    assert drops[("metrics", "bad_key")] == 2
    assert drops[("metrics", "bad_dict")] == 1
    assert drops[("metrics", "bad_step")] == 1
    assert (
        samples[("rlotel_throughput_tokens_per_second_per_gpu", frozenset({("run", "cap")}))] == 5
    )


def test_log_accepts_numpy_and_torch_scalars(tel):
    import torch

    tel.log(
        {"actor/lr": np.float32(0.5), "actor/kl": torch.tensor(0.25), "count": np.int64(3)},
        step=1,
    )
    tel.flush(10)
    samples = parse_exposition(scrape(tel.metrics_url))
    values = {
        dict(labels)["key"]: value
        for (name, labels), value in samples.items()
        if name == "rlotel_train_metric"
    }
    assert values == {"actor/lr": 0.5, "actor/kl": 0.25, "count": 3.0}


def test_bad_phase_names_and_timing_dicts_never_raise(tel):
    with tel.step(1):
        with tel.phase(None):  # type: ignore[arg-type]
            pass
        with tel.phase(""):
            pass
        with rlotel.marked_timer("gen", ()):  # type: ignore[arg-type]
            pass
    assert dropped(tel)[("spans", "bad_name")] == 2


def test_phase_label_explosion_is_capped(make_tel):
    tel = make_tel(run="explode", max_metric_keys=8)
    with tel.step(1):
        for i in range(40):
            with tel.phase(f"phase_{i}"):
                pass
    drops = dropped(tel)
    samples = parse_exposition(scrape(tel.metrics_url))
    phases = {dict(lab)["phase"] for n, lab in samples if n == "rlotel_step_phase_seconds"}
    assert len(phases) == 8
    assert drops[("metrics", "label_cap")] > 0


def test_default_endpoint_binds_loopback(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    tel = rlotel.init(prometheus_port=0)
    try:
        assert tel.metrics_url.startswith("http://127.0.0.1:")
    finally:
        tel.shutdown()
