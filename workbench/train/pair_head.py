"""``python -m workbench.train.pair_head``: the previous-token-conditioned head the pair policies read.

Estimated, not trained by gradient: on the same training files the embedded pairs were trained on
(``corpus.list_sources``, not held out; generated tables thinned as the recipe thins them), tokenized with the
pair's own tokenizer, every adjacent token pair is counted; each token keeps its ``successors`` most frequent
followers with log p(c | p) = log(smoothing * count(p, c) / count(p) + (1 - smoothing) * unigram(c)), and a pair
outside the table gets the unigram share alone. A few seconds on a CPU. The table and its making are written
as ``workbench.engine.policies.pair_head`` reads them.

    python -m workbench.train.pair_head --target dense --out workbench/assets/pair_head.npz --replace
"""
from __future__ import annotations

import argparse
import datetime
import io
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

from workbench.engine.policies.pair_head import FORMAT, VERSION
from workbench.models.identity import tokenizer_fingerprint
from workbench.records.files import npz_output, write_bytes_atomic
from workbench.shipped import ASSETS
from workbench.train import corpus

SUCCESSORS = 32
SMOOTHING = 0.9
TABLE_KEEP_ONE_IN = 4  # the recipe's thinning of the generated codec tables
TARGETS = {"dense": ASSETS / "target", "hybrid": ASSETS / "hybrid" / "target"}  # the embedded pairs' tokenizers


def token_ids(tokenizer_dir: Path, files) -> list[np.ndarray]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return [np.array(e.ids, dtype=np.int64) for e in tok.encode_batch([f.text for f in files], add_special_tokens=False)]


def build(ids: list[np.ndarray], vocab: int, successors: int = SUCCESSORS, smoothing: float = SMOOTHING) -> dict:
    """The head's arrays from token id sequences: succ_ids [V, M], succ_logp [V, M], backoff_logp [V]."""
    pairs = np.concatenate([a[:-1] * vocab + a[1:] for a in ids if len(a) > 1])
    keys, counts = np.unique(pairs, return_counts=True)  # sorted by (prev, next)
    prev, nxt = keys // vocab, keys % vocab
    total = np.bincount(prev, weights=counts, minlength=vocab)  # [V] pairs starting with each token
    uni = np.bincount(np.concatenate(ids), minlength=vocab).astype(np.float64)
    uni = (uni + 1.0) / (uni.sum() + vocab)  # add-one: every token has some share
    M = successors
    succ_ids = np.full((vocab, M), -1, dtype=np.int32)
    succ_logp = np.zeros((vocab, M), dtype=np.float32)  # 0 where no successor (never read: the id is -1)
    order = np.lexsort((-counts, prev))  # by prev, then count descending
    prev_o, next_o, count_o = prev[order], nxt[order], counts[order]
    starts = np.searchsorted(prev_o, np.arange(vocab))
    ends = np.searchsorted(prev_o, np.arange(vocab), side="right")
    for p in np.nonzero(ends > starts)[0]:
        a, b = starts[p], min(ends[p], starts[p] + M)
        c, n = next_o[a:b], count_o[a:b]
        succ_ids[p, : b - a] = c
        succ_logp[p, : b - a] = np.log(smoothing * n / total[p] + (1 - smoothing) * uni[c])
    seen = total > 0
    # a pair outside the table: the unigram share (the smoothing's part where the previous token was seen)
    backoff = np.log(uni * np.where(seen.any(), 1 - smoothing, 1.0))
    return {"succ_ids": succ_ids, "succ_logp": succ_logp, "backoff_logp": backoff.astype(np.float32),
            "pairs": int(pairs.size), "distinct": int(keys.size)}


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m workbench.train.pair_head", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="dense", help="dense or hybrid (an embedded pair), or a model directory "
                                                     "holding tokenizer.json")
    p.add_argument("--out", required=True, help="the .npz to write")
    p.add_argument("--replace", action="store_true", help="write over an existing --out file (refused otherwise)")
    p.add_argument("--successors", type=int, default=SUCCESSORS, help=f"followers kept per token ({SUCCESSORS})")
    p.add_argument("--smoothing", type=float, default=SMOOTHING, help=f"weight of the pair counts ({SMOOTHING})")
    return p.parse_args(argv)


def check_args(args) -> tuple[Path, int]:
    """(the tokenizer's folder, the vocabulary size): every refusal before the work, one line naming the flag
    and its value (ValueError)."""
    if args.successors < 1:
        raise ValueError(f"--successors {args.successors}: must be 1 or more")
    if not 0.0 < args.smoothing < 1.0:
        raise ValueError(f"--smoothing {args.smoothing}: must be in (0, 1), the weight of the pair counts")
    npz_output(args.out, "a pair head", args.replace)
    tdir = TARGETS[args.target] if args.target in TARGETS else Path(args.target)
    if not (tdir / "tokenizer.json").is_file() or not (tdir / "config.json").is_file():
        raise ValueError(f"--target {args.target}: neither {' nor '.join(TARGETS)} (an embedded pair) nor a model "
                         "directory holding tokenizer.json and config.json")
    try:
        cfg = json.loads((tdir / "config.json").read_text())
        vocab = int(cfg.get("text_config", cfg)["vocab_size"])
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ValueError(f"--target {args.target}: its config.json gives no vocab_size") from None
    return tdir, vocab


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        tdir, vocab = check_args(args)
    except ValueError as e:
        print(f"pair_head: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    files = [f for f in corpus.thin_generated_tables(corpus.list_sources(), TABLE_KEEP_ONE_IN) if not f.held_out]
    arrays = build(token_ids(tdir, files), vocab, args.successors, args.smoothing)
    meta = {"format": FORMAT, "version": VERSION, "vocab": vocab, "tokenizer": tokenizer_fingerprint(tdir),
            "made": {"date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
                     "command": "python -m workbench.train.pair_head " + " ".join(argv if argv is not None else sys.argv[1:]),
                     "data": f"{len(files)} training files of this interpreter's standard library (Python "
                             f"{platform.python_version()}; workbench.train.corpus, not held out, generated tables "
                             f"1 in {TABLE_KEEP_ONE_IN}), the files the embedded pairs were trained on",
                     "pairs": arrays.pop("pairs"), "distinct_pairs": arrays.pop("distinct"),
                     "successors": args.successors, "smoothing": args.smoothing}}
    meta["made"]["seconds"] = round(time.perf_counter() - t0, 1)
    buf = io.BytesIO()  # built in memory, then written beside --out and renamed over it: never half-written
    np.savez_compressed(buf, meta=np.array(json.dumps(meta)), **arrays)
    write_bytes_atomic(args.out, buf.getvalue())
    print(f"pair_head: {meta['made']['pairs']} token pairs from {len(files)} files -> {args.out} "
          f"({Path(args.out).stat().st_size // 1024} KiB, {meta['made']['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
