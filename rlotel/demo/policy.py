"""A tiny causal transformer policy and the toy task it learns: digits summing to a target.

Prompt: [BOS, target]. Response: up to `MAX_RESPONSE` digit tokens ended by EOS. Reward is
1 when the digits sum to the target and falls off linearly with the distance.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

DIGITS = 10
EOS = 10
BOS = 11
TARGET_BASE = 12
MIN_TARGET, MAX_TARGET = 3, 18
VOCAB = TARGET_BASE + MAX_TARGET + 1
PROMPT_LEN = 2
MAX_RESPONSE = 6


class TinyPolicy(nn.Module):
    def __init__(self, width: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Embedding(PROMPT_LEN + MAX_RESPONSE, width)
        layer = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=4 * width, dropout=0.0, batch_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, VOCAB)
        self.width, self.layers, self.heads = width, layers, heads

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(length)
        hidden = self.embed(tokens) + self.position(torch.arange(length))
        return self.head(self.blocks(hidden, mask=mask, is_causal=True))

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


@dataclass
class Rollout:
    tokens: torch.Tensor  # (B, PROMPT_LEN + MAX_RESPONSE)
    response_mask: torch.Tensor  # (B, MAX_RESPONSE) 1 up to and including EOS
    targets: torch.Tensor  # (B,)

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)


def make_prompts(n: int, generator: torch.Generator) -> torch.Tensor:
    targets = torch.randint(MIN_TARGET, MAX_TARGET + 1, (n,), generator=generator)
    return torch.stack([torch.full_like(targets, BOS), TARGET_BASE + targets], dim=1)


@torch.no_grad()
def generate(
    policy: TinyPolicy, prompts: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample responses token by token; returns (tokens, response_mask)."""
    tokens = prompts
    alive = torch.ones(prompts.shape[0], dtype=torch.bool)
    mask = torch.zeros(prompts.shape[0], MAX_RESPONSE, dtype=torch.long)
    for position in range(MAX_RESPONSE):
        logits = policy(tokens)[:, -1, : DIGITS + 1]  # digits or EOS only
        if position == 0:
            logits[:, EOS] = -torch.inf  # at least one digit
        sampled = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
        sampled = torch.where(alive[:, None], sampled, torch.full_like(sampled, EOS))
        mask[:, position] = alive.long()
        alive = alive & (sampled[:, 0] != EOS)
        tokens = torch.cat([tokens, sampled], dim=1)
    return tokens, mask


def digit_sum(rollout_tokens: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    response = rollout_tokens[:, PROMPT_LEN:]
    digits = torch.where((response < DIGITS) & response_mask.bool(), response, 0)
    return digits.sum(-1)


def rewards(rollout: Rollout) -> torch.Tensor:
    distance = (digit_sum(rollout.tokens, rollout.response_mask) - rollout.targets).abs()
    return (1.0 - distance.float() / MAX_TARGET).clamp(min=0.0)


def response_log_probs(policy: TinyPolicy, tokens: torch.Tensor) -> torch.Tensor:
    """Log-probability of each response token under `policy`, shape (B, MAX_RESPONSE)."""
    logits = policy(tokens[:, :-1])[:, PROMPT_LEN - 1 :]
    log_probs = torch.log_softmax(logits.float(), -1)
    return log_probs.gather(-1, tokens[:, PROMPT_LEN:, None]).squeeze(-1)


def dense_flops(policy: TinyPolicy, seqlens: list[int]) -> float:
    """verl's dense-model estimate for one forward+backward: 6·N·Σtokens + attention term."""
    head_dim = policy.width // policy.heads
    attention = 6 * sum(s * s for s in seqlens) * head_dim * policy.heads * policy.layers
    return 6 * policy.n_params * sum(seqlens) + attention
