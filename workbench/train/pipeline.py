"""Train the embedded default: a byte-level BPE, a small Qwen3 target and a DFlash drafter.

    python -m workbench.train --out workbench/assets            # the shipped models (~47 min, 2 cores)
    python -m workbench.train --out /tmp/smoke --smoke          # seconds, used by the tests
    python -m workbench.train --arch hybrid --out workbench/assets/hybrid   # the hybrid pair

Stages (each writes to ``--out`` and can be re-run alone with ``--stage``):
tokenizer -> target (next-token training, then the loops phase) -> distill (the target's greedy
continuations) -> draft -> report.

``--arch hybrid`` trains a Qwen3.5-architecture target instead (GatedDeltaNet linear-attention
layers between gated full-attention layers) with the same drafter layout. Its report holds both the
greedy acceptance simulated through transformers alone (``workbench.train.greedy_sim``) and the engine's
own tau; ``--stage eval`` re-measures the engine's figures for any pair.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from workbench.train import corpus

EOS = "<|endoftext|>"
MASK = "<|mask|>"


@dataclass
class Recipe:
    vocab_size: int = 4096
    hidden: int = 256
    layers: int = 6
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 768
    max_positions: int = 1024
    seq_len: int = 256
    batch: int = 16
    target_steps: int = 1600
    target_lr: float = 3e-3
    table_keep_one_in: int = 4  # generated codec tables kept in the target's corpus (1 in N)
    # The loops phase (off: ul_rounds 0): rounds of unlikelihood against the target's own greedy
    # repeats. Tried on the 6-layer target, it raised the distinct-token share to ~0.6 but the
    # target escaped its loops into junk tokens (docs/training.md, "Earlier pairs").
    ul_rounds: int = 0
    ul_steps: int = 10  # steps per round; each round continues fresh prompts first
    ul_prompts: int = 32
    ul_short_share: float = 0.35
    ul_new_tokens: int = 64
    ul_ngram: int = 4
    ul_alpha: float = 0.5
    ul_lr: float = 6e-4
    draft_layers: int = 2
    # Evenly spaced from layer 1 to layer N-2, never the last layer: vLLM captures a layer's output
    # before the final norm and SGLang captures "before layer k + 1", so a last-layer feature is not
    # the tensor transformers' hidden_states[N] (final-normed) hands our engine and our training.
    # z-lab's rule (1 to N-3, one id per draft layer) would give 2 ids of 6 layers; 4 ids read more.
    target_layer_ids: tuple[int, ...] = (1, 2, 3, 4)
    block_size: int = 16
    distill_prompts: int = 12288  # 6,144 before: twice the data raised DFlash tau 2.66 / 2.81 to 2.77 / 3.07 (docs/training.md)
    distill_prompt_tokens: int = 96
    distill_new_tokens: int = 96
    short_share: float = 0.55  # share of distillation prompts in the short shapes people type
    bucket_by_length: bool = True  # drafter batches from one length bucket (needed with short prompts)
    draft_steps: int = 5000  # affordable because the target's context features are computed once
    draft_batch: int = 16
    anchors_per_seq: int = 8
    draft_lr: float = 2e-3
    gamma: float = 7.0
    kd_weight: float = 0.0  # share of the drafter's loss that is KL to the target's distribution
    eval_prompts: int = 40
    eval_short_prompts: int = 40
    eval_new_tokens: int = 64
    checkpoint_every: int = 500  # target and drafter saved every N steps, so a cut-short run still leaves one
    max_files: int = 0  # 0 = all files
    bf16: bool = True


# v1: the first shipped pair's recipe (long prompts only, every codec table; its drafter had a
# second phase: `--stage draft --resume-draft --draft-steps 2000 --draft-lr 1e-3 --seed 1`).
V1 = dict(distill_prompts=3072, short_share=0.0, table_keep_one_in=1, bucket_by_length=False, draft_steps=1500)


@dataclass
class HybridRecipe(Recipe):
    """The hybrid pair: a Qwen3.5-text target, every ``full_attention_interval``-th layer gated full
    attention, the others GatedDeltaNet; sized so target + drafter stay under 30 MB (float32)."""

    intermediate: int = 640
    full_attention_interval: int = 3  # 6 layers: linear, linear, full, linear, linear, full
    linear_key_heads: int = 2
    linear_value_heads: int = 4
    linear_head_dim: int = 64
    linear_conv_kernel: int = 4
    target_steps: int = 1200
    distill_prompts: int = 4096
    draft_steps: int = 3000


# The recipe fields a `--stage draft` run decides (the rest trained the target and stay as recorded).
DRAFTER_FIELDS = ("draft_layers", "target_layer_ids", "block_size", "distill_prompts", "distill_prompt_tokens",
                  "distill_new_tokens", "short_share", "bucket_by_length", "draft_steps", "draft_batch",
                  "anchors_per_seq", "draft_lr", "gamma", "kd_weight")


def smoke_recipe() -> Recipe:
    """Tiny models, a few steps of every stage (the loops phase included)."""
    return Recipe(
        vocab_size=300, hidden=32, layers=4, heads=2, kv_heads=1, head_dim=16, intermediate=64,
        max_positions=1024, seq_len=64, batch=4, target_steps=3, ul_rounds=2, ul_steps=2, ul_prompts=6,
        ul_new_tokens=12, draft_layers=1, target_layer_ids=(1, 2),
        block_size=8, distill_prompts=8, distill_prompt_tokens=24, distill_new_tokens=24, draft_steps=3,
        draft_batch=4, anchors_per_seq=2, eval_prompts=4, eval_short_prompts=5, eval_new_tokens=16, max_files=12, bf16=False,
    )


def hybrid_smoke_recipe() -> HybridRecipe:
    """The smoke recipe's sizes as a hybrid (one full-attention layer in three), no loops phase."""
    small = {k: v for k, v in asdict(smoke_recipe()).items() if k not in ("ul_rounds", "layers", "target_layer_ids")}
    return HybridRecipe(**small, layers=3, target_layer_ids=(0, 1), ul_rounds=0, linear_key_heads=1,
                        linear_value_heads=2, linear_head_dim=16)


def log(msg: str) -> None:
    print(f"[train {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- corpus + tokenizer

def load_corpus(recipe: Recipe):
    """-> train, held-out, train test files, held-out test files (test files are prompt sources only)."""
    files = corpus.list_sources()
    tests = corpus.list_sources(tests=True)
    if recipe.max_files:
        files = files[: recipe.max_files * 4]
    train = corpus.thin_generated_tables([f for f in files if not f.held_out], recipe.table_keep_one_in)
    held = [f for f in files if f.held_out]
    train_tests = [f for f in tests if not f.held_out]
    held_tests = [f for f in tests if f.held_out]
    if recipe.max_files:
        train, held = train[: recipe.max_files], (held or train[-2:])[:2]
        train_tests, held_tests = train_tests[: recipe.max_files], held_tests[:4]
    return train, held, train_tests, held_tests


def train_tokenizer(train_files, recipe: Recipe, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.vocab_size,
        special_tokens=[EOS, MASK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((f.text for f in train_files), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, mask_token=MASK, pad_token=EOS)
    fast.save_pretrained(out / "target")
    fast.save_pretrained(out / "draft")
    return fast


def encode_files(tokenizer, files) -> torch.Tensor:
    eos = tokenizer.convert_tokens_to_ids(EOS)
    ids: list[int] = []
    for f in files:
        ids.extend(tokenizer(f.text, add_special_tokens=False)["input_ids"])
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


# ---------------------------------------------------------------- target

def is_hybrid(recipe: Recipe) -> bool:
    return isinstance(recipe, HybridRecipe)


def target_config(recipe: Recipe, tokenizer):
    from transformers import Qwen3Config

    if is_hybrid(recipe):
        return hybrid_target_config(recipe, tokenizer)
    return Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=recipe.hidden, intermediate_size=recipe.intermediate,
        num_hidden_layers=recipe.layers, num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.kv_heads, head_dim=recipe.head_dim,
        max_position_embeddings=recipe.max_positions, tie_word_embeddings=True, rope_theta=10000.0,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id, architectures=["Qwen3ForCausalLM"],
    )


def hybrid_target_config(recipe: HybridRecipe, tokenizer):
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=len(tokenizer), hidden_size=recipe.hidden, intermediate_size=recipe.intermediate,
        num_hidden_layers=recipe.layers, num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.kv_heads, head_dim=recipe.head_dim,
        linear_num_key_heads=recipe.linear_key_heads, linear_num_value_heads=recipe.linear_value_heads,
        linear_key_head_dim=recipe.linear_head_dim, linear_value_head_dim=recipe.linear_head_dim,
        linear_conv_kernel_dim=recipe.linear_conv_kernel, full_attention_interval=recipe.full_attention_interval,
        max_position_embeddings=recipe.max_positions, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id, architectures=["Qwen3_5ForCausalLM"],
    )


def target_class(recipe: Recipe):
    from transformers import Qwen3_5ForCausalLM, Qwen3ForCausalLM

    return Qwen3_5ForCausalLM if is_hybrid(recipe) else Qwen3ForCausalLM


def training_kernels(recipe: Recipe):
    """The hybrid target's GatedDeltaNet layers train on ``fast_delta.chunk_gated_delta_rule`` (the
    same math as transformers' torch path, one triangular solve per chunk instead of a row loop)."""
    from contextlib import nullcontext

    from workbench.train.fast_delta import fast_delta_rule

    return fast_delta_rule() if is_hybrid(recipe) else nullcontext()


def lr_at(step: int, total: int, peak: float, warmup: int = 50) -> float:
    warmup = min(warmup, max(1, total // 10))
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup))))


def windows(ids: torch.Tensor, seq_len: int, batch: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(ids) - seq_len - 1, (batch,), generator=gen)
    return torch.stack([ids[s : s + seq_len] for s in starts.tolist()])


def train_target(recipe: Recipe, tokenizer, train_ids, held_ids, out: Path, seed: int):
    torch.manual_seed(seed)
    model = target_class(recipe)(target_config(recipe, tokenizer))
    n = sum(p.numel() for p in model.parameters())
    log(f"target: {n / 1e6:.2f}M parameters, {len(train_ids)} train tokens")
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.target_lr, weight_decay=0.1, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed)
    model.train()
    t0 = time.time()
    for step in range(recipe.target_steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, recipe.target_steps, recipe.target_lr)
        x = windows(train_ids, recipe.seq_len, recipe.batch, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe.bf16), training_kernels(recipe):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == recipe.target_steps - 1:
            log(f"target step {step} loss {loss.item():.3f} ({time.time() - t0:.0f}s)")
        if recipe.checkpoint_every and step and step % recipe.checkpoint_every == 0:  # a cut-short run leaves one
            model.save_pretrained(out / "target")
    model.eval()
    model.save_pretrained(out / "target")
    return model


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


# ---------------------------------------------------------------- distillation data

def make_prompts(files, test_files, rng: random.Random, n: int, short_share: float) -> list[tuple[str, bool]]:
    """-> [(prompt, is_short)]: ``short_share`` in the short shapes people type (corpus.SHORT_SHAPES,
    test openings from ``test_files``), the rest long: half def/class openings, half mid-file stops."""
    prompts: list[tuple[str, bool]] = []
    files = list(files)
    for _ in range(50 * n):
        if len(prompts) >= n or not files:
            break
        if short_share and rng.random() < short_share:  # no draw at 0: the same prompts as before short shapes
            shape = rng.choice(corpus.SHORT_SHAPES)
            src = test_files if shape == "test_opening" and test_files else files
            prompts += [(p, True) for p in corpus.short_prompts(rng.choice(src).text, rng, 1, shape)]
        else:
            f = rng.choice(files)
            make = corpus.opening_prompts if rng.random() < 0.5 else corpus.midfile_prompts
            prompts += [(p, False) for p in make(f.text, rng, 1)]
    return prompts[:n]


@torch.no_grad()
def greedy_continue(model, prompt_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation of a batch of equal-length prompts. -> [bs, new_tokens]"""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(input_ids=prompt_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    nxt = out.logits[:, -1].argmax(-1)
    toks = [nxt]
    for _ in range(new_tokens - 1):
        out = model(input_ids=nxt[:, None], past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1)
        toks.append(nxt)
    return torch.stack(toks, dim=1)


def encode_prompts(tokenizer, prompts: list[tuple[str, bool]], max_tokens: int) -> list[list[int]]:
    """Token ids of (prompt, is_short) pairs: long prompts keep their last ``max_tokens`` tokens;
    short ones are kept whole (they are the point). Too-short prompts are dropped."""
    encoded = [(tokenizer(t, add_special_tokens=False)["input_ids"], short) for t, short in prompts]
    return [e[-max_tokens:] for e, short in encoded if len(e) >= (4 if short else max_tokens // 2)]


def continue_prompts(model, encoded: list[list[int]], new_tokens: int, what: str, bs: int = 64) -> list:
    """The model's greedy continuations. -> [(prompt + continuation ids, prompt length)]

    Equal lengths per batch without padding: prompts are grouped by length and cut to the
    group's shortest.
    """
    encoded = sorted(encoded, key=len)
    seqs = []
    t0 = time.time()
    for i in range(0, len(encoded), bs):
        group = encoded[i : i + bs]
        m = min(len(e) for e in group)
        x = torch.tensor([e[-m:] for e in group])
        full = torch.cat([x, greedy_continue(model, x, new_tokens)], dim=1)
        seqs += [(row.tolist(), m) for row in full]
        if i // bs % 8 == 0:
            log(f"{what} {i + len(group)}/{len(encoded)} ({time.time() - t0:.0f}s)")
    return seqs


def distill(recipe: Recipe, model, tokenizer, train_files, train_tests, out: Path, seed: int) -> list:
    """The target's greedy continuations of training prompts. -> [(token ids, prompt length)]"""
    rng = random.Random(seed + 1)
    prompts = make_prompts(train_files, train_tests, rng, recipe.distill_prompts, recipe.short_share)
    encoded = encode_prompts(tokenizer, prompts, recipe.distill_prompt_tokens)
    seqs = continue_prompts(model, encoded, recipe.distill_new_tokens, "distill")
    torch.save(seqs, out / "distill.pt")
    return seqs


# ---------------------------------------------------------------- target: fewer loops

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


# ---------------------------------------------------------------- drafter

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


def length_buckets(seqs) -> list[list[int]]:
    """Indices of sequences grouped by length (distillation makes equal-length groups)."""
    by_len: dict[int, list[int]] = {}
    for i, (ids, _) in enumerate(seqs):
        by_len.setdefault(len(ids), []).append(i)
    return list(by_len.values())


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


# ---------------------------------------------------------------- evaluation prompts + report

SPLITS = ("long", "short")


def eval_prompts_path(out: Path, split: str) -> Path:
    return out / ("eval_prompts.jsonl" if split == "long" else f"eval_prompts_{split}.jsonl")


def long_eval_prompts(held_files, recipe: Recipe, seed: int) -> list[dict]:
    """Long split: ~10-line excerpts of held-out files (def/class openings and mid-file stops)."""
    rng = random.Random(seed + 4)
    items = []
    files = sorted(held_files, key=lambda f: f.relpath)
    i = 0
    while len(items) < recipe.eval_prompts and i < 50 * recipe.eval_prompts:
        f = files[i % len(files)]
        kind = "opening" if i % 2 == 0 else "midfile"
        got = (corpus.opening_prompts if kind == "opening" else corpus.midfile_prompts)(f.text, rng, 1)
        if got and len(got[0]) <= 600:
            items.append({"id": f"eval-{len(items):03d}", "kind": kind, "source": f.relpath, "prompt": got[0]})
        i += 1
    return items


def short_eval_prompts(held_files, held_tests, recipe: Recipe, seed: int) -> list[dict]:
    """Short split: 1-7 lines in each of corpus.SHORT_SHAPES, in turn, from held-out files only.

    Files are visited round-robin (sorted by path) so no one file dominates a shape.
    """
    rng = random.Random(seed + 5)
    files = sorted(held_files, key=lambda f: f.relpath)
    tests = sorted(held_tests, key=lambda f: f.relpath) or files
    items, seen = [], set()
    cursor = {shape: 0 for shape in corpus.SHORT_SHAPES}
    stalled = 0
    while len(items) < recipe.eval_short_prompts and stalled < len(corpus.SHORT_SHAPES):
        stalled = 0
        for shape in corpus.SHORT_SHAPES:
            if len(items) >= recipe.eval_short_prompts:
                break
            src = tests if shape == "test_opening" else files
            for _ in range(len(src)):  # next file (round-robin) that has this shape
                f = src[cursor[shape] % len(src)]
                cursor[shape] += 1
                got = [p for p in corpus.short_prompts(f.text, rng, 4, shape) if p not in seen]
                if got:
                    seen.add(got[0])
                    items.append({"id": f"short-{len(items):03d}", "split": "short", "kind": shape,
                                  "source": f.relpath, "prompt": got[0]})
                    break
            else:
                stalled += 1
    return items


def write_eval_prompts(held_files, held_tests, recipe: Recipe, out: Path, seed: int) -> dict[str, list[dict]]:
    splits = {"long": [{**it, "split": "long"} for it in long_eval_prompts(held_files, recipe, seed)],
              "short": short_eval_prompts(held_files, held_tests, recipe, seed)}
    for split, items in splits.items():
        tmp = eval_prompts_path(out, split).with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(it) + "\n" for it in items))
        tmp.replace(eval_prompts_path(out, split))
    return splits


def first_prompts(splits: dict[str, list[dict]], n: int | None) -> dict[str, list[dict]]:
    """The first ``n`` prompts of each split (None: all)."""
    return splits if n is None else {split: items[:n] for split, items in splits.items()}


def read_eval_prompts(out: Path) -> dict[str, list[dict]]:
    return {split: [json.loads(line) for line in eval_prompts_path(out, split).read_text().splitlines()]
            for split in SPLITS}


@torch.no_grad()
def split_figures(target, draft, engine, tokenizer, prompts, new_tokens: int, tree_budget: int, known) -> dict:
    """Linear DFlash (dflash_generate, the reference) and DDTree(budget) (the engine) on one split."""
    import dflash.model as dm

    from workbench.bench.policy_bench import run_one
    from workbench.engine.policies import DDTree

    # dflash_generate's stats path calls torch.cuda.synchronize(); on CPU a plain clock is right.
    if not torch.cuda.is_available():
        dm._cuda_time = time.perf_counter
    taus, distinct, words, accepted, cycles, tree_accepted, tree_cycles = [], [], [], 0, 0, 0, 0
    eos = tokenizer.eos_token_id
    for i, item in enumerate(prompts):
        if i % 10 == 0:
            log(f"evaluating {item.get('split', '')} prompt {i}/{len(prompts)}")
        x = tokenizer(item["prompt"], return_tensors="pt", add_special_tokens=False)["input_ids"]
        r = dm.dflash_generate(draft, target, x, new_tokens, [eos], return_stats=True)
        share, known_share = continuation_shares(r.output_ids[0, x.shape[1]:].tolist(), eos, tokenizer, known)
        distinct.append(share)
        words.append(known_share)
        if r.acceptance_lengths:  # none when the target's first token is EOS
            taus.append(sum(r.acceptance_lengths) / len(r.acceptance_lengths))
        accepted += sum(r.acceptance_lengths)
        cycles += len(r.acceptance_lengths)
        t = run_one(engine, DDTree(tree_budget), item["prompt"], new_tokens)
        tree_accepted += sum(t.accept_lengths)
        tree_cycles += len(t.accept_lengths)
    dflash_tau = accepted / cycles
    tree_tau = tree_accepted / max(1, tree_cycles)
    return {
        # Pooled = all accepted tokens / all cycles (Spec-Bench, SGLang); the per-prompt mean is
        # inflated by prompts where the target loops and every draft is accepted.
        "dflash_tau": dflash_tau,
        "dflash_tau_mean_of_prompts": sum(taus) / max(1, len(taus)),
        f"ddtree{tree_budget}_tau": tree_tau,
        f"ddtree{tree_budget}_over_dflash": tree_tau / dflash_tau,
        "distinct_token_share": mean(distinct),
        "known_word_share": mean(words),
        "prompts": len(prompts),
    }


@torch.no_grad()
def report(target, draft, tokenizer, held_ids, splits: dict, recipe: Recipe, out: Path, known,
           new_tokens: int = 64, tree_budget: int = 32) -> dict:
    """Every figure, for each split of the evaluation prompts."""
    from workbench.engine.core import load

    # Same thread count as training: wb.load's default (up to 8) thrashes a shared 2-core machine.
    engine = load(target=out / "target", draft=out / "draft", threads=torch.get_num_threads())
    spread = spread_windows(held_ids, recipe.seq_len)
    return {
        # The first 64 windows of the held-out files (in path order, mostly argparse.py), as in every earlier report.
        "held_out_loss_nats": held_out_loss(target, held_ids, recipe.seq_len),
        # 64 windows spread evenly over all held-out files.
        "held_out_loss_spread_nats": held_out_loss(target, spread, recipe.seq_len),
        # The same windows as text: what real code scores on the known-word share.
        "known_word_share_of_held_out_code": mean(known_word_share(tokenizer.decode(w), known)
                                                  for w in spread.view(-1, recipe.seq_len).tolist()),
        "new_tokens": new_tokens,
        "splits": {split: split_figures(target, draft, engine, tokenizer, items, new_tokens, tree_budget, known)
                   for split, items in splits.items()},
    }


def spread_windows(held_ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    """64 windows spread evenly over all held-out files, end to end. -> [n * seq_len]"""
    n_win = max(1, (len(held_ids) - 1) // seq_len)
    return held_ids[: n_win * seq_len].view(n_win, seq_len)[:: max(1, n_win // 64)].flatten()


def weights_mb(out: Path) -> float:
    return sum(f.stat().st_size for f in out.glob("*/model.safetensors")) / 1e6


@torch.no_grad()
def dense_losses_beside(tokenizer, held_ids: torch.Tensor, seq_len: int) -> dict:
    """The shipped dense target's held-out losses on the same windows, when it shares the tokenizer
    (else nats per token would not compare)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.engine.loading import DEFAULT_TARGET

    if not (DEFAULT_TARGET / "config.json").is_file():
        return {"dense_target": f"not compared: no dense target in {DEFAULT_TARGET}"}
    if AutoTokenizer.from_pretrained(DEFAULT_TARGET).get_vocab() != tokenizer.get_vocab():
        return {"dense_target": "not compared: its tokenizer differs from this pair's"}
    dense = AutoModelForCausalLM.from_pretrained(DEFAULT_TARGET).eval()
    return {"dense_held_out_loss_nats": held_out_loss(dense, held_ids, seq_len),
            "dense_held_out_loss_spread_nats": held_out_loss(dense, spread_windows(held_ids, seq_len), seq_len)}


@torch.no_grad()
def hybrid_report(target, draft, tokenizer, held_ids, splits: dict, recipe: Recipe, out: Path, known,
                  new_tokens: int = 64, tree_budget: int = 32) -> dict:
    """The hybrid pair's figures: held-out loss (beside the dense target's on the same windows); per split
    the greedy continuations' shares and the simulated greedy tau of linear DFlash and DDTree(budget)
    with the drafter's per-slot top-1 agreement (greedy_sim, transformers alone); and the same taus
    measured through the engine (``engine``), so the two can be checked against each other."""
    from workbench.train import greedy_sim

    eos = tokenizer.eos_token_id
    spread = spread_windows(held_ids, recipe.seq_len)
    metrics = {
        "arch": "hybrid",
        "target_layer_types": list(target.config.layer_types),
        "held_out_loss_nats": held_out_loss(target, held_ids, recipe.seq_len),
        "held_out_loss_spread_nats": held_out_loss(target, spread, recipe.seq_len),
        **dense_losses_beside(tokenizer, held_ids, recipe.seq_len),
        "new_tokens": new_tokens,
        "weights_mb": weights_mb(out),
        "splits": {},
    }
    for split, items in splits.items():
        log(f"simulating {split} split ({len(items)} prompts)")
        sim, continuations = greedy_sim.figures(target, draft, tokenizer, items, new_tokens, tree_budget)
        shares = [continuation_shares(c, eos, tokenizer, known) for c in continuations]
        metrics["splits"][split] = {**sim, "distinct_token_share": mean(a for a, _ in shares),
                                    "known_word_share": mean(b for _, b in shares)}
    log("measuring through the engine")
    metrics["engine"] = engine_figures(out, splits, new_tokens, tree_budget)
    return metrics


@torch.no_grad()
def engine_figures(out: Path, splits: dict, new_tokens: int, tree_budget: int = 32) -> dict:
    """Greedy DFlash and DDTree(budget) tau through the engine, pooled per split (any pair in --out)."""
    from workbench.engine.core import load
    from workbench.bench.policy_bench import run_one
    from workbench.engine.policies import DDTree, DFlash

    engine = load(target=out / "target", draft=out / "draft", threads=torch.get_num_threads())
    figures = {}
    for split, items in splits.items():
        runs = {"dflash": [], f"ddtree{tree_budget}": []}
        for i, item in enumerate(items):
            if i % 10 == 0:
                log(f"engine: {split} prompt {i}/{len(items)}")
            for name, policy in (("dflash", DFlash()), (f"ddtree{tree_budget}", DDTree(tree_budget))):
                runs[name] += run_one(engine, policy, item["prompt"], new_tokens).accept_lengths
        taus = {f"{name}_tau": sum(v) / max(1, len(v)) for name, v in runs.items()}
        figures[split] = {**taus, "prompts": len(items)}
    return figures


def convention_figures(out: Path, splits: dict) -> dict:
    """The engine-convention table for the pair in ``out`` (``workbench.adapters.conventions``) on the first
    long evaluation prompt: the feature each engine's capture rule would hand the drafter."""
    from workbench.engine.core import load
    from workbench.adapters.conventions import conventions_report

    engine = load(target=out / "target", draft=out / "draft", threads=torch.get_num_threads())
    first = next(iter(splits.values()))[0]["prompt"]
    return conventions_report(engine.models, engine.encode(first).ids)


# ---------------------------------------------------------------- main

HISTORY_KEYS = ("recipe", "previous_drafters", "previous_drafter", "loops_phase", "engine_conventions")


def previous_drafters(earlier: dict) -> list[dict]:
    """The drafters a ``--stage draft`` run replaces, newest first, for comparison: the replaced one's
    drafter-side recipe and figures, then the history its report kept (``previous_drafter``: the single
    entry older reports had)."""
    recipe = earlier.get("recipe", {})
    replaced = {**{k: recipe[k] for k in DRAFTER_FIELDS if k in recipe},
                **{k: v for k, v in earlier.items() if k not in HISTORY_KEYS}}
    legacy = [earlier["previous_drafter"]] if "previous_drafter" in earlier else []
    return [replaced, *earlier.get("previous_drafters", []), *legacy]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.train", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for target/, draft/, eval_prompts.jsonl")
    ap.add_argument("--smoke", action="store_true", help="tiny models and a few steps (seconds; v2 recipe)")
    ap.add_argument("--arch", default="dense", choices=["dense", "hybrid"],
                    help="dense: a Qwen3 target (the embedded default); hybrid: a Qwen3.5-text target "
                         "(GatedDeltaNet + gated attention), e.g. --out workbench/assets/hybrid")
    ap.add_argument("--recipe", default="v2", choices=["v1", "v2"],
                    help="v2: the shipped pair (default); v1: the first shipped pair's recipe (long prompts only)")
    ap.add_argument("--loops", type=int, metavar="ROUNDS",
                    help="the target's loops phase: unlikelihood rounds after its training (default 0: off)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stage", default="all",
                    choices=["all", "target", "loops", "draft", "report", "eval", "prompts"],
                    help="'target' trains the target and runs its loops phase; 'loops' runs only that phase "
                         "on the target in --out; 'draft' and 'report' reuse the target (and tokenizer) in --out; "
                         "'eval' adds the engine's DFlash/DDTree tau to the report in --out; "
                         "'prompts' only writes the evaluation prompts (both splits)")
    ap.add_argument("--target-steps", type=int)
    ap.add_argument("--draft-steps", type=int)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--resume-draft", action="store_true", help="with --stage draft: continue the drafter in --out")
    ap.add_argument("--draft-lr", type=float)
    ap.add_argument("--draft-layers", type=int, metavar="N", help="drafter layers (default: the recipe's, 2)")
    ap.add_argument("--distill-prompts", type=int)
    ap.add_argument("--short-share", type=float, help="share of short-shape distillation prompts (0-1)")
    ap.add_argument("--checkpoint-every", type=int, help="save the target and drafter every N steps (0: only at the end)")
    ap.add_argument("--eval-prompts", type=int, metavar="N",
                    help="figures on the first N evaluation prompts of each split (default: all)")
    args = ap.parse_args(argv)
    if args.loops is not None and args.loops < 0:
        ap.error(f"--loops {args.loops} must be 0 or more")
    if args.short_share is not None and not 0.0 <= args.short_share <= 1.0:
        ap.error(f"--short-share {args.short_share} must be between 0 and 1")
    if args.eval_prompts is not None and args.eval_prompts < 1:
        ap.error(f"--eval-prompts {args.eval_prompts} must be 1 or more")

    hybrid = args.arch == "hybrid"
    if hybrid and args.recipe != "v2":
        ap.error(f"--recipe {args.recipe} is a dense recipe; --arch hybrid has one recipe (drop --recipe)")
    if args.stage not in ("all", "target", "prompts") and (args.out / "target" / "config.json").is_file():
        found = json.loads((args.out / "target" / "config.json").read_text()).get("model_type", "")
        if found.startswith("qwen3_5") != hybrid:
            ap.error(f"the target in {args.out / 'target'} is {found!r}: pass --arch "
                     f"{'hybrid' if found.startswith('qwen3_5') else 'dense'}")

    torch.set_num_threads(args.threads)
    if hybrid:
        recipe = hybrid_smoke_recipe() if args.smoke else HybridRecipe()
    else:
        recipe = smoke_recipe() if args.smoke else Recipe(**(V1 if args.recipe == "v1" else {}))
    if args.loops is not None:
        recipe.ul_rounds = args.loops
    if args.stage == "loops" and not recipe.ul_rounds:
        ap.error("--stage loops with 0 rounds does nothing: add --loops N")
    if args.target_steps is not None:
        recipe.target_steps = args.target_steps
    if args.draft_steps is not None:
        recipe.draft_steps = args.draft_steps
    if args.draft_layers is not None and args.draft_layers < 1:
        ap.error(f"--draft-layers {args.draft_layers} must be 1 or more")
    for name in ("draft_lr", "draft_layers", "distill_prompts", "short_share", "checkpoint_every"):
        if getattr(args, name) is not None:
            setattr(recipe, name, getattr(args, name))
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    random.seed(args.seed)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    train_files, held_files, train_tests, held_tests = load_corpus(recipe)
    log(f"corpus: {len(train_files)} train files, {len(held_files)} held-out files "
        f"(+{len(train_tests)}/{len(held_tests)} test files, prompts only)")
    if args.stage == "prompts":
        write_eval_prompts(held_files, held_tests, recipe, out, args.seed)
        return 0
    if args.stage == "eval":  # the engine's figures, added to the report already there
        old = out / "training_report.json"
        metrics = json.loads(old.read_text()) if old.exists() else {}
        metrics["engine"] = engine_figures(out, first_prompts(read_eval_prompts(out), args.eval_prompts),
                                           recipe.eval_new_tokens)
        metrics["engine_conventions"] = convention_figures(out, read_eval_prompts(out))
        tmp = out / "training_report.json.tmp"
        tmp.write_text(json.dumps(metrics, indent=2) + "\n")
        tmp.replace(old)
        print(json.dumps(metrics["engine"]))
        return 0
    known = corpus_words(train_files)  # the words the target could have learned
    if args.stage in ("all", "target"):
        tokenizer = train_tokenizer(train_files, recipe, out)
        train_ids, held_ids = encode_files(tokenizer, train_files), encode_files(tokenizer, held_files)
        target = train_target(recipe, tokenizer, train_ids, held_ids, out, args.seed)
    else:
        tokenizer = AutoTokenizer.from_pretrained(out / "target")
        held_ids = encode_files(tokenizer, held_files)
        target = AutoModelForCausalLM.from_pretrained(out / "target").eval()
        train_ids = encode_files(tokenizer, train_files) if args.stage == "loops" else None
    if args.stage in ("all", "target"):
        prompts = write_eval_prompts(held_files, held_tests, recipe, out, args.seed)
    else:  # later stages evaluate on the prompts the first stage wrote, whatever their seed
        prompts = read_eval_prompts(out)
    prompts = first_prompts(prompts, args.eval_prompts)
    if args.stage in ("all", "target", "loops") and recipe.ul_rounds:
        before = target_figures(target, tokenizer, held_ids, prompts, recipe, known)
        target = train_fewer_loops(recipe, target, tokenizer, train_ids, train_files, train_tests, args.seed)
        target.save_pretrained(out / "target")
        phase = {"before": before, "after": target_figures(target, tokenizer, held_ids, prompts, recipe, known)}
        log(f"loops phase: {json.dumps(phase)}")
        tmp = out / "loops_phase.json.tmp"
        tmp.write_text(json.dumps(phase, indent=2) + "\n")
        tmp.replace(out / "loops_phase.json")
    elif args.stage in ("all", "target"):  # a new target without the phase: no stale before/after
        (out / "loops_phase.json").unlink(missing_ok=True)
    if args.stage in ("target", "loops"):
        return 0
    if args.stage in ("all", "draft"):
        seqs = distill(recipe, target, tokenizer, train_files, train_tests, out, args.seed)
        draft = train_draft(recipe, target, tokenizer, seqs, out, args.seed, resume=args.resume_draft)
        (out / "distill.pt").unlink(missing_ok=True)
    else:
        from dflash.model import DFlashDraftModel

        draft = DFlashDraftModel.from_pretrained(out / "draft").eval()
    metrics = (hybrid_report if hybrid else report)(target, draft, tokenizer, held_ids, prompts, recipe, out, known,
                                                    new_tokens=recipe.eval_new_tokens)
    metrics["engine_conventions"] = convention_figures(out, prompts)
    if (out / "loops_phase.json").exists():  # what the target's loops phase did, written by that stage
        metrics["loops_phase"] = json.loads((out / "loops_phase.json").read_text())
    old = out / "training_report.json"
    if args.stage in ("report", "draft") and old.exists():  # the recipe is whatever trained the target
        earlier = json.loads(old.read_text())
        metrics.update({k: v for k, v in earlier.items() if k in ("recipe", "draft_phase2", "draft_finetune")})
        if args.stage == "draft":  # the drafter's side of the recipe is this run's
            metrics["previous_drafters"] = previous_drafters(earlier)
            metrics["recipe"] = dict(metrics.get("recipe", {}))
            metrics["recipe"].update({k: v for k, v in asdict(recipe).items() if k in DRAFTER_FIELDS})
            metrics["draft_finetune"] = {
                "resume_draft": args.resume_draft, "seed": args.seed,
                **{k: getattr(recipe, k) for k in ("draft_layers", "draft_steps", "draft_lr", "distill_prompts",
                                                   "short_share")},
                "note": "drafter (re)trained on the target above with --stage draft",
            }
    else:
        metrics["recipe"] = asdict(recipe)
    tmp = out / "training_report.json.tmp"
    tmp.write_text(json.dumps(metrics, indent=2) + "\n")
    tmp.replace(old)
    log(f"report: {json.dumps({k: v for k, v in metrics.items() if k != 'recipe'})}")
    print(json.dumps({k: v for k, v in metrics.items() if k != "recipe"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
