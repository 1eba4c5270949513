"""The engine interface: one abstract base (``workbench.interface.base``), one registry by name, the
workbench's engine behind it, an engine added as one class, and a production step recorded as a Cycle
by ``workbench.records.engine_step``. (vLLM's side: tests/adapters/test_vllm.py.)"""
from __future__ import annotations

import pytest
import torch

import workbench as wb
from workbench.interface import registry
from workbench.interface.base import BaseEngine, BaseSession, EngineLacks
from workbench.records.cycle import cycle_problem
from workbench.records.engine_step import chain_cycle, decode_cycle

SETTINGS = ("policy", "temperature", "top_p", "top_k", "seed", "max_new_tokens", "kernel_backend", "record_topk",
            "capture")


def test_the_workbench_engine_and_session_offer_the_declared_interface(tiny_engines):
    e = tiny_engines["l4-h32"]
    assert isinstance(e, BaseEngine) and e.name == "workbench" and registry.engine_class("workbench") is type(e)
    s = e.session("t1 t2", max_new_tokens=4)
    assert isinstance(s, BaseSession)
    for name in SETTINGS + ("engine", "prompt", "prompt_ids", "generated", "finish_reason", "trace", "text",
                            "finished", "tokens", "cycles", "sampling"):
        getattr(s, name)  # every part the views read is there
    assert s.trace.meta["device"] == str(e.device) == "cpu"
    assert isinstance(s.step(), wb.Cycle) and s.run() is s.trace


def test_an_unknown_engine_is_one_line_naming_the_known(capsys):
    """The line lists what the registry knows (built-in, registered and installed engines alike), read from
    the registry itself: an engine another package installs is named too, never a pinned list."""
    import re

    known = registry.engine_names()
    assert {"workbench", "vllm"} <= set(known)
    with pytest.raises(ValueError, match=rf"^engine='sglang' is not known; known engines: {re.escape(', '.join(known))}$"):
        wb.load(engine="sglang")
    from workbench.cli import main

    for command in (["bench"], ["run", "--prompt", "t1"], ["serve"], ["bench-serve"], ["pays-off"]):
        assert main([*command, "--engine", "sglang"]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "'sglang'" in err and all(f"'{n}'" in err for n in known), err


class ToyEngine(BaseEngine):
    """An engine in one class: the workbench's engine under another name, without batches or replay."""

    name = "toy"
    instead = {"batch_session": "run the sessions one at a time"}

    def __init__(self, inner):
        self.inner = inner
        self.tokenizer = inner.tokenizer

    @classmethod
    def load(cls, target=None, draft=None, **options):
        return cls(wb.load(target, draft, **options))

    @property
    def device(self):
        return self.inner.device

    def session(self, prompt=None, policy=wb.DFlash(), temperature=0.0, max_new_tokens=128, *, prompt_ids=None,
                **settings):
        return self.inner.session(prompt, policy, temperature, max_new_tokens=max_new_tokens, prompt_ids=prompt_ids,
                                  **settings)


@pytest.fixture
def toy_engine():
    registry.register_engine("toy", f"{__name__}:ToyEngine")
    yield
    registry.unregister_engine("toy")


def test_an_engine_is_one_class_in_the_registry(toy_engine, tiny_pairs):
    t, d = tiny_pairs["l4-h32"]
    e = wb.load(t, d, engine="toy")
    assert isinstance(e, ToyEngine) and "toy" in registry.engine_names()
    s = e.session("t1 t2", max_new_tokens=6)
    assert s.run().new_tokens == 6 and str(s.policy) == "DFlash"
    with pytest.raises(EngineLacks, match=r"^the toy engine has no batch_session\(\): run the sessions one at a time$"):
        e.batch_session(["a", "b"])
    with pytest.raises(EngineLacks, match=r"^the toy engine has no replay\(\): use the workbench's engine"):
        e.replay(s.trace)


def test_run_and_bench_take_any_registered_engine_and_refuse_what_it_cannot_run(toy_engine, tiny_pairs, tmp_path,
                                                                                capsys, monkeypatch):
    """ToyEngine is not built on the workbench's Engine (it wraps one and has no ``models``): ``run`` and the policy
    bench read only what the interface declares, so they run on it (its choices come from the registry, so
    ``--engine toy`` is there once registered); what drives the engine's own model states, or needs batched
    sessions it lacks, is refused in one line before anything loads."""
    import json

    from workbench.cli import main
    from workbench.interface import registry as reg

    t, d = tiny_pairs["l4-h32"]
    pair = ["--target", str(t), "--draft", str(d), "--threads", "1"]
    assert main(["run", "--engine", "toy", "--prompt", "t1 t2", "--policy", "ddtree:4", "--max-new-tokens", "6",
                 "--json", *pair]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["engine"], out["policy"], out["new_tokens"], out["kernel_backend"]) == ("toy", "DDTree(4)", 6, "torch")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "t1 t5 t9 t3"}\n{"id": "b", "prompt": "t40 t2 t17"}\n')
    assert main(["bench", "--engine", "toy", "--policies", "ar,ddtree:4", "--prompts", str(prompts), "--max-new-tokens",
                 "8", "--repeats", "1", "--no-warmup", "--check-lossless", "--json", "--no-progress", *pair]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["DDTree(4)"]["lossless"] is True and summary["settings"]["dtype"] == "float32"

    loads = []
    real = reg.load
    monkeypatch.setattr(reg, "load", lambda *a, **k: loads.append(a) or real(*a, **k))
    for argv, line in (
        (["bench", "--batch-size", "2"], "--batch-size runs batched sessions; the toy engine has none: run the "
                                         "sessions one at a time"),
        (["bench", "--reference"], "--engine toy: --reference drives the workbench engine's own model states, "
                                   "which the toy engine does not have: use --engine workbench, or an engine "
                                   "built on workbench.engine.core.Engine"),
        (["bench", "--profile", str(tmp_path)], "--engine toy: --profile drives the workbench engine's own"),
        (["serve", "--port", "0"], "--engine toy: serve drives the workbench engine's own model states"),
        (["bench-serve"], "--engine toy: bench-serve drives the workbench engine's own model states"),
        (["pays-off"], "--engine toy: pays-off drives the workbench engine's own model states"),
    ):
        assert main([*argv, "--engine", "toy"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"workbench: error: {line}") and "\n" not in err, err
    assert loads == []  # every refusal came before any engine loaded


def test_an_engine_missing_a_declared_operation_cannot_be_made():
    class Half(BaseEngine):
        name = "half"

        @classmethod
        def load(cls, target=None, draft=None, **options):
            return cls()

    with pytest.raises(TypeError, match="abstract"):
        Half.load()


# ------------------------------------------------------------------------------ a production step as a Cycle
def test_a_chain_step_is_a_consistent_cycle():
    g = torch.Generator().manual_seed(0)
    V, K = 30, 5
    draft_logits = torch.randn(K, V, generator=g)
    drafts = draft_logits.argmax(-1)
    for accepted_drafts in range(K + 1):
        d = K
        target_logits = torch.randn(d + 1, V, generator=g)
        # the target agrees with the first `accepted_drafts` drafts
        target_logits[torch.arange(accepted_drafts), drafts[:accepted_drafts]] = 50.0
        choice = target_logits.argmax(-1)
        accepted = torch.full((d + 1,), -1)
        accepted[: accepted_drafts + 1] = torch.cat([drafts[:accepted_drafts], choice[accepted_drafts:accepted_drafts + 1]])
        c = chain_cycle(3, 40, 7, drafts, draft_logits, target_logits, accepted, accepted_drafts + 1, {"verify": 0.1})
        assert cycle_problem(c, V) is None, (accepted_drafts, cycle_problem(c, V))
        assert c.accept_length == accepted_drafts + 1 and c.bonus == int(choice[accepted_drafts])
        assert c.tokens.tolist() == [7] + drafts.tolist() and c.position_ids.tolist() == list(range(40, 46))
        assert c.draft_topk_tokens[:, 0].tolist() == drafts.tolist()
    tl = torch.randn(3, V, generator=g)  # two of five drafts verified (the request's end): the first accepted
    tl[0, drafts[0]], tl[1, drafts[1]] = 50.0, -50.0
    c = chain_cycle(0, 4, 1, drafts, None, tl, torch.tensor([drafts[0], tl[1].argmax(), -1]), 2, {})
    assert cycle_problem(c) is None and c.n_nodes == 2 and c.draft_topk_tokens.shape[0] == 0
    c = decode_cycle(2, 10, 5, [11], 0.01)
    assert cycle_problem(c) is None and c.bonus == 11 and c.committed == 1 and c.policy == "AR"
