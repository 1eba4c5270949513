"""A learned conditioned head: how likely each of slot d's candidates is the target's token, given the drafter's
state at slot d and the token chosen at slot d - 1 (its parent in a tree).

A block-diffusion drafter drafts every slot in one forward, so slot d's distribution assumes the drafter's own
argmax path above it. Once a path takes another token, slot d no longer knows its previous token. The successor
table (``pair_head``) supplies that dependence from the previous token alone; this head learns it from the
drafter's state too (``python -m workbench.train.cond_head``). For slot d with hidden state h (the drafter's final
hidden state, its LM head's input), top-K candidates c_j with log-probs l_j, and a parent with token p at rank
c of slot d - 1 (slot 0: the root):

    g      = (P h + p0) * (E[p] + R[bucket(c)])           # [r]: a low-rank bilinear of state and previous token
    s_j    = alpha * l_j + U[c_j] . g                        # U = the target's LM head times a learned map, [V, r]
    s_out  = log(1 - sum_j exp(l_j)) + u_out . g + c_out     # "the target's token is none of the K"
    log q_j = s_j - logsumexp(s_1..s_K, s_out)

E = the target's input embedding times a learned map ([V, r], stored); bucket: 0 the root, 1-3 ranks 0-2, 4 ranks
3 and up. q_j is an estimate of the probability that candidate
j is the target's token given that the path down to the parent was accepted, so a prefix's summed log q estimates
the log-probability that the target accepts it whole (the trees' score, as in ``path_tree``).

Stored as ``.npz``: ``P`` [r, H], ``p0`` [r], ``E`` [V, r] (float16), ``R`` [5, r], ``U`` [V, r] (float16), ``u_out``
[r], ``scalars`` [alpha, c_out] and ``meta`` (JSON: format, version, K, rank, the pair it was trained on: vocabulary,
tokenizer, block size, drafter and target with their weight fingerprints, how it was made). Made on one drafter's
states, it is refused in one line (``CondHeadError``) on any other pair before any decode.
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

from workbench.shipped import ASSETS

FORMAT = "ddtree-workbench conditioned head"
VERSION = 1
MAKE = "python -m workbench.train.cond_head --target dense --out FILE"
SHIPPED = {"dense": ASSETS / "cond_head.npz", "hybrid": ASSETS / "hybrid" / "cond_head.npz"}
BUCKETS = 5  # root, rank 0, 1, 2, 3 and up
ARRAYS = ("P", "p0", "E", "R", "U", "u_out", "scalars")
# identity fields a head must share with the pair it runs on, with the words for them
PAIR_FIELDS = (("vocab", "vocabulary size"), ("tokenizer", "tokenizer"), ("block_size", "drafter block size"),
               ("drafter", "drafter"), ("target", "target"))


class CondHeadError(ValueError):
    """A head file that cannot be used on this pair; the message is one line."""


def rank_bucket(parent_rank: Tensor) -> Tensor:
    """A parent's rank among its slot's candidates (-1: the root) -> its bucket 0..4."""
    return torch.where(parent_rank < 0, 0, parent_rank.clamp(max=3) + 1)


@dataclass(frozen=True)
class CondHead:
    """The head's arrays on the host; ``tensors`` copies them (float32) to a device once."""

    path: str
    arrays: dict  # name -> np.ndarray (ARRAYS)
    meta: dict

    def __post_init__(self):
        object.__setattr__(self, "on_device", {})

    @property
    def K(self) -> int:
        return int(self.meta["K"])

    def check_pair(self, pair: dict) -> None:
        """Refuse (one line) a pair other than the one this head was trained on."""
        mine = self.meta.get("pair") or {}
        for key, words in PAIR_FIELDS:
            if mine.get(key) != pair.get(key):
                raise CondHeadError(f"conditioned head {self.path} was trained on another pair: its {words} is "
                                    f"{brief(mine.get(key))}, this pair's {brief(pair.get(key))}; train one for this "
                                    f"pair with {MAKE}")

    def tensors(self, device) -> dict:
        t = self.on_device.get(device)
        if t is None:
            t = self.on_device[device] = {k: torch.from_numpy(v.astype(np.float32)).to(device)
                                          for k, v in self.arrays.items()}
        return t

    def host(self) -> dict:
        """The arrays as float32 NumPy (``P`` also transposed, contiguous), made once: the host scoring's."""
        h = self.on_device.get("host")
        if h is None:
            h = self.on_device["host"] = {k: v.astype(np.float32) for k, v in self.arrays.items()}
            h["PT"] = np.ascontiguousarray(h["P"].T)
        return h

    def log_q(self, hidden: Tensor, topv: Tensor, topi: Tensor, prev: Tensor, bucket: Tensor) -> Tensor:
        """log q of each candidate under each parent. hidden [..., H]; topv, topi [..., K] (rank order, the
        head's K); prev, bucket [..., C]: C parents' tokens and rank buckets -> float32 [..., C, K]."""
        a = self.tensors(hidden.device)
        return scores(a, hidden, topv, a["E"][prev] + a["R"][bucket], a["U"][topi])[..., :-1]


def scores(a: dict, hidden: Tensor, topv: Tensor, parent: Tensor, u_cand: Tensor) -> Tensor:
    """The head's formula (the module docstring's), shared by the policies and the training. a: P [r, H], p0 [r],
    u_out [r], scalars [2]; hidden [..., H]; topv [..., K]; parent [..., C, r] each parent's E[p] + R[bucket(c)];
    u_cand [..., K, r] the candidates' rows of U -> log q [..., C, K + 1]: the K candidates, then "none of them"."""
    left = hidden.float() @ a["P"].T + a["p0"]  # [..., r]
    g = left[..., None, :] * parent  # [..., C, r]
    s = a["scalars"][0] * topv[..., None, :] + g @ u_cand.transpose(-1, -2)  # [..., C, K]
    rest = torch.log(-torch.expm1(torch.logsumexp(topv, dim=-1).clamp(max=-1e-6)))  # [...]: log(1 - mass)
    s_out = rest[..., None] + g @ a["u_out"] + a["scalars"][1]  # [..., C]
    return torch.log_softmax(torch.cat([s, s_out[..., None]], dim=-1), dim=-1)


def brief(v) -> str:
    """A pair field for a one-line message (a model's facts as 'qwen3, 2 layers x 256, weights 5f28...')."""
    if isinstance(v, dict):
        return f"{v.get('model_type')}, {v.get('layers')} layers x {v.get('hidden')}, weights {v.get('weights')}"
    return str(v)


_LOADED: dict[tuple, CondHead] = {}


def resolve(name_or_path) -> Path:
    """'dense' / 'hybrid' (a shipped head) or a file's path -> the path."""
    if isinstance(name_or_path, str) and name_or_path in SHIPPED:
        return SHIPPED[name_or_path]
    return Path(name_or_path).expanduser()


def load_head(name_or_path) -> CondHead:
    """A head file (or a shipped one by name), checked for its format; CondHeadError in one line otherwise.
    Cached by path and mtime."""
    p = resolve(name_or_path)
    if not p.is_file():
        raise CondHeadError(f"conditioned head {name_or_path} is not a file nor a shipped one ({', '.join(SHIPPED)}); "
                            f"train one with {MAKE}")
    key = (str(p.resolve()), p.stat().st_mtime_ns)
    if key not in _LOADED:
        try:
            with np.load(p, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                arrays = {k: z[k] for k in ARRAYS}
        except (zipfile.BadZipFile, EOFError, zlib.error) as e:  # a file cut short or damaged in its archive
            raise CondHeadError(f"conditioned head {p} is cut short or damaged ({type(e).__name__}: {e}); copy it "
                                f"again or train it again with {MAKE}") from None
        except (OSError, ValueError, KeyError) as e:
            raise CondHeadError(f"conditioned head {p} is not a head file ({type(e).__name__}); train one with "
                                f"{MAKE}") from None
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise CondHeadError(f"conditioned head {p} is not a version-{VERSION} conditioned head; train one with "
                                f"{MAKE}")
        V, r = arrays["E"].shape
        H = arrays["P"].shape[1]
        want = {"P": (r, H), "p0": (r,), "E": (V, r), "R": (BUCKETS, r), "U": (V, r), "u_out": (r,), "scalars": (2,)}
        if any(arrays[k].shape != s for k, s in want.items()) or (meta.get("pair") or {}).get("vocab") != V:
            raise CondHeadError(f"conditioned head {p}: its arrays disagree in shape with its vocabulary and rank; "
                                f"train it again with {MAKE}")
        _LOADED[key] = CondHead(str(p), arrays, meta)
    return _LOADED[key]


def shipped_for(pair: dict) -> CondHead | None:
    """The shipped head trained on ``pair``, or None."""
    for p in SHIPPED.values():
        if p.is_file():
            head = load_head(p)
            try:
                head.check_pair(pair)
            except CondHeadError:
                continue
            return head
    return None


def conditioned_increments(head: CondHead, hidden: Tensor, topv: Tensor, topi: Tensor, roots: Tensor, k: int) -> Tensor:
    """Every slot's first ``k`` candidates scored under each possible parent: hidden [bs, D, H]; topv, topi [bs, D,
    K] (the head's K, rank order); roots [bs] -> log q float64 [bs, D, k, k]: [b, d, j, c] = candidate j of slot d
    under the parent that is candidate c of slot d - 1 (slot 0: under the root, the same for every c). The parent
    classes of ``ddtree_kernels.path_tree.rank_class``, as ``pair_head.conditioned_increments`` gives them."""
    bs, D, K = topi.shape
    a = head.tensors(hidden.device)
    prev = torch.cat([roots.reshape(bs, 1, 1).expand(bs, 1, k), topi[:, :-1, :k]], dim=1)  # [bs, D, k] class -> token
    parent = a["E"][prev.clamp(min=0)] + bucket_rows(a, D, k)  # [bs, D, class, r]
    q = scores(a, hidden, topv, parent, a["U"][topi])  # [bs, D, class, K + 1]
    return q[..., :k].transpose(2, 3).double()  # [bs, D, k, class]


def host_increments(head: CondHead, hidden: np.ndarray, topv: np.ndarray, topi: np.ndarray, roots: np.ndarray,
                    k: int) -> np.ndarray:
    """``conditioned_increments`` on the host, in NumPy: the same formula (``scores``) and layout, float32 [bs, D,
    k, k]. On a CPU a few dozen tensor ops on arrays this small cost several times their NumPy twins, and the host
    tree build reads NumPy anyway. hidden [bs, D, H]; topv, topi [bs, D, K]; roots [bs]."""
    a = head.host()
    bs, D, K = topi.shape
    r = a["p0"].shape[0]
    left = (hidden.reshape(bs * D, -1) @ a["PT"] + a["p0"]).reshape(bs, D, 1, r)  # [bs, D, 1, r]
    prev = np.empty((bs, D, k), dtype=np.int64)  # [bs, D, class]: each parent class's token
    prev[:, 0] = np.asarray(roots).reshape(bs, 1)
    prev[:, 1:] = topi[:, :-1, :k]
    g = left * (a["E"][prev] + bucket_rows(a, D, k))  # [bs, D, k, r]
    s = g @ a["U"][topi].transpose(0, 1, 3, 2) + a["scalars"][0] * topv[:, :, None, :]  # [bs, D, k, K]
    # exp's arguments are kept >= -80: below that a float32 result is subnormal (x86 computes those about 100x
    # slower) and adds less than 1e-34 to a sum that holds a 1.
    mass = np.log(np.exp(np.maximum(topv, -80.0)).sum(-1))  # [bs, D]: log of the top-K's probability
    rest = np.log(-np.expm1(np.minimum(mass, -1e-6)))  # [bs, D]: log(1 - mass)
    s_out = g @ a["u_out"] + (rest + a["scalars"][1])[:, :, None]  # [bs, D, k]
    top = np.maximum(s.max(-1), s_out)  # [bs, D, k]
    tail = np.exp(np.maximum(s - top[..., None], -80.0)).sum(-1) + np.exp(np.maximum(s_out - top, -80.0))
    lse = top + np.log(tail)  # [bs, D, k]
    return (s[..., :k] - lse[..., None]).transpose(0, 1, 3, 2)  # [bs, D, j, class]


def bucket_rows(a: dict, D: int, k: int):
    """R's row for each (slot, parent class) of ``conditioned_increments``'s layout, [D, k, r], from the tensor
    or the NumPy tables ``a`` (cached there: a static table, made without a host-to-device copy)."""
    rows = a.get(("R", D, k))
    if rows is None:
        R = a["R"]
        dev = R.device if isinstance(R, Tensor) else "cpu"
        slot, rank = torch.arange(D, device=dev)[:, None], torch.arange(k, device=dev).expand(D, k)
        bucket = rank_bucket(torch.where(slot == 0, -1, rank))  # [D, k]
        rows = a[("R", D, k)] = R[bucket] if isinstance(R, Tensor) else R[bucket.numpy()]
    return rows
