"""Named hook points on the cycle (``workbench.engine.hooks``): every point in order with its payload, the
replacements of a tree, the target's choices and an accepted path (checked, taking effect, recorded), hooks
scoped to a run (gone afterwards, also when a hook raises), never seen by another session, a batch's
hooks seeing each request, and a cycle without hooks running no hook machinery at all."""
from __future__ import annotations

import threading

import pytest
import torch

import workbench as wb
from ddtree_kernels import Tree
from test_engine import tiny_prompts
from tiny_hybrid import make_hybrid_pair
from workbench.engine import hooks as hook_module
from workbench.engine.hooks import POINTS, REPLACEABLE, STAGE_POINTS, HookReturnError
from workbench.engine.scheduler import BatchLimits, Scheduler
from workbench.records.cycle import Trace

pytestmark = pytest.mark.usefixtures("one_thread")

CYCLE_POINTS = [p for p in POINTS if p.startswith("cycle.")]


@pytest.fixture(scope="module")
def engine(tiny_engines):
    return tiny_engines["l4-h32"]


@pytest.fixture(scope="module")
def prompts(engine):
    return tiny_prompts(engine, 3, seed=49)


def ar_tokens(engine, prompt, n=24) -> list[int]:
    s = engine.session(prompt, policy=wb.AR(), max_new_tokens=n)
    s.run()
    return s.tokens


def chain(tokens: list[int]) -> Tree:
    """A chain tree over ``tokens`` (root first), [1, n] fields on the CPU."""
    n = len(tokens)
    return Tree(torch.tensor([tokens]), torch.arange(-1, n - 1)[None], torch.arange(n)[None],
                torch.zeros(1, n, dtype=torch.long), torch.zeros(1, n, dtype=torch.float64))


# ------------------------------------------------------------------------------------------------ observing
def test_hooks_observe_every_point_in_order_with_the_stage_outputs(engine, prompts):
    s = engine.session(prompts[0], policy=wb.DDTree(6), max_new_tokens=24)
    s.step()  # a cycle before: the hooks are told this one's index
    seen = []
    c = s.step(hooks=[(p, lambda v, h: seen.append((h.name, v, h))) for p in CYCLE_POINTS])
    assert [name for name, _, _ in seen] == CYCLE_POINTS  # one row: each point once, in cycle order
    assert all(h.request is s and h.row == 0 and h.batch == 1 and h.cycle == 1 and h.rows is s.driver.rows
               for _, _, h in seen)
    got = {name: v for name, v, _ in seen}
    depth = got["cycle.hook_begin"]
    assert depth == engine.models.block_size - 1 and list(got["cycle.hook_draft"].logprobs.shape)[:2] == [1, depth]
    seen, m = got["cycle.hook_draft_input"], engine.models  # what the draft forward read: its block and new context
    assert seen.block_tokens.tolist() == [c.root_token] + [m.mask_token_id] * (m.block_size - 1)
    assert seen.block_positions.tolist() == list(range(c.start, c.start + m.block_size))
    assert seen.context_positions.tolist() == list(range(s.cycles[0].start, c.start))
    width = len(m.target_layer_ids) * m.target.config.hidden_size
    assert list(seen.context_features.shape) == [c.start - s.cycles[0].start, width]
    tree = got["cycle.hook_tree"]
    assert torch.equal(tree.tokens[0], c.tokens) and torch.equal(tree.parents[0], c.parents)
    assert torch.equal(got["cycle.hook_compiled"].positions[0], c.position_ids)
    assert torch.equal(got["cycle.hook_choices"][0], c.target_choice)  # [1, n]
    assert torch.equal(got["cycle.hook_accepted"], c.accepted_nodes)
    committed = got["cycle.hook_committed"]
    assert committed.bonus == c.bonus and committed.tokens == c.accepted_tokens[1:].tolist() + [c.bonus]
    assert got["cycle.hook_record"] is c is s.cycles[-1]
    assert got["cycle.hook_end"] is None
    assert c.replaced == () and c.lossless and not s.hook_points  # observed, not replaced; the hooks are gone


def test_stage_names_stand_for_their_output_points_and_unknown_names_are_refused(engine, prompts):
    s = engine.session(prompts[0], policy=wb.DDTree(6), max_new_tokens=12)
    seen = []
    with s.hooks(*[(stage, lambda v, h: seen.append(h.name)) for stage in STAGE_POINTS]):
        s.step()
    assert seen == list(STAGE_POINTS.values())
    with pytest.raises(ValueError, match=r"no hook point 'cycle.hook_tre'; the points are prefill.hook_begin") as e:
        s.step(hooks=[("cycle.hook_tre", print)])
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="not a function"):
        s.step(hooks=[("tree_build", 3)])
    assert not s.hook_points


@pytest.mark.parametrize("policy", [wb.AR(), wb.DFlash(), wb.DDTree(4), wb.DDTree(16), wb.EagleTree(), wb.Spine(2)])
def test_observers_change_nothing_greedy_output_equals_ar(engine, prompts, policy):
    ref = ar_tokens(engine, prompts[1])
    calls = []
    s = engine.session(prompts[1], policy=policy, max_new_tokens=24,  # the prefill's points: given at the start
                       hooks=[(p, lambda v, h: calls.append(h.name)) for p in POINTS if p not in CYCLE_POINTS])
    s.run_with_hooks(hooks=[(p, lambda v, h: calls.append(h.name)) for p in CYCLE_POINTS])
    assert s.tokens == ref and len(calls) == len(POINTS) - len(CYCLE_POINTS) + len(CYCLE_POINTS) * len(s.cycles)
    assert all(c.replaced == () for c in s.cycles) and set(s.hook_points.fns) == set(POINTS) - set(CYCLE_POINTS)


def test_a_replaceable_value_changed_in_place_but_not_returned_changes_nothing(engine, prompts):
    plain = engine.session(prompts[0], policy=wb.DDTree(6), max_new_tokens=12)
    s = engine.session(prompts[0], policy=wb.DDTree(6), max_new_tokens=12)

    def scribble(v, h):  # no return: an observer, whatever it does to its copy
        (v.tokens if h.name == "cycle.hook_tree" else v).fill_(0)

    c = s.step(hooks=[("tree_build", scribble), ("verify", scribble), ("accept", scribble)])
    p = plain.step()
    assert c.replaced == () and torch.equal(c.tokens, p.tokens) and torch.equal(c.target_choice, p.target_choice)
    assert torch.equal(c.accepted_nodes, p.accepted_nodes) and s.tokens == plain.tokens


def test_an_observe_only_point_refuses_a_returned_value(engine, prompts):
    s = engine.session(prompts[0], policy=wb.DDTree(6), max_new_tokens=12)
    with pytest.raises(HookReturnError, match="a hook on cycle.hook_draft returned a value; only cycle.hook_tree"):
        s.step(hooks=[("draft", lambda v, h: v)])
    assert set(REPLACEABLE) == {"cycle.hook_tree", "cycle.hook_choices", "cycle.hook_accepted"}


# ------------------------------------------------------------------------------------------------ replacing
def test_a_replaced_tree_takes_effect_is_recorded_and_stays_lossless(engine, prompts):
    """The target's own continuation as a chain: every drafted node accepted; the output is still AR's."""
    ref = ar_tokens(engine, prompts[0], 24)
    s = engine.session(prompts[0], policy=wb.DDTree(6), max_new_tokens=24)
    depth = {}

    def oracle_chain(tree, hook):
        k = len(hook.request.generated)  # the root is ref[k - 1]
        return chain(ref[k - 1 : k + depth["d"]])

    s.run_with_hooks(hooks=[("cycle.hook_begin", lambda d, h: depth.update(d=d)), ("tree_build", oracle_chain)])
    assert s.tokens == ref
    for c in s.cycles:
        assert c.replaced == ("tree_build",) and c.lossless
        assert c.accepted == c.n_nodes or c.committed < c.accept_length  # all accepted (or cut at the limit)
    assert s.trace.summary().replaced == {"tree_build": len(s.cycles)} and s.trace.summary().lossless
    assert "replaced by hooks: tree_build in" in str(s.trace.summary())


def test_a_forced_accepted_path_takes_effect_and_is_recorded(engine, prompts, tmp_path):
    """A root child the target did not choose, forced: the output leaves AR's there, and the trace says so."""
    s = engine.session(prompts[2], policy=wb.DDTree(8), max_new_tokens=30)
    ref = ar_tokens(engine, prompts[2], 30)
    seen = {}

    def off_choice(path, hook):
        tree, choice = seen["tree"], seen["choice"]
        kids = [i for i, q in enumerate(tree.parents[0].tolist()) if q == 0 and tree.tokens[0, i] != choice[0, 0]]
        seen["forced"] = [0, kids[0]]
        return torch.tensor(seen["forced"])

    c = s.step(hooks=[("tree_build", lambda t, h: seen.update(tree=t)),
                      ("verify", lambda ch, h: seen.update(choice=ch)), ("accept", off_choice)])
    assert c.accepted_nodes.tolist() == seen["forced"] and c.replaced == ("accept",) and not c.lossless
    assert c.bonus == int(c.target_choice[seen["forced"][-1]])  # the target's choice at the forced path's end
    assert "replaced by a hook: accept" in repr(c)
    s.run()
    assert s.tokens[:2] == ref[:1] + [int(c.tokens[seen["forced"][1]])] != ref[:2]  # it left AR's output there
    summary = s.trace.summary()
    assert summary.replaced == {"accept": 1} and not summary.lossless
    assert "(the output is not the target's own)" in str(summary)
    back = Trace.load(s.trace.save(tmp_path / "forced.trace.jsonl"))  # a forced path reads back as recorded
    assert back.cycles[0].replaced == ("accept",) and back.cycles[0].accepted_nodes.tolist() == seen["forced"]
    with pytest.raises(ValueError, match=r"cycle\(s\) 0 of this trace had a stage's output replaced by a hook"):
        engine.replay(back)


@pytest.fixture(scope="module")
def hybrid_engine(tmp_path_factory):
    t, d = make_hybrid_pair(tmp_path_factory.mktemp("hyb"), "qwen3_5", seed=4, vocab=40)
    return wb.load(target=t, draft=d)


@pytest.mark.parametrize("which", ["dense", "hybrid"])
def test_after_a_forced_path_the_state_is_the_forced_prefixs(engine, hybrid_engine, which):
    """The model states commit the forced path as they would an accepted one (K/V, or a recurrent state taken
    from the path's last node): every later token is plain decoding's from the prefix the forced cycle left."""
    e = hybrid_engine if which == "hybrid" else engine
    checked = 0
    for prompt in tiny_prompts(e, 4, seed=7):  # (a random pair may say end-of-text on the forced path)
        s = e.session(prompt, policy=wb.DDTree(8), max_new_tokens=24)
        s.step()
        seen = {}
        c = s.step(hooks=[("tree_build", lambda t, h: seen.update(parents=t.parents[0].tolist())),
                          ("accept", lambda p, h: first_child_line(seen["parents"]))])  # as deep as the tree goes
        assert c.replaced == ("accept",) and c.accepted >= 1
        cut = len(s.generated)
        s.run()
        rest = s.generated[cut:]
        if not rest:
            continue
        # AR's first token comes from its prefill over the forced prefix: the session's next token must equal it.
        ar = e.session(prompt_ids=s.prompt_ids + s.generated[:cut], policy=wb.AR(), max_new_tokens=len(rest))
        ar.run()
        assert rest == ar.generated[: len(rest)]
        checked += 1
    assert checked >= 2


def first_child_line(parents: list[int]) -> list[int]:
    """The path from the root through each node's lowest-index child."""
    line = [0]
    while kids := [i for i in range(1, len(parents)) if parents[i] == line[-1]]:
        line.append(kids[0])
    return line


def test_replaced_choices_steer_the_accept_walk_and_are_recorded(engine, prompts):
    s = engine.session(prompts[0], policy=wb.DDTree(8), max_new_tokens=24)
    tokens = {}

    def agree_with_first_child(choice, hook):  # the target "chooses" each node's first child's token
        tree = tokens[hook.row]
        par, tok = tree.parents[0].tolist(), tree.tokens[0].tolist()
        out = choice.clone()
        for i in range(len(par) - 1, 0, -1):  # the lowest-index child wins
            out[0, par[i]] = tok[i]
        return out

    c = s.step(hooks=[("cycle.hook_tree", lambda t, h: tokens.__setitem__(h.row, t)),
                      ("verify", agree_with_first_child)])
    line = first_child_line(c.parents.tolist())
    assert c.accepted_nodes.tolist() == line and c.replaced == ("verify",) and not c.lossless
    assert c.target_choice[0] == c.tokens[line[1]]  # the record holds the choices the walk followed


@pytest.mark.parametrize("point, bad, match", [
    ("tree_build", lambda t: chain([t.tokens[0, 0].item() + 1, 3]), "node 0 .* the root must be the bonus token"),
    ("tree_build", lambda t: chain([t.tokens[0, 0].item()] + [3] * 9), r"deeper than the 7 drafted slots"),
    ("tree_build", lambda t: "a tree", "is str, not a ddtree_kernels.Tree"),
    ("verify", lambda c: c[0, :2], r"have shape \[1, 2\]; the tree has \d+ nodes"),
    ("verify", lambda c: c.float(), "give token ids"),
    ("verify", lambda c: c + 10_000, "outside the vocabulary"),
    ("accept", lambda p: [1], "a path starts at the root"),
    ("accept", lambda p: [0, 0], "steps from node 0 to node 0, which is not its child"),
])
def test_a_bad_replacement_is_refused_in_one_line_and_the_session_goes_on(engine, prompts, point, bad, match):
    ref = ar_tokens(engine, prompts[1])
    s = engine.session(prompts[1], policy=wb.DDTree(6), max_new_tokens=24)
    with pytest.raises(ValueError, match=match) as e:
        s.step(hooks=[(point, lambda v, h: bad(v))])
    assert "\n" not in str(e.value) and not s.hook_points and not s.cycles
    s.run()  # the aborted cycle committed nothing: the session steps on, still lossless
    assert s.tokens == ref


def test_a_tree_over_the_static_node_count_is_refused(engine, prompts):
    s = engine.session(prompts[0], policy=wb.DDTree(2), max_new_tokens=12, static_shapes=True)
    with pytest.raises(ValueError, match="3 drafted nodes exceed the budget of 2"):
        s.step(hooks=[("tree_build", lambda t, h: chain([t.tokens[0, 0].item(), 1, 2, 3]))])


# ------------------------------------------------------------------------------------------------ scoping
def test_hooks_are_removed_after_the_run_even_when_a_hook_raises(engine, prompts):
    ref = ar_tokens(engine, prompts[0])
    s = engine.session(prompts[0], policy=wb.DDTree(6), max_new_tokens=24)
    ends = []

    def boom(v, h):
        raise KeyError("a hook failed")

    with pytest.raises(KeyError, match="a hook failed"):
        s.run_with_hooks(hooks=[("verify", boom), ("cycle.hook_end", lambda e, h: ends.append(e))])
    assert not s.hook_points and len(ends) == 1 and isinstance(ends[0], KeyError)  # hook_end saw the error
    with pytest.raises(KeyError):
        with s.hooks(("commit", boom)):
            s.step()
    assert not s.hook_points
    s.run()
    assert s.tokens == ref


def test_two_sessions_never_see_each_others_hooks(engine, prompts):
    a = engine.session(prompts[0], policy=wb.DDTree(6), max_new_tokens=20)
    b = engine.session(prompts[1], policy=wb.DFlash(), max_new_tokens=20)
    seen = []
    with a.hooks(("cycle.hook_record", lambda c, h: seen.append((h.request, c)))):
        while not (a.finished and b.finished):  # interleaved in one process
            for s in (a, b):
                if not s.finished:
                    s.step()
    assert [r for r, _ in seen] == [a] * len(a.cycles) and [c for _, c in seen] == a.cycles
    assert not a.hook_points and not b.hook_points


def test_scheduled_sessions_in_shared_cycles_see_only_their_own_row(engine, prompts):
    # A long gather window (it waits only for a session not yet asking again), so that the two share cycles.
    sched = Scheduler(engine, BatchLimits(gather_seconds=1.0, gather_floor=1.0))
    try:
        a = sched.session(prompts[0], policy=wb.DDTree(6), max_new_tokens=20)
        b = sched.session(prompts[1], policy=wb.DDTree(6), max_new_tokens=20)
        seen = []
        other = threading.Thread(target=b.run)
        other.start()
        a.run_with_hooks(hooks=[("cycle.hook_accepted", lambda p, h: seen.append((h.request, h.batch)))])
        other.join()
    finally:
        sched.close()
    assert [r for r, _ in seen] == [a] * len(a.cycles) and any(n == 2 for _, n in seen)  # in shared cycles too
    for s, p in ((a, prompts[0]), (b, prompts[1])):
        alone = engine.session(p, policy=wb.DDTree(6), max_new_tokens=20)
        alone.run()
        assert s.tokens == alone.tokens


def test_a_batch_sessions_hooks_see_each_request(engine, prompts):
    b = engine.batch_session(prompts, policy=[wb.DDTree(6), wb.DFlash(), wb.DDTree(3)], max_new_tokens=16)
    seen, mine = [], []
    with b.hooks(("cycle.hook_record", lambda c, h: seen.append((h.request, h.row, h.batch, c)))):
        with b.sessions[1].hooks(("accept", lambda p, h: mine.append(h.request))):
            b.step()
    assert [(r, row, n) for r, row, n, _ in seen] == [(s, i, 3) for i, s in enumerate(b.sessions)]
    assert [c for *_, c in seen] == [s.cycles[0] for s in b.sessions]
    assert mine == [b.sessions[1]] and not any(s.hook_points for s in b.sessions)
    forced = b.step(hooks=[("accept", lambda p, h: [0] if h.row == 2 else None)])  # one request's path forced
    assert [c.replaced for c in forced.cycles] == [(), (), ("accept",)]
    b.run()
    for s, p, pol in zip(b.sessions[:2], prompts, [wb.DDTree(6), wb.DFlash()]):  # the others stay their own
        alone = engine.session(p, policy=pol, max_new_tokens=16)
        alone.run()
        assert s.tokens == alone.tokens


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_the_draft_input_point_hands_over_the_features_the_commit_gave_the_drafter(engine, prompts, static):
    """The features at cycle.hook_draft_input are the tensor the drafter's forward read: the prompt's features
    first, then each commit's features of its accepted nodes, row for row (static shapes too, where the
    forward reads its own buffers and a long context goes in chunks)."""
    s = engine.session(prompts[1], policy=wb.DDTree(6), max_new_tokens=24, static_shapes=static)
    kept, seen = [], []
    s.run_with_hooks(hooks=[("cycle.hook_committed", lambda v, h: kept.append(v)),
                            ("cycle.hook_draft_input", lambda v, h: seen.append(v))])
    assert seen[0].context_positions.tolist() == list(range(len(s.prompt_ids)))  # the prefill's rows
    drafted = [v for v in seen if v is not None]  # the last cycle may draft nothing (its last token)
    assert len(drafted) >= 3
    for before, now, c in zip(kept, drafted[1:], s.cycles[1:]):
        assert torch.equal(now.context_features, before.context[0])  # [L + 1, F]: the same values, not rebuilt
        assert now.context_positions.tolist() == list(range(c.start - before.context.shape[1], c.start))
    b = engine.batch_session(prompts[:2], policy=wb.DFlash(), max_new_tokens=10)
    got = []
    b.step(hooks=[("cycle.hook_draft_input", lambda v, h: got.append((h.row, v)))])
    assert [r for r, _ in got] == [0, 1]
    for (_, v), sess in zip(got, b.sessions):
        assert v.context_positions.tolist() == list(range(len(sess.prompt_ids)))


# ------------------------------------------------------------------------------------------------ the hot path
def test_a_cycle_without_hooks_builds_no_dispatcher(engine, prompts, monkeypatch):
    def no(*a, **k):
        raise AssertionError("hook machinery ran for a session without hooks")

    monkeypatch.setattr(hook_module.CycleHooks, "__init__", no)
    s = engine.session(prompts[0], policy=wb.DDTree(6), max_new_tokens=12)
    s.run()
    b = engine.batch_session(prompts[:2], policy=wb.DDTree(6), max_new_tokens=8)
    b.run()


def test_time_in_hooks_is_counted_as_other_not_as_the_stage_watched(engine, prompts):
    import time

    from workbench.records.cycle import STAGES

    s = engine.session(prompts[0], policy=wb.DDTree(6), max_new_tokens=12)
    c = s.step(hooks=[("tree_build", lambda t, h: time.sleep(0.2))])
    assert set(c.stage_seconds) == set(STAGES)
    assert c.stage_seconds["other"] >= 0.2 > c.stage_seconds["tree_build"]


def test_the_shape_capture_rides_on_the_requests_hook_points(engine, prompts):
    s = engine.session(prompts[0], policy=wb.DDTree(6), max_new_tokens=12)
    with wb.shapes.capture(s):
        assert set(s.hook_points.fns) == {"prefill.hook_begin", "prefill.hook_end", "cycle.hook_begin",
                                          "cycle.hook_end"}
        c = s.step()
    assert not s.hook_points and c.forwards[-1].modules
    assert s.driver.rows.target.capture is None and s.driver.rows.draft.capture is None  # off between cycles
    assert s.step().forwards[-1].modules == ()
