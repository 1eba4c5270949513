"""What the conditioned head learns from: the drafter's state at every slot of a block and the target's own
tokens there.

A tree node at slot d is accepted only when the path above it was, i.e. when its parent's token is the target's
own greedy token at slot d - 1. So the data are the target's greedy continuations of prompts (teacher-forced:
every token of a continuation is the target's argmax after the ones before it), and for a block rooted at any
position s of a continuation (a cycle could start there: the drafter's context is the target's features of
positions < s, its block [token s, MASK x (B-1)], as in the engine), each slot d records

- the drafter's final hidden state (its LM head's input) and its top-K candidates, and
- the target's token at s + d + 1 (the label) and at s + d (the previous token: the root for slot 0).

Many blocks of one sequence go through the drafter in one forward, each block seeing the context before its
root and itself only (the mask the drafter was trained with, ``workbench.train.drafter.draft_batch``).
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from workbench.models.config_facts import draft_value
from workbench.shipped import SPLITS, eval_prompts
from workbench.train import corpus
from workbench.train.distill import continue_prompts, encode_prompts, length_buckets, make_prompts
from workbench.train.progress import log


@dataclass
class Blocks:
    """Blocks of the drafter's slots with the target's tokens beside them; row i is one block."""

    hidden: Tensor  # float16 [n, D, H]: the drafter's final hidden state per slot (stored half: it is big)
    topv: Tensor  # float32 [n, D, K]: each slot's top-K log-probs, descending
    topi: Tensor  # int64 [n, D, K]: their token ids
    path: Tensor  # int64 [n, D + 1]: the root, then the target's tokens at slots 0..D-1 (-1 past the end)
    group: Tensor  # int64 [n]: the sequence each block was cut from (splits keep a sequence's blocks together)

    @property
    def ranks(self) -> Tensor:
        """[n, D]: the rank of the target's token among each slot's K candidates (K: not among them; -1: the
        sequence ended before this slot)."""
        hit = self.topi == self.path[:, 1:, None]  # [n, D, K]
        K = self.topi.shape[-1]
        r = torch.where(hit.any(-1), hit.int().argmax(-1), K)
        return torch.where(self.path[:, 1:] >= 0, r, -1)

    def subset(self, keep: Tensor) -> "Blocks":
        return Blocks(self.hidden[keep], self.topv[keep], self.topi[keep], self.path[keep], self.group[keep])

    @staticmethod
    def cat(parts: list["Blocks"]) -> "Blocks":
        return Blocks(*(torch.cat([getattr(p, f) for p in parts]) for f in ("hidden", "topv", "topi", "path", "group")))


def evaluation_texts() -> tuple[set[str], set[str]]:
    """(prompt texts, source files) of the shipped evaluation prompts (both splits): kept out of the training."""
    items = [it for split in SPLITS for it in eval_prompts(split)]
    return {it["prompt"] for it in items}, {it.get("source", "") for it in items}


def training_prompts(n: int, seed: int) -> list[tuple[str, bool]]:
    """``n`` prompts cut from the training files as the drafters' distillation cut theirs (half short shapes), none
    from a file an evaluation prompt came from, none equal to, inside or holding an evaluation prompt."""
    held, sources = evaluation_texts()
    files = [f for f in corpus.thin_generated_tables(corpus.list_sources(), 4)
             if not f.held_out and f.relpath not in sources]
    tests = [f for f in corpus.list_sources(tests=True) if not f.held_out and f.relpath not in sources]
    rng = random.Random(5000 + seed)  # a stream of its own (the distillation and the calibration use others)
    got = make_prompts(files, tests, rng, 2 * n, 0.5)
    keep, seen = [], set()
    for t, short in got:  # a repeated prompt would put one continuation on both sides of a split
        if t not in seen and not any(t == h or t in h or h in t for h in held):
            seen.add(t)
            keep.append((t, short))
    return keep[:n]


def continuations(models, prompts: list[list[int]], new_tokens: int, rows: int = 64) -> list[tuple[list[int], int]]:
    """The target's greedy continuations of token-id prompts, ``rows`` at a time (a batch's prompts are cut to
    its shortest; 1: every prompt whole). -> [(prompt + continuation, prompt length)]"""
    return continue_prompts(models.target, prompts, new_tokens, "cond-head continuations", bs=rows)


@torch.no_grad()
def blocks_of(models, seqs, K: int, anchors: int | None, seed: int, rows: int = 16) -> Blocks:
    """Blocks rooted in each continuation: ``anchors`` random roots per sequence (None: every root whose slot 0 is
    known), through the drafter in batches of ``rows`` sequences of one length."""
    rng = random.Random(seed)
    parts, t0 = [], time.time()
    for bucket in length_buckets(seqs):
        for i in range(0, len(bucket), rows):
            idx = bucket[i : i + rows]
            ids = torch.tensor([seqs[j][0] for j in idx], device=models.device)  # [bs, T]
            roots = []
            for j in idx:
                span = list(range(seqs[j][1] - 1, ids.shape[1] - 1))  # roots whose slot 0 is a continuation token
                roots.append(span if anchors is None or anchors >= len(span) else sorted(rng.sample(span, anchors)))
            A = min(len(r) for r in roots)
            roots = torch.tensor([r[:A] for r in roots], device=models.device)  # [bs, A]
            parts.append(sequence_blocks(models, ids, roots, K, torch.tensor(idx)))
    log(f"cond-head blocks: {sum(p.group.numel() for p in parts)} from {len(seqs)} sequences ({time.time() - t0:.0f}s)")
    return Blocks.cat(parts)


def sequence_blocks(models, ids: Tensor, roots: Tensor, K: int, groups: Tensor, chunk: int = 16) -> Blocks:
    """The blocks of ``bs`` equal-length sequences: one target forward, then drafter forwards of ``chunk`` blocks
    per row (the block-to-block mask grows with the square of the blocks in one forward). ids [bs, T]; roots
    [bs, A] positions of each block's root; groups [bs] the sequences' numbers."""
    from dflash.model import extract_context_feature

    hs = models.target.model(input_ids=ids, output_hidden_states=True).hidden_states
    ctx = extract_context_feature(hs, models.target_layer_ids)  # [bs, T, F]
    parts = [drafted_blocks(models, ids, ctx, roots[:, a : a + chunk], K) for a in range(0, roots.shape[1], chunk)]
    # block order: row-major over (sequence, root), whatever the chunking
    fields = [torch.cat([p[f] for p in parts], dim=1).flatten(0, 1) for f in range(4)]
    return Blocks(*fields, groups.repeat_interleave(roots.shape[1]))


def drafted_blocks(models, ids: Tensor, ctx: Tensor, roots: Tensor, K: int) -> tuple[Tensor, ...]:
    """One drafter forward over A blocks per row. ids [bs, T]; ctx [bs, T, F]; roots [bs, A]. -> hidden [bs, A, D,
    H] (half), topv [bs, A, D, K], topi [bs, A, D, K], path [bs, A, D + 1], on the host."""
    target, draft = models.target, models.draft
    B = models.block_size
    D = B - 1
    bs, T = ids.shape
    A = roots.shape[1]
    dev = ids.device
    block_pos = (roots[:, :, None] + torch.arange(B, device=dev)).reshape(bs, A * B)  # [bs, A*B]
    block_ids = torch.full_like(block_pos, models.mask_token_id)
    block_ids[:, ::B] = ids.gather(1, roots)
    q_root = roots.repeat_interleave(B, dim=1)  # [bs, A*B]
    see_ctx = torch.arange(T, device=dev)[None, None, :] < q_root[:, :, None]  # [bs, A*B, T]: strictly before the root
    blk = torch.arange(A, device=dev).repeat_interleave(B)
    see_blk = (blk[:, None] == blk[None, :]).expand(bs, A * B, A * B)  # a block sees itself (bidirectional)
    mask = torch.cat([see_ctx, see_blk], dim=2)[:, None]  # [bs, 1, A*B, T + A*B]
    pos = torch.cat([torch.arange(T, device=dev).expand(bs, T), block_pos], dim=1)
    scale = float(draft_value(draft.config, "input_embedding_scale", 1.0))
    noise = target.get_input_embeddings()(block_ids) * scale
    h = draft(position_ids=pos, attention_mask=mask, noise_embedding=noise, target_hidden=ctx)
    h = h.reshape(bs, A, B, -1)[:, :, 1:]  # [bs, A, D, H]: the masked slots
    lp = torch.log_softmax(draft.compute_logits(h, target.lm_head).float(), dim=-1)  # [bs, A, D, V]
    topv, topi = torch.topk(lp, min(K, lp.shape[-1]), dim=-1)  # [bs, A, D, K]
    at = roots[:, :, None] + torch.arange(D + 1, device=dev)  # [bs, A, D + 1]: the root, then each slot's position
    path = torch.where(at < T, ids.gather(1, at.clamp(max=T - 1).reshape(bs, -1)).reshape(bs, A, D + 1), -1)
    return h.half().cpu(), topv.cpu(), topi.cpu(), path.cpu()


def prompt_blocks(models, texts: list[tuple[str, bool]], new_tokens: int, K: int, anchors: int | None, seed: int,
                  max_prompt_tokens: int = 96) -> Blocks:
    """Blocks from the target's continuations of ``texts`` [(prompt, is_short)]."""
    encoded = encode_prompts(models.tokenizer, texts, max_prompt_tokens)
    seqs = continuations(models, encoded, new_tokens)
    return blocks_of(models, seqs, K, anchors, seed)
