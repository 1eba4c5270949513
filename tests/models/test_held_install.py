"""What a state installs on a shared model is removed when the last state holding it ends: the hybrid state's
GatedDeltaNet forward router and the drafter's per-layer mask pre-hook (workbench.models.held_install)."""
from __future__ import annotations

import gc
import json

import torch
from tiny_hybrid import make_hybrid_pair
from tiny_models import make_pair

import workbench as wb
from workbench.models import drafter, hybrid
from workbench.models.held_install import HeldInstall


def _gdn_modules(engine) -> list:
    return [m for m in engine.models.target.modules() if hasattr(m, "conv1d") and hasattr(m, "A_log")]


def test_hybrid_forward_router_is_removed_when_the_last_session_ends(tmp_path):
    t, d = make_hybrid_pair(tmp_path, "qwen3_5", vocab=24)
    engine = wb.load(target=t, draft=d, threads=1)
    gdn = _gdn_modules(engine)
    assert gdn and not any("forward" in m.__dict__ for m in gdn)  # loaded: the class's own forward
    first = engine.session("ab", policy=wb.DDTree(4), max_new_tokens=4)
    first.step()
    second = engine.session("ba", policy=wb.DFlash(), max_new_tokens=4)
    assert all("forward" in m.__dict__ for m in gdn) and hybrid.GDN_FORWARDS.holders(engine.models.target) >= 2
    del first
    gc.collect()
    second.run()  # the other session's forwards are still routed: it runs to the end
    assert all("forward" in m.__dict__ for m in gdn)
    del second
    gc.collect()
    assert hybrid.GDN_FORWARDS.holders(engine.models.target) == 0
    assert not any("forward" in m.__dict__ for m in gdn)
    assert all(m.forward.__func__ is type(m).forward for m in gdn)
    again = engine.session("ab", policy=wb.DDTree(4), max_new_tokens=4)  # a new session routes them again
    again.run()
    assert all("forward" in m.__dict__ for m in gdn)


def test_an_instance_forward_set_before_is_restored_not_dropped():
    """Another library's instance forward (accelerate's device hooks set one) is what comes back."""
    class GDN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1d, self.A_log = torch.nn.Identity(), torch.nn.Parameter(torch.zeros(1))

    model = torch.nn.Sequential(GDN(), GDN())

    def theirs(*a, **k):
        return "theirs"

    model[0].forward = theirs
    owner = type("Owner", (), {})()
    release = hybrid.install(model, owner)
    assert model[0].forward is not theirs and "forward" in model[1].__dict__
    release()
    release()  # idempotent
    assert model[0].forward is theirs and "forward" not in model[1].__dict__


def test_drafter_mask_hooks_are_removed_when_the_batch_ends(tmp_path):
    """A drafter mixing sliding and full layers batches with a per-layer mask pre-hook; it goes with the batch."""
    t, d = make_pair(tmp_path, vocab=64, hidden=32, layers=4, draft_layers=2, layer_ids=(1, 2), block_size=4, seed=3)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(layer_types=["sliding_attention", "full_attention"], use_sliding_window=True, sliding_window=5)
    (d / "config.json").write_text(json.dumps(cfg))
    engine = wb.load(target=t, draft=d, threads=1)
    attns = [layer.self_attn for layer in engine.models.draft.layers]
    assert not any(a._forward_pre_hooks for a in attns)
    bs = engine.batch_session(["ab", "ba c"], policy=wb.DDTree(4), max_new_tokens=6)
    bs.run()
    assert all(len(a._forward_pre_hooks) == 1 for a in attns)
    assert drafter.MASK_HOOKS.holders(engine.models.draft) >= 1
    del bs
    gc.collect()
    assert drafter.MASK_HOOKS.holders(engine.models.draft) == 0
    assert not any(a._forward_pre_hooks for a in attns)


def test_held_install_installs_once_and_undoes_after_the_last_owner():
    calls = []
    held = HeldInstall(lambda model: calls.append("install") or (lambda: calls.append("undo")))
    model, a, b = object(), type("A", (), {})(), type("B", (), {})()
    held.hold(a, model)
    release_b = held.hold(b, model)
    assert calls == ["install"] and held.holders(model) == 2
    release_b()
    assert calls == ["install"] and held.holders(model) == 1
    del a
    gc.collect()
    assert calls == ["install", "undo"] and held.holders(model) == 0
