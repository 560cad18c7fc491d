"""`rlotel_train_metric{key}`: every key of a real verl `main_ppo` step fits the default
budgets, validation keys (which `val_before_train` logs first) have a budget of their own,
and keys past a budget are dropped, counted by reason, and seen by the alert rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlotel import config
from rlotel.offline.replay import replay
from rlotel.schema import vocabulary as voc
from tests.helpers import parse_exposition, scrape

# verl 0.9.1's own FileLogger output (`VERL_FILE_LOGGER_PATH`) of a real `main_ppo` run of
# the e2e recipe (tests/e2e/main_ppo.py: V1 trainer, GRPO, vLLM rollout, CPU; 2 steps; plugin
# off) with `trainer.val_before_train=True trainer.test_freq=2
# actor_rollout_ref.rollout.val_kwargs.n=4 actor_rollout_ref.rollout.val_kwargs.do_sample=True`:
# step 0 is validation only (33 keys), step 1 training (90), step 2 both (124), exactly as
# verl logged them.
REAL_RUN = Path(__file__).resolve().parent / "data" / "verl-0.9.1-main_ppo.jsonl"


def real_steps() -> list[tuple[int, dict]]:
    records = [json.loads(line) for line in REAL_RUN.read_text().splitlines()]
    return [(record["step"], record["data"]) for record in records]


def exposed_keys(tel) -> set[str]:
    assert tel.flush(10)
    samples = parse_exposition(scrape(tel.metrics_url))
    return {dict(labels)["key"] for name, labels in samples if name == "rlotel_train_metric"}


def cap_drops(tel) -> dict[str, float]:
    assert tel.flush(10)  # what was logged has reached the store
    samples = parse_exposition(scrape(tel.metrics_url))
    return {
        dict(labels)["reason"]: value
        for (name, labels), value in samples.items()
        if name == "rlotel_telemetry_dropped_total"
        and dict(labels)["reason"] in ("log_key_cap", "val_log_key_cap", "label_cap")
    }


def test_the_real_run_has_validation_keys_first_and_training_keys_after():
    steps = real_steps()
    first_step, first = steps[0]
    assert first_step == 0 and first and all(voc.is_validation_key(k) for k in first)
    training = {key for _, data in steps[1:] for key in data if not voc.is_validation_key(key)}
    validation = {key for _, data in steps for key in data if voc.is_validation_key(key)}
    assert (len(first), len(training), len(validation)) == (33, 91, 33)


def test_every_key_of_a_real_main_ppo_step_is_exposed_with_the_defaults(make_tel):
    tel = make_tel(run="real")
    assert (tel.config.max_log_keys, tel.config.max_val_log_keys) == (
        config.MAX_LOG_KEYS,
        config.MAX_VAL_LOG_KEYS,
    )
    logged: set[str] = set()
    for number, data in real_steps():
        tel.log(data, step=number)
        logged |= set(data)
    exposed = exposed_keys(tel)
    assert cap_drops(tel) == {}
    # every key that is not one of rlotel's own series (timing_s/*, perf/*, ...) is there
    # every key is there but those rlotel has series of its own for (phase seconds, per-token
    # time, throughput, step time, tokens, MFU)
    own = (voc.TIMING_S, voc.TIMING_PER_TOKEN_MS, voc.PERF)
    assert logged - exposed == {key for key in logged if key.startswith(own)}
    assert exposed <= logged and len(exposed) == 110
    print(f"\nkeys logged {len(logged)}, as rlotel_train_metric {len(exposed)}")


def test_validation_keys_logged_first_do_not_crowd_out_training_keys(make_tel):
    tel = make_tel(run="val", max_log_keys=10, max_val_log_keys=4)
    tel.log({f"val-core/bench_{i}/acc/mean@16": 0.5 for i in range(6)}, step=0)  # first
    tel.log({f"actor/metric_{i}": float(i) for i in range(10)}, step=1)
    exposed = exposed_keys(tel)
    assert {f"actor/metric_{i}" for i in range(10)} <= exposed  # the whole training budget
    assert len([key for key in exposed if key.startswith("val-")]) == 4
    assert cap_drops(tel) == {"val_log_key_cap": 2}

    tel.log({**{f"actor/metric_{i}": 1.0 for i in range(12)}, "val-aux/x/y": 1.0}, step=2)
    exposed = exposed_keys(tel)
    assert "actor/metric_10" not in exposed and "actor/metric_11" not in exposed
    # counted per write: a key past the budget is counted each step that logs it
    assert cap_drops(tel) == {"val_log_key_cap": 3, "log_key_cap": 2}
    tel.log({f"actor/metric_{i}": 2.0 for i in range(12)}, step=3)
    assert cap_drops(tel)["log_key_cap"] == 4


def test_replay_uses_the_live_budgets(tmp_path):
    """`rlotel replay` of the real run exposes the same keys as the live run, no drops."""
    result = replay(REAL_RUN, tmp_path / "out", "real", start_time=1_700_000_000.0)
    assert result.steps == len(real_steps())
    assert not {r for r in result.dropped if r.endswith("_cap")}


@pytest.mark.parametrize(
    ("key", "validation"),
    [
        ("val-core/openai/gsm8k/acc/mean@1", True),
        ("val-aux/num_turns/max", True),
        ("val/loss", True),  # verl's SFT trainers
        ("validation/off_policy/evicted_samples_staleness/mean", True),  # V1 replay buffer
        ("actor/pg_loss", False),
        ("critic/score/mean", False),
        ("training/off_policy/evicted_samples_staleness/mean", False),
        ("value/x", False),
    ],
)
def test_what_counts_as_a_validation_key(key, validation):
    assert voc.is_validation_key(key) is validation
