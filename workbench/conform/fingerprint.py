"""A cheap fingerprint of a loaded pair's weights, written in a dump's header and compared by the checker.

Two pairs can agree on everything a header's other keys hold (the embedded dense and hybrid pairs share the
vocabulary, the block, the mask token and the target layers), and a dump replayed on the wrong pair blames
the engine for every contract. The weights themselves tell them apart. Hashing every weight of a large model
would cost a full read of it, so the fingerprint hashes each parameter's name, shape and a few fixed elements
(the first, middle and last few and a fixed stride of the rest), read where the parameter lives and widened
to float32 (exact for bfloat16 and float16). A different checkpoint, a fine-tune or another architecture
changes it; the same checkpoint loaded in the same dtype on any device gives the same one.

    pair_fingerprint(models) -> {"method": METHOD, "target": "3fa9...", "draft": "91c0..."}

Computed once per module (cached by the module object), so every dump of an engine pays for it once.
"""
from __future__ import annotations

import hashlib
import weakref

import torch

METHOD = "param-slices-1"  # another sampling of the weights is another method: compared only like with like
EDGE = 8  # elements read at the start, the middle and the end of each parameter
STRIDE_POINTS = 61  # and at this many fixed fractions of its length (prime: not aligned with head or row sizes)

_CACHE: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()


def sample_positions(n: int) -> list[int]:
    """The flat positions read from a parameter of ``n`` elements, sorted, each once."""
    mid = n // 2
    picks = {*range(min(EDGE, n)), *range(max(mid - EDGE // 2, 0), min(mid + EDGE // 2, n)),
             *range(max(n - EDGE, 0), n), *(n * k // STRIDE_POINTS for k in range(STRIDE_POINTS))}
    return sorted(i for i in picks if 0 <= i < n)


def module_fingerprint(module: torch.nn.Module) -> str:
    """16 hex digits over every parameter's name, shape and sampled values (tied weights once)."""
    cached = _CACHE.get(module)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    with torch.no_grad():
        for name, p in sorted(module.named_parameters(), key=lambda item: item[0]):
            h.update(f"{name}:{tuple(p.shape)};".encode())
            if p.is_meta or p.numel() == 0:  # offloaded or empty: its name and shape are all there is to read
                continue
            flat = p.detach().reshape(-1)
            idx = torch.tensor(sample_positions(flat.numel()), device=flat.device)
            h.update(flat[idx].to(torch.float32).cpu().numpy().tobytes())
    digest = h.hexdigest()[:16]
    _CACHE[module] = digest
    return digest


def pair_fingerprint(models) -> dict:
    """The header's ``pair.fingerprint`` of a loaded pair (``engine.models``)."""
    return {"method": METHOD, "target": module_fingerprint(models.target), "draft": module_fingerprint(models.draft)}
