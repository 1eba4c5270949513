"""Static shapes (``static_shapes=True``): every draft and verify forward reads the same shapes and the
same storage from one cycle to the next, decodes exactly what the dynamic path decodes, and reads nothing
from the device between the draft and the verify forward (what a CUDA graph capture needs)."""
from __future__ import annotations

import pytest
import torch
from shared_checks import NoHostSync, hf_greedy

import workbench as wb
from workbench.engine import runner


def _sig(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.dtype, t.data_ptr()


class ForwardInputs:
    """Forward pre-hooks on the target, the drafter and the shared embedding: every forward's input
    tensors (shape, dtype, address), the cache's K/V store included."""

    def __init__(self, engine):
        m = engine.models
        self.target, self.draft, self.embed = [], [], []  # embed: the drafter's block ids (outside the target)
        self.in_target = False

        def embed(mod, args):
            if not self.in_target:
                self.embed.append(_sig(args[0]))

        def target_done(*a):
            self.in_target = False

        self.handles = [
            m.target.register_forward_pre_hook(self._hook(self.target, self), with_kwargs=True),
            m.target.register_forward_hook(target_done),
            m.draft.register_forward_pre_hook(self._hook(self.draft), with_kwargs=True),
            m.target.get_input_embeddings().register_forward_pre_hook(embed),
        ]

    @staticmethod
    def _hook(out: list, target=None):
        def hook(module, args, kwargs):
            if target is not None:
                target.in_target = True
            # noise_embedding is the drafter's embedding of the block ids, computed inside the forward the
            # graph captures (run_draft); its input, the block ids, is what the embedding hook records.
            sig = {k: _sig(v) for k, v in kwargs.items() if isinstance(v, torch.Tensor) and k != "noise_embedding"}
            cache = kwargs.get("past_key_values")
            sig["kv_store"] = _sig(cache.store)
            out.append(sig)
        return hook

    def close(self):
        for h in self.handles:
            h.remove()


def _same(records: list, what: str) -> None:
    assert len(records) >= 3, f"too few {what} forwards to compare: {len(records)}"
    for i, r in enumerate(records[1:], 1):
        assert r == records[0], f"{what} forward {i} differs from the first: {r} vs {records[0]}"


CASES = [("ddtree16", wb.DDTree(16), 1), ("ddtree64", wb.DDTree(64), 1), ("dflash", wb.DFlash(), 1),
         ("batch2", wb.DDTree(16), 2)]


@pytest.mark.parametrize("label,policy,batch", CASES, ids=[c[0] for c in CASES])
def test_static_forwards_keep_shapes_and_storage_and_decode_as_dynamic(engine, eval_prompts, label, policy, batch):
    prompts = [p["prompt"] for p in eval_prompts[:batch]]
    n = 40
    rec = ForwardInputs(engine)
    try:
        if batch == 1:
            s = engine.session(prompts[0], policy, max_new_tokens=n, static_shapes=True)
        else:
            s = engine.batch_session(prompts, policy, max_new_tokens=n, static_shapes=True)
        rec.target.clear(), rec.draft.clear(), rec.embed.clear()  # the prefill has its own shapes
        while not s.finished and (batch == 1 or len(s.live) == batch):  # a retirement starts a smaller bucket
            s.step()
    finally:
        rec.close()
    s.run()
    static = [s] if batch == 1 else s.sessions
    _same(rec.target, "target verify")
    _same(rec.draft, "draft")  # the first cycle's drafts included: a long context goes in block-sized chunks
    _same(rec.embed, "draft block ids")
    verify_ids = rec.target[0]["input_ids"][0]
    nodes = 16 if isinstance(policy, wb.DFlash) else policy.budget + 1
    assert verify_ids == (batch, nodes), verify_ids
    assert rec.target[0]["attention_mask"][0][-1] == rec.target[0]["kv_store"][0][4]  # every cache column
    # Same tokens and the same accept lengths as the dynamic path, request by request.
    for p, s in zip(prompts, static):
        dyn = engine.session(p, policy, max_new_tokens=n)
        dyn.run()
        assert s.tokens == dyn.tokens
        assert [len(c.accepted_nodes) for c in s.cycles] == [len(c.accepted_nodes) for c in dyn.cycles]


class _SyncFreeWindow:
    """NoHostSync from the start of the draft stage to the end of the verify stage of every cycle."""

    def __init__(self, monkeypatch):
        self.mode, self.windows = None, 0
        orig = runner.Stopwatch.start

        def start(sw, name):
            if name == "draft":
                self.mode = NoHostSync()
                self.mode.__enter__()
            elif name == "accept" and self.mode is not None:
                self.mode.__exit__(None, None, None)
                self.mode = None
                self.windows += 1
            return orig(sw, name)

        monkeypatch.setattr(runner.Stopwatch, "start", start)

    def close(self):
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.mode = None


@pytest.mark.parametrize("batch", [1, 2])
def test_static_cycle_reads_nothing_from_the_device_between_draft_and_verify(engine, eval_prompts, monkeypatch,
                                                                              batch):
    prompts = [p["prompt"] for p in eval_prompts[:batch]]
    if batch == 1:
        s = engine.session(prompts[0], wb.DDTree(16), max_new_tokens=24, static_shapes=True)
    else:
        s = engine.batch_session(prompts, wb.DDTree(16), max_new_tokens=24, static_shapes=True)
    guard = _SyncFreeWindow(monkeypatch)
    try:
        for _ in range(3):
            s.step()
    finally:
        guard.close()
    assert guard.windows == 3


def test_the_dynamic_cycle_does_read_the_device_there(engine, eval_prompts, monkeypatch):
    """The guard can fail: the dynamic path's CPU tree build reads the top-k on the host."""
    s = engine.session(eval_prompts[0]["prompt"], wb.DDTree(16), max_new_tokens=24)
    guard = _SyncFreeWindow(monkeypatch)
    try:
        with pytest.raises(AssertionError, match="host sync"):
            s.step()
    finally:
        guard.close()


def test_static_session_past_its_first_length_bucket_goes_on_exactly(engine, eval_prompts):
    """Raising max_new_tokens mid-session moves the buffers to a larger bucket, keeping what is committed."""
    p = eval_prompts[1]["prompt"]
    s = engine.session(p, wb.DDTree(8), max_new_tokens=8, static_shapes=True)
    s.run()
    cap = s._rows.capacity
    s.run(max_new_tokens=8 + cap)  # past the first bucket
    assert s._rows.capacity > cap
    dyn = engine.session(p, wb.DDTree(8), max_new_tokens=8 + cap)
    dyn.run()
    assert s.tokens == dyn.tokens


def test_cuda_graphs_refused_without_cuda():
    with pytest.raises(ValueError, match="cuda_graphs=True needs a CUDA device, got device='cpu'"):
        wb.load(cuda_graphs=True)


def test_readiness_checklist_holds_for_static_and_names_the_dynamic_paths_reads(engine, eval_prompts):
    """The notebook 09 checklist on a live session: every requirement met under static shapes; the dynamic
    path reads the host between its draft and its verify forward (the tree build's heap), and the window
    ends at the verify forward, so what comes after it (the greedy choice's tie check) is not counted."""
    from workbench.engine.graphs import readiness

    static = readiness(engine, eval_prompts[0]["prompt"], wb.DDTree(16), max_new_tokens=24, static_shapes=True)
    assert all(ok for ok, _ in static.values()), static
    dynamic = readiness(engine, eval_prompts[0]["prompt"], wb.DDTree(16), max_new_tokens=24, static_shapes=False)
    ok, evidence = dynamic["no host read between draft and verify"]
    assert not ok and "tolist" in evidence and "__bool__" not in evidence, evidence


# ------------------------------------------------------------------------------------------- MLA (DeepSeek-V3)
@pytest.fixture(scope="module")
def mla_engine(tmp_path_factory):
    """The tiny DeepSeek-V3 layout of tests/real_layouts.py: MLA, whose cache holds the latent (c_kv of
    kv_lora_rank 16 in the keys' place, k_pe of qk_rope_head_dim 8 in the values'): two widths."""
    import real_layouts as rl

    root = tmp_path_factory.mktemp("mla")
    return wb.load(target=rl.write_deepseek_v3(root / "target"), draft=rl.write_draft(root / "draft"), threads=1,
                   dtype="float32")


def test_mla_static_shapes_are_graph_ready_and_decode_as_dynamic_and_generate(mla_engine):
    """static_shapes=True on MLA: fixed shapes and storage, no host read between draft and verify (what
    cuda_graphs=True needs, checked as far as a CPU goes), the dynamic path's tokens and transformers' own
    greedy generate's, solo and batched over ragged prompts."""
    from workbench.engine.graphs import readiness
    from workbench.models.registry import kv_layout

    e, n = mla_engine, 12
    lay = kv_layout(e.models.target.config)
    assert (lay.heads, lay.key_dim, lay.value_dim, lay.names) == (1, 16, 8, ("c_kv", "k_pe"))
    prompts = ["t1 t2 t3 t4", "t7 t5"]
    checks = readiness(e, prompts[0], wb.DDTree(8), max_new_tokens=n, static_shapes=True)
    assert all(ok for ok, _ in checks.values()), checks
    for policy in (wb.DDTree(8), wb.DFlash(), wb.AR()):
        solo = [e.session(p, policy, max_new_tokens=n, static_shapes=True) for p in prompts]
        for s in solo:
            s.run()
            assert s._rows.target.cache.static is not None  # the static path ran
        batch = e.batch_session(prompts, policy, max_new_tokens=n, static_shapes=True)
        batch.run()
        for p, s, b in zip(prompts, solo, batch.sessions):
            dyn = e.session(p, policy, max_new_tokens=n)
            dyn.run()
            assert s.tokens == b.tokens == dyn.tokens == hf_greedy(e, s.prompt_ids, n), (policy, p)
    # The store holds each layer's latent once: bytes as described, keys and values of their own widths.
    s = e.session(prompts[0], wb.DDTree(8), max_new_tokens=n, static_shapes=True)
    s.run()
    state = s._rows.target
    specs = state.describe()
    assert [(x.name, x.shape[1], x.shape[3]) for x in specs] == [("c_kv", 1, 16), ("k_pe", 1, 8)]
    assert sum(x.bytes for x in specs) == state.nbytes() == sum(t.nbytes for kv in state.view(0) for t in kv)
