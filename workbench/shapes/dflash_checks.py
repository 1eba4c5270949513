"""SGLang's own DFlash verify checks, read from the installed source, against a ragged batch of trees.

``dflash_verify_checks(node_counts)`` lists every ``if ...: raise`` guard of the functions SGLang's
DFlash worker calls on the verify logits (``dflash_utils.py``), the path that reaches each (read
from ``DFlashWorkerV2``: the enclosing ``if``/``elif`` test of its call), and whether a ragged batch
(requests with ``node_counts[i]`` tree nodes each, logits flattened to ``sum(node_counts)`` rows)
passes it. ``greedy_accept_call()`` names what the greedy path calls instead: a kernel whose name
says it checks nothing. Nothing is imported from SGLang; each check's condition is evaluated on
stand-in tensors that carry only shapes and devices.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from workbench.shapes.sglang_source import DFLASH_WORKER, parsed_source, find_def

DFLASH_UTILS = "srt/speculative/dflash_utils.py"
# The functions of dflash_utils.py the worker runs on the verify logits, and the argument values it
# passes that shapes alone do not give (the worker passes draft_token_num=int(self.block_size)).
CHECKED = ("compute_dflash_sampling_correct_drafts_and_bonus", "apply_dflash_verify_logits_adjustments")
WORKER_METHODS = ("DFlashWorkerV2._accept_block", "DFlashWorkerV2.forward_batch_generation")


class _T:
    """A tensor stand-in: shape, ndim, device (all a check looks at)."""

    def __init__(self, *shape: int, device: str = "cuda:0"):
        self.shape, self.ndim, self.device = tuple(shape), len(shape), device


@dataclass(frozen=True)
class VerifyCheck:
    function: str  # the dflash_utils function holding the check
    condition: str  # the raising test, as ast.unparse prints it
    message: str  # the literal start of what it raises
    path: str  # which verify path reaches the function (the enclosing test in DFlashWorkerV2)
    ragged: bool | None  # True: a ragged batch passes; False: it raises; None: cannot tell from shapes
    why: str  # the values the condition saw

    def __str__(self) -> str:
        verdict = {True: "passes", False: "FAILS", None: "unknown"}[self.ragged]
        return f"{self.function}: `{self.condition}` -> ragged tree {verdict} ({self.why}); path: {self.path}"


def _message(node: ast.Raise) -> str:
    exc = node.exc
    if isinstance(exc, ast.Call) and exc.args:
        parts = []
        for a in exc.args[:1]:
            for v in (a.values if isinstance(a, ast.JoinedStr) else [a]):
                if isinstance(v, ast.Constant) and isinstance(v.value, str):
                    parts.append(v.value)
                elif isinstance(v, ast.FormattedValue):
                    parts.append("{" + ast.unparse(v.value) + "}")
        return "".join(parts)
    return ast.unparse(exc) if exc else ""


def _callee(node: ast.Call) -> str:
    return getattr(node.func, "id", getattr(node.func, "attr", ""))


def _call_paths(name: str) -> list[str]:
    """For each call of ``name`` in the worker's verify methods: the if/elif tests around it."""
    tree = parsed_source(DFLASH_WORKER)
    out: list[str] = []

    def visit(node, where, tests):
        if isinstance(node, ast.If):
            t = ast.unparse(node.test)
            for st in node.body:
                visit(st, where, [*tests, t])
            for st in node.orelse:
                visit(st, where, [*tests, f"not ({t})"])
            return
        if isinstance(node, ast.Call) and _callee(node) == name:
            out.append(f"{where} when " + (" and ".join(tests) if tests else "always"))
        for child in ast.iter_child_nodes(node):
            visit(child, where, tests)

    for where in WORKER_METHODS:
        try:
            visit(find_def(tree, where), where, [])
        except ValueError:  # a method this sglang version does not have
            continue
    return out


_BUILTINS = ("len", "tuple", "int", "float")


def _stand_ins(node_counts: list[int], vocab: int, block_size: int, padded: bool) -> dict:
    bs, total = len(node_counts), sum(node_counts)
    width = max(node_counts)
    cand = _T(bs, width) if padded else _T(total)
    return {
        "candidates": cand, "next_token_logits": _T(total, vocab), "draft_token_num": block_size,
        # the worker's call passes no uniform samples: those checks see their default, None
        "sampling_info": [None] * bs, "uniform_samples": None, "uniform_samples_for_final_sampling": None, "len": len, "tuple": tuple, "int": int, "float": float,
    }


def _checks_of(fn: ast.FunctionDef, ns: dict, path: str) -> list[VerifyCheck]:
    """Every top-level raising ``if`` of ``fn``, evaluated on the stand-ins (each on its own, so a batch
    that fails an early check still shows which later ones it would fail), in source order."""
    out = []
    for stmt in fn.body:
        if isinstance(stmt, ast.If) and any(isinstance(st, ast.Raise) for st in stmt.body):
            cond = ast.unparse(stmt.test)
            if "_AVAILABLE" in cond:
                continue  # a build/device availability switch, not a shape check
            raise_node = next(st for st in stmt.body if isinstance(st, ast.Raise))
            names = sorted({n.id for n in ast.walk(stmt.test) if isinstance(n, ast.Name)})
            try:
                fails = bool(eval(compile(ast.Expression(stmt.test), "<sglang check>", "eval"), {}, ns))
                verdict = not fails
                why = ", ".join(f"{n}={_show(ns[n])}" for n in names if n in ns)
            except NameError as e:
                verdict, why = None, f"{e.name} is unknown: the unpacking above failed"
            except Exception as e:  # noqa: BLE001 - a value the stand-ins do not carry
                verdict, why = None, f"cannot evaluate on shapes alone ({type(e).__name__})"
            out.append(VerifyCheck(fn.name, cond, _message(raise_node), path, verdict, why))
        elif isinstance(stmt, ast.Assign):
            try:  # e.g. ``bs, draft_token_num = candidates.shape``: an unpacking that can itself fail
                exec(compile(ast.Module(body=[stmt], type_ignores=[]), "<sglang assignment>", "exec"), {}, ns)
            except ValueError as e:
                out.append(VerifyCheck(fn.name, ast.unparse(stmt), str(e), path, False,
                                       f"candidates={_show(ns['candidates'])}"))
            except Exception:  # noqa: BLE001 - needs SGLang's runtime (get_spec(), ...): not a shape
                pass
    return out


def _show(v) -> str:
    if isinstance(v, _T):
        return f"shape {list(v.shape)} on {v.device}"
    if isinstance(v, list):
        return f"{len(v)} requests"
    return repr(v)


def dflash_verify_checks(node_counts: list[int], vocab: int = 151_936, block_size: int = 16,
                         padded: bool = False) -> list[VerifyCheck]:
    """SGLang's DFlash verify checks against a ragged batch of trees (see the module docstring).

    ``padded=False``: candidates flattened like the logits, ``[sum(node_counts)]`` (SGLang's ragged
    layout); ``padded=True``: candidates padded to ``[bs, max(node_counts)]``. ImportError (one line)
    when sglang is not installed.
    """
    if not node_counts or any(not isinstance(n, int) or n < 1 for n in node_counts):
        raise ValueError(f"node_counts={node_counts!r} must be positive integers, one per request")
    tree = parsed_source(DFLASH_UTILS)
    out = []
    for name in CHECKED:
        fn = find_def(tree, name)
        paths = _call_paths(name)
        params = {a.arg for a in (*fn.args.args, *fn.args.kwonlyargs)}
        ns = {k: v for k, v in _stand_ins(node_counts, vocab, block_size, padded).items()
              if k in params or k in _BUILTINS}  # only what the function is given
        out += _checks_of(fn, ns, "; ".join(paths) if paths else "not called by DFlashWorkerV2")
    return out


def greedy_accept_call() -> tuple[str, str]:
    """(function, the test that selects it) for the greedy accept in ``DFlashWorkerV2._accept_block``:
    the call in the ``else`` branch after the sampling path, read from the source."""
    fn = find_def(parsed_source(DFLASH_WORKER), "DFlashWorkerV2._accept_block")
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            name = _callee(node)
            if "accept" in name and "unchecked" in name:
                return name, "greedy: sampling_info is None or all requests greedy (the else branch)"
    raise ValueError("no unchecked accept kernel in DFlashWorkerV2._accept_block; the installed sglang differs")
