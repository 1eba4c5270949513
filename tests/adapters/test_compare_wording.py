"""``wb.compare`` says only what it saw: once a drafter input differs, a chunk or layer whose
comparison could not be given the production's version of that input is worded as following from it, never as
differing "for identical inputs"; a layer that differs on the production's own inputs (positions included) is
the layer's own computation, whatever differs upstream.

The divergences are recorded comparison data: vLLM 0.32 CPU on the shipped pair with its block positions shifted
by one (``tests/conform/faults.py::vllm_block_positions_shifted``), prompt 0's first cycle, without the
workarounds (layer 1's attention then differs on vLLM's own inputs: its CPU build's shared ``k_norm``) and with
them (nothing but the positions differs); the last two cases edit that record where the comparison could not be
given vLLM's positions or tokens."""
from __future__ import annotations

import copy

from workbench.adapters.compare import ComparisonReport, Divergence, EngineRun

INPUTS = [
    {"input": "context tokens", "compared": 6, "differ": 0, "first": "", "missing": "", "equal": True},
    {"input": "context positions", "compared": 6, "differ": 0, "first": "", "missing": "", "equal": True},
    {"input": "block tokens", "compared": 16, "differ": 0, "first": "", "missing": "", "equal": True},
    {"input": "block positions", "compared": 16, "differ": 16, "first": "slot 0: production 7, reference 6",
     "missing": "", "equal": False},
]
CHUNKS = [{"chunk": j, "layer": j + 1, "rel_diff": 3e-7, "rms_theirs": r, "rms_ours": r, "equal": True}
          for j, r in enumerate((6.73, 7.63, 8.38, 9.41))]
K_NORM_LAYERS = [{"layer": 0, "attention": 3.31e-7, "mlp": 3.50e-7}, {"layer": 1, "attention": 0.388, "mlp": 4.27e-7}]


def divergence(inputs=INPUTS, chunks=CHUNKS, layers=K_NORM_LAYERS, on_reference=()) -> Divergence:
    return Divergence(0, 0, 6, [], copy.deepcopy(chunks), copy.deepcopy(layers), 2.68e-7, copy.deepcopy(inputs), {},
                      list(on_reference))


def report(d: Divergence, workarounds=()) -> ComparisonReport:
    runs = {n: EngineRun(n, [[1]], [[0]], [[1]]) for n in ("workbench AR", "workbench DFlash", "vLLM 0.32.0 DFlash")}
    return ComparisonReport("vLLM 0.32.0", ["p"], runs, {}, (0, 1), d, tuple(workarounds))


def test_a_layer_that_differs_on_the_productions_own_positions_is_its_own_not_the_differing_input():
    """Shifted positions and the shared k_norm together: layer 1 was run on vLLM's own positions (the shifted
    ones), so its difference is the layer's, and the workaround that removes it is still named."""
    d = divergence()
    v = d.verdict()
    assert v[0].startswith("drafter input 'block positions' differs from the reference's: 16 of 16 values")
    assert len(v) == 2 and v[1].startswith("drafter layer 1 attention: output differs (relative difference 0.388) on "
                                           "the production engine's own inputs to it"), v
    assert "the layer's own computation, not the differing block positions above" in v[1]
    assert not any("identical inputs" in line or "follows from" in line for line in v), v
    assert any("per_layer_k_norm" in s for s in report(d).next_steps())


def test_with_the_layers_equal_only_the_shifted_positions_are_named():
    """The same fault with the workarounds on: every layer equal on vLLM's own inputs."""
    d = divergence(layers=[{"layer": 0, "attention": 3.31e-7, "mlp": 3.50e-7},
                           {"layer": 1, "attention": 2.57e-7, "mlp": 4.36e-7}])
    assert d.verdict() == ["drafter input 'block positions' differs from the reference's: 16 of 16 values, first at "
                           "slot 0: production 7, reference 6"]
    assert not d.own_attention_differs()


def test_layers_run_without_the_differing_input_are_worded_as_its_consequences():
    """vLLM handed the drafter fewer context positions than were committed, so the layers ran on the reference's:
    every layer that differs downstream follows from that input, and no workaround is offered for it."""
    inputs = copy.deepcopy(INPUTS)
    inputs[1].update(differ=1, equal=False, first="production has 5 values, the reference 6")
    inputs[3].update(differ=0, equal=True, first="")
    layers = [{"layer": 0, "attention": 0.21, "mlp": 3.5e-7}, {"layer": 1, "attention": 0.34, "mlp": 4.3e-7}]
    d = divergence(inputs=inputs, layers=layers, on_reference=["context positions"])
    v = d.verdict()
    assert v[0].startswith("drafter input 'context positions' differs")
    assert v[1:] == [
        f"drafter layer {i} attention: output differs (relative difference {x}), which follows from the differing "
        "input above: the reference layer ran on the reference's context positions, the production's could not be "
        "given to it" for i, x in ((0, 0.21), (1, 0.34))], v
    assert not any("identical inputs" in line or "own computation" in line for line in v), v
    steps = report(d).next_steps()
    assert not any("per_layer_k_norm" in s for s in steps) and "no known workaround" in steps[-1], steps
    assert "which follows from the differing input above" in str(report(d))


def test_feature_chunks_of_differing_context_tokens_follow_from_them():
    inputs = copy.deepcopy(INPUTS)
    inputs[0].update(differ=2, equal=False, first="position 3: production 11, reference 12")
    inputs[3].update(differ=0, equal=True, first="")
    chunks = copy.deepcopy(CHUNKS)
    chunks[2].update(rel_diff=0.4, equal=False)
    v = divergence(inputs=inputs, chunks=chunks, layers=[]).verdict()
    assert v[1].startswith("context-feature chunk 2 (target layer 3) differs from the reference's feature: relative "
                           "difference 0.4") and v[1].endswith("which follows from the differing input above: the "
                                                               "production's features are of the context tokens it "
                                                               "was handed, the reference's of the committed ones"), v
    # the same chunk with every input equal is a difference for the same tokens
    v = divergence(inputs=[dict(i, differ=0, equal=True, first="") for i in INPUTS], chunks=chunks,
                   layers=[]).verdict()
    assert v == ["context-feature chunk 2 (target layer 3) differs from the reference's feature: relative difference "
                 "0.4, RMS 8.38 (production) vs 8.38 (reference), for the same tokens"], v


def test_positions_that_were_not_recorded_are_named_as_the_reference_s_standing_in():
    layers = [{"layer": 0, "attention": 0.2, "mlp": 1e-7}]
    inputs = [dict(i, differ=0, equal=True, first="") for i in INPUTS]
    inputs[1].update(compared=0, missing="not recorded by the production engine's hooks", equal=False)
    v = divergence(inputs=inputs, layers=layers, on_reference=["context positions"]).verdict()
    assert v == ["drafter layer 0 attention: output differs (relative difference 0.2) on the production's hidden "
                 "states and context but the reference's context positions (the production's were not recorded): "
                 "the layer's computation or those positions"], v
