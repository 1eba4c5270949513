"""The learned conditioned head's training: deterministic for a seed and quick on a tiny pair, its file what the
policies read (the same log q as the trained module), its examples the slots a tree can reach, its options refused
in one line before anything loads."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch

from workbench.engine.policies.cond_head import load_head
from workbench.models.identity import pair_identity
from workbench.train import cond_head as ch
from workbench.train.cond_data import Blocks, blocks_of, continuations
from shared_checks import run_main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny(tiny_engines):
    """The tiny pair's models and its blocks: random prompts, the target's greedy continuations, 4 roots each."""
    models = tiny_engines["l4-h32"].models
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 60, (10 + i % 3,), generator=g).tolist() for i in range(24)]
    seqs = continuations(models, prompts, 12)
    return models, blocks_of(models, seqs, ch.K, 4, seed=0)


def test_training_is_deterministic_for_a_seed_and_quick(tiny):
    models, blocks = tiny
    ex = ch.examples(blocks)
    t0 = time.perf_counter()
    a = ch.train(models, ex, rank=8, steps=40, batch=128, seed=0).export()
    b = ch.train(models, ex, rank=8, steps=40, batch=128, seed=0).export()
    c = ch.train(models, ex, rank=8, steps=40, batch=128, seed=1).export()
    assert time.perf_counter() - t0 < 20
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert any(not np.array_equal(a[k], c[k]) for k in a)


def test_the_file_gives_the_trained_modules_log_q(tiny, tmp_path):
    models, blocks = tiny
    ex = ch.examples(blocks)
    head = ch.train(models, ex, rank=8, steps=30, batch=128, seed=0)
    path = tmp_path / "head.npz"
    ch.write_head(path, head, pair_identity(models), {"note": "test"})
    loaded = load_head(path)
    loaded.check_pair(pair_identity(models))
    with torch.no_grad():
        want = head(ex["hidden"].float(), ex["topv"], ex["topi"], ex["prev"], ex["bucket"])[:, :-1]
    got = loaded.log_q(ex["hidden"].float(), ex["topv"], ex["topi"], ex["prev"][:, None], ex["bucket"][:, None])[:, 0]
    assert got.shape == want.shape == (ex["label"].numel(), ch.K)
    assert torch.allclose(got, want, atol=2e-2)  # E and U are stored half
    assert (ch.learned_best(head, ex) == ch.learned_best(loaded, ex)).float().mean() > 0.95


def test_examples_are_the_slots_a_tree_can_reach():
    """A block whose slot 1 token is outside the candidates: its slots 2.. cannot be reached, so no rows."""
    D, K, H = 3, 4, 2
    topi = torch.arange(D * K).reshape(1, D, K)  # slot d's candidates d*K .. d*K+3
    path = torch.tensor([[99, 1, 100, 9]])  # slot 0: rank 1 (a sibling); slot 1: none of the candidates
    b = Blocks(torch.zeros(1, D, H).half(), torch.zeros(1, D, K), topi, path, torch.zeros(1, dtype=torch.long))
    ex = ch.examples(b)
    assert ex["label"].tolist() == [1, K]  # slot 0 (rank 1), slot 1 (none); slot 2 is unreachable
    assert ex["state"].tolist() == [0, 1]  # spine, then after a sibling
    assert ex["prev"].tolist() == [99, 1] and ex["bucket"].tolist() == [0, 2]  # the root; a rank-1 parent


@pytest.fixture()
def no_load(monkeypatch):
    """``load_pair`` refused: a refusal must come before any model loads."""
    def refuse(*_a, **_k):
        raise AssertionError("a model loaded before the options were checked")
    monkeypatch.setattr(ch, "load_pair", refuse)


@pytest.mark.parametrize("args,msg", [
    (["--steps", "0"], "--steps 0 must be 1 or more"),
    (["--target", "/nowhere"], "--target /nowhere: a model directory needs --draft DIR"),
    (["--out", "/nowhere/x.npz"], "--out '/nowhere/x.npz': the folder '/nowhere' does not exist"),
    (["--out", "{tmp}"], "--out '{tmp}' is a directory"),
    (["--out", "{tmp}/x.txt"], "--out {tmp}/x.txt: a conditioned head is an .npz file; give a name ending in .npz"),
    (["--out", "/proc/x.npz"], "--out '/proc/x.npz' cannot be written"),
    (["--out", "{tmp}/old.npz"], "--out {tmp}/old.npz exists; give --replace to write over it, or another path"),
])
def test_bad_options_are_one_line(args, msg, capfd, tmp_path, no_load):
    (tmp_path / "old.npz").write_bytes(b"old")
    args = [a.format(tmp=tmp_path) for a in args]
    argv = ["--out", str(tmp_path / "h.npz"), *args] if "--out" not in args else args
    rc, _, err = run_main(ch.main, capfd, *argv)
    assert rc == 2 and err.startswith("cond_head: " + msg.format(tmp=tmp_path)), err
    assert len(err.strip().splitlines()) == 1, err
    assert [p.name for p in tmp_path.iterdir()] == ["old.npz"] and (tmp_path / "old.npz").read_bytes() == b"old"


def test_an_existing_head_is_replaced_only_with_replace(capfd, tmp_path, no_load):
    out = tmp_path / "h.npz"
    out.write_bytes(b"old")
    rc, _, err = run_main(ch.main, capfd, "--out", str(out))
    assert rc == 2 and err.strip() == f"cond_head: --out {out} exists; give --replace to write over it, or another path"
    with pytest.raises(AssertionError, match="a model loaded"):  # past every check, on to the models
        ch.main(["--out", str(out), "--replace"])
    assert out.read_bytes() == b"old"


def test_the_head_is_written_to_exactly_path_atomically(tmp_path, monkeypatch):
    """An untrained head over a 6-token vocabulary (its file's writing, not its training)."""
    head = ch.HeadModule(torch.randn(6, 4), torch.randn(6, 4), rank=2)
    pair = {"vocab": 6, "tokenizer": "t", "block_size": 4, "drafter": "d", "target": "t"}
    path = tmp_path / "head.npz"
    path.write_bytes(b"old")
    replaced = []
    monkeypatch.setattr("workbench.records.files.os.replace", lambda a, b: replaced.append(b) or os.rename(a, b))
    ch.write_head(path, head, pair, {"note": "test"})
    assert replaced == [path] and [p.name for p in tmp_path.iterdir()] == ["head.npz"]
    assert np.load(path)["U"].shape == (6, 2)
