"""verl 0.9.1's derived step metrics, reproduced term for term.

Sources: `verl/trainer/ppo/metric_utils.py` (`compute_timing_metrics`,
`compute_throughout_metrics`) and the MFU keys of the actor workers. The arithmetic is kept
in verl's order (`seconds * 1000 / tokens`) so results are bit-identical, not just close.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlotel.schema import vocabulary as voc

# Which token count normalises each phase in timing_per_token_ms/* (verl's table).
RESPONSE_TOKEN_PHASES = frozenset({voc.GEN})
ALL_TOKEN_PHASES = frozenset({voc.REF, voc.VALUES, voc.ADV, voc.UPDATE_CRITIC, voc.UPDATE_ACTOR})


def timing_metrics(
    timing_raw: Mapping[str, float], prompt_tokens: int | None, response_tokens: int | None
) -> dict[str, float]:
    """`timing_s/*` for every phase; `timing_per_token_ms/*` only when tokens are known."""
    metrics: dict[str, float] = {voc.TIMING_S + name: value for name, value in timing_raw.items()}
    if prompt_tokens is None or response_tokens is None:
        return metrics
    overall = prompt_tokens + response_tokens
    for name, value in timing_raw.items():
        if name in RESPONSE_TOKEN_PHASES:
            tokens = response_tokens
        elif name in ALL_TOKEN_PHASES:
            tokens = overall
        else:
            continue
        metrics[voc.TIMING_PER_TOKEN_MS + name] = value * 1000 / tokens if tokens > 0 else 0.0
    return metrics


def throughput_metrics(
    timing_raw: Mapping[str, float], total_tokens: int | None, n_gpus: int
) -> dict[str, float]:
    """`perf/time_per_step`, plus token count and throughput when tokens are known."""
    if voc.STEP not in timing_raw:
        return {}
    seconds = timing_raw[voc.STEP]
    metrics: dict[str, float] = {voc.TIME_PER_STEP: seconds}
    if total_tokens is not None:
        metrics[voc.TOTAL_NUM_TOKENS] = total_tokens
        metrics[voc.THROUGHPUT] = total_tokens / (seconds * n_gpus) if seconds > 0 else 0.0
    return metrics


def mfu_metrics(mfu: Mapping[str, float]) -> dict[str, float]:
    """`perf/mfu/{role}` as verl's actor workers name them (actor, actor_infer, ...)."""
    return {voc.MFU + role: value for role, value in mfu.items()}
