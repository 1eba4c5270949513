"""The training script runs end to end in seconds (smoke recipe) and writes loadable models; the
evaluation splits are held out and shaped as documented; distillation draws on training files only."""
from __future__ import annotations

import json
import random

import pytest

import workbench as wb
from workbench.train import corpus
from workbench.train.pipeline import main
from workbench.shipped import eval_prompts
from shared_checks import run_main


def train(capfd, *argv: str) -> tuple[int, str, str]:
    return run_main(main, capfd, *argv)


def test_train_help(capfd):
    rc, out, _ = train(capfd, "--help")
    assert rc == 0 and "--smoke" in out


@pytest.mark.slow
def test_smoke_training_writes_a_pair_the_engine_loads(tmp_path, capfd):
    rc, out, err = train(capfd, "--out", str(tmp_path), "--smoke", "--threads", "1")
    assert rc == 0, err[-2000:]
    assert "loops round 1 step 1" in err  # the target's loops phase ran, both rounds
    metrics = json.loads(out.strip().splitlines()[-1])
    assert {"held_out_loss_nats", "held_out_loss_spread_nats", "splits"} <= set(metrics)
    for split in ("long", "short"):
        fig = metrics["splits"][split]
        assert {"dflash_tau", "ddtree32_tau", "ddtree32_over_dflash", "distinct_token_share"} <= set(fig)
        assert fig["dflash_tau"] >= 1.0 and fig["ddtree32_tau"] >= 1.0 and 0 < fig["distinct_token_share"] <= 1
    report = json.loads((tmp_path / "training_report.json").read_text())
    assert report["recipe"]["block_size"] == 8 and report["splits"] == metrics["splits"]
    long_ = [json.loads(x) for x in (tmp_path / "eval_prompts.jsonl").read_text().splitlines()]
    short = [json.loads(x) for x in (tmp_path / "eval_prompts_short.jsonl").read_text().splitlines()]
    assert long_ and all(p["prompt"] and p["split"] == "long" for p in long_)
    assert short and all(p["prompt"] and p["split"] == "short" for p in short)
    assert metrics["splits"]["short"]["prompts"] == len(short)
    engine = wb.load(target=tmp_path / "target", draft=tmp_path / "draft")
    for prompt in (long_[0]["prompt"], short[0]["prompt"]):
        s = engine.session(prompt, policy=wb.DDTree(4), max_new_tokens=8)
        ar = engine.session(prompt, policy=wb.AR(), max_new_tokens=8)
        assert s.run() and ar.run() and s.tokens == ar.tokens
    # --stage loops reruns only the loops phase, on the target already there.
    before = (tmp_path / "target" / "model.safetensors").read_bytes()
    rc, _, err = train(capfd, "--out", str(tmp_path), "--smoke", "--stage", "loops", "--threads", "1")
    assert rc == 0 and "loops round 1 step 1" in err, err[-2000:]
    assert (tmp_path / "target" / "model.safetensors").read_bytes() != before


@pytest.mark.parametrize("split", ["long", "short"])
def test_shipped_eval_prompts_are_held_out(split):
    prompts = eval_prompts(split)
    assert len(prompts) >= 32
    assert all(p["split"] == split for p in prompts)
    assert all(corpus.is_held_out(p["source"]) for p in prompts)
    assert len({p["id"] for p in prompts}) == len(prompts)


def test_eval_prompts_rejects_an_unknown_split():
    with pytest.raises(ValueError, match="'tiny'"):
        eval_prompts("tiny")


def test_short_split_is_short_covers_every_shape_and_was_never_trained_on():
    short, long_ = eval_prompts("short"), eval_prompts("long")
    assert all(1 <= p["prompt"].count("\n") + 1 <= corpus.MAX_SHORT_LINES for p in short)
    counts = {shape: sum(p["kind"] == shape for p in short) for shape in corpus.SHORT_SHAPES}
    assert min(counts.values()) >= 4, counts
    assert not {p["prompt"] for p in short} & {p["prompt"] for p in long_}
    trained = {f.relpath for f in corpus.list_sources() if not f.held_out}  # the target's corpus (superset)
    assert not {p["source"] for p in short} & trained
    # Every short prompt starts with a line cut from its source file (after dedenting).
    sources = {f.relpath: f.text for f in corpus.list_sources() + corpus.list_sources(tests=True)}
    for p in short:
        first = p["prompt"].split("\n")[0].strip()
        assert first and first in sources[p["source"]], (p["id"], first)


MODULE = '''import os
import sys


class Box(object):
    """A box."""

    def __init__(self, size):
        self.size = size

    def area(self, scale=1):
        """The area of the box."""
        total = self.size * self.size * scale
        return total


class BoxTests(unittest.TestCase):
    def test_area(self):
        self.assertEqual(Box(2).area(), 4)
'''


@pytest.mark.parametrize("shape,expected", [
    ("def_doc", ['def area(self, scale=1):\n    """The area of the box."""\n    ']),
    ("class_init", ['class Box(object):\n    """A box."""\n\n    def __init__(self, size):\n        ']),
    ("test_opening", ["class BoxTests(unittest.TestCase):\n    def test_area(self):\n"
                      "        self.assertEqual(Box(2).area(), 4)\n        "]),
])
def test_short_prompt_shapes_on_a_known_module(shape, expected):
    assert corpus.short_prompts(MODULE, random.Random(0), 10, shape) == expected


def test_imports_main_and_expression_shapes_on_a_known_module():
    got = corpus.short_prompts(MODULE, random.Random(0), 10, "imports_main")
    assert "import os\nimport sys\n\n\ndef main():\n    " in got and all(g.startswith("import os") for g in got)
    for seed in range(5):
        (expr,) = corpus.short_prompts(MODULE.split("class BoxTests")[0], random.Random(seed), 1, "expression")
        head, last = expr.rsplit("\n", 1)
        # the function so far, dedented, then a cut inside the assignment line
        assert head == 'def area(self, scale=1):\n    """The area of the box."""'
        assert "    total = self.size * self.size * scale".startswith(last.rstrip())
        assert last.rstrip().endswith("=") and last.endswith(" ")


def test_short_prompts_rejects_an_unknown_shape():
    with pytest.raises(ValueError, match="'lambda'"):
        corpus.short_prompts(MODULE, random.Random(0), 1, "lambda")


def test_generated_tables_are_thinned_and_nothing_else_is():
    files = corpus.list_sources()
    tables = [f for f in files if corpus.is_generated_table(f)]
    kept = corpus.thin_generated_tables(files, 4)
    assert len(tables) > 20
    assert [f for f in kept if not corpus.is_generated_table(f)] == [f for f in files if not corpus.is_generated_table(f)]
    assert 0 < sum(corpus.is_generated_table(f) for f in kept) < len(tables) / 2


def test_distillation_draws_on_training_files_only():
    from workbench.train.distill import make_prompts
    from workbench.train.recipe import Recipe
    from workbench.train.tokenizer import load_corpus

    train, held, train_tests, held_tests = load_corpus(Recipe())
    assert train and held and train_tests and held_tests
    assert not any(f.held_out for f in train + train_tests)
    assert all(f.held_out for f in held + held_tests)
    rng = random.Random(0)
    short = make_prompts(train[:40], train_tests[:40], rng, 64, short_share=1.0)
    assert len(short) == 64 and all(is_short and p.count("\n") < corpus.MAX_SHORT_LINES for p, is_short in short)
    long_ = make_prompts(train[:40], train_tests[:40], rng, 16, short_share=0.0)
    assert long_ and not any(is_short for _, is_short in long_)
    texts = "\n".join(f.text for f in train[:40] + train_tests[:40])
    for p, _ in short + long_:  # each prompt's first line comes from one of the given training files
        line = p.split("\n")[0].strip()
        assert line in texts, line


def test_draft_batches_never_mix_lengths():
    from workbench.train.drafter import draft_batch
    from workbench.train.recipe import smoke_recipe

    recipe = smoke_recipe()
    seqs = [(list(range(40)), 10)] * 5 + [(list(range(100, 180)), 30)] * 7
    rng = random.Random(0)
    seen = set()
    for _ in range(40):
        picked, ids, block_ids, labels, mask, pos, _ = draft_batch(seqs, recipe, rng, mask_id=1)
        assert ids.tolist() == [seqs[i][0] for i in picked]  # the indices name the rows (features are cached by them)
        assert ids.shape[1] in (40, 80)
        seen.add(ids.shape[1])
        prompt_len = 10 if ids.shape[1] == 40 else 30
        anchors = pos[:, ids.shape[1]:: recipe.block_size]  # block positions of each anchor
        assert anchors.min() >= prompt_len - 1 and anchors.max() <= ids.shape[1] - recipe.block_size
    assert seen == {40, 80}


def test_cached_context_features_equal_a_live_forward_over_each_row():
    import torch
    from dflash.model import extract_context_feature
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from workbench.train.drafter import context_features, draft_batch
    from workbench.train.recipe import smoke_recipe

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=128)
    target = Qwen3ForCausalLM(cfg).eval()
    gen = random.Random(1)
    seqs = [([gen.randrange(64) for _ in range(n)], 4) for n in (30,) * 5 + (45,) * 3]
    layers = [0, 2]
    feats = context_features(target, seqs, layers, bf16=False, bs=2)
    assert [f.shape for f in feats] == [(len(s), 64) for s, _ in seqs] and feats[0].dtype == torch.float32
    half = context_features(target, seqs, layers, bf16=True, bs=3)  # what the shipped recipe stores
    assert half[0].dtype == torch.bfloat16
    torch.testing.assert_close(torch.cat(half).float(), torch.cat(feats), atol=0.1, rtol=0.05)
    recipe = smoke_recipe()
    recipe.bucket_by_length = False  # rows of both lengths, cut to the shortest: the cache must be cut too
    picked, ids, *_ = draft_batch(seqs, recipe, random.Random(2), mask_id=1)
    assert ids.shape[1] == 30 and any(len(seqs[i][0]) == 45 for i in picked)  # a long row was cut
    with torch.no_grad():
        live = extract_context_feature(target(input_ids=ids, output_hidden_states=True).hidden_states, layers)
    cached = torch.stack([feats[i][: ids.shape[1]] for i in picked])
    torch.testing.assert_close(cached, live, atol=1e-5, rtol=1e-5)
    other = extract_context_feature(target(input_ids=ids.flip(1), output_hidden_states=True).hidden_states, layers)
    assert not torch.allclose(cached, other.detach(), atol=1e-2, rtol=1e-2)  # the check can fail


def test_default_recipe_is_the_one_that_trained_the_shipped_target():
    from dataclasses import asdict

    from workbench.engine.loading import ASSETS
    from workbench.train.recipe import V1, Recipe

    shipped = json.loads((ASSETS / "training_report.json").read_text())["recipe"]
    default = asdict(Recipe())
    # `make train` must reproduce the shipped pair: every recipe field it recorded is today's default.
    assert {k: v for k, v in shipped.items() if k in default} == {
        k: (list(v) if isinstance(v, tuple) else v) for k, v in default.items() if k in shipped}
    assert set(V1) <= set(default) and any(V1[k] != default[k] for k in V1)
    assert default["ul_rounds"] == 0 and default["kd_weight"] == 0.0  # tried, not shipped (docs/training.md)


def _repeats_oracle(row: list[int], start: int, n: int) -> list[bool]:
    out = [False] * len(row)
    for t in range(start + n - 1, len(row)):
        gram = row[t - n + 1 : t + 1]
        out[t] = any(row[u - n + 1 : u + 1] == gram for u in range(start + n - 1, t))
    return out


def test_repeated_ngrams_are_the_continuations_own_repeats():
    import torch

    from workbench.train.loops import repeated_ngram_mask

    seqs = torch.tensor([[7, 7, 7, 1, 2, 3, 1, 2, 3, 1, 2]])
    # The prompt's 7s never count; "1 2" repeats from position 6 on (n=2), "1 2 3" from 8 (n=3).
    assert repeated_ngram_mask(seqs, 3, 2)[0].nonzero().flatten().tolist() == [7, 8, 9, 10]
    assert repeated_ngram_mask(seqs, 3, 3)[0].nonzero().flatten().tolist() == [8, 9, 10]
    gen = torch.Generator().manual_seed(0)
    for n in (1, 2, 4):
        rand = torch.randint(0, 4, (6, 30), generator=gen)
        got = repeated_ngram_mask(rand, 5, n)
        assert got.tolist() == [_repeats_oracle(r, 5, n) for r in rand.tolist()]


def test_unlikelihood_loss_pushes_down_only_the_penalised_tokens():
    import torch

    from workbench.train.loops import unlikelihood_loss

    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 6, 10, generator=gen, requires_grad=True)
    ids = torch.randint(0, 10, (2, 6), generator=gen)
    penalise = torch.zeros(2, 6, dtype=torch.bool)
    assert unlikelihood_loss(logits, ids, penalise).item() == 0.0
    penalise[0, 3] = True  # predicted from position 2
    loss = unlikelihood_loss(logits, ids, penalise)
    p = logits[0, 2].softmax(-1)[ids[0, 3]]
    assert torch.allclose(loss, -torch.log1p(-p))
    loss.backward()
    g = logits.grad
    assert g[0, 2, ids[0, 3]] > 0  # a descent step lowers that token's logit
    assert g.abs().sum() == g[0, 2].abs().sum()  # and touches nothing else


def test_distill_kl_is_zero_exactly_when_the_drafter_matches_the_target():
    import torch
    import torch.nn.functional as F

    from workbench.train.drafter import distill_kl

    gen = torch.Generator().manual_seed(2)
    T, V = 12, 9
    target_logits = torch.randn(2, T, V, generator=gen)
    block_pos = torch.tensor([[4, 5, 6, 7], [2, 3, 4, 5]])
    match = target_logits.gather(1, (block_pos - 1)[..., None].expand(-1, -1, V))  # the target one earlier
    assert distill_kl(match, target_logits, block_pos, T).abs().max() < 1e-5
    other = torch.randn(2, 4, V, generator=gen)
    kl = distill_kl(other, target_logits, block_pos, T)
    ref = F.kl_div(other.log_softmax(-1), match.log_softmax(-1), log_target=True, reduction="none").sum(-1)
    assert torch.allclose(kl, ref, atol=1e-5) and (kl > 0).all()


def test_known_word_share_tells_code_from_glued_subwords():
    from workbench.train.text_quality import corpus_words, known_word_share

    known = corpus_words([corpus.SourceFile("box.py", MODULE)])
    assert {"import", "Box", "object", "size", "area"} <= known and "os" not in known  # 3+ characters
    assert known_word_share("class Box(object):\n    def area(self):", known) == 1.0
    assert known_word_share("self.sizearea = proviotst(Box)", known) == pytest.approx(2 / 4)
    assert known_word_share("x = 1  # ok", known) is None  # no word to judge


def test_loops_stage_without_rounds_is_refused_in_one_line(tmp_path, capfd):
    rc, _, err = train(capfd, "--out", str(tmp_path), "--stage", "loops")
    assert rc == 2 and "add --loops N" in err.strip().splitlines()[-1]
    rc, _, err = train(capfd, "--out", str(tmp_path), "--loops", "-1")
    assert rc == 2 and "--loops -1 must be 0 or more" in err


def test_a_retrained_drafter_keeps_every_replaced_drafter_newest_first():
    from workbench.train.recipe import DRAFTER_FIELDS
    from workbench.train.report import previous_drafters

    oldest = {"target_layer_ids": [1, 3, 5], "splits": {"long": {"dflash_tau": 2.4}}}
    middle = {"recipe": {"target_layer_ids": [1, 2, 3, 4], "distill_prompts": 6144, "layers": 6},
              "splits": {"long": {"dflash_tau": 2.66}}, "previous_drafter": oldest,
              "engine_conventions": {"rows": []}, "loops_phase": {}}
    history = previous_drafters(middle)
    assert [d["splits"]["long"]["dflash_tau"] for d in history] == [2.66, 2.4]
    # The replaced drafter's own recipe (drafter side only), none of the report's nested history.
    assert history[0]["distill_prompts"] == 6144 and "layers" not in history[0]
    assert set(history[0]) <= set(DRAFTER_FIELDS) | {"splits"}
    newest = {"recipe": {"target_layer_ids": [1, 2, 3, 4], "distill_prompts": 12288},
              "splits": {"long": {"dflash_tau": 2.77}}, "previous_drafters": history}
    assert [d["splits"]["long"]["dflash_tau"] for d in previous_drafters(newest)] == [2.77, 2.66, 2.4]


def test_each_stage_value_walks_its_part_of_the_stage_list_in_order():
    """main is the walk over STAGES: each --stage value runs exactly these stages, in this order (the order the
    training made its pairs in; a stage moved or dropped from a value changes what a rerun does)."""
    from workbench.train.options import RUNS
    from workbench.train.pipeline import STAGES

    walk = {value: [s.name for s in STAGES if value in s.runs_in] for value in RUNS}
    target = ["corpus", "tokenizer and target", "evaluation prompts", "loops phase"]
    reuse = ["corpus", "the target in --out", "the evaluation prompts in --out"]
    assert walk == {
        "all": [*target, "distillation and drafter", "report"],
        "target": target,
        "loops": [*reuse, "loops phase"],
        "draft": [*reuse, "distillation and drafter", "report"],
        "report": [*reuse, "the drafter in --out", "report"],
        "eval": ["corpus", "engine figures"],
        "prompts": ["corpus", "evaluation prompts"],
    }
