"""The policy registry: every reader (parsing, the wire, validation, the runner) goes through it, a
policy added by one class in one file runs end to end, and the Spine policy decodes losslessly."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import workbench as wb
from ddtree_kernels import chain_tree
from workbench.bench.policy_bench import first_difference
from workbench.engine.validate import policy_list
from workbench.engine import policies
from workbench.serve import wire

EVERY = [wb.AR(), wb.DFlash(), wb.DDTree(8), wb.DDTree(16, width=1), wb.EagleTree(2, 3, 6), wb.Spine(0), wb.Spine(3)]
# Calibrated on one pair (its shipped calibration): the tiny random pairs below have none, so these run on the
# embedded pairs (tests/engine/test_new_policies.py: lossless, static nodes, refusals).
CALIBRATED = [wb.PathTree(8), wb.CostTree(16), wb.CutTree(8, threshold=0.3), wb.CutTree(7, width=1), wb.PairTree(8),
              wb.PairChain(4), wb.CondTree(8), wb.CondChain(4)]


def test_every_servable_policy_round_trips_text_and_wire():
    # every built-in is listed; a policy an installed package registers (entry points) is not ours to list
    built_in = {k for k, cls in policies.registered().items() if cls.__module__.startswith("workbench.")}
    assert {p.kind for p in EVERY + CALIBRATED} == built_in - {"tree"}
    for p in EVERY + CALIBRATED:
        assert type(p).__name__ in wb.__all__  # every built-in policy is a public name of the package
        assert wb.parse_policy(str(p)) == p and wb.parse_policy(repr(p)) == p
        assert wire.policy_from_wire(wire.loads(wire.dumps(wire.policy_to_wire(p)))) == p
    assert wb.parse_policy("spine:4") == wb.parse_policy("Spine(4)") == wb.parse_policy("spine(siblings=4)") == wb.Spine(4)
    assert policy_list("ar,Spine(2),ddtree:8") == [wb.AR(), wb.Spine(2), wb.DDTree(8)]
    for bad, msg in [("spine:x", "'x' is not an integer"), ("spine:1:2", "write 'spine:K'"),
                     ("spine:-1", "siblings=-1"), ("beam", "spine:K")]:
        with pytest.raises(ValueError, match=msg):
            wb.parse_policy(bad)


def test_static_nodes_bound_every_tree(tiny_engines):
    engine = tiny_engines["l3-h48-b5"]
    B = engine.models.block_size
    for p in EVERY + [wb.TreePolicy(lambda lp, r, b: chain_tree(lp.argmax(-1), r, lp), "chain", budget=B)]:
        s = engine.session("t1 t2 t3", policy=p, max_new_tokens=12)
        s.run()
        assert max(c.n_nodes for c in s.cycles) + 1 <= p.static_nodes(B), p
    assert wb.Spine(3).static_nodes(B) == B + 3 and wb.AR().static_nodes(B) == 1


@dataclasses.dataclass(frozen=True)
class Pair(policies.Policy):
    """A toy policy, one class: the argmax chain cut to its first ``depth`` drafts."""

    depth: int = 2
    kind = "pair"
    usage = "pair:N"
    knobs = ("depth",)

    def static_nodes(self, block_size: int) -> int:
        return min(self.depth, block_size - 1) + 1

    def build_tree(self, drafted, roots, sync_free):
        lp = drafted.logprobs[:, : self.depth]
        return chain_tree(lp.argmax(-1), roots, lp)

    def __str__(self) -> str:
        return f"Pair({self.depth})"


@pytest.fixture
def toy():
    policies.register(Pair)
    yield Pair
    policies.unregister("pair")


def test_a_policy_is_one_registered_class(toy, tiny_engines):
    engine = tiny_engines["l4-h32"]
    assert wb.parse_policy("pair:3") == Pair(3) and wb.parse_policy("Pair(3)") == Pair(3)
    assert wire.policy_from_wire(wire.policy_to_wire(Pair(1))) == Pair(1)
    ref = engine.session("t1 t2 t3", policy=wb.AR(), max_new_tokens=16)
    ref.run()
    for static in (False, True):
        s = engine.session("t1 t2 t3", policy="pair:3", max_new_tokens=16, static_shapes=static)
        s.run()
        assert s.tokens == ref.tokens and all(c.n_nodes <= 3 for c in s.cycles) and s.cycles[0].policy == "Pair(3)"
    with pytest.raises(ValueError, match="is taken by Pair"):
        policies.register(dataclasses.make_dataclass("Other", [], bases=(Pair,), frozen=True))


def test_unregistered_policy_is_gone():
    with pytest.raises(ValueError, match="unknown policy 'pair:3'"):
        wb.parse_policy("pair:3")


def test_kind_and_usage_are_checked_at_registration():
    class NoKind(policies.Policy):
        usage = "x"

    with pytest.raises(ValueError, match="kind=None must be a lower-case name"):
        policies.register(NoKind)


# ------------------------------------------------------------------------------ Spine
@pytest.mark.parametrize("shape", ["l4-h32", "l3-h48-b5"])
def test_spine_greedy_equals_ar_on_random_models(tiny_engines, shape):
    engine = tiny_engines[shape]
    ref = engine.session("t4 t9 t4 t9 t1", policy=wb.AR(), max_new_tokens=24)
    ref.run()
    for k in (0, 1, 3, 200):
        s = engine.session("t4 t9 t4 t9 t1", policy=wb.Spine(k), max_new_tokens=24)
        s.run()
        assert s.tokens == ref.tokens, f"Spine({k}) differs at {first_difference(ref.tokens, s.tokens)}"


def test_spine_greedy_equals_ar_on_the_embedded_pair(engine, eval_prompts):
    for item in eval_prompts[2:4]:
        ref = engine.session(item["prompt"], policy=wb.AR(), max_new_tokens=32)
        ref.run()
        for k in (1, 2, 4):
            s = engine.session(item["prompt"], policy=wb.Spine(k), max_new_tokens=32)
            s.run()
            assert s.tokens == ref.tokens, f"Spine({k}) on {item['id']}: differs at {first_difference(ref.tokens, s.tokens)}"
            c = s.cycles[0]
            assert c.n_nodes == engine.models.block_size - 1 + k  # the full chain and k siblings
            assert int((c.depth == 1).sum()) >= 1 and c.policy == f"Spine({k})"


def test_spine_accepts_at_least_dflash_on_the_same_cycle(engine):
    """The chain is DFlash's, so on the first cycle (same context) Spine accepts at least as far."""
    prompt = "def parse(line):\n    "
    d = engine.session(prompt, policy=wb.DFlash(), max_new_tokens=20).step()
    for k in (1, 4):
        c = engine.session(prompt, policy=wb.Spine(k), max_new_tokens=20).step()
        assert torch.equal(c.tokens[: d.tokens.numel()], d.tokens) and c.accept_length >= d.accept_length


def test_a_server_limits_every_policy_by_its_static_nodes(tiny_engines):
    """max_budget bounds the drafted nodes of any policy (a Spine has no budget field but a node count)."""
    from workbench.serve.store import Limits, ServeError, SessionStore

    engine = tiny_engines["l4-h32"]  # block size 8: a Spine(k) drafts 7 + k nodes
    store = SessionStore(engine, Limits(max_budget=20))
    for ok in (wb.DDTree(20), wb.Spine(13), wb.DFlash(), wb.AR(), wb.EagleTree(4, 5, 21)):
        store.check_policy(ok)
    for bad, field in ((wb.DDTree(21), "policy.budget"), (wb.Spine(14), "policy"), (wb.EagleTree(4, 5, 22), "policy.budget")):
        with pytest.raises(ServeError, match="max_budget=20") as e:
            store.check_policy(bad)
        assert e.value.field == field, bad


def test_nothing_outside_the_policies_package_tells_policies_apart_by_type():
    # The registry is the one reader: elsewhere a policy is told apart by its kind or by what it declares
    # (static_nodes, capacity, drafts), never by isinstance or its class name.
    import ast
    from pathlib import Path

    names = {cls.__name__ for cls in policies.registered().values()} | {"TreePolicy"}
    root = Path(wb.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if "policies" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
                classes = {n.id if isinstance(n, ast.Name) else getattr(n, "attr", None)
                           for n in ast.walk(node.args[1])}
                if classes & names:
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "__name__":
                consts = {c.value for c in node.comparators if isinstance(c, ast.Constant)}
                if consts & names:
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert found == [], f"policies told apart by type outside the registry: {found}"
    assert {"AR", "DFlash", "DDTree", "Spine", "EagleTree", "PathTree", "CostTree", "CutTree", "PairTree",
            "PairChain"} <= names  # the scan looks for the real names
