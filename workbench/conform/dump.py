"""The cycle dump: what crosses each contract of a speculative engine's step, per request, one file per run.

Engine-neutral and versioned (docs/dump-format.md). A dump is UTF-8 JSON lines, written as the engine
steps (one line per record, flushed), so a run that stopped early is readable up to its last whole line:

    line 1      header   {"format": "ddtree-workbench-dump", "version": 1, "engine", "pair", "policy", "sampling", ...}
    then        records  {"kind": "request", "seq", ...}  a request starts (its prompt ids)
                         {"kind": "cycle", "seq", ...}    one engine step of one request (one per row per step)
    last        end      {"kind": "end", "records": N}  written by close(); absent when the run stopped early

Arrays are the wire format's packed tensors (``workbench.records.tensor_codec.pack_tensor``: the values as raw
little-endian bytes, integers in the narrowest type that holds them, booleans 8 to a byte, zlib, base64),
so a record stays small and the file stays text (``head -1 run.dump`` shows the header).

Every record field is optional but ``kind`` / ``request`` / ``step``: an engine dumps what it holds and
``Record.missing()`` names what a record lacks (a checker reports those contracts as not checked).
``FIELDS`` is the one list of fields: the writer refuses a name not in it, the reader reports one it does
not know (``Record.unknown``) and otherwise ignores it. The writer numbers every record (``seq``), refuses an
existing file unless asked to replace it and a path another of its writers holds open (``check_dump_path``).
"""
from __future__ import annotations

import json
import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from workbench.records.tensor_codec import pack_tensor, unpack_tensor

DUMP_FORMAT = "ddtree-workbench-dump"
DUMP_VERSION = 1  # any change to a field's name, shape, dtype or meaning bumps it; a new optional field does not
READABLE_VERSIONS = (1,)
VISIBILITY_FORMS = ("dense", "sglang_mask", "flashinfer_packed", "bias")
DRAFT_VALUE_KINDS = ("logprobs", "logits")


class DumpFileError(ValueError):
    """A dump that is not ours, of a version this workbench does not read, or damaged; names file and line."""


@dataclass(frozen=True)
class Field:
    """One record field: its name, what it holds, and the contract it feeds."""

    name: str
    kind: str  # "int", "float", "str", "tensor"
    dtype: str  # tensors: "int" (any integer dtype), "float", "bool", "uint8"; "" for scalars
    shape: str  # as documented: "[n]", "[D, k]", ...
    contract: str  # which contract it feeds (docs/dump-format.md)
    doc: str
    alt: str = ""  # fields with the same ``alt`` hold one thing in different forms: one of them is enough


# n = tree nodes (root included, root at 0); D = drafted slots; k = top-k; V = vocabulary; c = context rows;
# B = drafter block; L = accepted drafts (the features: the drafter's target layers); H = the target's hidden
# size; P = the features digest's dims; m = visibility columns (n, or context_len + n).
SEQ_DOC = ("the record's number in the file (0, 1, ... over request and cycle records, as the writer wrote "
           "them): a checker names a record missing, repeated or out of order by it")
CYCLE_FIELDS = (
    Field("kind", "str", "", "", "record", '"cycle"'),
    Field("seq", "int", "", "", "record", SEQ_DOC),
    Field("request", "str", "", "", "record", "the request's id (as its request record names it)"),
    Field("step", "int", "", "", "record", "the engine step (0, 1, ... over the whole run; rows of one step share it)"),
    Field("cycle", "int", "", "", "record", "this request's cycle index (0 = its first step after the prefill)"),
    Field("row", "int", "", "", "record", "the request's row in this step's batch"),
    Field("rows", "int", "", "", "record", "requests in this step's batch"),
    Field("policy", "str", "", "", "tree", "the policy that built this tree, e.g. 'DDTree(32)', 'DFlash'"),
    Field("context_len", "int", "", "", "context",
          "tokens committed in the target's cache before this step = the position of the root"),
    Field("root_token", "int", "", "", "context", "the root's token (the previous step's bonus)"),
    Field("draft_context_tokens", "tensor", "int", "[c]", "drafter context",
          "the tokens whose target features the drafter took in as new context this step"),
    Field("draft_context_positions", "tensor", "int", "[c]", "drafter context",
          "the positions the drafter gave those context rows"),
    Field("draft_block_tokens", "tensor", "int", "[B]", "drafter context",
          "the drafter's block input: the root, then the mask token in every slot"),
    Field("draft_block_positions", "tensor", "int", "[B]", "drafter context", "the block's positions"),
    Field("draft_context_features", "tensor", "float", "[c, L * H]", "drafter features",
          "the features the drafter's forward was handed for those context rows: the target's hidden states at "
          "the drafter's L target layers, side by side (the header's features.form 'rows')", "features"),
    Field("draft_context_features_rms", "tensor", "float", "[c, L]", "drafter features",
          "digest (features.form 'digest', for large models): each context row's RMS per target layer", "features"),
    Field("draft_context_features_proj", "tensor", "float", "[c, L, P]", "drafter features",
          "digest: each context row's target layers times the fixed seeded projection [H, P] (the header's "
          "features.seed, features.dims; workbench.conform.features)", "features"),
    Field("draft_topk_ids", "tensor", "int", "[D, k]", "drafter output",
          "the k best tokens of every drafted slot (slot d predicts depth d + 1), best first", "draft"),
    Field("draft_topk_values", "tensor", "float", "[D, k]", "drafter output",
          "their values (``draft_values`` says log-probs or logits)", "draft"),
    Field("draft_values", "str", "", "", "drafter output", '"logprobs" or "logits": what the draft values are'),
    Field("draft_logits", "tensor", "float", "[D, V]", "drafter output",
          "every slot's full distribution (``draft_values`` says log-probs or logits)", "draft"),
    Field("tree_tokens", "tensor", "int", "[n]", "tree", "each node's token; node 0 is the root"),
    Field("tree_parents", "tensor", "int", "[n]", "tree", "each node's parent (-1 at the root; parent < child)"),
    Field("tree_depths", "tensor", "int", "[n]", "tree", "each node's depth (0 at the root)"),
    Field("verify_ids", "tensor", "int", "[n]", "verify positions",
          "the verify forward's input ids for this request, in the engine's node order"),
    Field("verify_positions", "tensor", "int", "[n]", "verify positions",
          "their positions (absolute; the root at context_len)"),
    Field("visibility_form", "str", "", "", "visibility",
          f"which form the engine's attention visibility is dumped in: {', '.join(VISIBILITY_FORMS)}"),
    Field("visibility", "tensor", "bool", "[n, m]", "visibility",
          "dense: row i sees column j; m = n (tree columns only, the prefix visible) or context_len + n "
          "(prefix columns first)", "visibility"),
    Field("sglang_custom_mask", "tensor", "bool", "[n * m]", "visibility",
          "SGLang's custom_mask slice of this request: rows of m = context_len + n (FULL_MASK) or n "
          "(QLEN_ONLY) booleans", "visibility"),
    Field("sglang_mask_mode", "str", "", "", "visibility", '"FULL_MASK" or "QLEN_ONLY"'),
    Field("fi_packed_mask", "tensor", "uint8", "[bytes]", "visibility",
          "FlashInfer's packed custom mask bytes the engine's indptr points at for this request (the [n, m] "
          "mask row-major, 8 bits a byte, little bit order)", "visibility"),
    Field("fi_mask_indptr", "tensor", "int", "[2]", "visibility",
          "the engine's mask_indptr entries of this request (byte offsets into the batch's packed mask)"),
    Field("fi_kv_len", "int", "", "", "visibility", "m: the key columns of each packed row"),
    Field("attn_bias", "tensor", "float", "[n, m]", "visibility",
          "a per-request additive bias: 0 where visible, -inf where hidden", "visibility"),
    Field("target_topk_ids", "tensor", "int", "[n, k]", "target logits",
          "the target's k best tokens at every node, best first", "target"),
    Field("target_topk_values", "tensor", "float", "[n, k]", "target logits", "their logits", "target"),
    Field("target_logits", "tensor", "float", "[n, V]", "target logits", "every node's full logits", "target"),
    Field("target_choice", "tensor", "int", "[n]", "accept", "the target's token at every node (argmax or sample)"),
    Field("accepted_nodes", "tensor", "int", "[L + 1]", "accept", "the accepted path's nodes, root first"),
    Field("bonus", "int", "", "", "accept", "the target's token after the accepted path"),
    Field("committed_tokens", "tensor", "int", "[t]", "commit",
          "tokens this step appended to the request's output (accepted drafts, then the bonus; fewer where "
          "end-of-text or the token limit cut the path)"),
    Field("kv_kept_nodes", "tensor", "int", "[L + 1]", "commit",
          "the nodes whose K/V rows the engine kept, in cache order (what it handed its compaction)"),
    Field("next_context_len", "int", "", "", "commit",
          "the engine's own count of tokens in its cache after this step (its host mirror)"),
    Field("state_from", "tensor", "int", "[n]", "recurrent state",
          "hybrid targets: the node whose recurrent state each node continued from (-1: the committed state)"),
    Field("notes", "str", "", "", "record",
          "what the writer could not read for this record, one line per field (a converter's notes)"),
)
REQUEST_FIELDS = (
    Field("kind", "str", "", "", "record", '"request"'),
    Field("seq", "int", "", "", "record", SEQ_DOC),
    Field("request", "str", "", "", "record", "the request's id"),
    Field("prompt_ids", "tensor", "int", "[p]", "context", "the prompt's token ids"),
    Field("first_token", "int", "", "", "context", "the token the prefill chose (the first cycle's root)"),
    Field("policy", "str", "", "", "tree", "the policy the request started with"),
    Field("temperature", "float", "", "", "accept", "sampling temperature (0: greedy)"),
    Field("top_p", "float", "", "", "accept", "nucleus sampling (1: off)"),
    Field("top_k", "int", "", "", "accept", "top-k sampling (0: off)"),
    Field("seed", "int", "", "", "accept", "the request's sampling seed"),
    Field("max_new_tokens", "int", "", "", "commit", "the request's token limit"),
)
HEADER_KEYS = ("format", "version", "engine", "pair", "policy", "sampling", "created")
PAIR_KEYS = ("target", "draft", "vocab_size", "block_size", "dtype", "device", "target_layer_ids", "hybrid",
             "mask_token_id", "fingerprint")
FIELDS = {"cycle": {f.name: f for f in CYCLE_FIELDS}, "request": {f.name: f for f in REQUEST_FIELDS}}
REQUIRED = ("kind", "request")  # a cycle also needs "step"


# ------------------------------------------------------------------------------------------ encoding
def _encode(f: Field, value):
    if f.kind == "tensor":
        t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16: widened exactly (the header's pair.dtype says which)
            t = t.float()
        return pack_tensor(t.detach().cpu())
    if f.kind == "int":
        if isinstance(value, torch.Tensor):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"dump field {f.name}={value!r:.60} must be an integer")
        return int(value)
    if f.kind == "float":
        if isinstance(value, torch.Tensor):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"dump field {f.name}={value!r:.60} must be a number")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"dump field {f.name}={value!r:.60} must be a string")
    return value


_DTYPE_FAMILY = {"int": ("int8", "int16", "int32", "int64", "uint8"), "float": ("float16", "bfloat16", "float32",
                 "float64"), "bool": ("bool",), "uint8": ("uint8",)}


def _decode(f: Field, raw):
    """One stored value -> Python/torch; ValueError (one line, without the file) when it is not that field's kind."""
    if f.kind == "tensor":
        if not isinstance(raw, dict) or not {"dtype", "shape"} <= raw.keys():
            raise ValueError(f"{f.name} is not a packed tensor")
        if str(raw["dtype"]) not in _DTYPE_FAMILY[f.dtype]:
            raise ValueError(f"{f.name} has dtype {str(raw['dtype'])[:20]}, not {f.dtype}")
        try:
            return unpack_tensor(raw)
        except Exception as e:  # zlib, base64, shape: all one complaint about this field
            raise ValueError(f"{f.name} does not unpack ({' '.join(str(e).split())[:120]})") from None
    ok = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "str": lambda v: isinstance(v, str)}[f.kind]
    if not ok(raw):
        raise ValueError(f"{f.name}={str(raw)[:40]} is not {'an' if f.kind == 'int' else 'a'} {f.kind}")
    return raw


# ------------------------------------------------------------------------------------------ records
class Record:
    """One request or cycle record, decoded lazily: ``rec["tree_parents"]`` unpacks that array on first use.

    ``rec.get(name)`` is None where absent; ``rec.missing()`` names the documented fields the record lacks
    (a group of alternatives, e.g. the visibility forms, counts as present when one of them is);
    ``rec.unknown`` the fields this version does not know (kept, not decoded)."""

    def __init__(self, raw: dict, where: str):
        self.raw, self.where = raw, where
        self.kind = raw["kind"]
        self._spec = FIELDS[self.kind]
        self._cache: dict = {}

    @property
    def request(self) -> str:
        return self.raw["request"]

    @property
    def fields(self) -> list[str]:
        """The known fields present, in the documented order."""
        return [n for n in self._spec if n in self.raw]

    @property
    def unknown(self) -> list[str]:
        return [n for n in self.raw if n not in self._spec]

    def missing(self) -> list[str]:
        """Documented fields absent from this record; alternatives are named once, by their group."""
        out, groups = [], {}
        for name, f in self._spec.items():
            if f.alt:
                groups.setdefault(f.alt, []).append(name)
            elif name not in self.raw and name != "notes":  # no notes: nothing went unread
                out.append(name)
        out += [f"{g} ({' or '.join(names)})" for g, names in groups.items() if not any(n in self.raw for n in names)]
        return out

    def __contains__(self, name: str) -> bool:
        return name in self.raw

    def __getitem__(self, name: str):
        if name not in self.raw:
            raise KeyError(f"{self.where}: the {self.kind} record has no {name!r}")
        if name not in self._cache:
            f = self._spec.get(name)
            if f is None:
                return self.raw[name]
            try:
                self._cache[name] = _decode(f, self.raw[name])
            except ValueError as e:
                raise DumpFileError(f"{self.where}: {e}") from None
        return self._cache[name]

    def get(self, name: str, default=None):
        return self[name] if name in self.raw else default

    def __repr__(self) -> str:
        ident = f"step {self.raw.get('step')}, cycle {self.raw.get('cycle')}" if self.kind == "cycle" else ""
        return f"Record({self.kind}, request {self.request!r}{', ' + ident if ident else ''}, {len(self.raw)} fields)"


class DumpRecords:
    """The records of one dump, read lazily line by line (iterate once). After iteration: ``count`` whole
    records read, ``complete`` (the end line was there), ``truncated`` (None, or why the last line was
    not read: the run stopped mid-record), ``end`` (the end line, or None)."""

    def __init__(self, path: Path, first_line: int):
        self.path, self._first = path, first_line
        self.count, self.complete, self.truncated, self.end = 0, False, None, None

    def __iter__(self) -> Iterator[Record]:
        with open(self.path, "rb") as fh:
            for no, line in enumerate(fh, start=1):
                if no < self._first:
                    continue
                if self.complete:
                    raise DumpFileError(f"{self.path}:{no}: a line after the end line; the file is damaged")
                if not line.endswith(b"\n"):  # the writer ends every line: a cut-short last record
                    self.truncated = (f"{self.path}:{no}: the last line is cut short (no newline): the run stopped "
                                      f"mid-record; {self.count} whole records read")
                    return
                raw = _parse(self.path, no, line)
                kind = raw.get("kind")
                if kind == "end":
                    if raw.get("records") != self.count:
                        raise DumpFileError(f"{self.path}:{no}: the end line counts {raw.get('records')!r} records, "
                                            f"the file has {self.count}")
                    self.complete, self.end = True, raw
                    continue
                where = f"{self.path}:{no}"
                if kind not in FIELDS:
                    raise DumpFileError(f"{where}: record kind {str(kind)[:30]!r}; this version knows "
                                        f"{', '.join(FIELDS)} and end")
                need = REQUIRED + (("step",) if kind == "cycle" else ())
                for name in need:
                    if name not in raw:
                        raise DumpFileError(f"{where}: the {kind} record has no {name!r}")
                if not isinstance(raw["request"], str):
                    raise DumpFileError(f"{where}: request={str(raw['request'])[:40]} is not a string")
                self.count += 1
                yield Record(raw, where)


def _parse(path: Path, no: int, line: bytes) -> dict:
    try:
        raw = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise DumpFileError(f"{path}:{no}: not UTF-8 text; not a {DUMP_FORMAT}") from None
    except json.JSONDecodeError as e:
        raise DumpFileError(f"{path}:{no}: not valid JSON ({e.msg} at column {e.colno}); the file is damaged") from None
    if not isinstance(raw, dict):
        raise DumpFileError(f"{path}:{no}: a record is a JSON object, not {type(raw).__name__}")
    return raw


def read_dump(path) -> tuple[dict, DumpRecords]:
    """(header, records): the header is read and checked now; the records are read as they are iterated.
    A foreign file, an unknown version or a damaged header raise DumpFileError naming file and line."""
    path = Path(path)
    if path.is_dir():
        raise DumpFileError(f"{path} is a directory, not a {DUMP_FORMAT} file")
    if not path.is_file():
        raise DumpFileError(f"{path}: no such file")
    with open(path, "rb") as fh:
        first = fh.readline()
    if not first.endswith(b"\n"):
        raise DumpFileError(f"{path}:1: no whole header line; not a {DUMP_FORMAT}, or cut short before any record")
    try:
        head = json.loads(first.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        head = None
    if not isinstance(head, dict) or head.get("format") != DUMP_FORMAT:
        raise DumpFileError(f"{path}:1: not a {DUMP_FORMAT} (no '{DUMP_FORMAT}' header)")
    if head.get("version") not in READABLE_VERSIONS:
        raise DumpFileError(f"{path}:1: dump version {str(head.get('version'))[:20]}; this workbench reads "
                            f"version{'s' if len(READABLE_VERSIONS) > 1 else ''} "
                            f"{', '.join(map(str, READABLE_VERSIONS))}")
    for key in ("engine", "pair"):
        if not isinstance(head.get(key), dict):
            raise DumpFileError(f"{path}:1: damaged header ({key!r} is not an object)")
    return head, DumpRecords(path, 2)


# ------------------------------------------------------------------------------------------ writing
def make_header(engine: dict, pair: dict, policy=None, sampling: dict | None = None, **extra) -> dict:
    """A header: ``engine`` {"name", "version", ...}; ``pair`` (PAIR_KEYS: what identifies the models);
    ``policy`` (a label, or None when requests differ); ``sampling`` {"temperature", "top_p", "top_k", "seed"}."""
    import datetime

    if not isinstance(engine, dict) or not isinstance(engine.get("name"), str):
        raise ValueError(f"engine={engine!r:.60} must be a dict with a 'name'")
    if not isinstance(pair, dict):
        raise ValueError(f"pair={pair!r:.60} must be a dict ({', '.join(PAIR_KEYS)})")
    return {"format": DUMP_FORMAT, "version": DUMP_VERSION, "engine": engine, "pair": pair,
            "policy": None if policy is None else str(policy), "sampling": sampling or {},
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **extra}


# The writers open in this process, by resolved path: a second writer on a path the first still writes would
# interleave two runs' records in one file (weak: a writer dropped without close() frees its path).
OPEN_WRITERS: "weakref.WeakValueDictionary[str, DumpWriter]" = weakref.WeakValueDictionary()


def check_dump_path(path, replace: bool = False, flag: str = "dump_replace") -> Path:
    """A path a dump can be written to, or ValueError (one line) naming it: before any expensive work.

    Refused: not a path, a directory, a path under a file or in a folder that does not exist, a path another
    open writer of this process writes, an existing file unless ``replace`` (``flag`` names the caller's
    keyword in the message), and a path the OS will not let us create or write (probed by creating the file
    and removing it again, so a read-only or virtual folder such as /proc is named before the run, not after
    its prefill)."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ValueError(f"dump={path!r:.60} must be a path (a str or pathlib.Path) to the file to write")
    if not isinstance(replace, bool):
        raise ValueError(f"{flag}={replace!r:.40} must be True (overwrite an existing dump) or False")
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"dump={str(path)!r} is a directory; give a file path such as {str(p / 'run.dump')!r}")
    if not p.parent.is_dir():
        for up in (p.parent, *p.parent.parents):  # the nearest thing that exists says what is wrong
            if up.exists() or up.is_symlink():
                if not up.is_dir():
                    raise ValueError(f"dump={str(path)!r}: {up} is a file, not a folder; give a path inside a folder")
                break
        raise ValueError(f"dump={str(path)!r}: the folder {p.parent} does not exist; create it first")
    owner = OPEN_WRITERS.get(writer_key(p))
    if owner is not None and not owner.closed:
        raise ValueError(f"dump={str(path)!r} is still being written by {owner!r} in this process; give another "
                         "path, or close that one first (session.dump.close())")
    if p.exists() and not replace:
        raise ValueError(f"dump={str(path)!r} exists; pass {flag}=True to overwrite it, or give another path")
    try:
        if p.exists():  # opened for appending and closed at once: the file is not changed
            os.close(os.open(p, os.O_WRONLY | os.O_APPEND))
        else:
            os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            p.unlink()
    except OSError as e:
        raise ValueError(f"dump={str(path)!r} cannot be written ({e.strerror or type(e).__name__}); give a path in a "
                         "folder you can write to") from None
    return p


def writer_key(path: Path) -> str:
    """One key per file however the path is spelled (relative, through a symlinked folder)."""
    return str(Path(path).resolve())


class DumpWriter:
    """Writes one dump: the header now, then a line per ``request(...)`` / ``cycle(...)``, flushed as written
    (a run that stops early leaves a readable file), and the end line on ``close()``. A context manager.

    ``replace``: overwrite an existing file (refused otherwise); a path another open writer of this process
    holds is refused either way. Every record gets ``seq``, its number in the file, so a checker can tell a
    record lost, repeated or moved from an engine's fault. Fields are checked against ``FIELDS`` as they are
    written: an unknown name or a value of the wrong kind raises ValueError naming it; tensors may sit on any
    device (copied to the host)."""

    def __init__(self, path, header: dict, replace: bool = False):
        if not isinstance(header, dict) or header.get("format") != DUMP_FORMAT:
            raise ValueError("header must come from workbench.conform.dump.make_header(...)")
        self.path = check_dump_path(path, replace, flag="replace")
        self.records = 0
        self.bytes = 0  # = characters: json.dumps writes ASCII only
        self._end_at = None  # where the end line starts once written (reopen() cuts it off)
        self._closed_as = None  # the file as close() left it: reopen() refuses a file another writer changed
        self._fh = open(self.path, "w", encoding="utf-8")
        OPEN_WRITERS[writer_key(self.path)] = self
        self._line(header)

    def _line(self, obj: dict) -> None:
        text = json.dumps(obj, allow_nan=True, separators=(",", ":")) + "\n"
        self._fh.write(text)
        self._fh.flush()
        self.bytes += len(text)

    def _write(self, kind: str, fields: dict) -> None:
        if self._fh is None:
            raise ValueError(f"dump {self.path} is closed")
        spec = FIELDS[kind]
        if "seq" in fields:
            raise ValueError("dump field 'seq' is numbered by the writer (the record's place in the file); leave it out")
        out = {"kind": kind, "seq": self.records}
        for name, value in fields.items():
            if value is None:
                continue  # a field the engine does not hold: left out, reported by Record.missing()
            f = spec.get(name)
            if f is None or name == "kind":
                raise ValueError(f"dump field {name!r} is not a {kind} field of version {DUMP_VERSION} "
                                 "(docs/dump-format.md lists them)")
            out[name] = _encode(f, value)
        for name in REQUIRED + (("step",) if kind == "cycle" else ()):
            if name not in out:
                raise ValueError(f"a {kind} record needs {name!r}")
        self._line(out)
        self.records += 1

    def request(self, request, **fields) -> None:
        """A request starts: ``prompt_ids``, ``first_token``, ``policy``, sampling, ``max_new_tokens``."""
        self._write("request", {"request": str(request), **fields})

    def cycle(self, request, step: int, **fields) -> None:
        """One engine step of one request (CYCLE_FIELDS)."""
        form = fields.get("visibility_form")
        if form is not None and form not in VISIBILITY_FORMS:
            raise ValueError(f"visibility_form={form!r}; use one of {', '.join(VISIBILITY_FORMS)}")
        kind = fields.get("draft_values")
        if kind is not None and kind not in DRAFT_VALUE_KINDS:
            raise ValueError(f"draft_values={kind!r}; use one of {', '.join(DRAFT_VALUE_KINDS)}")
        self._write("cycle", {"request": str(request), "step": step, **fields})

    def close(self) -> None:
        """Write the end line and close (again: nothing)."""
        if self._fh is not None:
            self._end_at = self.bytes
            self._line({"kind": "end", "records": self.records})
            self._fh.close()
            self._fh = None
            self._closed_as = file_state(self.path)

    def reopen(self) -> None:
        """Go on writing a closed dump (a finished session resumed under a larger token limit): the end line
        is cut off and written again by the next close(). Refused (ValueError, one line) when the file is no
        longer the one this writer closed (another writer replaced it, or it was edited or removed), or
        another open writer holds the path: appending there would mix two runs in one file."""
        if self._fh is None and self._end_at is not None:
            owner = OPEN_WRITERS.get(writer_key(self.path))
            if (owner is not None and owner is not self and not owner.closed) or file_state(self.path) != self._closed_as:
                raise ValueError(f"dump {str(self.path)!r} changed since this writer closed it (replaced by another "
                                 "writer, edited or removed): the resumed run's records are not appended to it; give "
                                 "the resumed run its own dump")
            self._fh = open(self.path, "r+", encoding="utf-8")
            self._fh.truncate(self._end_at)
            self._fh.seek(self._end_at)
            self.bytes, self._end_at = self._end_at, None
            OPEN_WRITERS[writer_key(self.path)] = self

    @property
    def closed(self) -> bool:
        return self._fh is None

    def __enter__(self) -> "DumpWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DumpWriter({str(self.path)!r}, {self.records} records, {self.bytes} bytes)"


def file_state(path: Path) -> tuple | None:
    """What tells one version of a file from another here: its inode, size and modification time (None: gone)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns
