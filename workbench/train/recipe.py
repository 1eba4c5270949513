"""What the embedded pairs are trained with: the recipe's sizes, steps and rates (``Recipe``; the hybrid target's
``HybridRecipe``), the first shipped pair's changes (``V1``), the tiny recipes the tests run, and which fields a
``--stage draft`` run decides (``DRAFTER_FIELDS``). docs/training.md says what each choice measured.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


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
    # target escaped its loops into junk tokens (docs/training.md, "The embedded dense pair": the loops phase row).
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
    distill_prompts: int = 12288  # twice 6,144 raised DFlash tau from 2.66 / 2.81 to 2.77 / 3.07 (docs/training.md)
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


def is_hybrid(recipe: Recipe) -> bool:
    return isinstance(recipe, HybridRecipe)
