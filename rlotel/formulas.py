"""verl 0.9.1's derived step metrics, reproduced term for term.

Sources: `verl/trainer/ppo/metric_utils.py` (`compute_timing_metrics`,
`compute_throughout_metrics`) and the MFU keys of the actor workers. The arithmetic is kept
in verl's order (`seconds * 1000 / tokens`) so results are bit-identical, not just close.
"""

from __future__ import annotations

from collections.abc import Mapping

# Which token count normalises each phase in timing_per_token_ms/* (verl's table).
RESPONSE_TOKEN_PHASES = frozenset({"gen"})
ALL_TOKEN_PHASES = frozenset({"ref", "values", "adv", "update_critic", "update_actor"})


def timing_metrics(
    timing_raw: Mapping[str, float], prompt_tokens: int | None, response_tokens: int | None
) -> dict[str, float]:
    """`timing_s/*` for every phase; `timing_per_token_ms/*` only when tokens are known."""
    metrics: dict[str, float] = {f"timing_s/{name}": value for name, value in timing_raw.items()}
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
        metrics[f"timing_per_token_ms/{name}"] = value * 1000 / tokens if tokens > 0 else 0.0
    return metrics


def throughput_metrics(
    timing_raw: Mapping[str, float], total_tokens: int | None, n_gpus: int
) -> dict[str, float]:
    """`perf/time_per_step`, plus token count and throughput when tokens are known."""
    if "step" not in timing_raw:
        return {}
    seconds = timing_raw["step"]
    metrics: dict[str, float] = {"perf/time_per_step": seconds}
    if total_tokens is not None:
        metrics["perf/total_num_tokens"] = total_tokens
        metrics["perf/throughput"] = total_tokens / (seconds * n_gpus) if seconds > 0 else 0.0
    return metrics


def mfu_metrics(mfu: Mapping[str, float]) -> dict[str, float]:
    """`perf/mfu/{role}` as verl's actor workers name them (actor, actor_infer, ...)."""
    return {f"perf/mfu/{role}": value for role, value in mfu.items()}
