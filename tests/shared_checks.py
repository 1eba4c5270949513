"""Helpers shared by test files in different folders (imported by bare name: pytest's ``pythonpath`` in
pyproject.toml puts tests/ on the path): the sampling-law check, greedy output against plain decoding,
transformers' own greedy generate, random trees for the GatedDeltaNet kernels, the no-host-sync guard, and a
command's main run in this process."""
from __future__ import annotations

import importlib.util
import json
import math
import urllib.error
import urllib.request

import torch
from torch.overrides import TorchFunctionMode

from ddtree_kernels import Tree
from workbench.engine.graphs import host_read


# ----------------------------------- sampling law: tests/engine/test_engine.py, tests/models/test_hybrid.py

def assert_sampling_law(eng, prompt: str, policy, sampling: dict, n: int) -> None:
    """n seeded sessions of 3 tokens: their joint law == the target's own (chi-square), with drafts accepted."""
    from workbench.engine.sampling import Sampling

    counts: dict = {}
    accepted_drafts = 0
    for seed in range(n):
        s = eng.session(prompt, policy=policy, max_new_tokens=3, seed=seed, **sampling)
        s.run()
        accepted_drafts += sum(c.accepted for c in s.cycles)
        key = tuple(s.tokens)
        counts[key] = counts.get(key, 0) + 1
    assert accepted_drafts > n // 4, "drafted tokens were rarely accepted: the test would not exercise verify"
    probs = exact_joint(eng, eng.tokenizer(prompt)["input_ids"], 3, Sampling(**sampling))
    # Pool cells with small expectation so the chi-square approximation holds.
    stat, df, pooled_o, pooled_e = 0.0, 0, 0, 0.0
    for key, p in probs.items():
        e = p * n
        if e < 5:
            pooled_o += counts.get(key, 0)
            pooled_e += e
            continue
        stat += (counts.get(key, 0) - e) ** 2 / e
        df += 1
    if pooled_e > 0:
        stat += (pooled_o - pooled_e) ** 2 / max(pooled_e, 1e-9)
        df += 1
    assert set(counts) <= {k for k, p in probs.items() if p > 0}
    pvalue = chi_square_pvalue(stat, df - 1)
    assert pvalue > 1e-3, f"chi2={stat:.1f} df={df - 1} p={pvalue:.2e}"


def exact_joint(engine, prompt_ids, n_tokens, sampling):
    """P(first n generated tokens | prompt) under the target's own sampling, by enumeration.

    A sequence that reaches end-of-text stops there, as generation does.
    """
    from workbench.engine.sampling import target_probs

    eos = engine.models.eos_token_ids
    probs = {}

    def walk(seq, p):
        if len(seq) == n_tokens or (seq and seq[-1] in eos):
            probs[tuple(seq)] = p
            return
        with torch.inference_mode():
            logits = engine.models.target(input_ids=torch.tensor([prompt_ids + seq])).logits[0, -1]
        dist = target_probs(logits, sampling)
        for t in range(dist.shape[0]):
            if float(dist[t]) > 0:
                walk(seq + [t], p * float(dist[t]))

    walk([], 1.0)
    return probs


def chi_square_pvalue(stat: float, df: int) -> float:
    """Upper tail of chi-square via the Wilson-Hilferty normal approximation."""
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


# ----------------------- lossless: tests/engine/test_tree_policies.py, tests/engine/test_new_policies.py

def assert_greedy_equals_ar(engine, prompts, policies, max_new_tokens: int, *, batch: bool = False,
                            seeded: bool = False, node_cap=None, label: str = "") -> None:
    """Every policy's greedy output equals plain decoding's (``wb.AR()``) token for token on every prompt: the
    property every tree policy must have (docs/architecture.md, "Add a tree policy"), checked one way for all.

    ``batch``: each policy runs the prompts as one BatchSession (AR still alone, the reference); ``seeded``:
    prompt i's sessions take ``seed=i``; ``node_cap(policy)``: the most nodes any cycle of a solo run may verify
    (beside the root); ``label`` starts each failure's line (e.g. the random model's shape)."""
    from workbench.bench.policy_bench import first_difference
    from workbench.engine.policies import AR

    def solo(prompt, policy, i):
        s = engine.session(prompt, policy=policy, max_new_tokens=max_new_tokens, **({"seed": i} if seeded else {}))
        s.run()
        return s

    ref = [solo(p, AR(), i).tokens for i, p in enumerate(prompts)]
    for policy in policies:
        if batch:
            b = engine.batch_session(prompts, policy=policy, max_new_tokens=max_new_tokens)
            b.run()
            got = [s.tokens for s in b.sessions]
        else:
            got = []
            for i, p in enumerate(prompts):
                s = solo(p, policy, i)
                got.append(s.tokens)
                if node_cap is not None:
                    cap = node_cap(policy)
                    assert all(c.n_nodes <= cap for c in s.cycles), f"{label}{policy} prompt {i}: over {cap} nodes"
        for i, (r, g) in enumerate(zip(ref, got)):
            assert g == r, (f"{label}{policy} prompt {i} {prompts[i]!r:.40} (batch={batch}): differs at "
                            f"{first_difference(r, g)}")


# --------------------- greedy oracle: tests/models/test_real_layouts.py, tests/engine/test_static_shapes.py

def hf_greedy(engine, ids: list[int], n: int) -> list[int]:
    """transformers' own greedy generate: the independent oracle."""
    m = engine.models
    eos = sorted(m.eos_token_ids)
    out = m.target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                            max_new_tokens=n, do_sample=False, eos_token_id=eos or None, pad_token_id=0)
    return out[0, len(ids):].tolist()


# -------------------------- random trees: tests/kernels/test_gdn_kernels.py, tests/models/test_gdn_layer.py

def random_tree(seed: int, bs: int, n: int) -> Tree:
    """Random shapes: node i's parent uniform over 0..i-1 (so parents precede children), per request."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((bs, n), -1, dtype=torch.long)
    for i in range(1, n):
        parents[:, i] = (torch.rand(bs, generator=g) * i).long()
    depth = torch.zeros(bs, n, dtype=torch.long)
    for i in range(1, n):
        depth[:, i] = depth.gather(1, parents[:, i : i + 1])[:, 0] + 1
    zeros = torch.zeros(bs, n, dtype=torch.long)
    return Tree(torch.randint(0, 50, (bs, n), generator=g), parents, depth, zeros, zeros.float())


# -------------------------- host syncs: tests/kernels/test_sync_free.py, tests/engine/test_static_shapes.py

class NoHostSync(TorchFunctionMode):
    """Raises at the first call that needs a tensor's values on the host (``workbench.engine.graphs.host_read``)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        why = host_read(func, args, kwargs)
        if why is not None:
            raise AssertionError(f"host sync: {why}")
        return func(*args, **kwargs)


# ----------------------------------- batched cycles: tests/serve/test_serve.py, tests/serve/test_serve_batching.py

def same_cycle(a, b) -> None:
    """Every field equal; the float ones (scores, log-probs, probabilities, logits) to float32 rounding: a
    batched forward sums in another order. Not compared: the stage times and forward records, which are
    the shared batch's ([rows, nodes] shapes)."""
    da, db = a.to_dict(), b.to_dict()
    for k in ("stage_seconds", "forwards"):
        da.pop(k), db.pop(k)
    assert da.keys() == db.keys()
    for k in da:
        x, y = da[k], db[k]
        if isinstance(x, dict) and x.get("dtype", "").startswith("float"):
            assert x["shape"] == y["shape"], (a.index, k)
            torch.testing.assert_close(torch.tensor(x["data"]), torch.tensor(y["data"]), atol=1e-4, rtol=1e-4)
        else:
            assert x == y, (a.index, k)


# ----------------------------------- a served engine by hand: tests/serve/test_serve.py, test_serve_isolation.py

def http_call(server, method: str, path: str, body=None, token: str | None = "server", headers=None):
    """A request by hand -> (status, JSON body)."""
    h = {"Content-Type": "application/json", **(headers or {})}
    if token is not None:
        h["Authorization"] = f"Bearer {server.token if token == 'server' else token}"
    data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(server.url + path, data=data, method=method, headers=h)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# ----------------------------------- a repository script as a module: test_tau_regression.py, test_static_figures.py

def load_script(path, name: str):
    """The Python file ``path`` (a tool or the notebook builder, not a package module) imported as ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------- a command in this process: tests/train/, tests/conform/, ...
def run_main(main, capfd, *argv: str) -> tuple[int, str, str]:
    """A command's ``main(argv)`` in the test's own process (torch and the workbench are already imported: a
    subprocess would pay about 4 s of CPU to import them again): (exit code, stdout, stderr)."""
    try:
        rc = main(list(argv))
    except SystemExit as e:  # argparse's --help and its refusals
        rc = e.code
    out, err = capfd.readouterr()
    return rc, out, err
