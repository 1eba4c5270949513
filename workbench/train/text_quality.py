"""How good a target's text is: held-out loss (nats per token), and of its greedy continuations the
distinct-token share (how little it repeats itself) and the known-word share (how much of it is words the
corpus uses, so junk that merely avoids repeats scores low).
"""
from __future__ import annotations

import re

import torch

from workbench.train.distill import greedy_continue
from workbench.train.recipe import Recipe


@torch.no_grad()
def held_out_loss(model, held_ids: torch.Tensor, seq_len: int, n_windows: int = 64) -> float:
    n_windows = max(1, min(n_windows, (len(held_ids) - 1) // seq_len))
    losses = []
    for i in range(n_windows):
        x = held_ids[i * seq_len : (i + 1) * seq_len][None]
        losses.append(model(input_ids=x, labels=x).loss.item())
    return float(sum(losses) / len(losses))


def distinct_share(tokens: list[int]) -> float:
    """Distinct tokens / tokens: how little a continuation repeats itself (real held-out code: ~0.6
    over 64 tokens)."""
    return len(set(tokens)) / max(1, len(tokens))


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")


def corpus_words(files) -> frozenset[str]:
    """Every identifier-like word (3+ characters) of the given files."""
    return frozenset(w for f in files for w in _WORD.findall(f.text))


def known_word_share(text: str, known: frozenset[str]) -> float | None:
    """Share of the identifier-like words in ``text`` that the training corpus uses (None: no words).

    Distinct-token share alone rewards junk: a target pushed off its loops can glue sub-words into
    names nobody writes. Real held-out code scores about 0.92 here; such junk scores far lower.
    """
    words = _WORD.findall(text)
    return sum(w in known for w in words) / len(words) if words else None


def continuation_shares(gen: list[int], eos: int, tokenizer, known) -> tuple[float, float | None]:
    """(distinct-token share, known-word share) of a continuation, up to its first EOS."""
    gen = gen[: gen.index(eos)] if eos in gen else gen
    return distinct_share(gen), known_word_share(tokenizer.decode(gen), known)


def mean(values) -> float:
    values = [v for v in values if v is not None]
    return sum(values) / max(1, len(values))


@torch.no_grad()
def target_figures(model, tokenizer, held_ids: torch.Tensor, splits: dict, recipe: Recipe, known) -> dict:
    """Held-out loss and, per split, the distinct-token and known-word shares of greedy continuations
    (stopped at EOS)."""
    eos = tokenizer.eos_token_id
    figures = {"held_out_loss_nats": held_out_loss(model, held_ids, recipe.seq_len)}
    for split, items in splits.items():
        shares, words = [], []
        for item in items:
            x = tokenizer(item["prompt"], return_tensors="pt", add_special_tokens=False)["input_ids"]
            share, known_share = continuation_shares(greedy_continue(model, x, recipe.eval_new_tokens)[0].tolist(),
                                                     eos, tokenizer, known)
            shares.append(share)
            words.append(known_share)
        figures[f"distinct_token_share_{split}"] = mean(shares)
        figures[f"known_word_share_{split}"] = mean(words)
    return figures


def spread_windows(held_ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    """64 windows spread evenly over all held-out files, end to end. -> [n * seq_len]"""
    n_win = max(1, (len(held_ids) - 1) // seq_len)
    return held_ids[: n_win * seq_len].view(n_win, seq_len)[:: max(1, n_win // 64)].flatten()
