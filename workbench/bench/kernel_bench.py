"""The tree kernels' micro-bench (``python -m workbench kernels``): tree build, the accept walk and KV compaction
against their plain baselines and oracles, medians with their spread, contradictory rows flagged."""
from __future__ import annotations

import statistics

import torch

from workbench.bench.opcount import OpCounter
from workbench.bench.versions import versions
from workbench.engine.core import clock
from workbench.engine.policies import MAX_BUDGET
from workbench.records.texttable import legend, text_table


KERNEL_BUDGETS = (16, 32, 64, 128, 256, 512, 1024)


def _times(fn, repeats: int, device: torch.device) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn()``, after one warm-up call."""
    fn()
    ts = []
    for _ in range(repeats):
        t0 = clock(device)
        fn()
        ts.append(clock(device) - t0)
    return ts


def _timed(row: dict, key: str, fn, repeats: int, device) -> float:
    """Time ``fn`` into row[key + '_s'] (median) and row[key + '_range_s'] ([min, max] over the calls)."""
    ts = _times(fn, repeats, device)
    row[f"{key}_s"], row[f"{key}_range_s"] = statistics.median(ts), [min(ts), max(ts)]
    return row[f"{key}_s"]


def _path_choice(tree) -> torch.Tensor:
    """A target 'choice' per node that accepts the tree's deepest root-to-leaf path (the longest walk)."""
    n = tree.n
    parents = tree.parents[0].tolist()
    tokens = tree.tokens[0].tolist()
    depth = tree.depth[0].tolist()
    choice = torch.full((1, n), -1, dtype=torch.long)  # no node carries token -1: the walk stops there
    node = depth.index(max(depth))
    while parents[node] >= 0:
        choice[0, parents[node]] = tokens[node]
        node = parents[node]
    return choice


def time_kernels(budgets=KERNEL_BUDGETS, repeats: int = 10, device="cpu", depth: int = 15, vocab: int = 4096,
                 backends=("torch", "sglang"), seed: int = 0, progress=None) -> dict:
    """Micro-benchmarks of the tree kernels, medians side by side in one run.

    tree_build: vectorized ``build_tree`` vs a host heap over the top-k (``build_tree_host_heap``, the
    plain baseline) on random log-probs [1, depth, vocab], and build + compile together;
    accept: the accept walk through each backend on that tree (torch vs SGLang's Triton kernel,
    under Triton's interpreter on a CPU); kv_compact: ``compact_kv`` vs the per-row loop oracle.
    Unavailable backends are reported with an ``error`` instead of a time.
    """
    from tqdm.auto import tqdm

    from ddtree_kernels import accept, build_tree, compile_tree
    from workbench.engine.loading import resolve_device

    dev = resolve_device(device)
    budgets = checked_budgets(budgets, repeats)
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(1, depth, vocab, generator=g) * 3, dim=-1).to(dev)  # [1, depth, vocab]
    root = torch.tensor([1], device=dev)
    prefix = 512
    available = backend_errors(backends)
    out = {"device": str(dev), "threads": torch.get_num_threads(), "logprobs_shape": [1, depth, vocab],
           "repeats": repeats, "seed": seed, "versions": versions(), "tree_build": [], "accept": [], "kv_compact": []}
    # Three steps per budget (tree build, accept walk, KV compaction), so a large budget shows progress.
    bar = tqdm(total=3 * len(budgets), desc="kernels", unit="step", leave=False,
               disable=(None if progress is None else not progress))
    for b in budgets:
        bar.set_postfix_str(f"budget {b}: tree build", refresh=True)
        out["tree_build"].append(tree_build_row(b, lp, root, prefix, depth, repeats, dev))
        bar.update(1)
        bar.set_postfix_str(f"budget {b}: accept walk", refresh=True)
        tree = build_tree(lp, root, b)
        ct = compile_tree(tree, prefix, depth)
        choice = _path_choice(tree).to(dev)
        out["accept"].append(accept_row(b, tree, ct, choice, depth, available, repeats, dev))
        bar.update(1)
        bar.set_postfix_str(f"budget {b}: KV compaction", refresh=True)
        acc = accept("torch", tree, ct, choice, depth)
        out["kv_compact"].append(kv_compact_row(b, tree, acc, prefix, g, repeats, dev))
        bar.update(1)
    bar.close()
    out["cond_build"] = cond_build_rows(budgets, repeats, dev, depth, vocab, seed)
    return out


def checked_budgets(budgets, repeats) -> list[int]:
    """The budgets as ints, each once and within DDTree's limit, and ``repeats`` a positive int (ValueError)."""
    budgets = [int(b) for b in budgets]
    twice = sorted({b for b in budgets if budgets.count(b) > 1})
    if twice:
        raise ValueError(f"budget {twice[0]} is given twice; give each budget once")
    for b in budgets:
        if b < 1:
            raise ValueError(f"budget {b} must be a positive integer")
        if b > MAX_BUDGET:
            raise ValueError(f"budget {b} is absurdly large; the limit is {MAX_BUDGET} nodes, as for DDTree")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be a positive integer")
    return budgets


def backend_errors(backends) -> dict[str, str | None]:
    """{backend: None where it runs here, else why not}."""
    from ddtree_kernels import check_backend

    available = {}
    for b in backends:
        try:
            check_backend(b)
            available[b] = None
        except (ValueError, RuntimeError) as e:
            available[b] = str(e)
    return available


def tree_build_row(b: int, lp, root, prefix: int, depth: int, repeats: int, dev) -> dict:
    """build_tree vs the host heap, and build + compile, at budget ``b``; medians that contradict each other
    flagged, and on a GPU whether the build runs without a host sync."""
    from ddtree_kernels import build_tree, compile_tree
    from ddtree_kernels.oracles import build_tree_host_heap

    row = {"budget": b}
    vec = _timed(row, "vectorized", lambda: build_tree(lp, root, b), repeats, dev)
    heap = _timed(row, "heap", lambda: build_tree_host_heap(lp, root, b), repeats, dev)
    both = _timed(row, "build_compile", lambda: compile_tree(build_tree(lp, root, b), prefix, depth), repeats, dev)
    row["heap_over_vectorized"] = heap / vec
    # build + compile runs the build, so it cannot truly be faster: a busy machine measured one of them
    why = []
    if both < vec:
        why.append(f"build+compile ({1e6 * both:.0f} us) < build alone ({1e6 * vec:.0f} us)")
    # On a CPU build_tree *is* a host heap: the two medians cannot truly differ several times over.
    if dev.type == "cpu" and not 0.5 <= heap / vec <= 2:
        why.append(f"heap ({1e6 * heap:.0f} us) and build_tree ({1e6 * vec:.0f} us) run the same host heap on a "
                   f"CPU yet differ {max(heap / vec, vec / heap):.1f}x")
    if why:
        row["contradiction"] = "; ".join(why) + ": the machine was busy during one of them; rerun on an idle machine"
    if dev.type == "cuda":  # the build must not wait on the host: torch raises on a synchronising call
        try:  # steady state: the per-budget candidate table was built (and cached) by the calls above
            torch.cuda.set_sync_debug_mode("error")
            build_tree(lp, root, b)
            row["host_sync_free"] = True
        except RuntimeError:
            row["host_sync_free"] = False
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return row


def accept_row(b: int, tree, ct, choice, depth: int, available: dict, repeats: int, dev) -> dict:
    """The accept walk through each backend on the budget-``b`` tree (an unavailable one: its error)."""
    from ddtree_kernels import accept

    arow = {"budget": b, "nodes": tree.n}
    for name, err in available.items():
        if err is not None:
            arow[f"{name}_s"], arow[f"{name}_error"] = None, err
            continue
        _timed(arow, name, lambda name=name: accept(name, tree, ct, choice, depth), repeats, dev)
    if arow.get("torch_s") and arow.get("sglang_s"):
        arow["sglang_over_torch"] = arow["sglang_s"] / arow["torch_s"]
    return arow


def kv_compact_row(b: int, tree, acc, prefix: int, g: torch.Generator, repeats: int, dev,
                   heads: int = 8, head_dim: int = 64) -> dict:
    """compact_kv vs the per-row loop oracle over the accepted rows of random K/V [1, heads, prefix + n, head_dim]."""
    from ddtree_kernels import compact_kv
    from ddtree_kernels.oracles import compact_kv_loop

    nodes = acc.index[0, : int(acc.length[0]) + 1]
    kv = torch.randn(1, heads, prefix + tree.n, head_dim, generator=g).to(dev)
    krow = {"budget": b, "accepted": int(nodes.numel()), "kv_shape": list(kv.shape)}
    fast = _timed(krow, "compact_kv", lambda: compact_kv(kv, prefix, nodes), repeats, dev)
    loop = _timed(krow, "loop", lambda: compact_kv_loop(kv, prefix, nodes.tolist()), repeats, dev)
    krow["loop_over_compact"] = loop / fast
    return krow


COND_ROWS = (1, 8)  # batch rows of the conditioned build's rows


def random_head(vocab: int, hidden: int, seed: int, rank: int = 64, K: int = 16):
    """A conditioned head of random weights (``workbench.engine.policies.cond_head.CondHead``): its cost is its
    shapes'."""
    import numpy as np

    from workbench.engine.policies.cond_head import BUCKETS, CondHead

    r = np.random.default_rng(seed)
    shapes = {"P": (rank, hidden), "p0": (rank,), "E": (vocab, rank), "R": (BUCKETS, rank), "U": (vocab, rank),
              "u_out": (rank,), "scalars": (2,)}
    return CondHead("random", {k: (0.05 * r.standard_normal(v)).astype(np.float32) for k, v in shapes.items()},
                    {"K": K})


def cond_build_rows(budgets, repeats: int, dev, depth: int, vocab: int, seed: int, hidden: int = 256) -> list[dict]:
    """The conditioned tree's build beside DDTree's at each budget and batch rows (``COND_ROWS``), each from the
    drafted log-probs [rows, depth, vocab]: DDTree's build on this device (``build_tree``: a host heap on a CPU),
    DDTree's vectorised build alone, CondTree's stage as a cycle runs it (a new draft's top-K, the head's
    increments, the build for this device), the increments alone (as the stage scores them: NumPy on a CPU), and
    its two builds alone (the vectorised ``ddtree_kernels.cond_tree`` and the host heap)."""
    from ddtree_kernels import build_tree
    from ddtree_kernels.cond_tree import build_cond_tree
    from ddtree_kernels.path_tree import path_tree_heap, rank_class
    from ddtree_kernels.tree_build import build_tree_vectorized, sorted_slots, top_slots
    from workbench.engine.policies import CondTree
    from workbench.engine.policies.cond_head import conditioned_increments, host_increments
    from workbench.engine.stages.draft import Draft

    g = torch.Generator().manual_seed(seed + 1)
    head = random_head(vocab, hidden, seed)
    out = []
    for b in budgets:
        for rows in COND_ROWS:
            lp = torch.log_softmax(torch.randn(rows, depth, vocab, generator=g) * 3, dim=-1).to(dev)
            h = torch.randn(rows, depth, hidden, generator=g).to(dev)
            root = torch.arange(1, rows + 1, device=dev)
            k, K = min(b, vocab), min(head.K, vocab)
            policy = CondTree(b).bound_to(head)
            topv, topi = top_slots(lp, K)
            inc = conditioned_increments(head, h, topv, topi, root, min(b, K))
            dv, di = sorted_slots(lp, k)
            row = {"budget": b, "rows": rows}
            ddtree = _timed(row, "ddtree", lambda: build_tree(lp, root, b), repeats, dev)
            _timed(row, "ddtree_vectorized_build", lambda: build_tree_vectorized(dv, di, root, b), repeats, dev)
            cond = _timed(row, "cond", lambda: policy.build_tree(Draft(lp, None, hidden=h), root, dev.type != "cpu"),
                          repeats, dev)
            host = (h.numpy(), topv.numpy(), topi.numpy(), root.numpy()) if dev.type == "cpu" else None
            _timed(row, "cond_head", lambda: conditioned_increments(head, h, topv, topi, root, min(b, K))
                   if host is None else host_increments(head, *host, min(b, K)), repeats, dev)
            _timed(row, "cond_build", lambda: build_cond_tree(inc, topi[..., : min(b, K)], root, b), repeats, dev)
            _timed(row, "cond_heap", lambda: path_tree_heap(inc, topi[..., : min(b, K)], root, b, rank_class, 0),
                   repeats, dev)
            row["cond_over_ddtree"] = cond / ddtree
            row["ddtree_vec_kernels"] = kernels(lambda: build_tree_vectorized(dv, di, root, b))
            row["cond_vec_kernels"] = kernels(lambda: build_cond_tree(conditioned_increments(
                head, h, topv, topi, root, min(b, K)), topi[..., : min(b, K)], root, b))
            out.append(row)
    return out


def kernels(fn) -> int:
    """Kernels ``fn()`` dispatches (``workbench.bench.opcount``): under CUDA graphs a build this small costs about
    a launch each, whatever its tensors' sizes."""
    with OpCounter() as c:
        fn()
    return c.kernels


def cond_table(rows: list[dict]) -> str:
    def us(v):
        return f"{1e6 * v:.0f}"

    body = [["", str(r["budget"]), str(r["rows"]), us(r["ddtree_s"]), us(r["ddtree_vectorized_build_s"]),
             us(r["cond_s"]), us(r["cond_head_s"]), us(r["cond_build_s"]), us(r["cond_heap_s"]),
             f"{r['cond_over_ddtree']:.2f}", f"{r['cond_build_s'] / r['ddtree_vectorized_build_s']:.2f}",
             f"{r['ddtree_vec_kernels']} / {r['cond_vec_kernels']}"] for r in rows]
    return text_table(["conditioned build", "budget", "rows", "ddtree", "ddtree vec", "cond", "cond head",
                       "cond vec", "cond heap", "cond/ddtree", "vec/vec", "kernels"], body)


def kernel_table(res: dict) -> str:
    """The kernel medians with their min-max over the timed calls; contradictory rows flagged '!'."""
    def us(v):
        return "n/a" if v is None else f"{1e6 * v:.0f}"

    def rng(r, key):
        v = r.get(f"{key}_range_s")
        return "-" if not v else f"{1e6 * v[0]:.0f}-{1e6 * v[1]:.0f}"

    tb = res["tree_build"]
    sync = bool(tb) and "host_sync_free" in tb[0]
    head = ["tree build", "budget", "build_tree", "range", "heap", "range", "heap/ours", "build+compile", "range",
            *(["sync-free"] if sync else []), "flag"]
    rows = [["", str(r["budget"]), us(r["vectorized_s"]), rng(r, "vectorized"), us(r["heap_s"]), rng(r, "heap"),
             f"{r['heap_over_vectorized']:.2g}", us(r["build_compile_s"]), rng(r, "build_compile"),
             *([str(r["host_sync_free"])] if sync else []), "!" if "contradiction" in r else ""] for r in tb]
    lines = [f"device {res['device']}, {res['threads']} threads, log-probs {res['logprobs_shape']}; "
             f"microseconds: median of {res['repeats']} calls, range = min-max over them", "",
             text_table(head, rows)]
    lines += [f"  ! budget {r['budget']}: {r['contradiction']}" for r in tb if "contradiction" in r]
    arows = [["", str(r["budget"]), str(r["nodes"]), us(r.get("torch_s")), rng(r, "torch"), us(r.get("sglang_s")),
              rng(r, "sglang"), f"{r['sglang_over_torch']:.1f}" if "sglang_over_torch" in r else "-"]
             for r in res["accept"]]
    lines += ["", text_table(["accept walk", "budget", "nodes", "torch", "range", "sglang", "range", "sglang/torch"],
                             arows)]
    errs = {k: v for r in res["accept"] for k, v in r.items() if k.endswith("_error")}
    for k, v in errs.items():
        lines.append(f"{'':16}{k[:-6]}: {v}")
    krows = [["", str(r["budget"]), str(r["accepted"]), us(r["compact_kv_s"]), rng(r, "compact_kv"), us(r["loop_s"]),
              rng(r, "loop"), f"{r['loop_over_compact']:.1f}"] for r in res["kv_compact"]]
    lines += ["", text_table(["kv compaction", "budget", "accepted", "compact_kv", "range", "loop", "range",
                              "loop/compact"], krows)]
    if res.get("cond_build"):
        lines += ["", cond_table(res["cond_build"])]
    lines += ["", legend([
        ("build_tree", "our tree build (host heap on a CPU, vectorized on a GPU)"),
        ("heap", "the plain baseline: top-k, one copy to the host, a Python heap"),
        ("heap/ours", "heap median / build_tree median (> 1: ours faster)"),
        ("build+compile", "build_tree then compile_tree (verify inputs); never truly below build_tree alone"),
        ("flag", "'!': the row's measurements contradict each other (a busy machine); see the note"),
        ("accept walk", "the walk through each backend; sglang = SGLang's kernel (Triton interpreter on a CPU)"),
        ("kv compaction", "compact_kv vs a per-row loop over the accepted rows"),
        ("conditioned build", "per batch of rows, from the drafted log-probs [rows, 15, V]: ddtree = DDTree's "
                              "build_tree (its stage: top-k and build), ddtree vec = its vectorised build alone "
                              "from the top-k, cond = CondTree's stage (top-16, a random head's increments, the "
                              "build this device runs), cond head = the head's increments alone (NumPy on a "
                              "CPU), cond vec = the vectorised conditioned build alone, cond heap = its host "
                              "heap alone, vec/vec = cond vec / ddtree vec, kernels = kernels dispatched by "
                              "ddtree vec / by cond vec with its head (a launch each on a GPU)")])]
    return "\n".join(lines)
