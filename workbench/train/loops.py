"""The target's loops phase (off by default): unlikelihood rounds against the n-grams its own greedy
continuations repeat, beside the usual next-token loss (docs/training.md, "The embedded dense pair": the loops phase row).
"""
from __future__ import annotations

import random
import time

import torch

from workbench.train.distill import continue_prompts, encode_prompts, length_buckets, make_prompts
from workbench.train.progress import log
from workbench.train.recipe import Recipe
from workbench.train.target import lr_at, windows


def repeated_ngram_mask(seqs: torch.Tensor, start: int, n: int) -> torch.Tensor:
    """True at each position t >= start whose n-gram ending at t already ended at an earlier
    position >= start + n - 1 (a repeat within the continuation). [bs, T] -> [bs, T] bool"""
    bs, T = seqs.shape
    mask = torch.zeros(bs, T, dtype=torch.bool)
    for b, row in enumerate(seqs.tolist()):
        seen = set()
        for t in range(start + n - 1, T):
            gram = tuple(row[t - n + 1 : t + 1])
            if gram in seen:
                mask[b, t] = True
            seen.add(gram)
    return mask


def unlikelihood_loss(logits: torch.Tensor, ids: torch.Tensor, penalise: torch.Tensor) -> torch.Tensor:
    """Mean of -log(1 - p(token)) over the penalised positions: pushes the model's own greedy
    loops down (Welleck et al. 2019, sequence-level unlikelihood).
    logits [bs, T, V] predict ids [bs, T] shifted by one; penalise [bs, T] marks ids positions."""
    logp = logits[:, :-1].float().log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]  # [bs, T-1]
    m = penalise[:, 1:]
    one_minus = (1 - logp.exp()).clamp(min=1e-5)
    return -(one_minus.log() * m).sum() / m.sum().clamp(min=1)


def train_fewer_loops(recipe: Recipe, model, tokenizer, train_ids, train_files, train_tests, seed: int):
    """Unlikelihood rounds: continue fresh training prompts greedily, then penalise the tokens that
    repeat an n-gram of the same continuation, alongside the usual next-token loss on the corpus.

    A round's ``ul_prompts`` (<= 64) are continued as one batch, so each is cut to the shortest
    one's length: the phase works on short contexts, where the target loops most.
    """
    if not recipe.ul_rounds:
        return model
    rng = random.Random(seed + 6)
    gen = torch.Generator().manual_seed(seed + 6)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.ul_lr, weight_decay=0.1, betas=(0.9, 0.95))
    t0 = time.time()
    for r in range(recipe.ul_rounds):
        model.eval()
        prompts = make_prompts(train_files, train_tests, rng, recipe.ul_prompts, recipe.ul_short_share)
        pool = continue_prompts(model, encode_prompts(tokenizer, prompts, recipe.distill_prompt_tokens),
                                recipe.ul_new_tokens, f"loops round {r}")
        buckets = length_buckets(pool)
        model.train()
        for step in range(recipe.ul_steps):
            for g in opt.param_groups:  # one warmup-cosine schedule over all rounds
                g["lr"] = lr_at(r * recipe.ul_steps + step, recipe.ul_rounds * recipe.ul_steps, recipe.ul_lr)
            bucket = buckets[rng.randrange(len(buckets))]
            rows = [pool[bucket[rng.randrange(len(bucket))]] for _ in range(recipe.batch)]
            ids = torch.tensor([row for row, _ in rows])  # [bs, T]
            penalise = repeated_ngram_mask(ids, rows[0][1], recipe.ul_ngram)
            x = windows(train_ids, recipe.seq_len, recipe.batch, gen)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe.bf16):
                mle = model(input_ids=x, labels=x).loss
                ul = unlikelihood_loss(model(input_ids=ids).logits, ids, penalise)
            loss = mle + recipe.ul_alpha * ul
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step % 20 == 0 or step == recipe.ul_steps - 1:
                share = penalise[:, rows[0][1]:].float().mean().item()
                log(f"loops round {r} step {step} mle {mle.item():.3f} ul {ul.item():.3f} "
                    f"repeats {share:.2f} ({time.time() - t0:.0f}s)")
    model.eval()
    return model
