"""The drafter's path checked without relying on greedy output (which does not depend on the drafts at all).

Per cycle, the drafter's input is recomputed from scratch and its output compared with what the cycle
recorded: the committed tokens (prompt and every generated token but the pending bonus) go through a plain
transformers forward of the target; the chosen layers' hidden states are the drafter's context features, at
positions 0 .. start - 1; the block is [the previous bonus, MASK x (block - 1)] at positions start ..; and
one uncached forward of dflash's own drafter over all of it gives the log-probs every drafted slot must
have. A drafter whose context lost a token (the previous bonus, say), took it twice, shifted a position or
read the wrong features drafts other log-probs and fails here, even where the output stays lossless.
"""
from __future__ import annotations

import pytest
import torch

import workbench as wb


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models on one thread


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    from tiny_models import make_pair

    t, d = make_pair(tmp_path_factory.mktemp("ctx"), vocab=48, hidden=32, layers=4, layer_ids=(1, 2), block_size=6,
                     seed=21, eos=False)
    return wb.load(target=t, draft=d)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    from tiny_hybrid import make_hybrid_pair

    t, d = make_hybrid_pair(tmp_path_factory.mktemp("ctx-hybrid"), "qwen3_5", seed=4, vocab=48, block_size=5,
                            layer_ids=(1, 2), eos=False)
    return wb.load(target=t, draft=d)


def from_scratch_logprobs(eng, committed: list[int], root: int) -> torch.Tensor:
    """[block - 1, V] log-probs of the drafter's slots after ``committed`` tokens, the block rooted at ``root``."""
    from dflash.model import _draft_value, extract_context_feature

    m = eng.models
    start, Bk = len(committed), m.block_size
    with torch.inference_mode():
        out = m.target(input_ids=torch.tensor([committed]), output_hidden_states=True)
        feats = extract_context_feature(out.hidden_states, m.target_layer_ids)  # [1, start, F]
        block = torch.full((1, Bk), m.mask_token_id, dtype=torch.long)
        block[0, 0] = root
        noise = m.target.get_input_embeddings()(block) * float(_draft_value(m.draft.config, "input_embedding_scale",
                                                                            1.0))
        hidden = m.draft(position_ids=torch.arange(start + Bk)[None], noise_embedding=noise, target_hidden=feats,
                         past_key_values=None, use_cache=False)
        logits = m.draft.compute_logits(hidden[:, 1:], m.target.lm_head)
    return torch.log_softmax(logits[0].float(), dim=-1)


def check_cycles(eng, s, cycles=None) -> int:
    """Every recorded draft of session ``s`` against the from-scratch drafter; -> slots checked."""
    V = eng.models.target.config.vocab_size
    generated = [s.generated[0]]
    checked = 0
    for c in (s.cycles if cycles is None else cycles):
        committed = s.prompt_ids + generated[:-1]
        assert c.start == len(committed) and c.root_token == generated[-1]
        D = c.draft_topk_logprobs.shape[0]
        if D:
            ref = from_scratch_logprobs(eng, committed, generated[-1])[:D]
            assert c.draft_topk_tokens.shape == (D, V), "record_topk must cover the vocabulary here"
            assert (c.draft_topk_logprobs[:, 1:] <= c.draft_topk_logprobs[:, :-1]).all(), "not in rank order"
            got = torch.full_like(ref, float("nan")).scatter(1, c.draft_topk_tokens, c.draft_topk_logprobs)
            torch.testing.assert_close(got, ref, atol=2e-4, rtol=1e-4,
                                       msg=lambda m: f"cycle {c.index} (start {c.start}): {m}")
            checked += D
        generated += c.accepted_tokens.tolist()[1:] + [c.bonus]
    assert generated[: len(s.generated)] == s.generated
    return checked


CASES = [(wb.DFlash(), {}), (wb.DDTree(6), dict(temperature=0.9, seed=3)), (wb.DDTree(10), {})]


@pytest.mark.parametrize("policy,kw", CASES, ids=["dflash", "ddtree-sampled", "ddtree"])
def test_every_draft_equals_a_from_scratch_drafter(dense, policy, kw):
    V = dense.models.target.config.vocab_size
    s = dense.session("t1 t2 t3", policy=policy, max_new_tokens=12, record_topk=V, **kw)
    s.run()
    assert len(s.cycles) >= 4
    assert check_cycles(dense, s) >= 4 * (dense.models.block_size - 1)


def test_drafts_after_setting_changes_equal_a_from_scratch_drafter(dense):
    """AR cycles draft nothing but still commit context; the drafter must pick it all up when drafting resumes."""
    V = dense.models.target.config.vocab_size
    s = dense.session("t4 t5", policy=wb.AR(), max_new_tokens=14, record_topk=V)
    s.step(), s.step()
    s.policy = wb.DDTree(8)
    s.step(), s.step()
    s.policy = wb.AR()
    s.step()
    s.policy = wb.DFlash()
    s.temperature = 0.7
    s.run()
    assert check_cycles(dense, s) > 0


def test_batched_drafts_equal_a_from_scratch_drafter(dense):
    """Rows of different lengths padded into one drafter forward: each row's drafts as its own from scratch."""
    V = dense.models.target.config.vocab_size
    b = dense.batch_session(["t1 t2 t3 t4 t5", "t9", "t3 t3"], policy=[wb.DFlash(), wb.DDTree(6), wb.DDTree(3)],
                            max_new_tokens=[10, 8, 12], record_topk=V)
    b.run()
    for s in b.sessions:
        assert check_cycles(dense, s) > 0


def test_static_shape_drafts_equal_a_from_scratch_drafter(dense):
    V = dense.models.target.config.vocab_size
    s = dense.session("t1 t2 t3 t4 t5 t6 t7 t8 t9 t10", policy=wb.DDTree(6), max_new_tokens=10, record_topk=V,
                      static_shapes=True)
    s.run()
    assert check_cycles(dense, s) > 0


@pytest.mark.parametrize("policy,kw", CASES[:2], ids=["dflash", "ddtree-sampled"])
def test_hybrid_target_drafts_equal_a_from_scratch_drafter(hybrid, policy, kw):
    V = hybrid.models.target.config.vocab_size
    s = hybrid.session("t1 t2 t3", policy=policy, max_new_tokens=10, record_topk=V, **kw)
    s.run()
    assert check_cycles(hybrid, s) > 0
