"""Sampling checked against oracles that share no code with ``workbench.engine.sampling``.

Two oracles: distributions worked out by hand (``math.exp`` over a few logits, the kept set read off by
eye), and transformers' own logits processors in the order ``generate`` applies them (temperature, top-k,
top-p: ``GenerationMixin._get_logits_processor``). The sampled verify's acceptance law (which path a cycle
accepts and which bonus it draws) is checked against the exact law computed from plain target forwards
through the same transformers processors.
"""
from __future__ import annotations

import math

import pytest
import torch

import workbench as wb
from workbench.engine.sampling import Sampling, target_choice, target_probs


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models on one thread


# ------------------------------------------------------------------------------------------ the oracles
@pytest.fixture(scope="module")
def hf_model():
    """Any transformers model: its ``_get_logits_processor`` builds generate's warpers."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1,
                      num_key_value_heads=1, head_dim=8)
    return Qwen3ForCausalLM(cfg)


def hf_processors(model, temperature: float, top_p: float = 1.0, top_k: int = 0):
    """The warpers ``model.generate(do_sample=True, temperature=..., top_p=..., top_k=...)`` applies, in its order."""
    from transformers import GenerationConfig

    gc = GenerationConfig(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k)
    procs = model._get_logits_processor(gc, input_ids_seq_length=1, device="cpu", model_kwargs={})
    names = [type(p).__name__ for p in procs]
    order = {"TemperatureLogitsWarper": 0, "TopKLogitsWarper": 1, "TopPLogitsWarper": 2}
    assert set(names) <= set(order) and names == sorted(names, key=order.get), names
    return procs


def hf_probs(model, logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """[..., V] logits -> generate's sampling distribution (float64)."""
    procs = hf_processors(model, temperature, top_p, top_k)
    flat = logits.double().reshape(-1, logits.shape[-1])
    scores = procs(torch.zeros(flat.shape[0], 1, dtype=torch.long), flat.clone())
    return torch.softmax(scores, dim=-1).reshape(logits.shape)


# ------------------------------------------------------------------------------------------ by hand
def softmax_of(xs: list[float]) -> list[float]:
    e = [math.exp(x) for x in xs]
    return [v / sum(e) for v in e]


def test_four_logits_at_T2_top_p_08_by_hand():
    """logits (2, 1, 0, -1) at T = 2: probabilities e^(1, 0.5, 0, -0.5) / Z = .455 .276 .167 .102. Top-p 0.8
    keeps the smallest set whose mass reaches 0.8: .455 + .276 = .731 < .8, so three tokens (.898); token 3
    is dropped and the three renormalise over e^1 + e^0.5 + e^0. (Top-p on the untempered probabilities
    .644 .237 .087 .032 would keep only two.)"""
    got = target_probs(torch.tensor([2.0, 1.0, 0.0, -1.0]), Sampling(temperature=2.0, top_p=0.8)).tolist()
    z3 = math.exp(1) + math.exp(0.5) + math.exp(0)
    want = [math.exp(1) / z3, math.exp(0.5) / z3, 1 / z3, 0.0]
    assert got[3] == 0.0 and all(g > 0 for g in got[:3])
    assert got == pytest.approx(want, abs=1e-6)
    assert want == pytest.approx([0.5065, 0.3072, 0.1863, 0.0], abs=1e-4)  # the hand arithmetic itself


def test_same_logits_at_T1_keep_two():
    """At T = 1 the same logits give .644 .237 .087 .032: .644 < .8 <= .881, so two tokens stay."""
    got = target_probs(torch.tensor([2.0, 1.0, 0.0, -1.0]), Sampling(temperature=1.0, top_p=0.8)).tolist()
    z2 = math.exp(2) + math.exp(1)
    assert got == pytest.approx([math.exp(2) / z2, math.exp(1) / z2, 0.0, 0.0], abs=1e-6)


def test_top_k_then_top_p_in_generates_order_by_hand():
    """logits (1, 0.9, 0, 0), top_k = 2, top_p = 0.5 at T = 1. Generate's order: top-k first leaves
    (.525, .475); then top-p 0.5 keeps the first token alone (.525 >= .5). Top-p first would keep two
    (.379 < .5 on the full distribution)."""
    got = target_probs(torch.tensor([1.0, 0.9, 0.0, 0.0]), Sampling(temperature=1.0, top_p=0.5, top_k=2)).tolist()
    assert got == pytest.approx([1.0, 0.0, 0.0, 0.0], abs=1e-7)


def test_top_k_at_low_temperature_by_hand():
    """logits (0, 1, 2, 3) at T = 0.5, top_k = 2: scores (0, 2, 4, 6); the two best renormalise: e^4, e^6."""
    got = target_probs(torch.tensor([0.0, 1.0, 2.0, 3.0]), Sampling(temperature=0.5, top_k=2)).tolist()
    z = math.exp(4) + math.exp(6)
    assert got == pytest.approx([0.0, 0.0, math.exp(4) / z, math.exp(6) / z], abs=1e-6)


def test_top_k_keeps_every_token_tied_with_the_kth():
    """(1, 1, 1, 0) with top_k = 2: the k-th value is 1, and every token equal to it stays (as generate's
    TopKLogitsWarper does): 1/3 each."""
    got = target_probs(torch.tensor([1.0, 1.0, 1.0, 0.0]), Sampling(temperature=1.0, top_k=2)).tolist()
    assert got == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0.0], abs=1e-6)


def test_plain_temperature_by_hand():
    got = target_probs(torch.tensor([0.0, math.log(2.0), math.log(4.0)]), Sampling(temperature=1.0)).tolist()
    assert got == pytest.approx([1 / 7, 2 / 7, 4 / 7], abs=1e-6)
    got = target_probs(torch.tensor([0.0, math.log(4.0)]), Sampling(temperature=2.0)).tolist()
    assert got == pytest.approx([1 / 3, 2 / 3], abs=1e-6)  # 4^(1/2) = 2


def test_greedy_choice_and_its_probability_by_hand():
    logits = torch.tensor([[[0.0, math.log(3.0), 0.0]]])
    choice, prob = target_choice(logits, Sampling(), None)
    assert choice.tolist() == [[1]] and float(prob[0, 0]) == pytest.approx(3 / 5, abs=1e-6)


# ------------------------------------------------------------------------------------------ transformers
SETTINGS = [(1.0, 1.0, 0), (0.7, 1.0, 0), (1.3, 0.9, 0), (0.8, 1.0, 5), (2.0, 0.8, 0), (0.6, 0.75, 12),
            (1.5, 0.5, 40), (0.3, 0.95, 3), (1.0, 0.2, 0)]


@pytest.mark.parametrize("temperature,top_p,top_k", SETTINGS)
def test_target_probs_equals_generates_warpers(hf_model, temperature, top_p, top_k):
    g = torch.Generator().manual_seed(int(100 * temperature + 10 * top_p + top_k))
    logits = torch.randn(6, 50, generator=g) * 3
    got = target_probs(logits, Sampling(temperature, top_p, top_k)).double()
    want = hf_probs(hf_model, logits, temperature, top_p, top_k)
    assert torch.equal(got > 0, want > 0), "a different set of tokens is kept"
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_samples_follow_generates_distribution(hf_model):
    """16,000 draws of target_choice at one node against generate's distribution (chi-square)."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(1, 1, 12, generator=g) * 2
    s = Sampling(temperature=1.3, top_p=0.85, top_k=8)
    want = hf_probs(hf_model, logits[0, 0], 1.3, 0.85, 8)
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(12, dtype=torch.float64)
    for _ in range(16):
        c, p = target_choice(logits.expand(1, 1000, 12), s, gen)
        counts += torch.bincount(c[0], minlength=12).double()
        torch.testing.assert_close(p[0].double(), want[c[0]], atol=1e-6, rtol=1e-5)  # the recorded probability
    n = counts.sum()
    assert counts[want == 0].sum() == 0, "a token outside generate's support was drawn"
    keep = want > 0
    stat = float((((counts - n * want) ** 2)[keep] / (n * want[keep])).sum())
    assert stat < chi2_quantile(int(keep.sum()) - 1), f"chi2={stat:.1f}"


def chi2_quantile(df: int, z: float = 3.29) -> float:
    """The chi-square value with upper tail about 5e-4 (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2_pooled(counts: dict, probs: dict, n: int) -> tuple[float, int]:
    """Pearson's statistic over the cells, those expecting under 5 pooled into one."""
    stat, df, po, pe = 0.0, 0, 0, 0.0
    for key, p in probs.items():
        e = p * n
        if e < 5:
            po, pe = po + counts.get(key, 0), pe + e
            continue
        stat += (counts.get(key, 0) - e) ** 2 / e
        df += 1
    if pe > 0:
        stat, df = stat + (po - pe) ** 2 / max(pe, 1e-9), df + 1
    return stat, df - 1


# ------------------------------------------------------------------------------------------ the engine
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 6-token target: the exact laws below are sums over few paths."""
    from tiny_models import make_pair

    t, d = make_pair(tmp_path_factory.mktemp("oracle6"), vocab=6, hidden=16, layers=2, layer_ids=(0, 1),
                     block_size=4, init_std=0.3, seed=3, eos=False)
    return wb.load(target=t, draft=d)


def next_token_probs(eng, hf_model, ids: list[int], sampling: dict) -> torch.Tensor:
    """The target's distribution after ``ids``: a plain transformers forward from scratch, then generate's warpers."""
    with torch.inference_mode():
        logits = eng.models.target(input_ids=torch.tensor([ids])).logits[0, -1]
    return hf_probs(hf_model, logits, sampling.get("temperature", 1.0), sampling.get("top_p", 1.0),
                    sampling.get("top_k", 0))


def exact_acceptance_law(eng, hf_model, prompt_ids: list[int], c: wb.Cycle, sampling: dict) -> dict:
    """P(accepted nodes, bonus) for the cycle's tree: at each node the target draws from its distribution
    given the prompt and the tokens root..node; a draw equal to a child's token moves there, any other
    draw stops the walk and is the bonus."""
    tokens, parents = c.tokens.tolist(), c.parents.tolist()
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        if p >= 0:
            children.setdefault(p, []).append(i)
    law = {}

    def walk(path: list[int], mass: float):
        ids = prompt_ids + [tokens[i] for i in path]
        dist = next_token_probs(eng, hf_model, ids, sampling).tolist()
        kids = {tokens[ch]: ch for ch in children.get(path[-1], [])}
        for t, p in enumerate(dist):
            if p <= 0:
                continue
            if t in kids:
                walk(path + [kids[t]], mass * p)
            else:
                law[(tuple(path), t)] = mass * p

    walk([0], 1.0)
    return law


@pytest.mark.parametrize("policy,sampling", [(wb.DDTree(5), dict(temperature=1.0)),
                                             (wb.DDTree(6), dict(temperature=0.8, top_p=0.9, top_k=4))],
                         ids=["T1", "T0.8-p0.9-k4"])
def test_sampled_verify_acceptance_law(tiny, hf_model, policy, sampling):
    """The first cycle of n seeded requests (one batch: row i has seed i): the (root, accepted path, bonus)
    triples follow the exact law (chi-square): the prefill's draw of the root, then the walk over that root's
    tree; and every node's recorded target_prob is generate's probability of the recorded choice."""
    n = 400
    b = tiny.batch_session(["t1 t3 t2"] * n, policy=policy, max_new_tokens=12, seed=0, **sampling)
    b.step()
    eos = tiny.models.eos_token_ids
    prompt = b.sessions[0].prompt_ids
    trees: dict = {}
    counts: dict = {}
    for s in b.sessions:
        if not s.cycles:  # its first token, drawn by the prefill, ended it
            assert s.generated[0] in eos and len(s.generated) == 1
            counts[("eos", s.generated[0])] = counts.get(("eos", s.generated[0]), 0) + 1
            continue
        c = s.cycles[0]
        ref = trees.setdefault(c.root_token, c)
        assert torch.equal(c.tokens, ref.tokens) and torch.equal(c.parents, ref.parents), "one root, one tree"
        key = (c.root_token, tuple(c.accepted_nodes.tolist()), c.bonus)
        counts[key] = counts.get(key, 0) + 1
    for c in list(trees.values())[:2]:  # per-node probabilities against from-scratch forwards
        assert c.n_nodes >= 3, "the test needs a tree"
        for i in range(c.tokens.shape[0]):
            path, j = [], i
            while j >= 0:
                path.append(int(c.tokens[j]))
                j = int(c.parents[j])
            dist = next_token_probs(tiny, hf_model, prompt + path[::-1], sampling)
            assert float(dist[int(c.target_choice[i])]) > 0
            assert float(c.target_prob[i]) == pytest.approx(float(dist[int(c.target_choice[i])]), abs=1e-5)
    first = next_token_probs(tiny, hf_model, prompt, sampling).tolist()
    law = {("unseen roots",): sum(p for t, p in enumerate(first) if t not in trees and t not in eos)}
    law.update({("eos", t): first[t] for t in eos if t < len(first)})
    for root, c in trees.items():
        for (path, bonus), p in exact_acceptance_law(tiny, hf_model, prompt, c, sampling).items():
            law[(root, path, bonus)] = first[root] * p
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-9)
    assert set(counts) <= set(law), "a (root, path, bonus) the law gives no mass"
    assert sum(v for k, v in counts.items() if len(k) == 3 and len(k[1]) > 1) > n // 5, "drafts were rarely accepted"
    stat, df = chi2_pooled(counts, law, n)
    assert stat < chi2_quantile(df), f"chi2={stat:.1f} df={df}"


@pytest.mark.parametrize("policy,sampling", [(wb.DDTree(4), dict(temperature=1.0)),
                                             (wb.DFlash(), dict(temperature=2.0, top_p=0.8))], ids=["T1", "T2-p0.8"])
def test_first_three_tokens_follow_generates_law(tiny, hf_model, policy, sampling):
    """The joint law of the first three generated tokens of n seeded requests (one batch) against the exact
    law from plain target forwards and generate's warpers (not ``target_probs``): the prefill's draw, then
    drafted nodes' draws."""
    n = 500
    b = tiny.batch_session(["t1 t3 t2"] * n, policy=policy, max_new_tokens=3, seed=0, **sampling)
    b.run()
    counts: dict = {}
    for s in b.sessions:
        counts[tuple(s.tokens)] = counts.get(tuple(s.tokens), 0) + 1
    assert sum(len(s.cycles) == 1 and len(s.tokens) == 3 for s in b.sessions) > n // 10, "drafts rarely accepted"
    prompt = b.sessions[0].prompt_ids
    law: dict = {}

    eos = tiny.models.eos_token_ids

    def walk(seq, mass):
        if len(seq) == 3 or (seq and seq[-1] in eos):  # generation stops at end-of-text
            law[tuple(seq)] = mass
            return
        for t, p in enumerate(next_token_probs(tiny, hf_model, prompt + seq, sampling).tolist()):
            if p > 0:
                walk(seq + [t], mass * p)

    walk([], 1.0)
    assert set(counts) <= {k for k, p in law.items() if p > 0}
    stat, df = chi2_pooled(counts, law, n)
    assert stat < chi2_quantile(df), f"chi2={stat:.1f} df={df}"


def test_batch_rows_sample_with_their_own_settings(tiny):
    """A batch whose rows were given different sampling settings between cycles: every row's next cycles equal a
    solo session with the same settings and seed (the verify samples each row with its own settings)."""
    settings = [dict(temperature=1.0), dict(temperature=0.4, top_k=2), dict(temperature=1.5, top_p=0.6),
                dict(temperature=0.0)]
    b = tiny.batch_session(["t1 t3 t2"] * 4, policy=wb.DDTree(4), max_new_tokens=12, seed=10, temperature=1.0)
    b.step()
    for s, kw in zip(b.sessions, settings):
        for k, v in kw.items():
            setattr(s, k, v)
    b.step(), b.step()
    for i, (row, kw) in enumerate(zip(b.sessions, settings)):
        solo = tiny.session("t1 t3 t2", policy=wb.DDTree(4), max_new_tokens=12, seed=10 + i, temperature=1.0)
        solo.step()
        for k, v in kw.items():
            setattr(solo, k, v)
        solo.step(), solo.step()
        assert [c.target_choice.tolist() for c in row.cycles] == [c.target_choice.tolist() for c in solo.cycles], i
        assert [(c.temperature, c.top_p, c.top_k) for c in row.cycles[1:]] == [
            (kw.get("temperature"), kw.get("top_p", 1.0), kw.get("top_k", 0))] * 2
