"""A previous-token-conditioned head: how likely token c follows token p, as a small table the pair policies
read (``PairChain``, ``PairTree``).

A block-diffusion drafter drafts every slot of its block in one forward, each slot's distribution a marginal
over whatever came before it on the drafter's own argmax path. Once a path takes another token (a sibling), the
next slot's marginal no longer knows its previous token. The head supplies that dependence (as DFlash2's
selector and TreeFlash's MLP do with trained networks): the candidates of slot d are rescored given the token
before them,

    s_j = log p_drafter(c_j) + beta * log p_head(c_j | previous token)
    q_j = (the drafter's mass on its k candidates) * softmax_j(s_j)

so a candidate's probability is the drafter's candidate mass redistributed by the head (q_j <= 1; beta = 0 is
the drafter's own marginal). ``beta`` is chosen on the calibration prompts (``python -m workbench.calibrate``)
and kept in the calibration file beside the head's file name.

The head itself is the training corpus's bigram (``python -m workbench.train.pair_head``): for every token its
``M`` most frequent successors in the drafters' training files, interpolated with the unigram. Stored as
``.npz``: ``succ_ids`` int32 [V, M] (-1: none), ``succ_logp`` float32 [V, M], ``backoff_logp`` float32 [V]
(log of the unigram share left to a pair outside the table) and ``meta`` (JSON: format, vocabulary,
tokenizer fingerprint, how it was made). It is tied to the tokenizer: a pair with another vocabulary or
tokenizer is refused in one line (``PairHeadError``) before any decode.
"""
from __future__ import annotations

import json
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

FORMAT = "ddtree-workbench pair head"
VERSION = 1
MAKE = "python -m workbench.train.pair_head --target DIR --out FILE"


class PairHeadError(ValueError):
    """A head file that cannot be used on this pair; the message is one line."""


@dataclass(frozen=True)
class PairHead:
    """The successor table, on the host; ``log_pair`` moves what it needs to the candidates' device."""

    path: str
    succ_ids: np.ndarray  # int32 [V, M]
    succ_logp: np.ndarray  # float32 [V, M]
    backoff_logp: np.ndarray  # float32 [V]
    meta: dict

    def __post_init__(self):
        object.__setattr__(self, "on_device", {})  # device -> (ids, logp, backoff) tensors, copied once

    @property
    def vocab(self) -> int:
        return int(self.succ_ids.shape[0])

    def check_pair(self, pair: dict) -> None:
        """Refuse (one line) a pair whose vocabulary or tokenizer is not the one this head was made with."""
        for key, words in (("vocab", "vocabulary size"), ("tokenizer", "tokenizer")):
            if self.meta.get(key) != pair.get(key):
                raise PairHeadError(f"pair head {self.path} does not match this drafter's tokens: its {words} is "
                                    f"{self.meta.get(key)}, this pair's {pair.get(key)}; make one for this pair "
                                    f"with {MAKE}")

    def tables(self, device) -> tuple[Tensor, Tensor, Tensor]:
        """(keys, log-probs, backoff) on ``device``, copied once: the table's (prev, next) pairs as sorted int64
        keys prev * V + next [P] with their log-probs [P], float64, and the backoff per next token [V]."""
        t = self.on_device.get(device)
        if t is None:
            ids = torch.from_numpy(self.succ_ids.astype(np.int64))  # [V, M], -1: none
            prev = torch.arange(ids.shape[0], dtype=torch.int64)[:, None].expand_as(ids)
            have = ids >= 0
            keys = prev[have] * self.vocab + ids[have]  # [P]
            keys, order = torch.sort(keys)
            logp = torch.from_numpy(self.succ_logp.astype(np.float64))[have][order]
            t = self.on_device[device] = (keys.to(device), logp.to(device),
                                          torch.from_numpy(self.backoff_logp.astype(np.float64)).to(device))
        return t

    def log_pair(self, prev: Tensor, cand: Tensor) -> Tensor:
        """log p_head(cand | prev): prev [...], cand [..., k] token ids -> float64 [..., k]. A sorted-key lookup
        (one search for all candidates) rather than comparing each candidate with its parent's whole row."""
        keys, logp, back = self.tables(cand.device)
        q = prev[..., None] * self.vocab + cand  # [..., k]
        at = torch.searchsorted(keys, q.reshape(-1)).clamp_(max=keys.numel() - 1).reshape(q.shape)
        return torch.where(keys[at] == q, logp[at], back[cand])

    def rescored(self, topv: Tensor, topi: Tensor, prev: Tensor, beta: float) -> Tensor:
        """log q of the candidates of each slot given the token before them.

        topv, topi [..., k]: a slot's top-k log-probs and ids (rank order); prev [...]: the previous token ->
        float64 [..., k], each <= the log of the drafter's mass on its k candidates."""
        lp = topv.double()
        mass = torch.logsumexp(lp, dim=-1, keepdim=True)  # [..., 1] log of the candidates' drafter mass
        s = lp + beta * self.log_pair(prev, topi)
        return mass + s - torch.logsumexp(s, dim=-1, keepdim=True)


_LOADED: dict[tuple, PairHead] = {}


def load_head(path) -> PairHead:
    """A head file, checked for its format (PairHeadError in one line otherwise); cached by path and mtime."""
    p = Path(path)
    if not p.is_file():
        raise PairHeadError(f"pair head {p} is not a file; make one with {MAKE}")
    key = (str(p.resolve()), p.stat().st_mtime_ns)
    if key not in _LOADED:
        try:
            with np.load(p, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                head = PairHead(str(p), z["succ_ids"], z["succ_logp"], z["backoff_logp"], meta)
        except (zipfile.BadZipFile, EOFError, zlib.error) as e:  # a file cut short or damaged in its archive
            raise PairHeadError(f"pair head {p} is cut short or damaged ({type(e).__name__}: {e}); copy it again "
                                f"or make it again with {MAKE}") from None
        except (OSError, ValueError, KeyError) as e:
            raise PairHeadError(f"pair head {p} is not a pair head file ({type(e).__name__}); make one with {MAKE}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise PairHeadError(f"pair head {p} is not a version-{VERSION} pair head; make one with {MAKE}")
        V, M = head.succ_ids.shape
        if head.succ_logp.shape != (V, M) or head.backoff_logp.shape != (V,) or meta.get("vocab") != V:
            raise PairHeadError(f"pair head {p}: its tables disagree in shape with its {meta.get('vocab')}-token "
                                f"vocabulary; make it again with {MAKE}")
        _LOADED[key] = head
    return _LOADED[key]


def conditioned_increments(head: PairHead, topv: Tensor, topi: Tensor, roots: Tensor, beta: float) -> Tensor:
    """Every slot's candidates rescored given each possible parent: topv, topi [bs, D, k] (rank order), roots
    [bs] -> log q float64 [bs, D, k, k]: [b, d, j, c] = candidate j of slot d under the parent that is
    candidate c of slot d - 1 (slot 0: under the root, the same for every c). The parent classes of
    ``ddtree_kernels.path_tree.rank_class``."""
    bs, D, k = topi.shape
    prev = torch.cat([roots.reshape(bs, 1, 1).expand(bs, 1, k), topi[:, :-1, :]], dim=1)  # [bs, D, k] class -> token
    q = head.rescored(topv[:, :, None, :].expand(bs, D, k, k), topi[:, :, None, :].expand(bs, D, k, k),
                      prev.clamp(min=0), beta)  # [bs, D, class, k]
    return q.transpose(2, 3)  # [bs, D, k, class]
