"""Test stand-in: a dense toy reward. A random tiny model never solves gsm8k, so verl's rule
reward is always 0 and GRPO's gradient with it; this one varies per response."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    text = solution_str or ""
    digits = sum(c.isdigit() for c in text) / max(1, len(text))
    return digits + (1.0 if str(ground_truth) in text else 0.0)


def compute_score_with_acc(
    data_source, solution_str, ground_truth, extra_info=None, **kwargs
) -> dict[str, float]:
    """The dense score plus a coin-flip `acc` (the response's length is even) for DAPO's
    group filter: a group of 2 whose `acc` agree carries no signal half of the time."""
    score = compute_score(data_source, solution_str, ground_truth, extra_info)
    return {"score": score, "acc": float(len(solution_str or "") % 2 == 0)}
