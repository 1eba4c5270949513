"""A calibration file: what the calibrated policies know about one pair, and its checks.

``python -m workbench.calibrate`` decodes calibration prompts (never the evaluation prompts) on a pair and
writes one JSON file holding:

- ``pair``: the pair's identity (``workbench.models.identity.pair_identity``): vocabulary, block size, mask
  token, target layers read, each model's shape and weight fingerprint;
- ``acceptance``: the path-acceptance model (``path_model.PathModel``) and the counts it was fitted on;
- ``cost``: the pair's step time over rows x nodes (``step_cost.StepCost``), with its source;
- ``thresholds``: the acceptance threshold of ``CutTree`` chosen on the calibration prompts, per shape
  ("tree", "chain") and batch size;
- ``pair_head``: the previous-token-conditioned head the pair policies read (``pair_head.PairHead``): its file
  (relative to this one), the file's sha256 and the ``beta`` chosen on the calibration prompts;
- ``made``: date, command, prompts (source files, count, how they are kept apart from evaluation), cycles.

Both embedded pairs ship one (``workbench/assets/calibration.json``, ``workbench/assets/hybrid/calibration.json``).
A file is refused in one line (``CalibrationError``, a ValueError) when it is not one, when a value has the
wrong type or range (named by its field: a threshold outside (0, 1), a beta that is not finite, a count that
is not a whole number), when it was made from fewer cycles than the estimate needs, when its head is not
where it names it, or when it was made on another pair (vocabulary, block size, drafter or target differ);
the commands read the files their policies name before any model loads (``check_named``), and the policies
check the pair before any decode (``Policy.for_pair``).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workbench.engine.policies.pair_head import PairHead, PairHeadError, load_head
from workbench.engine.policies.path_model import PathModel
from workbench.engine.policies.step_cost import StepCost

FORMAT = "ddtree-workbench calibration"
VERSION = 1
ASSETS = Path(__file__).resolve().parents[2] / "assets"
SHIPPED = {"dense": ASSETS / "calibration.json", "hybrid": ASSETS / "hybrid" / "calibration.json"}
# The estimate needs enough cycles overall and enough target hits in every path state: the sibling and off
# states are met only after the chain missed, a few times per cycle at most.
MIN_CYCLES = 200
MIN_HITS = 30
SHAPES = ("tree", "chain")  # the shapes a threshold is chosen for
MAKE = "python -m workbench.calibrate --target DIR --draft DIR --out FILE"
# identity fields in the order a mismatch is named, with the words for them
PAIR_FIELDS = (("vocab", "vocabulary size"), ("block_size", "drafter block size"), ("drafter", "drafter"),
               ("mask_token_id", "drafter mask token"), ("target_layer_ids", "target layers the drafter reads"),
               ("target", "target"))


class CalibrationError(ValueError):
    """A calibration file that cannot be used for this policy or pair; the message is one line."""


@dataclass(frozen=True)
class Calibration:
    """One pair's calibration, as loaded from its file."""

    path: str
    pair: dict
    model: PathModel
    width: int  # candidates per slot the model was fitted on (the tree never looks past them)
    cost: StepCost | None
    thresholds: dict  # {"tree" | "chain": {"rows": threshold}}
    made: dict
    pair_head: dict | None = None  # {"file": relative path, "sha256": ..., "beta": float, ...}

    @property
    def cycles(self) -> int:
        return int(self.made.get("cycles", 0))

    def check_pair(self, pair: dict) -> None:
        """Refuse (one line) a pair other than the one this file was made on."""
        for key, words in PAIR_FIELDS:
            mine, theirs = self.pair.get(key), pair.get(key)
            if mine != theirs:
                raise CalibrationError(f"calibration {self.path} was made on another pair: its {words} is "
                                       f"{describe(mine)}, this pair's {describe(theirs)}; make one for this pair "
                                       f"with {MAKE}")

    def threshold(self, shape: str, rows: int) -> float:
        """The threshold chosen on the calibration prompts for ``shape`` ("tree" or "chain") at the measured
        batch size nearest ``rows``."""
        table = self.thresholds.get(shape) or {}
        if not table:
            raise CalibrationError(f"calibration {self.path} holds no {shape} threshold; give one "
                                   f"(CutTree(..., threshold=0.2)) or make the file again with {MAKE}")
        best = min(table, key=lambda r: (abs(int(r) - rows), int(r)))
        return float(table[best])

    def head(self, pair: dict | None = None) -> tuple[PairHead, float]:
        """The pair head this calibration chose ``beta`` for, and ``beta``; checked against ``pair`` when given.
        Refused (one line) when there is none, when its file changed since, or when it does not match the pair.
        Checked in full when a policy is bound to a pair (``pair`` given); a tree build's call (no ``pair``)
        reuses the last full check's result instead of hashing paths and stat-ing the file every row and cycle."""
        checked = self.__dict__.get("checked_head")
        if pair is None and checked is not None:
            return checked
        spec = self.pair_head
        if not spec:
            raise CalibrationError(f"calibration {self.path} holds no pair head; make it with {MAKE} (the shipped "
                                   "head is workbench/assets/pair_head.npz)")
        path = Path(self.path).parent / spec["file"]
        if not path.exists():
            raise CalibrationError(self.missing_head(path))
        try:
            head = load_head(path)
            if file_sha256(path) != spec.get("sha256"):
                raise PairHeadError(f"pair head {path} changed since calibration {self.path} chose its beta; make "
                                    f"the calibration again with {MAKE}")
            if pair is not None:
                head.check_pair(pair)
        except PairHeadError as e:
            raise CalibrationError(str(e)) from None
        self.__dict__["checked_head"] = (head, float(spec["beta"]))
        return head, float(spec["beta"])

    def missing_head(self, path: Path) -> str:
        """Why the head file is not where this calibration names it, and the fix: a calibration copied alone
        needs its head beside it (at the same relative path), the shipped head when it is that one."""
        spec = self.pair_head
        shipped = ASSETS / "pair_head.npz"
        which = (f" (the shipped {shipped} is that head)" if shipped.is_file()
                 and file_sha256(shipped) == spec.get("sha256") else "")
        return (f"calibration {self.path} names its pair head {spec['file']!r}, relative to its own folder, and "
                f"{path} is not there: copy the head the calibration was made with to {path}{which}")

    def step_cost(self) -> StepCost:
        if self.cost is None:
            raise CalibrationError(f"calibration {self.path} holds no cost table; make it with {MAKE} --costs FILE "
                                   "(a pays-off --json result or a cost table)")
        return self.cost


def describe(v) -> str:
    """A pair field for a one-line message (a model's facts as 'qwen3, 2 layers x 256, weights 5f28...')."""
    if isinstance(v, dict):
        return f"{v.get('model_type')}, {v.get('layers')} layers x {v.get('hidden')}, weights {v.get('weights')}"
    return str(v)


_LOADED: dict[tuple, Calibration] = {}  # (path, mtime) -> loaded file: policies look it up every cycle
_SHAS: dict[tuple, str] = {}


def file_sha256(path: Path) -> str:
    """A file's sha256 (cached by path and mtime: a calibration names the head file it chose beta for)."""
    key = (str(Path(path).resolve()), Path(path).stat().st_mtime_ns)
    if key not in _SHAS:
        _SHAS[key] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return _SHAS[key]


def resolve_path(name_or_path) -> Path:
    """A shipped calibration's name ('dense', 'hybrid') or a file's path -> the path."""
    if isinstance(name_or_path, str) and name_or_path in SHIPPED:
        return SHIPPED[name_or_path]
    return Path(name_or_path).expanduser()


def load(name_or_path) -> Calibration:
    """A calibration file (or a shipped one by name), checked; CalibrationError in one line otherwise."""
    p = resolve_path(name_or_path)
    if not p.is_file():
        shipped = ", ".join(SHIPPED)
        raise CalibrationError(f"calibration {name_or_path!s} is not a file nor a shipped one ({shipped}); make one "
                               f"with {MAKE}")
    key = (str(p.resolve()), p.stat().st_mtime_ns)
    if key not in _LOADED:
        _LOADED[key] = parse(p)
    return _LOADED[key]


def parse(p: Path) -> Calibration:
    """Read and check one file (the format, the cycles the estimate needs, the model and cost table, every
    value's type and range, each named by its field)."""
    where = f"calibration {p}"
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CalibrationError(f"{where} is not JSON ({type(e).__name__}); make one with {MAKE}") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise CalibrationError(f"{where} is not a calibration file (no \"format\": \"{FORMAT}\"); make one with {MAKE}")
    if d.get("version") != VERSION:
        raise CalibrationError(f"{where} is version {d.get('version')!r}; this workbench reads version {VERSION}: "
                               f"make it again with {MAKE}")
    made, acc = d.get("made") or {}, d.get("acceptance") or {}
    if not isinstance(made, dict) or not isinstance(acc, dict):
        raise CalibrationError(f"{where}: its made and acceptance entries must be JSON objects; make it again with {MAKE}")
    cycles = whole(made.get("cycles", 0), where, "made.cycles", "the decoded cycles it was made from")
    if cycles < MIN_CYCLES:
        raise CalibrationError(f"{where} was made from {cycles} cycles; the path estimate needs at least {MIN_CYCLES}: "
                               f"make it again from more prompts or tokens ({MAKE} --prompts N)")
    try:
        model = PathModel.from_dict(acc, where)
        cost = StepCost.from_dict(d["cost"], where) if d.get("cost") else None
    except ValueError as e:
        raise CalibrationError(str(e)) from None
    check_finite(model, cost, where)
    hits = acc.get("hits") or {}
    if not isinstance(hits, dict):
        raise CalibrationError(f"{where}: acceptance.hits must be an object of counts per state; make it again with {MAKE}")
    counts = {s: whole(hits.get(s, 0), where, f"acceptance.hits.{s}", "the target's hits in that state")
              for s in acc["states"]}
    thin = [s for s, n in counts.items() if n < MIN_HITS]
    if thin:
        raise CalibrationError(f"{where} saw the target take a candidate in the {', '.join(thin)} state(s) only "
                               f"{', '.join(str(counts[s]) for s in thin)} time(s); the estimate "
                               f"needs {MIN_HITS} each: make it again from more prompts ({MAKE} --prompts N)")
    pair = d.get("pair")
    if not isinstance(pair, dict) or any(k not in pair for k, _ in PAIR_FIELDS):
        raise CalibrationError(f"{where} records no pair identity (vocabulary, block size, drafter, target); make it "
                               f"again with {MAKE}")
    width = whole(acc.get("width", 0) or 0, where, "acceptance.width", "the candidates per slot it was fitted on")
    if width < 1:
        raise CalibrationError(f"{where} records no candidate width (acceptance.width); make it again with {MAKE}")
    head = d.get("pair_head")
    if head is not None and (not isinstance(head, dict) or not isinstance(head.get("file"), str)
                             or not isinstance(head.get("beta"), (int, float))):
        raise CalibrationError(f"{where}: its pair_head must name a file and a beta; make it again with {MAKE}")
    if head is not None and (isinstance(head["beta"], bool) or not math.isfinite(head["beta"]) or head["beta"] < 0):
        raise CalibrationError(f"{where}: pair_head.beta = {head['beta']!r} must be a finite number >= 0 (0: the "
                               f"drafter's own marginal); make it again with {MAKE}")
    return Calibration(str(p), pair, model, width, cost, thresholds_of(d.get("thresholds"), where), made, head)


def whole(v, where: str, field: str, what: str) -> int:
    """A count from the file: a whole number (JSON int), else one line naming the file and the field."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise CalibrationError(f"{where}: {field} = {v!r} is not a whole number ({what}); make it again with {MAKE}")
    return v


def thresholds_of(raw, where: str) -> dict:
    """The thresholds table, checked: {"tree" | "chain": {batch size as text: threshold in (0, 1)}}, as CutTree
    refuses a threshold outside (0, 1) at construction."""
    if not raw:
        return {}
    if not isinstance(raw, dict):
        raise CalibrationError(f"{where}: thresholds must be an object {{\"tree\" | \"chain\": {{rows: threshold}}}}; "
                               f"make it again with {MAKE}")
    for shape, table in raw.items():
        if shape not in SHAPES or not isinstance(table, dict):
            raise CalibrationError(f"{where}: thresholds.{shape} is not a table of one of the shapes "
                                   f"({', '.join(SHAPES)}) by batch size; make it again with {MAKE}")
        for rows, v in table.items():
            if not (isinstance(rows, str) and rows.isdigit() and int(rows) >= 1):
                raise CalibrationError(f"{where}: thresholds.{shape} key {rows!r} is not a batch size (a whole "
                                       f"number of rows, e.g. \"8\"); make it again with {MAKE}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 < v < 1.0:
                raise CalibrationError(f"{where}: thresholds.{shape}[{rows!r}] = {v!r} must be a number in (0, 1), "
                                       f"as CutTree's threshold is; make it again with {MAKE}")
    return raw


def check_finite(model: PathModel, cost: StepCost | None, where: str) -> None:
    """NaN or infinity in the acceptance weights or the cost table would score every tree alike."""
    if not np.isfinite(np.asarray(model.weights, dtype=np.float64)).all():
        raise CalibrationError(f"{where}: acceptance.weights hold a value that is not finite; make it again with {MAKE}")
    if cost is not None and not np.isfinite(np.asarray(cost.step_ms, dtype=np.float64)).all():
        raise CalibrationError(f"{where}: cost.step_ms holds a value that is not finite; make it again with {MAKE} "
                               "--costs FILE")


def shipped_for(pair: dict) -> Calibration | None:
    """The shipped calibration made on ``pair``, or None."""
    for p in SHIPPED.values():
        if p.is_file():
            cal = load(p)
            try:
                cal.check_pair(pair)
            except CalibrationError:
                continue
            return cal
    return None


def check_named(policies) -> None:
    """Read the calibration file each policy names, with what that policy needs from it (a cost table, a
    threshold, a pair head), before any model loads: what the file alone shows (missing, not JSON, a value out
    of range, no cost table) is refused now in one line (CalibrationError), not after the models load. The
    pair itself is checked when the policy is bound to one (``Policy.for_pair``)."""
    for p in policies:
        if getattr(p, "calibration", None) is not None and callable(getattr(p, "calibration_data", None)):
            p.calibration_data()
