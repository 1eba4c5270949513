"""The tau regression figures of the embedded pairs: per-cycle accept lengths on a fixed prompt set.

    .venv/bin/python tools/tau_regression.py --write     # regenerate tests/data/tau_regression.json
    .venv/bin/python tools/tau_regression.py             # compare the current weights with the file

Run ``--write`` after every retraining of an embedded pair (``make train``, ``make train-hybrid``, or
``python -m workbench.train ...``): the file records the weights' fingerprint, and
``tests/engine/test_tau_regression.py`` fails, naming this command, when the shipped weights differ from the ones
the figures were measured on. Float32 on a CPU with one thread is deterministic, so the test compares the
accept lengths exactly: a drafter-path bug that keeps the output lossless (greedy output does not depend on
the drafts) still changes them.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "tau_regression.json"
COMMAND = ".venv/bin/python tools/tau_regression.py --write"
PAIRS = ("dense", "hybrid")  # wb.load() and wb.load("hybrid")
POLICIES = ("DFlash", "DDTree(8)")
PROMPTS = 2  # the first prompts of the short evaluation split
MAX_NEW_TOKENS = 24


def asset_dirs(pair: str) -> list[Path]:
    import workbench

    assets = Path(workbench.__file__).resolve().parent / "assets"
    base = assets if pair == "dense" else assets / "hybrid"
    return [base / "target", base / "draft"]


def fingerprint(pair: str) -> str:
    """sha256 over the pair's weight and config files (name and bytes)."""
    h = hashlib.sha256()
    for d in asset_dirs(pair):
        for p in sorted(d.iterdir()):
            if p.suffix in (".safetensors", ".json") and p.is_file():
                h.update(f"{d.name}/{p.name}\0".encode())
                h.update(p.read_bytes())
    return h.hexdigest()


def measure(pair: str, prompts: int = PROMPTS, max_new_tokens: int = MAX_NEW_TOKENS) -> dict:
    """{"fingerprint", "prompts": [text], "runs": {policy: [{"accept_lengths", "tokens"} per prompt]}} on one
    CPU thread, greedy, float32."""
    import torch

    import workbench as wb
    from workbench.shipped import eval_prompts

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        eng = wb.load() if pair == "dense" else wb.load("hybrid")
        texts = [p["prompt"] for p in eval_prompts("short")[:prompts]]
        runs = {}
        for name in POLICIES:
            runs[name] = []
            for text in texts:
                s = eng.session(text, policy=wb.parse_policy(name), max_new_tokens=max_new_tokens)
                t = s.run()
                runs[name].append({"accept_lengths": t.accept_lengths, "tokens": list(s.generated)})
        return {"fingerprint": fingerprint(pair), "prompts": texts, "runs": runs}
    finally:
        torch.set_num_threads(before)


def tau(rows: list[dict]) -> float:
    al = [a for r in rows for a in r["accept_lengths"]]
    return sum(al) / len(al) if al else 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write {DATA.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    out = {"regenerate": COMMAND, "max_new_tokens": MAX_NEW_TOKENS, "threads": 1, "dtype": "float32",
           "pairs": {pair: measure(pair) for pair in PAIRS}}
    for pair, m in out["pairs"].items():
        print(f"{pair}: " + ", ".join(f"{k} tau {tau(v):.3f}" for k, v in m["runs"].items()))
    if args.write:
        DATA.parent.mkdir(parents=True, exist_ok=True)
        DATA.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {DATA}")
        return 0
    if not DATA.exists():
        print(f"no {DATA}; run {COMMAND}")
        return 1
    want = json.loads(DATA.read_text())
    same = all(want["pairs"].get(p) == m for p, m in out["pairs"].items())
    print("same as the file" if same else f"differs from the file; after a retraining run {COMMAND}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
