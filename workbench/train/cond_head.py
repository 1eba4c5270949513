r"""``python -m workbench.train.cond_head``: train the learned conditioned head the CondTree / CondChain policies read.

Data (``cond_data``): prompts cut from the drafters' training files (never a held-out file, a file an evaluation
prompt came from, or a text overlapping one), the target's greedy continuations of them, and blocks rooted in those
continuations through the drafter: every slot's final hidden state and top-K beside the target's token there and
before it. Training: the head's formula (``workbench.engine.policies.cond_head.scores``) by cross-entropy over the K
candidates and "none of them", on every slot whose path from the root lies among the candidates (the slots a tree
can reach), one tenth of the sequences kept aside for the report's figures. AdamW, warm-up then cosine. The shipped
heads: 4096 prompts and 1500 steps, 6-8 CPU minutes per pair on one thread, most of it the data (the defaults take
under 2 minutes and score 2-5 points lower after a sibling on the kept-aside tenth; more steps alone overfit them).

    python -m workbench.train.cond_head --target dense --out workbench/assets/cond_head.npz \
        --prompts 4096 --steps 1500 --replace
    python -m workbench.train.cond_head --target hybrid --out workbench/assets/hybrid/cond_head.npz \
        --prompts 4096 --steps 1500 --replace
"""
from __future__ import annotations

import argparse
import datetime
import io
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workbench.engine.policies.cond_head import BUCKETS, FORMAT, VERSION, rank_bucket, scores
from workbench.records.files import npz_output, write_bytes_atomic
from workbench.train.cond_data import Blocks
from workbench.train.progress import log

K = 16  # candidates per slot the head scores (the calibration's width)
RANK = 64
STEPS = 400
BATCH = 2048
LR = 3e-3
HOLD_ONE_IN = 10  # sequences kept aside for the report (by sequence number)


class HeadModule(nn.Module):
    """The head's parameters over the pair's frozen input embedding and LM head ([V, H] each)."""

    def __init__(self, embedding: Tensor, lm_head: Tensor, rank: int):
        super().__init__()
        V, H = lm_head.shape
        self.register_buffer("emb", embedding.detach().float().clone())  # [V, H]
        self.register_buffer("lm", lm_head.detach().float().clone())  # [V, H]
        self.P = nn.Linear(H, rank)  # the drafter's state, and p0
        self.Q = nn.Linear(H, rank, bias=False)  # the previous token's embedding
        self.A = nn.Parameter(torch.zeros(H, rank))  # U = lm @ A: zero, so training starts at the drafter's own q
        self.R = nn.Parameter(torch.zeros(BUCKETS, rank))
        self.u_out = nn.Parameter(torch.zeros(rank))
        self.scalars = nn.Parameter(torch.tensor([1.0, 0.0]))  # alpha, c_out

    def arrays(self) -> dict:
        return {"P": self.P.weight, "p0": self.P.bias, "R": self.R, "u_out": self.u_out, "scalars": self.scalars}

    def forward(self, hidden: Tensor, topv: Tensor, topi: Tensor, prev: Tensor, bucket: Tensor) -> Tensor:
        """One parent per example: hidden [n, H], topv/topi [n, K], prev/bucket [n] -> log q [n, K + 1]."""
        e_prev = self.Q(self.emb[prev])[:, None, :]  # [n, 1, r]
        u_cand = (self.lm @ self.A)[topi]  # [n, K, r]: all of U once (V rows) is cheaper than n * K rows
        return scores(self.arrays(), hidden, topv, e_prev + self.R[bucket[:, None]], u_cand)[:, 0]

    def export(self) -> dict:
        """The arrays the policies read (``cond_head.ARRAYS``): the tables E and U made once, stored half."""
        with torch.no_grad():
            out = {k: v.detach().numpy().astype(np.float32) for k, v in self.arrays().items()}
            out["E"] = self.Q(self.emb).numpy().astype(np.float16)
            out["U"] = (self.lm @ self.A).numpy().astype(np.float16)
        return out


def examples(blocks: Blocks) -> dict:
    """One row per (block, slot) a tree can reach: the slot's state, candidates, the previous token and its rank
    bucket, the label (the target token's rank, K: none of the candidates) and the path state above it."""
    ranks = blocks.ranks  # [n, D]
    n, D = ranks.shape
    Kb = blocks.topi.shape[-1]
    state = torch.zeros_like(ranks)  # 0 spine, 1 sibling, 2 off (ddtree_kernels.path_tree's states)
    inside = torch.ones(n, dtype=torch.bool)
    usable = torch.zeros_like(ranks, dtype=torch.bool)
    for d in range(D):
        usable[:, d] = inside & (ranks[:, d] >= 0)
        if d + 1 < D:
            state[:, d + 1] = torch.where(ranks[:, d] > 0, 1, torch.where(state[:, d] == 0, 0, 2))
            inside &= (ranks[:, d] >= 0) & (ranks[:, d] < Kb)
    parent = torch.cat([torch.full_like(ranks[:, :1], -1), ranks[:, :-1]], dim=1)  # [n, D]
    at = usable.nonzero(as_tuple=True)
    return {"hidden": blocks.hidden[at], "topv": blocks.topv[at], "topi": blocks.topi[at],
            "prev": blocks.path[:, :-1][at], "bucket": rank_bucket(parent[at]), "label": ranks[at],
            "state": state[at], "group": blocks.group[at[0]]}


def split(ex: dict, hold_one_in: int = HOLD_ONE_IN) -> tuple[dict, dict]:
    """(training rows, held-aside rows): every ``hold_one_in``-th sequence aside, whole."""
    aside = ex["group"] % hold_one_in == 0
    return ({k: v[~aside] for k, v in ex.items()}, {k: v[aside] for k, v in ex.items()})


def train(models, ex: dict, rank: int = RANK, steps: int = STEPS, batch: int = BATCH, lr: float = LR,
          seed: int = 0) -> HeadModule:
    """The head trained on the rows ``ex`` (``examples``). Deterministic for a seed on one thread."""
    torch.manual_seed(seed)
    head = HeadModule(models.target.get_input_embeddings().weight, models.target.lm_head.weight, rank)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    n = ex["label"].numel()
    warm = max(1, min(100, steps // 10))
    t0 = time.time()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * step / steps))
        ix = torch.randint(n, (min(batch, n),), generator=gen)
        logq = head(ex["hidden"][ix].float(), ex["topv"][ix], ex["topi"][ix], ex["prev"][ix], ex["bucket"][ix])
        loss = F.nll_loss(logq, ex["label"][ix])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 250 == 0 or step == steps - 1:
            log(f"cond-head step {step} loss {loss.item():.3f} ({time.time() - t0:.0f}s)")
    return head.eval()


def top1_by_state(ex: dict, best: Tensor) -> dict:
    """Share of rows whose best candidate (``best`` [n] ranks) is the target's token, by the path state above the
    slot. -> {"spine" | "sibling" | "off": {"slots": n, "top1": rate or None}}"""
    out = {}
    for s, name in enumerate(("spine", "sibling", "off")):
        at = ex["state"] == s
        n = int(at.sum())
        out[name] = {"slots": n, "top1": float((best[at] == ex["label"][at]).float().mean()) if n else None}
    return out


@torch.no_grad()
def learned_best(head, ex: dict, chunk: int = 8192) -> Tensor:
    """The head's best candidate per row given the target's previous token ([n] ranks). ``head``: a HeadModule or
    a loaded ``CondHead``."""
    out = []
    for a in range(0, ex["label"].numel(), chunk):
        sl = slice(a, a + chunk)
        args = (ex["hidden"][sl].float(), ex["topv"][sl], ex["topi"][sl])
        if isinstance(head, HeadModule):
            q = head(*args, ex["prev"][sl], ex["bucket"][sl])[:, :-1]
        else:
            q = head.log_q(*args, ex["prev"][sl][:, None], ex["bucket"][sl][:, None])[:, 0]
        out.append(q.argmax(-1))
    return torch.cat(out)


def table_best(table, beta: float, ex: dict) -> Tensor:
    """The successor table's best candidate per row (``pair_head.PairHead.rescored``), [n] ranks."""
    return table.rescored(ex["topv"], ex["topi"], ex["prev"], beta).argmax(-1)


def accuracy_table(ex: dict, head, table=None, beta: float = 0.5) -> dict:
    """Next-slot top-1 by path state: the drafter's marginal (rank 0), the successor table, the learned head."""
    out = {"marginal": top1_by_state(ex, torch.zeros_like(ex["label"])),
           "learned": top1_by_state(ex, learned_best(head, ex))}
    if table is not None:
        out["table"] = top1_by_state(ex, table_best(table, beta, ex))
    return out


def describe_accuracy(acc: dict) -> str:
    """'sibling: marginal 0.26, table 0.48, learned 0.64 (n=4836); ...'"""
    parts = []
    for state in ("spine", "sibling", "off"):
        rates = ", ".join(f"{who} {v[state]['top1']:.3f}" for who, v in acc.items() if v[state]["top1"] is not None)
        parts.append(f"{state}: {rates} (n={acc['marginal'][state]['slots']})")
    return "; ".join(parts)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workbench.train.cond_head", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="dense", help="dense or hybrid (an embedded pair), or a target directory "
                                                     "with --draft")
    p.add_argument("--draft", metavar="DIR", help="the DFlash drafter's directory (with a --target directory)")
    p.add_argument("--out", required=True, help="the .npz to write")
    p.add_argument("--replace", action="store_true", help="write over an existing --out file (refused otherwise)")
    p.add_argument("--prompts", type=int, default=1024, help="training prompts (default 1024)")
    p.add_argument("--new-tokens", type=int, default=48, help="the target's continuation per prompt (default 48)")
    p.add_argument("--anchors", type=int, default=16, help="blocks rooted in each continuation (default 16)")
    p.add_argument("--rank", type=int, default=RANK, help=f"the bilinear's rank (default {RANK})")
    p.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps (default {STEPS})")
    p.add_argument("--batch", type=int, default=BATCH, help=f"rows per step (default {BATCH})")
    p.add_argument("--lr", type=float, default=LR, help=f"peak learning rate (default {LR})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    return p


def check(args) -> str | None:
    """Why these options cannot make a head (one line), or None."""
    for name in ("prompts", "new_tokens", "anchors", "rank", "steps", "batch", "threads"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} {getattr(args, name)} must be 1 or more"
    if not args.lr > 0:
        return f"--lr {args.lr} must be positive"
    if args.target not in ("dense", "hybrid") and not args.draft:
        return f"--target {args.target}: a model directory needs --draft DIR (or use dense or hybrid)"
    try:
        npz_output(args.out, "a conditioned head", args.replace)
    except ValueError as e:
        return str(e)
    return None


def write_head(path, head: HeadModule, pair: dict, made: dict) -> None:
    """The head's file as ``workbench.engine.policies.cond_head.load_head`` reads it, tied to ``pair``
    (``workbench.models.identity.pair_identity``), written to exactly ``path`` and never half-written."""
    meta = {"format": FORMAT, "version": VERSION, "K": K, "rank": int(head.R.shape[1]),
            "pair": {k: pair[k] for k in ("vocab", "tokenizer", "block_size", "drafter", "target")}, "made": made}
    buf = io.BytesIO()  # built in memory, then written beside ``path`` and renamed over it
    np.savez_compressed(buf, meta=np.array(json.dumps(meta)), **head.export())
    write_bytes_atomic(path, buf.getvalue())


def load_pair(target: str, draft: str | None):
    """The loaded pair's models: 'dense' / 'hybrid' (embedded) or directories."""
    from workbench.engine.loading import load_models

    return load_models() if target == "dense" and not draft else load_models(target, draft)


def shipped_table(pair: dict):
    """(the successor table, its beta) of the shipped calibration made on ``pair``, or (None, None)."""
    from workbench.engine.policies.calibration import CalibrationError, shipped_for

    cal = shipped_for(pair)
    try:
        return cal.head(pair) if cal is not None else (None, None)
    except CalibrationError:
        return None, None


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    why = check(args)
    if why:
        print(f"cond_head: {why}", file=sys.stderr)
        return 2
    from workbench.models.identity import pair_identity
    from workbench.train.cond_data import prompt_blocks, training_prompts

    torch.set_num_threads(args.threads)
    t0, c0 = time.perf_counter(), time.process_time()
    models = load_pair(args.target, args.draft)
    pair = pair_identity(models)
    texts = training_prompts(args.prompts, args.seed)
    blocks = prompt_blocks(models, texts, args.new_tokens, K, args.anchors, args.seed)
    t_data, c_data = time.perf_counter() - t0, time.process_time() - c0
    fit, aside = split(examples(blocks))
    head = train(models, fit, args.rank, args.steps, args.batch, args.lr, args.seed)
    t_train, c_train = time.perf_counter() - t0 - t_data, time.process_time() - c0 - c_data
    table, beta = shipped_table(pair)
    acc = accuracy_table(aside, head, table, beta or 0.0)
    log(f"cond-head, next-slot top-1 on the sequences kept aside: {describe_accuracy(acc)}")
    made = {"date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
             "command": "python -m workbench.train.cond_head " + " ".join(sys.argv[1:] if argv is None else argv),
             "data": f"the target's greedy continuations ({args.new_tokens} tokens) of {len(texts)} prompts cut "
                     "from the drafters' training files (workbench.train.cond_data: no held-out file, no "
                     f"evaluation prompt's file or text), {args.anchors} blocks rooted in each",
             "blocks": int(blocks.group.numel()), "rows": int(fit["label"].numel()),
             "rows_aside": int(aside["label"].numel()), "steps": args.steps, "batch": args.batch,
             "lr": args.lr, "seed": args.seed, "threads": args.threads,
             "seconds": {"data": round(t_data, 1), "train": round(t_train, 1)},
             "cpu_seconds": {"data": round(c_data, 1), "train": round(c_train, 1)},
             "top1_aside": acc, "table_beta": beta}
    write_head(args.out, head, pair, made)
    print(f"cond_head: {made['rows']} rows from {len(texts)} prompts, {args.steps} steps -> {args.out} "
          f"({Path(args.out).stat().st_size // 1024} KiB; data {t_data:.0f} s, training {t_train:.0f} s wall, "
          f"{c_data:.0f} s + {c_train:.0f} s CPU, {args.threads} thread(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
