"""Which pair this is: the facts a calibration made on one target + drafter pair must match on another.

A calibration (``workbench.engine.policies.calibration``) estimates how often *this* target accepts *this*
drafter's candidates; a file made on another pair would silently mis-rank every tree. So a calibration records
the pair it was made on, and a policy compares it with the pair it runs on before any decode.

The identity is plain data (a dict of numbers and short strings) so that the policies, which sit below the
models, can compare it without importing them: the vocabulary and the tokenizer file's fingerprint, the
drafter's block size, mask token and the target layers it reads, each model's layer count and width, and a
fingerprint of each model's weight files.
The fingerprint reads each file's name, size and first MiB (for safetensors: the header naming every tensor,
then the first tensors' bytes): a retrained drafter of the same shape has other bytes there, while loading the
same files in another dtype or on another device keeps the identity (its acceptance barely moves).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
HEAD_BYTES = 1 << 20  # bytes of each weight file read for the fingerprint

_FINGERPRINTS: dict[tuple, str] = {}  # (directory, its files' names, sizes and mtimes) -> fingerprint


def weights_fingerprint(directory) -> str:
    """A short hex digest of the weight files in ``directory`` (names, sizes, first MiB each); 'none' when
    there are none (a model built in memory)."""
    d = Path(directory)
    files = sorted(p for p in d.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file()) if d.is_dir() else []
    if not files:
        return "none"
    stamp = (str(d.resolve()), tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files))
    if stamp not in _FINGERPRINTS:  # sessions start often; the files rarely change under a loaded engine
        h = hashlib.sha256()
        for p in files:
            h.update(f"{p.name}:{p.stat().st_size}:".encode())
            with p.open("rb") as f:
                h.update(f.read(HEAD_BYTES))
        _FINGERPRINTS[stamp] = h.hexdigest()[:16]
    return _FINGERPRINTS[stamp]


def tokenizer_fingerprint(directory) -> str:
    """A short hex digest of the tokenizer file in ``directory`` (``tokenizer.json``); 'none' without one. A
    previous-token-conditioned head (``workbench.engine.policies.pair_head``) is tied to the tokenizer."""
    p = Path(directory) / "tokenizer.json"
    if not p.is_file():
        return "none"
    stamp = (str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns)
    if stamp not in _FINGERPRINTS:
        _FINGERPRINTS[stamp] = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    return _FINGERPRINTS[stamp]


def model_facts(config, directory) -> dict:
    """Layers, width and weight fingerprint of one model (its text config, for a multimodal wrapper)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return {"model_type": str(getattr(text, "model_type", "")), "layers": int(text.num_hidden_layers),
            "hidden": int(text.hidden_size), "weights": weights_fingerprint(directory)}


def pair_identity(models) -> dict:
    """The identity of a loaded pair (``workbench.engine.loading.Models``): what a calibration records."""
    vocab = int(models.target.config.get_text_config().vocab_size)
    return {"vocab": vocab, "block_size": int(models.block_size), "mask_token_id": int(models.mask_token_id),
            "target_layer_ids": [int(i) for i in models.target_layer_ids],
            "tokenizer": tokenizer_fingerprint(models.target_dir),
            "target": model_facts(models.target.config, models.target_dir),
            "drafter": model_facts(models.draft.config, models.draft_dir)}
