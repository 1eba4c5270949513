"""A vLLM session at its limits: the last cycle of a request cut at max_new_tokens records what
the request kept, so its accept lengths equal the workbench's on the same drafts at every limit; bad
arguments refused in one line before a request starts. One vLLM engine, with the workarounds (identical
drafts), for the whole module."""
from __future__ import annotations

import pytest

import workbench as wb
from workbench.adapters import vllm_tap
from workbench.adapters.compare import EngineRun
from workbench.records.cycle import cycle_problem

pytestmark = pytest.mark.slow
PROMPTS = ["def parse(line):", "class Stack:\n    def __init__(self):\n"]


@pytest.fixture(scope="module")
def engines():
    vllm_tap.check_version()
    v = wb.load(engine="vllm", workarounds=True)
    yield v, wb.load()
    v.close()


def test_accept_lengths_equal_the_workbenchs_at_every_limit(engines):
    v, ours = engines
    # (32, the first prompt): vLLM's sampler accepts 7 drafts past the limit there
    for n, p in ((5, PROMPTS[0]), (32, PROMPTS[0]), (13, PROMPTS[1])):
        a = ours.session(p, policy=wb.DFlash(), max_new_tokens=n).run()
        s = v.session(p, max_new_tokens=n)
        b = s.run()
        # the same drafts (the workbench drafts no further than the limit: its chain is a prefix of vLLM's)
        assert [cb.tokens[:len(ca.tokens)].tolist() for ca, cb in zip(a.cycles, b.cycles)] == \
            [c.tokens.tolist() for c in a.cycles] and len(a.cycles) == len(b.cycles), (n, p)
        assert b.accept_lengths == a.accept_lengths and b.tau == a.tau, (n, p)
        assert [cycle_problem(c) for c in b.cycles] == [None] * len(b.cycles), (n, p)  # the cut cycle too
        assert [c.committed for c in b.cycles] == b.accept_lengths  # accepted counted as committed
        runs = [EngineRun(name, [], [[c.accepted for c in t.cycles]], [[c.committed for c in t.cycles]])
                for name, t in (("workbench", a), ("vllm", b))]
        assert runs[0].per_position() == runs[1].per_position() and runs[0].tau == runs[1].tau


def test_a_vllm_session_checks_its_arguments_before_the_request(engines):
    v, _ = engines
    for kw, why in ((dict(prompt_ids=[-1, 5]), r"prompt_ids holds ids \[-1\] outside the target's vocabulary"),
                    (dict(prompt="x", max_new_tokens=2.7), "max_new_tokens=2.7 must be a positive integer"),
                    (dict(prompt="x", max_new_tokens=5000), r"max_new_tokens=5000: the prompt's 1 tokens, the new ones "
                                                            r"and the 15 drafts .* max_model_len=1024; give at most 1008"),
                    (dict(prompt=""), "prompt='' is empty")):
        with pytest.raises(ValueError, match=why):
            v.session(**kw)
