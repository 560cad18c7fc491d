"""A tiny causal transformer policy and the toy task it learns: digits summing to a target.

Prompt: [BOS, target]. Response: up to `MAX_RESPONSE` tokens ended by EOS — digits, and at
most one TOOL call, answered by the calculator tool with the running digit sum (a token the
policy did not generate, masked out of the loss as verl masks tool responses). Reward is 1
when the digits sum to the target and falls off linearly with the distance.
"""

from __future__ import annotations

import torch
from torch import nn

DIGITS = 10
EOS = 10
TOOL = 11
BOS = 12
TARGET_BASE = 13  # number tokens: targets in prompts, running sums in tool responses
MIN_TARGET, MAX_TARGET = 3, 18
VOCAB = TARGET_BASE + MAX_TARGET + 1
PROMPT_LEN = 2
MAX_RESPONSE = 8


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


def make_prompts(n: int, generator: torch.Generator) -> torch.Tensor:
    targets = torch.randint(MIN_TARGET, MAX_TARGET + 1, (n,), generator=generator)
    return torch.stack([torch.full_like(targets, BOS), TARGET_BASE + targets], dim=1)


def digit_sum(tokens: torch.Tensor) -> torch.Tensor:
    """Sum of the digit tokens in each row's response."""
    response = tokens[..., PROMPT_LEN:]
    return torch.where(response < DIGITS, response, 0).sum(-1)


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
