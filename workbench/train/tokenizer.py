"""The training text and its tokens: the corpus split as the recipe says (train, held out, and test files that
are prompt sources only), the byte-level BPE trained on the training files, files encoded end to end.
"""
from __future__ import annotations

from pathlib import Path

import torch

from workbench.train import corpus
from workbench.train.recipe import Recipe


EOS = "<|endoftext|>"
MASK = "<|mask|>"


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
