"""Train the embedded default: a byte-level BPE, a small Qwen3 target and a DFlash drafter.

    python -m workbench.train --out workbench/assets            # the shipped models (~45 min, 2 cores)
    python -m workbench.train --out /tmp/smoke --smoke          # seconds, used by the tests

Stages (each writes to ``--out`` and can be re-run alone with ``--stage``):
tokenizer -> target -> distill (target's greedy continuations) -> draft -> report.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from workbench import corpus

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
    draft_layers: int = 2
    target_layer_ids: tuple[int, ...] = (1, 3, 5)
    block_size: int = 16
    distill_prompts: int = 3072
    distill_prompt_tokens: int = 96
    distill_new_tokens: int = 96
    draft_steps: int = 1500
    draft_batch: int = 16
    anchors_per_seq: int = 8
    draft_lr: float = 2e-3
    gamma: float = 7.0
    eval_prompts: int = 40
    max_files: int = 0  # 0 = all files
    bf16: bool = True


def smoke_recipe() -> Recipe:
    return Recipe(
        vocab_size=300, hidden=32, layers=4, heads=2, kv_heads=1, head_dim=16, intermediate=64,
        max_positions=256, seq_len=64, batch=4, target_steps=3, draft_layers=1, target_layer_ids=(1, 2),
        block_size=8, distill_prompts=8, distill_prompt_tokens=24, distill_new_tokens=24, draft_steps=3,
        draft_batch=4, anchors_per_seq=2, eval_prompts=4, max_files=12, bf16=False,
    )


def log(msg: str) -> None:
    print(f"[train {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- corpus + tokenizer

def load_corpus(recipe: Recipe):
    files = corpus.list_sources()
    if recipe.max_files:
        files = files[: recipe.max_files * 4]
    train = [f for f in files if not f.held_out]
    held = [f for f in files if f.held_out]
    if recipe.max_files:
        train, held = train[: recipe.max_files], (held or train[-2:])[:2]
    return train, held


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

def target_config(recipe: Recipe, tokenizer):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=recipe.hidden, intermediate_size=recipe.intermediate,
        num_hidden_layers=recipe.layers, num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.kv_heads, head_dim=recipe.head_dim,
        max_position_embeddings=recipe.max_positions, tie_word_embeddings=True, rope_theta=10000.0,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id, architectures=["Qwen3ForCausalLM"],
    )


def lr_at(step: int, total: int, peak: float, warmup: int = 50) -> float:
    warmup = min(warmup, max(1, total // 10))
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup))))


def windows(ids: torch.Tensor, seq_len: int, batch: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(ids) - seq_len - 1, (batch,), generator=gen)
    return torch.stack([ids[s : s + seq_len] for s in starts.tolist()])


def train_target(recipe: Recipe, tokenizer, train_ids, held_ids, out: Path, seed: int):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(target_config(recipe, tokenizer))
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
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe.bf16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == recipe.target_steps - 1:
            log(f"target step {step} loss {loss.item():.3f} ({time.time() - t0:.0f}s)")
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


# ---------------------------------------------------------------- distillation data

def make_prompts(files, rng: random.Random, n: int) -> list[str]:
    """Half function/class openings, half mid-file stops: what users will type."""
    prompts: list[str] = []
    files = list(files)
    while len(prompts) < n and files:
        f = rng.choice(files)
        if rng.random() < 0.5:
            prompts += corpus.opening_prompts(f.text, rng, 1)
        else:
            prompts += corpus.midfile_prompts(f.text, rng, 1)
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


def distill(recipe: Recipe, model, tokenizer, train_files, out: Path, seed: int) -> torch.Tensor:
    rng = random.Random(seed + 1)
    prompts = make_prompts(train_files, rng, recipe.distill_prompts)
    p = recipe.distill_prompt_tokens
    encoded = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in prompts]
    encoded = [e[-p:] for e in encoded if len(e) >= p // 2]
    # Equal lengths per batch without padding: group by length, cut to the group's shortest.
    encoded.sort(key=len)
    seqs = []
    bs = 64
    t0 = time.time()
    for i in range(0, len(encoded), bs):
        group = encoded[i : i + bs]
        m = min(len(e) for e in group)
        x = torch.tensor([e[-m:] for e in group])
        cont = greedy_continue(model, x, recipe.distill_new_tokens)
        full = torch.cat([x, cont], dim=1)
        for row in full:
            seqs.append((row.tolist(), m))
        if i // bs % 8 == 0:
            log(f"distill {i + len(group)}/{len(encoded)} ({time.time() - t0:.0f}s)")
    torch.save(seqs, out / "distill.pt")
    return seqs


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


def draft_batch(seqs, recipe: Recipe, rng: random.Random, mask_id: int):
    """Sequences, anchors and the drafter's attention mask for one training step.

    Every block [anchor, MASK...] sees the target context strictly before its
    anchor and the whole of its own block (bidirectional), nothing else.
    """
    B = recipe.block_size
    rows = [seqs[rng.randrange(len(seqs))] for _ in range(recipe.draft_batch)]
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
    return ids, block_ids, labels, mask, position_ids


def train_draft(recipe: Recipe, target, tokenizer, seqs, out: Path, seed: int, resume: bool = False):
    from dflash.model import DFlashDraftModel, extract_context_feature

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
    draft.train()
    t0 = time.time()
    for step in range(recipe.draft_steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, recipe.draft_steps, recipe.draft_lr)
        ids, block_ids, labels, mask, pos = draft_batch(seqs, recipe, rng, mask_id)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe.bf16):
            with torch.no_grad():
                hs = target(input_ids=ids, output_hidden_states=True).hidden_states
                ctx = extract_context_feature(hs, draft.target_layer_ids)
            h = draft(position_ids=pos, attention_mask=mask, noise_embedding=emb(block_ids), target_hidden=ctx)
            logits = head(h).float()
        ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape)
        w = weight.repeat(labels.shape[1] // B)[None]
        loss = (ce * w).sum() / (w.sum() * labels.shape[0])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == recipe.draft_steps - 1:
            acc1 = (logits.argmax(-1) == labels).view(labels.shape[0], -1, B)[:, :, 1].float().mean().item()
            log(f"draft step {step} loss {loss.item():.3f} slot1-acc {acc1:.2f} ({time.time() - t0:.0f}s)")
    draft.eval()
    draft.save_pretrained(out / "draft")
    return draft


# ---------------------------------------------------------------- evaluation prompts + report

def write_eval_prompts(held_files, recipe: Recipe, out: Path, seed: int) -> list[dict]:
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
    with open(out / "eval_prompts.jsonl", "w") as fh:
        for it in items:
            fh.write(json.dumps(it) + "\n")
    return items


@torch.no_grad()
def report(target, draft, tokenizer, held_ids, prompts, recipe: Recipe, new_tokens: int = 64) -> dict:
    import dflash.model as dm

    # dflash_generate's stats path calls torch.cuda.synchronize(); on CPU a plain clock is right.
    if not torch.cuda.is_available():
        dm._cuda_time = time.perf_counter
    taus, distinct, accepted, cycles = [], [], 0, 0
    for item in prompts:
        x = tokenizer(item["prompt"], return_tensors="pt", add_special_tokens=False)["input_ids"]
        r = dm.dflash_generate(draft, target, x, new_tokens, [tokenizer.eos_token_id], return_stats=True)
        gen = r.output_ids[0, x.shape[1]:].tolist()
        distinct.append(len(set(gen)) / max(1, len(gen)))
        taus.append(sum(r.acceptance_lengths) / len(r.acceptance_lengths))
        accepted += sum(r.acceptance_lengths)
        cycles += len(r.acceptance_lengths)
    return {
        "held_out_loss_nats": held_out_loss(target, held_ids, recipe.seq_len),
        # Pooled = all accepted tokens / all cycles (Spec-Bench, SGLang); the per-prompt mean is
        # inflated by prompts where the target loops and every draft is accepted.
        "dflash_tau": accepted / cycles,
        "dflash_tau_mean_of_prompts": sum(taus) / len(taus),
        "distinct_token_share": sum(distinct) / len(distinct),
        "new_tokens": new_tokens,
        "prompts": len(prompts),
    }


# ---------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.train", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for target/, draft/, eval_prompts.jsonl")
    ap.add_argument("--smoke", action="store_true", help="tiny models and a few steps (seconds)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stage", default="all", choices=["all", "target", "draft", "report"],
                    help="'draft' and 'report' reuse the target (and tokenizer) already in --out")
    ap.add_argument("--target-steps", type=int)
    ap.add_argument("--draft-steps", type=int)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--resume-draft", action="store_true", help="with --stage draft: continue the drafter in --out")
    ap.add_argument("--draft-lr", type=float)
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    recipe = smoke_recipe() if args.smoke else Recipe()
    if args.target_steps is not None:
        recipe.target_steps = args.target_steps
    if args.draft_steps is not None:
        recipe.draft_steps = args.draft_steps
    if args.draft_lr is not None:
        recipe.draft_lr = args.draft_lr
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    random.seed(args.seed)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    train_files, held_files = load_corpus(recipe)
    log(f"corpus: {len(train_files)} train files, {len(held_files)} held-out files")
    if args.stage in ("all", "target"):
        tokenizer = train_tokenizer(train_files, recipe, out)
        train_ids, held_ids = encode_files(tokenizer, train_files), encode_files(tokenizer, held_files)
        target = train_target(recipe, tokenizer, train_ids, held_ids, out, args.seed)
    else:
        tokenizer = AutoTokenizer.from_pretrained(out / "target")
        held_ids = encode_files(tokenizer, held_files)
        target = AutoModelForCausalLM.from_pretrained(out / "target").eval()
    if args.stage in ("all", "target"):
        prompts = write_eval_prompts(held_files, recipe, out, args.seed)
    else:  # later stages evaluate on the prompts the first stage wrote, whatever their seed
        prompts = [json.loads(line) for line in (out / "eval_prompts.jsonl").read_text().splitlines()]
    if args.stage == "target":
        return 0
    if args.stage in ("all", "draft"):
        seqs = distill(recipe, target, tokenizer, train_files, out, args.seed)
        draft = train_draft(recipe, target, tokenizer, seqs, out, args.seed, resume=args.resume_draft)
        (out / "distill.pt").unlink(missing_ok=True)
    else:
        from dflash.model import DFlashDraftModel

        draft = DFlashDraftModel.from_pretrained(out / "draft").eval()
    metrics = report(target, draft, tokenizer, held_ids, prompts, recipe)
    metrics["recipe"] = asdict(recipe)
    (out / "training_report.json").write_text(json.dumps(metrics, indent=2) + "\n")
    log(f"report: {json.dumps({k: v for k, v in metrics.items() if k != 'recipe'})}")
    print(json.dumps({k: v for k, v in metrics.items() if k != "recipe"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
