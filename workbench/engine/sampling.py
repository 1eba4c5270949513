"""The target's choice at every verified node: its argmax (greedy) or a sample from it."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from workbench.engine import validate


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self):
        t, p, k = self.temperature, self.top_p, self.top_k
        validate.temperature(t)  # finite: temperature=inf would sample uniform noise
        if not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"top_p={p!r} must be in (0, 1]")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"top_k={k!r} must be a non-negative integer (0 = no top-k)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def target_probs(logits: Tensor, s: Sampling) -> Tensor:
    """[..., V] logits -> the distribution the target samples from (temperature, top-k, top-p)."""
    scores = logits.float()
    if s.greedy:
        return torch.softmax(scores, dim=-1)
    scores = scores / s.temperature
    if 0 < s.top_k < scores.shape[-1]:
        kth = torch.topk(scores, s.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if s.top_p < 1:
        sp, order = probs.sort(dim=-1, descending=True)
        keep = sp.cumsum(-1) - sp < s.top_p  # the smallest set whose mass reaches top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sp * keep)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def target_choice(logits: Tensor, s: Sampling, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """logits [bs, n, V] -> (choice int64 [bs, n], probability of that choice [bs, n])."""
    if s.greedy:  # the argmax's probability needs only a log-sum-exp, not the whole softmax
        choice = logits.argmax(-1)
        chosen = logits.gather(-1, choice[..., None])[..., 0].float()
        return choice, torch.exp(chosen - torch.logsumexp(logits.float(), dim=-1))
    probs = target_probs(logits, s)
    flat = probs.reshape(-1, probs.shape[-1])
    choice = torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])
    return choice, probs.gather(-1, choice[..., None])[..., 0]
