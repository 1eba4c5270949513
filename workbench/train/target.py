"""The target: its config (a Qwen3, or a Qwen3.5-text hybrid), the learning-rate schedule, training windows and
next-token training, checkpointed every ``checkpoint_every`` steps so a cut-short run still leaves one.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from workbench.train.progress import log
from workbench.train.recipe import HybridRecipe, Recipe, is_hybrid


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
