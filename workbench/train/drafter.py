"""The DFlash drafter: its config (reading the target's layers ``target_layer_ids``), training batches of
anchored blocks with their attention mask, the target's context features computed once, and training with the
slot-decayed cross-entropy (optionally part KL to the target's distribution).
"""
from __future__ import annotations

import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from workbench.train.distill import length_buckets
from workbench.train.progress import log
from workbench.train.recipe import Recipe
from workbench.train.target import lr_at
from workbench.train.tokenizer import MASK


def draft_config(recipe: Recipe, tcfg, tokenizer):
    from transformers import Qwen3Config

    cfg = Qwen3Config(
        vocab_size=tcfg.vocab_size, hidden_size=tcfg.hidden_size, intermediate_size=tcfg.intermediate_size,
        num_hidden_layers=recipe.draft_layers, num_attention_heads=tcfg.num_attention_heads,
        num_key_value_heads=tcfg.num_key_value_heads, head_dim=tcfg.head_dim,
        max_position_embeddings=tcfg.max_position_embeddings, rope_theta=10000.0,
        tie_word_embeddings=False, architectures=["DFlashDraftModel"],
    )
    cfg.num_target_layers = tcfg.num_hidden_layers
    cfg.block_size = recipe.block_size
    cfg.dflash_config = {
        "mask_token_id": tokenizer.convert_tokens_to_ids(MASK),
        "target_layer_ids": list(recipe.target_layer_ids),
        "block_size": recipe.block_size,
    }
    return cfg


def draft_batch(seqs, recipe: Recipe, rng: random.Random, mask_id: int, buckets=None):
    """Sequences, anchors and the drafter's attention mask for one training step, with the indices
    of the rows in ``seqs`` (``picked``: their cached context features are looked up by it).

    Every block [anchor, MASK...] sees the target context strictly before its
    anchor and the whole of its own block (bidirectional), nothing else.
    Rows come from one length bucket (picked in proportion to its size): mixing a short
    prompt's sequence with a long one's would cut the long one's continuation away.
    """
    B = recipe.block_size
    if recipe.bucket_by_length:
        buckets = buckets or length_buckets(seqs)
        r = rng.randrange(len(seqs))
        for bucket in buckets:
            if r < len(bucket):
                break
            r -= len(bucket)
        picked = [bucket[rng.randrange(len(bucket))] for _ in range(recipe.draft_batch)]
    else:  # any rows, cut to the shortest
        picked = [rng.randrange(len(seqs)) for _ in range(recipe.draft_batch)]
    rows = [seqs[i] for i in picked]
    T = min(len(r[0]) for r in rows)
    ids = torch.tensor([r[0][:T] for r in rows])  # [bs, T]
    anchors = []
    for _, prompt_len in rows:
        lo, hi = max(1, prompt_len - 1), T - B
        anchors.append(sorted(rng.randrange(lo, hi + 1) for _ in range(recipe.anchors_per_seq)))
    anchors = torch.tensor(anchors)  # [bs, A]
    offs = torch.arange(B)
    block_pos = (anchors[:, :, None] + offs).flatten(1)  # [bs, A*B]
    block_ids = torch.full_like(block_pos, mask_id)
    block_ids[:, ::B] = ids.gather(1, anchors)
    labels = ids.gather(1, block_pos.clamp(max=T - 1))  # [bs, A*B]
    ctx_pos = torch.arange(T)
    q_anchor = anchors.repeat_interleave(B, dim=1)  # [bs, A*B]
    see_ctx = ctx_pos[None, None, :] < q_anchor[:, :, None]  # [bs, A*B, T]
    blk = torch.arange(anchors.shape[1]).repeat_interleave(B)
    see_blk = (blk[:, None] == blk[None, :]).expand(ids.shape[0], -1, -1)  # [bs, A*B, A*B]
    mask = torch.cat([see_ctx, see_blk], dim=2)[:, None]  # [bs, 1, A*B, T + A*B]
    position_ids = torch.cat([ctx_pos.expand(ids.shape[0], -1), block_pos], dim=1)
    return picked, ids, block_ids, labels, mask, position_ids, block_pos


@torch.no_grad()
def context_features(target, seqs, layer_ids, bf16: bool, bs: int = 32) -> list[torch.Tensor]:
    """The drafter's target context (the target's hidden states at ``layer_ids``, side by side) for
    every distilled sequence, computed once. The target is frozen and causal, so a training row's
    context is its sequence's, cut to the row: the drafter's steps then skip the target entirely.
    -> per sequence [T, len(layer_ids) * hidden], bf16 when ``bf16`` (what the drafter's autocast
    reads anyway: half the memory), else float32"""
    from dflash.model import extract_context_feature

    feats: list[torch.Tensor | None] = [None] * len(seqs)
    t0 = time.time()
    for bucket in length_buckets(seqs):
        for i in range(0, len(bucket), bs):
            idx = bucket[i : i + bs]
            ids = torch.tensor([seqs[j][0] for j in idx])  # [bs, T]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                hidden = target.model(input_ids=ids, output_hidden_states=True).hidden_states
            ctx = extract_context_feature(hidden, layer_ids).to(torch.bfloat16 if bf16 else torch.float32)
            for j, row in zip(idx, ctx):  # row [T, L*H]
                feats[j] = row.clone()
    log(f"context features: {len(seqs)} sequences ({time.time() - t0:.0f}s)")
    return feats


def distill_kl(draft_logits: torch.Tensor, target_logits: torch.Tensor, block_pos: torch.Tensor, T: int):
    """KL(target || drafter) per block slot: the target's whole distribution for the token at each
    block position (its logits one position earlier), not only its argmax.
    draft_logits [bs, A*B, V], target_logits [bs, T, V], block_pos [bs, A*B] -> [bs, A*B]"""
    src = (block_pos - 1).clamp(min=0, max=T - 1)
    t_logp = target_logits.float().gather(1, src[..., None].expand(-1, -1, target_logits.shape[-1])).log_softmax(-1)
    return (t_logp.exp() * (t_logp - draft_logits.log_softmax(-1))).sum(-1)


def train_draft(recipe: Recipe, target, tokenizer, seqs, out: Path, seed: int, resume: bool = False):
    from dflash.model import DFlashDraftModel

    torch.manual_seed(seed + 2)
    if resume:  # continue from the drafter already in --out (a second, lower-LR phase)
        draft = DFlashDraftModel.from_pretrained(out / "draft")
        cfg = draft.config
    else:
        cfg = draft_config(recipe, target.config, tokenizer)
        draft = DFlashDraftModel(cfg)
    target.requires_grad_(False)
    emb = target.get_input_embeddings()
    head = target.lm_head
    n = sum(p.numel() for p in draft.parameters())
    log(f"draft: {n / 1e6:.2f}M parameters, {len(seqs)} distilled sequences")
    opt = torch.optim.AdamW(draft.parameters(), lr=recipe.draft_lr, weight_decay=0.01, betas=(0.9, 0.95))
    rng = random.Random(seed + 3)
    B = recipe.block_size
    slot = torch.arange(B)
    weight = torch.where(slot == 0, 0.0, torch.exp(-(slot - 1).float() / recipe.gamma))
    mask_id = cfg.dflash_config["mask_token_id"]
    buckets = length_buckets(seqs)
    feats = context_features(target, seqs, draft.target_layer_ids, recipe.bf16)
    draft.train()
    t0 = time.time()
    for step in range(recipe.draft_steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, recipe.draft_steps, recipe.draft_lr)
        picked, ids, block_ids, labels, mask, pos, block_pos = draft_batch(seqs, recipe, rng, mask_id, buckets)
        T = ids.shape[1]
        ctx = torch.stack([feats[i][:T] for i in picked])  # [bs, T, L*H]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe.bf16):
            h = draft(position_ids=pos, attention_mask=mask, noise_embedding=emb(block_ids), target_hidden=ctx)
            logits = head(h).float()
        ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape)
        if recipe.kd_weight:  # the target's whole distribution is not cached: one live forward
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe.bf16):
                target_logits = target(input_ids=ids).logits
            ce = (1 - recipe.kd_weight) * ce + recipe.kd_weight * distill_kl(logits, target_logits, block_pos, T)
        w = weight.repeat(labels.shape[1] // B)[None]
        loss = (ce * w).sum() / (w.sum() * labels.shape[0])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == recipe.draft_steps - 1:
            acc1 = (logits.argmax(-1) == labels).view(labels.shape[0], -1, B)[:, :, 1].float().mean().item()
            log(f"draft step {step} loss {loss.item():.3f} slot1-acc {acc1:.2f} ({time.time() - t0:.0f}s)")
        if recipe.checkpoint_every and step and step % recipe.checkpoint_every == 0:
            draft.save_pretrained(out / "draft")
    draft.eval()
    draft.save_pretrained(out / "draft")
    return draft
