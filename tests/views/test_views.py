"""Views: the figure functions on real and synthetic cycles, the Stepper driven from Python, HTML export."""
from __future__ import annotations

import dataclasses
import re
import time

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

import workbench as wb
from workbench import views
from workbench.records.cycle import STAGES, Cycle, Trace
from workbench.views.figures import NODE_META, OUTCOME_NAMES


# ----------------------------------------------------------------------------- helpers
def synthetic_cycle(budget: int, depth: int = 15, vocab: int = 4096, index: int = 0, seed: int = 0) -> Cycle:
    """A Cycle around a real ``build_tree`` on random log-probs; the target agrees along the top chain
    for a few steps, so there is an accepted path, a bonus and target-agreed-but-unreached nodes."""
    from ddtree_kernels import accept_walk, build_tree, compile_tree

    g = torch.Generator().manual_seed(seed)
    logprobs = torch.log_softmax(3 * torch.randn(1, depth, vocab, generator=g), dim=-1)
    tree = build_tree(logprobs, torch.tensor([7]), budget)
    comp = compile_tree(tree, 100, depth)
    n = tree.n
    # The target "chooses" the first child of each node on the best chain for 3 steps, else a random token.
    choice = torch.randint(0, vocab, (1, n), generator=g)
    node = 0
    for _ in range(3):
        kids = (tree.parents[0] == node).nonzero().flatten()
        if not len(kids):
            break
        choice[0, node] = tree.tokens[0, kids[0]]
        node = int(kids[0])
    acc = accept_walk(tree.tokens, tree.parents, tree.depth, comp.visibility, choice, depth)
    nodes = acc.index[0, : int(acc.length[0]) + 1].tolist()
    assert len(nodes) >= 2  # the set-up chain was accepted
    nodes_t = torch.tensor(nodes, dtype=torch.long)
    top = torch.topk(logprobs[0], 8, dim=-1)
    return Cycle(
        index=index, policy=f"DDTree({budget})", start=100, root_token=7,
        draft_topk_tokens=top.indices, draft_topk_logprobs=top.values,
        tokens=tree.tokens[0], parents=tree.parents[0], depth=tree.depth[0], rank=tree.rank[0],
        score=tree.score[0].float(), position_ids=comp.positions[0], visibility=comp.visibility[0],
        retrieve_next_token=comp.retrieve_next_token[0], retrieve_next_sibling=comp.retrieve_next_sibling[0],
        target_choice=choice[0], target_prob=torch.rand(n, generator=g),
        accepted_nodes=nodes_t, accepted_tokens=tree.tokens[0][nodes_t], bonus=int(choice[0, nodes[-1]]),
        committed=len(nodes), stage_seconds={s: 1e-3 for s in STAGES}, forwards=(), temperature=0.0,
    )


def tiny_cycle(index: int, accepted: int, bonus: int, root: int) -> Cycle:
    """A one-chain cycle with ``accepted`` accepted drafted tokens (ids 1..accepted)."""
    n = accepted + 2
    idx = torch.arange(n)
    toks = torch.tensor([root] + list(range(1, n)))
    choice = torch.cat([toks[1:], torch.tensor([bonus])])
    choice[accepted] = bonus  # the target chose the bonus after the last accepted node
    nodes = torch.arange(accepted + 1)
    return Cycle(
        index=index, policy="DFlash", start=10 + index, root_token=root,
        draft_topk_tokens=torch.zeros(n - 1, 2, dtype=torch.long), draft_topk_logprobs=torch.zeros(n - 1, 2),
        tokens=toks, parents=idx - 1, depth=idx, rank=torch.zeros(n, dtype=torch.long), score=torch.zeros(n),
        position_ids=idx + 10, visibility=torch.tril(torch.ones(n, n, dtype=torch.bool)),
        retrieve_next_token=torch.full((n,), -1), retrieve_next_sibling=torch.full((n,), -1),
        target_choice=choice, target_prob=torch.full((n,), 0.9), accepted_nodes=nodes, accepted_tokens=toks[nodes],
        bonus=bonus, committed=accepted + 1, stage_seconds={s: 1e-4 for s in STAGES}, forwards=(),
    )


def synthetic_trace(n_cycles: int, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    templates = [tiny_cycle(0, a, 59, 5) for a in range(4)]  # cheap copies below (tensors shared)
    cycles, root = [], 5
    for i in range(n_cycles):
        a = int(rng.integers(0, 4))
        bonus = int(rng.integers(1, 60))
        cycles.append(dataclasses.replace(templates[a], index=i, root_token=root, bonus=bonus))
        root = bonus
    return Trace(meta={"policy": "DFlash", "prompt": "p"}, cycles=cycles,
                 new_tokens=1 + sum(c.committed for c in cycles))


def node_points(fig) -> dict[int, tuple[float, float, str]]:
    """customdata node index -> (x, y, trace name) over the node traces."""
    out = {}
    for t in fig.data:
        if t.meta == NODE_META:
            for i, x, y in zip(t.customdata, t.x, t.y):
                out[int(i)] = (x, y, t.name)
    return out


@pytest.fixture(scope="module")
def tiny(tiny_engines):
    return tiny_engines["l4-h32"]


@pytest.fixture(scope="module")
def ddtree_trace(tiny):
    return tiny.generate("t1 t2 t3", wb.DDTree(16), max_new_tokens=24)


# ----------------------------------------------------------------------------- tree figure on real cycles
def test_tree_figure_real_cycles(tiny, ddtree_trace):
    tok = tiny.tokenizer
    assert len(ddtree_trace) > 1
    for c in ddtree_trace.cycles:
        fig = views.tree_figure(c, tok)
        pts = node_points(fig)
        n = int(c.tokens.shape[0])
        # every tree node once, plus the bonus as node n
        assert views.tree_node_count(fig) == c.n_nodes + 2 == n + 1
        assert sorted(pts) == list(range(n + 1))
        assert pts[n][2] == OUTCOME_NAMES["bonus"]
        # no two nodes at the same place
        assert len({(x, y) for x, y, _ in pts.values()}) == n + 1
        # x is the depth; the bonus sits one step right of the last accepted node
        for i in range(n):
            assert pts[i][0] == int(c.depth[i])
        last = int(c.accepted_nodes[-1])
        assert pts[n][0] == pts[last][0] + 1
        # the accepted path line passes through the accepted nodes, then the bonus
        path = next(t for t in fig.data if t.meta == "path")
        want = [pts[int(i)][:2] for i in c.accepted_nodes] + [pts[n][:2]]
        assert list(zip(path.x, path.y)) == want
        # accepted nodes are drawn as accepted; the rest are agreed or rejected per the definition
        for i in range(1, n):
            p = int(c.parents[i])
            if i in c.accepted_nodes.tolist():
                expect = OUTCOME_NAMES["accepted"]
            elif int(c.tokens[i]) == int(c.target_choice[p]):
                expect = OUTCOME_NAMES["agreed"]
            else:
                expect = OUTCOME_NAMES["rejected"]
            assert pts[i][2] == expect
    # node count = budget + 1 (+ the bonus) on a full-budget cycle
    full = [c for c in ddtree_trace.cycles if c.n_nodes == 16]
    assert full, "expected at least one cycle with the full budget of 16 nodes"
    assert views.tree_node_count(views.tree_figure(full[0], tok)) == 16 + 1 + 1


def test_tree_figure_on_the_embedded_default(request):
    """Budget 32 on the embedded pair: 32 drafted nodes + root + bonus, byte-level BPE text made visible."""
    from pathlib import Path

    if not (Path(wb.__file__).parent / "assets" / "training_report.json").exists():
        pytest.skip("the embedded default model is not trained yet (workbench/assets/training_report.json)")
    engine = request.getfixturevalue("engine")
    s = engine.session("def parse(line):\n    return", policy=wb.DDTree(32), max_new_tokens=64)
    c = s.step()
    assert c.n_nodes == 32
    fig = views.tree_figure(c, engine.tokenizer)
    assert views.tree_node_count(fig) == 32 + 1 + 1
    texts = [x for t in fig.data if t.meta == NODE_META for x in t.text]
    assert all(x and " " not in x and "\n" not in x for x in texts)  # whitespace is drawn as ␣ / ⏎
    st = views.Stepper(s)  # a stepper on a session that has already run a cycle shows it
    assert st.shown_cycle == 0 and st.slider.max == 0 and views.tree_node_count(st.tree) == 34


def test_tree_figure_without_tokenizer_shows_ids(ddtree_trace):
    c = ddtree_trace[0]
    fig = views.tree_figure(c)
    texts = [s for t in fig.data if t.meta == NODE_META for s in t.text]
    assert texts and all(re.fullmatch(r"\[\d+\]", s) for s in texts)


def test_labels_escaped_and_whitespace_visible():
    class Tok:
        table = {1: "<b>x</b>", 2: " a\nb\t", 3: "&", 7: "root"}

        def decode(self, ids):
            return "".join(self.table.get(i, "?") for i in ids)

    c = tiny_cycle(0, accepted=2, bonus=3, root=7)
    fig = views.tree_figure(c, Tok())
    texts = {int(i): s for t in fig.data if t.meta == NODE_META for i, s in zip(t.customdata, t.text)}
    assert texts[1] == "&lt;b&gt;x&lt;/b&gt;"
    assert texts[2] == "␣a⏎b⇥"
    assert texts[4] == "&amp;"  # the bonus (node n = 4)
    hovers = " ".join(h for t in fig.data if t.meta == NODE_META for h in t.hovertext)
    assert "&lt;b&gt;x&lt;/b&gt;" in hovers and "<b>x</b>" not in hovers  # token markup never reaches plotly
    assert views.visible("<\n ") == "&lt;⏎␣"


def test_tree_figure_max_nodes_caps_and_says_so():
    c = synthetic_cycle(300, seed=1)
    fig = views.tree_figure(c, max_nodes=50)
    shown = views.tree_node_count(fig)
    assert shown <= 50 + 1 + c.accepted + 1
    assert f"showing {shown - 2} of 300 nodes: the top 50" in fig.layout.title.text
    pts = node_points(fig)
    for i in c.accepted_nodes.tolist():
        assert i in pts


def test_tree_1024_nodes_builds_fast(record_property):
    c = synthetic_cycle(1024, seed=2)
    assert c.n_nodes == 1024
    views.tree_figure(synthetic_cycle(64, seed=3))  # warm plotly's validators
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fig = views.tree_figure(c)
        times.append(time.perf_counter() - t0)
    best = min(times)
    record_property("tree_1024_seconds", best)
    print(f"\n1024-node tree_figure build: {1e3 * best:.1f} ms (best of 3)")
    assert views.tree_node_count(fig) == 1024 + 2
    pts = node_points(fig)
    assert len({(x, y) for x, y, _ in pts.values()}) == 1026  # no overlaps
    assert best < 1.0  # the target is 200 ms; generous for a loaded CI machine


def test_tree_layout_is_tidy():
    # root -> (1, 2); 1 -> (3, 4); 2 -> 5
    x, y = views.tree_layout([-1, 0, 0, 1, 1, 2])
    assert x.tolist() == [0, 1, 1, 2, 2, 2]
    assert y[3] == 0 and y[4] == 1 and y[5] == 2
    assert y[1] == 0.5 and y[2] == 2 and y[0] == 1.25


def test_draft_heatmap_and_mask(tiny, ddtree_trace):
    c = max(ddtree_trace.cycles, key=lambda c: c.accepted)
    fig = views.draft_heatmap(c, tiny.tokenizer)
    hm = fig.data[0]
    D, k = c.draft_topk_tokens.shape
    assert np.asarray(hm.z).shape == (D, k)
    np.testing.assert_allclose(np.asarray(hm.z), np.exp(c.draft_topk_logprobs.numpy()), rtol=1e-5)
    marks = fig.data[1]
    assert len(marks.x) <= c.accepted
    for x, y in zip(marks.x, marks.y):  # marked cells hold the accepted token of that depth
        assert int(c.draft_topk_tokens[y - 1, x]) == int(c.accepted_tokens[y])
    m = views.mask_figure(c, tiny.tokenizer)
    assert np.array_equal(np.asarray(m.data[0].z).astype(bool), c.visibility.numpy())
    # AR cycles have no drafted slots: a message, not an error
    ar = tiny.generate("t1", wb.AR(), max_new_tokens=3)
    assert views.draft_heatmap(ar[0]).layout.annotations


def test_the_mask_figures_key_labels_sit_below_its_title(tiny, ddtree_trace):
    """The key labels stand upright above the mask (their height: their length); the title is pinned to the
    figure's top, and the top margin holds the title, the axis title and the tallest label one above the other."""
    import html

    char, line, axis_title = 6, 24, 16  # at least: px a 12 px label character, a title line, the axis title take
    c = max(ddtree_trace.cycles, key=lambda c: c.n_nodes)
    for max_nodes in (None, 3):  # one title line; two, when the mask shows only some nodes
        lay = views.mask_figure(c, tiny.tokenizer, max_nodes=max_nodes).layout
        tallest = max(len(html.unescape(t)) for t in lay.xaxis.ticktext)
        assert lay.xaxis.side == "top" and lay.xaxis.tickangle == -90
        assert (lay.title.yref, lay.title.y, lay.title.yanchor) == ("container", 1, "top")
        lines = 2 if lay.title.subtitle.text else 1
        assert (lay.title.subtitle.text is not None) == (max_nodes is not None)
        assert lay.margin.t >= (lay.title.pad.t or 0) + line * lines + axis_title + char * tallest
        assert lay.height >= lay.margin.t + lay.margin.b + 12 * len(lay.xaxis.ticktext)  # the cells keep their room


# ----------------------------------------------------------------------------- streams and comparisons
def test_token_stream_covers_generated_text(tiny, ddtree_trace):
    tok = tiny.tokenizer
    fig = views.token_stream(ddtree_trace, tok)
    cells = {}
    for t in fig.data:
        for r, (zrow, trow) in enumerate(zip(t.z, t.text)):
            for col, (z, ch) in enumerate(zip(zrow, trow)):
                if z is not None:
                    assert (r, col) not in cells  # one layer per cell
                    cells[(r, col)] = ch
                else:
                    assert ch == ""
    text = "".join(cells[k] for k in sorted(cells))
    generated = [int(ddtree_trace[0].root_token)]
    for c in ddtree_trace:
        generated += (c.accepted_tokens.tolist()[1:] + [c.bonus])[: c.committed]
    assert len(generated) == ddtree_trace.new_tokens
    want = "".join(views.visible(views.token_text(tok, t)) for t in generated)
    assert text == want
    for t in fig.data[1:]:
        hovers = [h for row in t.hovertext for h in row if h]
        assert hovers and all(h.startswith("cycle ") and "accept length" in h for h in hovers)


def test_token_stream_2000_cycles():
    trace = synthetic_trace(2000)
    t0 = time.perf_counter()
    fig = views.token_stream(trace)
    dt = time.perf_counter() - t0
    print(f"\n2000-cycle token_stream build: {1e3 * dt:.0f} ms")
    assert fig.layout.meta["cycles"] == 2000
    assert fig.layout.yaxis.range[0] < fig.layout.meta["rows"]  # opens on a window, pannable
    assert fig.layout.dragmode == "pan"
    assert fig.layout.height < 800
    assert dt < 10


def test_acceptance_and_stage_figures_accept_traces_lists_and_dicts(ddtree_trace):
    other = synthetic_trace(30)
    d = {"accept_lengths": [1, 2, 2, 3], "stage_seconds": {"draft": 0.5, "verify": 1.0}}
    for arg, names in [(ddtree_trace, ["DDTree(16)"]), ([ddtree_trace, other], ["DDTree(16)", "DFlash"]),
                       ({"A": ddtree_trace, "B": d}, ["A", "B"])]:
        fig = views.acceptance_figure(arg)
        bars = [t for t in fig.data if t.type == "bar"]
        assert [b.name for b in bars] == names
        fig2 = views.stage_times_figure(arg)
        assert fig2.layout.barmode == "stack"
        assert [t.name for t in fig2.data][: len(STAGES)] == list(STAGES)
        assert all(list(t.x) == names for t in fig2.data)
    fig = views.acceptance_figure({"B": d})
    assert list(fig.data[0].x) == [1, 2, 3] and list(fig.data[0].customdata) == [1, 2, 1]
    np.testing.assert_allclose(fig.data[1].y, [1, 1.5, 5 / 3, 2])
    st = views.stage_times_figure({"B": d})
    ys = {t.name: t.y[0] for t in st.data}
    assert ys["draft"] == pytest.approx(500) and ys["verify"] == pytest.approx(1000) and ys["commit"] == 0
    with pytest.raises(TypeError):
        views.acceptance_figure({"x": 3})


# ----------------------------------------------------------------------------- the stepper, from Python
def test_stepper_step_updates_in_place(tiny):
    st = views.Stepper(tiny.session("t1 t2 t3", policy=wb.DDTree(8), max_new_tokens=40))
    tree_widget = st.tree
    assert isinstance(tree_widget, go.FigureWidget)
    assert views.tree_node_count(st.tree) == 0 and st.slider.disabled
    st.step_button.click()  # the button's click handlers run
    assert len(st.session.cycles) == 1 and st.slider.max == 0 and st.shown_cycle == 0
    first = views.tree_node_count(st.tree)
    assert first == st.session.cycles[0].n_nodes + 2
    x_before = [list(t.x) for t in st.tree.data]
    st.step()
    assert st.slider.max == 1 and st.slider.value == 1 and st.shown_cycle == 1
    assert st.tree is tree_widget  # same widget, updated in place
    assert [list(t.x) for t in st.tree.data] != x_before or \
        st.tree.layout.title.text.startswith("cycle 1")
    assert st.tree.layout.title.text.startswith("cycle 1")
    assert st.stream.layout.meta["cycles"] == 2
    assert "tau" in st.stats.value
    # the slider goes back to a past cycle
    st.slider.value = 0
    assert st.shown_cycle == 0 and st.tree.layout.title.text.startswith("cycle 0")
    st.show_cycle(-1)
    assert st.shown_cycle == 1


def test_stepper_controls_apply_to_next_cycle_and_reset(tiny):
    st = views.Stepper(tiny.session("t1 t2", policy=wb.DDTree(8), max_new_tokens=60))
    st.budget.value = 3
    c = st.step()
    assert c.policy == "DDTree(3)" and c.n_nodes <= 3
    assert views.tree_node_count(st.tree) == c.n_nodes + 2
    st.policy_kind.value = "dflash"
    assert st.budget.disabled
    st.temperature.value = 0.5
    c = st.step()
    assert c.policy == "DFlash" and c.temperature == 0.5
    st.run_n.value = 3
    st.run_button.click()
    assert len(st.session.cycles) == 5 and st.slider.max == 4 and st.shown_cycle == 4
    old = st.session
    st.reset_button.click()
    assert st.session is not old and st.session.prompt == old.prompt
    assert len(st.session.cycles) == 0 and st.slider.max == 0 and views.tree_node_count(st.tree) == 0
    assert str(st.session.policy) == "DFlash" and st.session.temperature == 0.5
    st.step()
    assert st.slider.max == 0 and st.shown_cycle == 0


def test_stepper_finished_session_says_so(tiny):
    st = views.Stepper(tiny.session("t1", policy=wb.DDTree(4), max_new_tokens=3))
    st.run(50)
    assert st.session.finished and st.step_button.disabled
    assert st.step() is None
    assert "finished" in st.status.value
    with pytest.raises(IndexError):
        st.show_cycle(99)


# ----------------------------------------------------------------------------- export
NET_SRC = re.compile(r"<script[^>]+src=[\"']?(https?:)?//", re.I)


def test_save_html_self_contained_and_atomic(tmp_path, tiny, ddtree_trace):
    fig = views.tree_figure(ddtree_trace[0], tiny.tokenizer)
    with pytest.raises(ValueError, match="does not exist"):  # a missing folder is refused, not created
        views.save_html(fig, tmp_path / "sub" / "tree.html")
    assert not (tmp_path / "sub").exists()
    (tmp_path / "sub").mkdir()
    p = views.save_html(fig, tmp_path / "sub" / "tree.html")
    html = p.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert not NET_SRC.search(html)
    assert "Plotly.newPlot" in html and len(html) > 1_000_000  # plotly.js is inline
    assert [f.name for f in p.parent.iterdir()] == ["tree.html"]  # no temp file left behind
    st = views.Stepper(tiny.session("t1 t2", policy=wb.DDTree(8), max_new_tokens=20))
    st.step()
    p2 = views.save_html(st, tmp_path / "stepper.html")
    h2 = p2.read_text()
    assert not NET_SRC.search(h2) and h2.count("Plotly.newPlot") == 2
    assert h2.count("<script type=\"text/javascript\">/**") <= 1  # plotly.js inlined once
    with pytest.raises(TypeError):
        views.save_html(object(), tmp_path / "x.html")
    assert not (tmp_path / "x.html").exists()


def test_write_report_from_trace_file(tmp_path, ddtree_trace, tiny):
    path = ddtree_trace.save(tmp_path / "run.jsonl")
    ar = tiny.generate("t1 t2 t3", wb.AR(), max_new_tokens=8).save(tmp_path / "ar.jsonl")
    out = views.write_report([path, ar], tmp_path / "report.html")
    html = out.read_text()
    assert not NET_SRC.search(html)
    assert "http://" not in html.split("<body>")[1][:2000]
    assert "DDTree(16)" in html and "AR" in html
    assert html.count("Plotly.newPlot") >= 4
    # one page from a single path too, and a broken trace file is reported, not half-written
    views.write_report(str(path), tmp_path / "one.html")
    (tmp_path / "bad.jsonl").write_text("{}\n")
    with pytest.raises(wb.TraceFileError):
        views.write_report(tmp_path / "bad.jsonl", tmp_path / "bad.html")
    assert not (tmp_path / "bad.html").exists()


def test_stepper_labels_every_registered_policy(tiny):
    """The menu is the policy registry: an EagleTree shows as one (not as DFlash), a Spine's siblings sit
    in the first box, and a user's TreePolicy joins the menu while the session uses it."""
    from ddtree_kernels import chain_tree

    s = tiny.session("t1 t2", policy=wb.EagleTree(2, 3, 6), max_new_tokens=40)
    st = views.Stepper(s)
    assert st.policy_kind.value == "eagle" and dict(st.policy_kind.options)["EagleTree"] == "eagle"
    assert st.budget.value == 6 and st.budget.description == "num_draft_tokens"
    assert st.step().policy == "EagleTree(2, 3, 6)"
    st.policy_kind.value = "spine"
    assert s.policy == wb.Spine() and st.budget.description == "siblings" and st.width.disabled
    st.budget.value = 4
    assert st.step().policy == "Spine(4)"
    st.policy_kind.value = "eagle"  # back: the EagleTree last used, not the defaults
    assert s.policy == wb.EagleTree(2, 3, 6)
    s.policy = wb.TreePolicy(lambda lp, r, b: chain_tree(lp.argmax(-1)[:, :b], r, lp[:, :b]), "mine", budget=3)
    st.step()
    assert ("mine", "tree") in st.policy_kind.options and st.policy_kind.value == "tree"
    st.budget.value = 2
    assert st.step().policy == "mine(2)"
