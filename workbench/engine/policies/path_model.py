"""The path-acceptance model a calibration file holds, evaluated on a cycle's drafted top-k.

For candidate j of slot d it estimates q = P(the target's token at that depth is this candidate | the target
took every ancestor of it), from what pays-off's branching table shows decides it: the drafter's own
log-odds and log-prob for the candidate, its slot's top-1 log-odds, the candidate's rank, the depth, and the state of the
path above it (``ddtree_kernels.path_tree``: spine, sibling, off). One logistic model per state:
q = sigmoid(w_state . x). A node's path-acceptance estimate is the product of q along its path, so
log q is the increment the path-conditioned tree build adds.

The weights are fitted by ``python -m workbench.calibrate`` on the pair's own traces
(``workbench.calibrate.fit``, which builds its design matrix with ``features`` here, so fit and use cannot
drift apart); this module only evaluates them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree_kernels.path_tree import STATES

# The feature vector, in order. A calibration file names them, and a file with other names is refused.
# "logit" is the drafter's own log-odds for the candidate: weight 1 on it and 0 elsewhere is exactly DDTree's
# estimate (q = the drafter's marginal), so the fit starts from the marginal and can only correct it.
FEATURES = ("bias", "logit", "logprob", "top1_logit", "rank_1", "rank_2", "rank_3", "rank_4_up", "depth")
LOGPROB_FLOOR = -20.0  # log-probs below this are all "never"
LOGIT_CAP = 20.0  # |log-odds| past this carry no more information (and float32 log-probs round near 0)
DEPTH_SCALE = 16.0  # depth enters as depth / 16: the published drafters' block size
MAX_Q = 1.0 - 1e-6  # q < 1 keeps every increment < 0, so a child never outscores its parent
LOG_MAX_Q = math.log(MAX_Q)


def features(topv: Tensor) -> Tensor:
    """topv [bs, D, k]: each slot's top-k log-probs in rank order -> float64 [bs, D, k, F] (``FEATURES``)."""
    bs, D, k = topv.shape
    lp = topv.double().clamp(min=LOGPROB_FLOOR, max=-1e-12)  # [bs, D, k]
    logit = (lp - torch.log(-torch.expm1(lp))).clamp(-LOGIT_CAP, LOGIT_CAP)  # log(p / (1 - p))
    top1 = logit[:, :, :1].expand(bs, D, k)
    rank = torch.arange(k, device=topv.device).view(1, 1, k).expand(bs, D, k)
    depth = (torch.arange(D, device=topv.device, dtype=torch.float64) + 1).view(1, D, 1).expand(bs, D, k)
    cols = [torch.ones_like(lp), logit, lp, top1, *((rank == r).double() for r in (1, 2, 3)),
            (rank >= 4).double(), depth / DEPTH_SCALE]
    return torch.stack(cols, dim=-1)


@dataclass(frozen=True)
class PathModel:
    """One logistic model per path state: ``weights[s]`` over ``FEATURES``."""

    weights: tuple  # [S][F] floats, S = len(STATES)

    def __post_init__(self):
        object.__setattr__(self, "on_device", {})  # device -> weights [S, F]: copied there once, not every cycle

    def log_q(self, topv: Tensor) -> Tensor:
        """topv [bs, D, k] -> log q, float64 [bs, D, k, S]: the increment of candidate j of slot d under a
        parent in state s (each < 0). Nothing here reads the device (the static-shape path calls it)."""
        x = features(topv)  # [bs, D, k, F]
        w = self.on_device.get(topv.device)
        if w is None:
            w = self.on_device[topv.device] = torch.tensor(self.weights, dtype=torch.float64, device=topv.device)
        return torch.nn.functional.logsigmoid(x @ w.T).clamp(max=LOG_MAX_Q)  # [bs, D, k, S]

    def q(self, topv: Tensor) -> Tensor:
        """The same as probabilities, [bs, D, k, S]."""
        return self.log_q(topv).exp()

    def to_dict(self) -> dict:
        return {"features": list(FEATURES), "states": list(STATES),
                "weights": {s: list(map(float, w)) for s, w in zip(STATES, self.weights)}}

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "PathModel":
        """From a calibration file's ``acceptance`` object; ValueError (one line) naming ``where`` if its
        features or states are not these."""
        if not isinstance(d, dict) or d.get("features") != list(FEATURES) or d.get("states") != list(STATES):
            raise ValueError(f"{where}: its acceptance model names features {d.get('features') if isinstance(d, dict) else None} "
                             f"and states {d.get('states') if isinstance(d, dict) else None}, not this workbench's "
                             f"{list(FEATURES)} / {list(STATES)}: make it again with python -m workbench.calibrate")
        w = d.get("weights")
        if not isinstance(w, dict) or any(not isinstance(w.get(s), list) or len(w[s]) != len(FEATURES)
                                          or not all(isinstance(x, (int, float)) for x in w[s]) for s in STATES):
            raise ValueError(f"{where}: its acceptance weights must hold {len(FEATURES)} numbers for each of "
                             f"{', '.join(STATES)}")
        return cls(tuple(tuple(float(x) for x in w[s]) for s in STATES))
