"""Fitting the path-acceptance model (``workbench.engine.policies.path_model``) to recorded cycles.

One observation per cycle, slot d and recorded candidate j where the target's path down to slot d is inside
the recorded candidates (otherwise no tree built from them holds it): y = 1 when the target's token at slot d
is candidate j. The path's state (spine / sibling / off) comes from the target's own ranks above d, exactly as
the tree build derives a node's state from its ancestors. Features are ``path_model.features`` (the same
function the policies evaluate). One logistic regression per state, Newton's method with a small ridge.
"""
from __future__ import annotations

import numpy as np
import torch

from ddtree_kernels.path_tree import OFF, SIBLING, SPINE, STATES
from workbench.calibrate.collect import Cycles
from workbench.engine.policies.path_model import FEATURES, PathModel, features

RIDGE = 1.0  # on every weight but the bias: keeps rare features (rank 3 after a sibling) from running off


def path_states(ranks: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """ranks [C, D] -> (state [C, D] of the target's path above each slot, usable [C, D]: that path lies in the
    recorded candidates and the slot's target token is known)."""
    C, D = ranks.shape
    state = np.full((C, D), SPINE, dtype=np.int64)
    inside = np.ones(C, dtype=bool)  # the path so far is among the recorded candidates
    usable = np.zeros((C, D), dtype=bool)
    for d in range(D):
        usable[:, d] = inside & (ranks[:, d] >= 0)
        if d + 1 < D:
            # the kernel's child_state rule (ddtree_kernels.path_tree), on arrays of the target's ranks
            state[:, d + 1] = np.where(ranks[:, d] > 0, SIBLING, np.where(state[:, d] == SPINE, SPINE, OFF))
            inside &= (ranks[:, d] >= 0) & (ranks[:, d] < K)
    return state, usable


def observations(cyc: Cycles) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """state -> (X [n, F], y [n], slot_hit [m]) with one row per usable (cycle, slot, candidate), and per usable
    slot whether the target's token was among the candidates."""
    K = cyc.K
    x = features(torch.from_numpy(cyc.topv)).numpy()  # [C, D, K, F]
    state, usable = path_states(cyc.ranks, K)
    y = cyc.ranks[:, :, None] == np.arange(K)[None, None, :]  # [C, D, K]
    real = np.isfinite(cyc.topv)  # candidates that exist (a slot of a small vocabulary has fewer)
    out = {}
    for s in range(len(STATES)):
        at = usable & (state == s)  # [C, D]
        rows = at[:, :, None] & real
        out[s] = (x[rows], y[rows].astype(np.float64), (cyc.ranks[at] < K))
    return out


def logistic(X: np.ndarray, y: np.ndarray, ridge: float = RIDGE, iters: int = 100) -> np.ndarray:
    """Weights of P(y = 1) = sigmoid(X w), penalised log-likelihood, Newton steps (a few dozen at most)."""
    F = X.shape[1]
    w = np.zeros(F)
    pen = np.full(F, ridge)
    pen[0] = 0.0  # the bias is free
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-np.clip(X @ w, -40, 40)))
        g = X.T @ (p - y) + pen * w
        H = (X * (p * (1 - p))[:, None]).T @ X + np.diag(pen + 1e-9)
        step = np.linalg.solve(H, g)
        w -= step
        if np.max(np.abs(step)) < 1e-9:
            break
    return w


def log_loss(X: np.ndarray, y: np.ndarray, q: np.ndarray) -> float:
    q = np.clip(q, 1e-12, 1 - 1e-12)
    return float(-np.mean(y * np.log(q) + (1 - y) * np.log(1 - q))) if len(y) else float("nan")


def fit(cyc: Cycles) -> tuple[PathModel, dict]:
    """The model on every cycle, and its figures: per state the slots seen, the target's hits among the
    candidates, the mean predicted vs observed acceptance, and, fitted on half the prompts and scored on the
    other half, its log-loss against the drafter's own marginal (DDTree's implicit estimate q = p_drafter)."""
    obs = observations(cyc)
    weights, figures = [], {"slots": {}, "hits": {}, "mean_q": {}, "observed": {}}
    for s, name in enumerate(STATES):
        X, y, hit = obs[s]
        if not len(y):
            raise ValueError(f"no cycle reached the {name} state; calibrate on more prompts or tokens")
        w = logistic(X, y)
        weights.append(tuple(float(v) for v in w))
        q = 1.0 / (1.0 + np.exp(-(X @ w)))
        figures["slots"][name], figures["hits"][name] = int(hit.size), int(hit.sum())
        figures["mean_q"][name], figures["observed"][name] = float(q.mean()), float(y.mean())
    figures["held_out"] = held_out_check(cyc)
    return PathModel(tuple(weights)), figures


def held_out_check(cyc: Cycles) -> dict:
    """Fit on the even prompts, score on the odd ones: log-loss per state of the model and of the marginal."""
    even = cyc.prompts % 2 == 0
    fit_obs, test_obs = observations(cyc.subset(even)), observations(cyc.subset(~even))
    out = {}
    lp_col = FEATURES.index("logprob")
    for s, name in enumerate(STATES):
        (Xa, ya, _), (Xb, yb, _) = fit_obs[s], test_obs[s]
        if not len(ya) or not len(yb):
            continue
        w = logistic(Xa, ya)
        out[name] = {"observations": int(len(yb)),
                     "log_loss_model": log_loss(Xb, yb, 1.0 / (1.0 + np.exp(-(Xb @ w)))),
                     "log_loss_drafter_marginal": log_loss(Xb, yb, np.exp(Xb[:, lp_col]))}
    return out
