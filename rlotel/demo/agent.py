"""The demo's agent loop: batched decoding with per-sample tool calls and scoring.

Half of the groups are "checked": the agent calls the calculator mid-answer and feeds the
result back, a second turn; the policy may also call it by itself. Like verl's agent loop,
every sample reports `generate_sequences`, `tool_calls` and
`compute_score` seconds: a sample is charged each decoding step while it is still being
generated (what its latency is under continuous batching), the calculator tool's own time
for its call, and the time of its own reward computation. It also keeps when each sample's
turns (its decoding between tool calls) and its calculator calls really ran, in Unix ns:
the trajectory spans' `chat` and `execute_tool calculator` children.

Each prompt also has verl's `data_source`, as a mixed dataset gives it: the toy's stand-in
names the smaller targets "openai/gsm8k" and the larger ones "lighteval/MATH" (their answers
need more digits: longer responses, and more room to miss). Scoring returns, beside each
sample's reward, the components a rule reward reports in `reward_extra_info`: `acc` (the
digits hit the target) and `format` (the answer ended with EOS, not at the length cap).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from time import perf_counter, time_ns

import torch

from rlotel.demo import policy as P


@dataclass
class Rollout:
    tokens: torch.Tensor  # (B, PROMPT_LEN + MAX_RESPONSE)
    response_mask: torch.Tensor  # (B, MAX_RESPONSE): response tokens up to and with EOS
    loss_mask: torch.Tensor  # (B, MAX_RESPONSE): tokens the policy generated itself
    targets: torch.Tensor  # (B,)
    generate_seconds: torch.Tensor  # (B,)
    tool_seconds: torch.Tensor  # (B,)
    tool_used: torch.Tensor  # (B,) bool
    # Per sample: (start, end) Unix ns of each turn; (tool, start, end) of each tool call.
    turn_times_ns: list[list[tuple[int, int]]] = field(default_factory=list)
    tool_times_ns: list[list[tuple[str, int, int]]] = field(default_factory=list)
    # Real Unix times of each trajectory: all start together (batched decoding); each ends
    # at the decoding step that finished it (EOS or the length cap).
    start_ns: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    end_ns: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)

    def select(self, rows: torch.Tensor) -> Rollout:
        """The trajectories at `rows` (a batch with some dropped)."""
        indices = rows.nonzero().flatten().tolist() if rows.dtype == torch.bool else rows.tolist()
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):  # per-sample lists (turn and tool times)
                picked[f.name] = [value[i] for i in indices] if value else value
            elif value.numel():
                picked[f.name] = value[rows]
        return replace(self, **picked)


def calculator(row: torch.Tensor) -> int:
    """The tool: the running digit sum of a response, as a number token."""
    return P.TARGET_BASE + min(int(P.digit_sum(row)), P.MAX_TARGET)


CHECK_AT = 1  # agent-checked samples call the calculator after their first digit
TOOL_NAME = "calculator"


@torch.no_grad()
def rollout(
    policy: P.TinyPolicy,
    prompts: torch.Tensor,
    generator: torch.Generator,
    checked: torch.Tensor | None = None,
    extra_passes: float = 0.0,
) -> Rollout:
    """Decode a batch; `checked` samples (bool mask) have the agent call the calculator
    mid-answer, and any sample may call it itself by emitting TOOL (once).
    `extra_passes`: more real forward passes per decoding step (a slower engine: a long
    trajectory then takes longer in real time than a short one)."""
    batch = prompts.shape[0]
    checked = torch.zeros(batch, dtype=torch.bool) if checked is None else checked
    tokens = prompts
    alive = torch.ones(batch, dtype=torch.bool)
    tool_used = torch.zeros(batch, dtype=torch.bool)
    awaiting_tool = torch.zeros(batch, dtype=torch.bool)
    response_mask = torch.zeros(batch, P.MAX_RESPONSE, dtype=torch.long)
    loss_mask = torch.zeros(batch, P.MAX_RESPONSE, dtype=torch.long)
    generate_seconds = torch.zeros(batch, dtype=torch.float64)
    tool_seconds = torch.zeros(batch, dtype=torch.float64)
    turns: list[list[tuple[int, int]]] = [[] for _ in range(batch)]
    tools: list[list[tuple[str, int, int]]] = [[] for _ in range(batch)]
    turn_started = torch.zeros(batch, dtype=torch.int64)  # Unix ns its open turn began; 0: none
    start_ns = torch.full((batch,), time_ns(), dtype=torch.long)
    end_ns = torch.zeros(batch, dtype=torch.long)
    owed = 0.0
    for position in range(P.MAX_RESPONSE):
        started, position_ns = perf_counter(), time_ns()
        owed += extra_passes
        while owed >= 1:
            policy(tokens)
            owed -= 1
        logits = policy(tokens)[:, -1, : P.TOOL + 1]  # digits, EOS or TOOL
        if position == 0:
            logits[:, P.EOS] = -torch.inf  # at least one digit
        no_tool = tool_used | (position >= P.MAX_RESPONSE - 2)  # one call, room to answer
        logits[no_tool, P.TOOL] = -torch.inf
        sampled = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)[:, 0]
        decoding = alive & ~awaiting_tool
        generate_seconds[decoding] += perf_counter() - started
        turn_started[decoding & (turn_started == 0)] = position_ns
        next_token = torch.where(alive, sampled, torch.full_like(sampled, P.EOS))
        if position == CHECK_AT:
            agent_call = checked & decoding & ~tool_used
            next_token[agent_call] = P.TOOL
        for index in torch.nonzero(awaiting_tool).flatten().tolist():
            started, call_ns = perf_counter(), time_ns()
            next_token[index] = calculator(tokens[index])
            tool_seconds[index] += perf_counter() - started
            tools[index].append((TOOL_NAME, call_ns, time_ns()))
        response_mask[:, position] = alive.long()
        loss_mask[:, position] = decoding.long()
        tool_call = decoding & (next_token == P.TOOL)
        tool_used |= tool_call
        turn_over = tool_call | (decoding & (next_token == P.EOS))
        if position == P.MAX_RESPONSE - 1:
            turn_over = decoding
        ended_ns = time_ns()
        for index in torch.nonzero(turn_over).flatten().tolist():
            turns[index].append((int(turn_started[index]), ended_ns))
        turn_started[turn_over] = 0
        finished = alive & (next_token == P.EOS)
        end_ns[finished] = time_ns()
        alive &= next_token != P.EOS
        awaiting_tool = tool_call
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
    end_ns[end_ns == 0] = time_ns()  # ran to the length cap
    return Rollout(
        tokens=tokens,
        response_mask=response_mask,
        loss_mask=loss_mask,
        targets=prompts[:, 1] - P.TARGET_BASE,
        generate_seconds=generate_seconds,
        tool_seconds=tool_seconds,
        tool_used=tool_used,
        turn_times_ns=turns,
        tool_times_ns=tools,
        start_ns=start_ns,
        end_ns=end_ns,
    )


def score(rollout: Rollout) -> tuple[torch.Tensor, list[float]]:
    """Rule-based reward per sample, each timed on its own (verl's compute_score)."""
    rewards, seconds = [], []
    for row, target in zip(rollout.tokens, rollout.targets.tolist(), strict=True):
        started = perf_counter()
        distance = abs(int(P.digit_sum(row)) - target)
        rewards.append(max(0.0, 1.0 - distance / P.MAX_TARGET))
        seconds.append(perf_counter() - started)
    return torch.tensor(rewards), seconds


# verl's `data_source` of each prompt, by its target: the stand-in for a two-dataset mix.
DATA_SOURCES = ("openai/gsm8k", "lighteval/MATH")
MATH_FROM = (P.MIN_TARGET + P.MAX_TARGET + 1) // 2  # targets from here on are "MATH"


def data_sources(targets: torch.Tensor) -> list[str]:
    """Each sample's `data_source` (one string a sample, as verl's batch has it)."""
    return [DATA_SOURCES[int(target >= MATH_FROM)] for target in targets.tolist()]


def reward_components(rollout: Rollout) -> dict[str, list[float]]:
    """verl's `reward_extra_info` of the rule reward: `acc` 1 when the digits sum to the
    target, `format` 1 when the answer ended with EOS (not cut at the length cap)."""
    hit = P.digit_sum(rollout.tokens) == rollout.targets
    ended = (rollout.tokens[:, P.PROMPT_LEN :] == P.EOS).any(-1)
    return {"acc": hit.double().tolist(), "format": ended.double().tolist()}


def by_source(rollout: Rollout) -> dict:
    """record_samples' `data_source` and `reward_extra_info` of a rollout's samples."""
    return {
        "data_source": data_sources(rollout.targets),
        "reward_extra_info": reward_components(rollout),
    }


def token_level_scores(rollout: Rollout, scores: torch.Tensor) -> torch.Tensor:
    """Each sequence's score on its last response token (verl's token_level_scores)."""
    last = (rollout.response_lengths - 1).clamp(min=0)
    token_scores = torch.zeros(rollout.response_mask.shape, dtype=torch.float32)
    token_scores.scatter_(1, last[:, None], scores[:, None].float())
    return token_scores * rollout.response_mask
