"""SGLang's own DFlash verify checks against a ragged tree, read from the installed source."""
from __future__ import annotations

import pytest
import torch

from workbench.shapes.dflash_checks import DFLASH_UTILS, dflash_verify_checks, greedy_accept_call
from workbench.shapes.sglang_source import sglang_def

ISSUE_CHECKS = ("next_token_logits.shape[0] != bs * draft_token_num", "candidates.ndim != 2",
                "candidates.device != next_token_logits.device",
                "uniform_samples is not None and uniform_samples.shape != (bs, draft_token_num)")


def by_condition(checks, fn):
    return {c.condition: c for c in checks if c.function == fn}


def test_lists_sglangs_checks_with_their_paths():
    checks = dflash_verify_checks([17, 9, 33])
    sampling = by_condition(checks, "compute_dflash_sampling_correct_drafts_and_bonus")
    for cond in ISSUE_CHECKS:
        assert cond in sampling, cond
    assert all("_is_all_greedy(sampling_info)" in c.path for c in sampling.values())  # the sampling path only
    adjust = by_condition(checks, "apply_dflash_verify_logits_adjustments")
    assert all("sampling_info is not None" in c.path for c in adjust.values())
    name, when = greedy_accept_call()
    assert "unchecked" in name and "greedy" in when


def test_a_ragged_tree_fails_the_row_count_check_a_uniform_chain_passes_all():
    ragged = by_condition(dflash_verify_checks([17, 9, 33], padded=True),
                          "compute_dflash_sampling_correct_drafts_and_bonus")
    assert ragged["next_token_logits.shape[0] != bs * draft_token_num"].ragged is False
    assert ragged["candidates.ndim != 2"].ragged is True
    flat = by_condition(dflash_verify_checks([17, 9, 33]), "compute_dflash_sampling_correct_drafts_and_bonus")
    assert flat["candidates.ndim != 2"].ragged is False
    # SGLang's own shape (every request drafts block_size tokens) passes every check: the property
    # that makes the ragged verdicts mean something
    assert all(c.ragged for c in dflash_verify_checks([16, 16, 16], block_size=16, padded=True))


@pytest.mark.parametrize("counts", [[17, 9, 33], [16, 16], [4]])
def test_verdict_agrees_with_running_sglangs_own_function(counts):
    """The row-count check of apply_dflash_verify_logits_adjustments, run from the installed file."""
    fn = sglang_def(DFLASH_UTILS, "apply_dflash_verify_logits_adjustments", torch=torch)
    verdict = by_condition(dflash_verify_checks(counts, block_size=16), "apply_dflash_verify_logits_adjustments")[
        "next_token_logits.shape[0] != bs * draft_token_num"].ragged

    class Info(list):
        has_custom_logit_processor = False
        acc_linear_penalties = None
        logit_bias = None
        vocab_mask = None

    try:
        fn(next_token_logits=torch.zeros(sum(counts), 8), sampling_info=Info([None] * len(counts)), draft_token_num=16)
        raised = False
    except ValueError as e:
        raised = "row count mismatch" in str(e)
    except (AttributeError, NameError, TypeError):
        raised = False  # got past the shape checks into code that needs SGLang's runtime
    assert verdict is (not raised)


def test_bad_node_counts_one_line():
    with pytest.raises(ValueError, match="node_counts"):
        dflash_verify_checks([3, 0])
