"""Loading a target and a DFlash drafter from local directories: one code path for everything.

The embedded default and real checkpoints (e.g. Qwen3-8B + its DFlash-b16 drafter on
a GPU host) go through the same functions. Nothing is ever downloaded: every
``from_pretrained`` call is local-only, and a path that is not a model directory
fails at once with a message naming it.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from workbench.models import packed_linear
from workbench.models.config_facts import (
    DEFAULT_BLOCK_SIZE, DRAFT_CLASSES, DTYPE_ALIASES, RUN_DTYPES, draft_value, run_dtype, torch_dtype,
)
from workbench.models.registry import pair_mismatch, refusal
from workbench.shipped import ASSETS  # workbench/assets: its one reader is workbench.shipped

DEFAULT_TARGET = ASSETS / "target"
DEFAULT_DRAFT = ASSETS / "draft"
# Embedded pairs by name: wb.load("hybrid") (a Qwen3.5-text target; see workbench/assets/hybrid).
PAIRS = {"hybrid": (ASSETS / "hybrid" / "target", ASSETS / "hybrid" / "draft")}
PACKAGE_PREFIX = "workbench/"  # a model path stored relative to the package's parent folder


def model_ref(path) -> str:
    """How a trace names a model directory: 'workbench/assets/target' for the embedded pair (relative to
    the package, so a trace still finds it on another machine or checkout), else the absolute path."""
    p = Path(path).resolve()
    try:
        return PACKAGE_PREFIX + p.relative_to(ASSETS.parent.resolve()).as_posix()
    except ValueError:
        return str(p)


def canonical_ref(ref) -> str:
    """A model entry (a trace's, a server's /info) as ``model_ref`` names it: an embedded model by its
    package-relative name wherever its checkout or wheel lies, another directory by its path."""
    s = str(ref)
    if s.startswith(PACKAGE_PREFIX):
        return s
    parts = Path(s).parts
    for i in range(len(parts) - 2, -1, -1):  # the last 'workbench/assets' in the path
        if parts[i:i + 2] == ("workbench", "assets"):
            return PACKAGE_PREFIX + "/".join(parts[i + 1:])
    return str(Path(s).expanduser().resolve()) if Path(s).expanduser().exists() else s


def resolve_model_ref(ref) -> Path | None:
    """The directory a trace's model entry names, if it exists here. A package-relative entry resolves
    against this checkout; an absolute path from another machine that ends in the embedded pair's
    'workbench/assets/<name>' falls back to this checkout's copy."""
    if not ref:
        return None
    ref = str(ref)
    if ref.startswith(PACKAGE_PREFIX):
        p = ASSETS.parent / ref[len(PACKAGE_PREFIX):]
        return p if p.is_dir() else None
    p = Path(ref)
    if p.is_dir():
        return p
    parts = p.parts
    if len(parts) >= 3 and parts[-3:-1] == ("workbench", "assets") and (ASSETS / parts[-1]).is_dir():
        return ASSETS / parts[-1]
    return None



class ModelPairError(ValueError):
    """The target and the drafter do not fit together, or a path is not a model directory."""


@dataclass
class Models:
    """A loaded target, drafter and tokenizer, with the facts the engine needs."""

    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object
    target_dir: Path
    draft_dir: Path
    device: torch.device  # where the target's embedding lives: inputs and the drafter go there
    dtype: torch.dtype
    notes: tuple = ()  # facts about the pair a user should see (``repr(engine)`` lists them)

    @property
    def block_size(self) -> int:
        return int(self.draft.block_size)

    @property
    def mask_token_id(self) -> int:
        return int(self.draft.mask_token_id)

    @property
    def target_layer_ids(self) -> list[int]:
        return list(self.draft.target_layer_ids)

    @property
    def max_positions(self) -> int:
        return int(self.target.config.max_position_embeddings)

    @property
    def eos_token_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        eos = getattr(self.target.config, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list) else [eos])
        return {int(i) for i in ids if i is not None}


def resolve_dtype(dtype, checkpoint: torch.dtype | None = None) -> torch.dtype:
    """A torch dtype from a name. ``"auto"``: the checkpoint's own dtype (``checkpoint``; float32 when the
    checkpoint names none); None: float32."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower() == "auto":
        return checkpoint or torch.float32
    if isinstance(dtype, str) and run_dtype(dtype) is not None:
        return torch_dtype(dtype)
    names = sorted({*RUN_DTYPES, *DTYPE_ALIASES})
    raise ValueError(f"dtype={dtype!r} is not 'auto', one of {', '.join(names)} or a torch.dtype")


def resolve_device(device) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device={str(device)!r} but CUDA is not available on this machine; use device='cpu'")
    return dev


def model_dir(path, role: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ModelPairError(f"{role} path '{p}' is not a directory; pass a local model directory (nothing is downloaded)")
    if not (p / "config.json").is_file():
        raise ModelPairError(f"{role} path '{p}' is not a model directory: it has no config.json")
    return p


# Config fields that must be positive integers wherever a config has them: a damaged or hand-edited value
# ("four") is refused here, naming file and field, before transformers' own 50-line validation error.
INT_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "max_position_embeddings", "head_dim")


def read_config(p: Path) -> dict:
    where = p / "config.json"
    try:
        cfg = json.loads(where.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelPairError(f"{where} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ModelPairError(f"{where} holds a JSON {type(cfg).__name__}, not an object of config fields")
    for section in (cfg, cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}):
        for name in INT_FIELDS:
            v = section.get(name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                inner = "text_config." if section is not cfg else ""
                raise ModelPairError(f"{where}: {inner}{name}={v!r} must be a positive integer; the config is "
                                     "damaged or hand-edited (restore it from the checkpoint's source)")
    return cfg


def _one_line(e: BaseException, limit: int = 300) -> str:
    msg = " ".join(str(e).split()) or type(e).__name__
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def check_weight_files(directory: Path, role: str) -> None:
    """Refuse, naming the file, a weight index that is not JSON or names missing shards, and a safetensors
    file whose header cannot be read (cut short, damaged): before transformers' traceback that names none.
    Reads headers only (safetensors maps the file; nothing is loaded)."""
    index = directory / "model.safetensors.index.json"
    files = sorted(directory.glob("*.safetensors"))
    if index.is_file():
        try:
            data = json.loads(index.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelPairError(f"{role} weight index {index} is not valid JSON ({_one_line(e)}); the file is "
                                 "damaged: copy it again from the checkpoint") from None
        wm = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            raise ModelPairError(f"{role} weight index {index} has no 'weight_map' of tensor name -> file; the "
                                 "file is damaged: copy it again from the checkpoint")
        missing = sorted({v for v in wm.values() if not (directory / v).is_file()})
        if missing:
            raise ModelPairError(f"{role} weight index {index} names shard(s) that are not there: "
                                 f"{', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    from safetensors import safe_open

    for f in files:
        try:
            with safe_open(f, "pt") as st:
                st.keys()
        except Exception as e:  # noqa: BLE001 - SafetensorError and OSError alike: the file cannot be read
            raise ModelPairError(f"{role} weights {f}: not a readable safetensors file ({_one_line(e, 160)}); it "
                                 "is cut short or damaged: copy it again from the checkpoint") from None


# ------------------------------------------------------------------------------------------ the drafter
@dataclass(frozen=True)
class DraftSettings:
    """What the drafter's config tells the engine, read the way dflash reads it."""

    cls_name: str  # the dflash class that loads it
    mask_token_id: int
    block_size: int
    target_layer_ids: list[int]
    num_target_layers: int | None  # as written in the config (None: not there)


def draft_settings(dcfg: dict, draft_dir: Path) -> DraftSettings:
    where = draft_dir / "config.json"
    archs = dcfg.get("architectures") or []
    known = [a for a in archs if a in DRAFT_CLASSES]
    if archs and not known:
        raise ModelPairError(f"draft config {where} names architectures {archs}, not a DFlash drafter "
                             f"({' or '.join(DRAFT_CLASSES)}); is '{draft_dir}' the drafter?")
    mask = draft_value(dcfg, "mask_token_id")
    if mask is None:
        raise ModelPairError(f"draft config {where} has no 'mask_token_id' (in its dflash_config or at the top "
                             f"level); is '{draft_dir}' a DFlash drafter?")
    block = draft_value(dcfg, "block_size", DEFAULT_BLOCK_SIZE)
    if isinstance(block, bool) or not isinstance(block, int) or block < 2:
        raise ModelPairError(f"draft config {where} has block_size={block!r}; a drafter block holds at least 2 tokens")
    ntl = draft_value(dcfg, "num_target_layers")
    if ntl is not None and (isinstance(ntl, bool) or not isinstance(ntl, int) or ntl < 1):
        raise ModelPairError(f"draft config {where} has num_target_layers={ntl!r}; it must be a positive integer")
    ids = draft_value(dcfg, "target_layer_ids")
    if ids is not None and (not isinstance(ids, list) or not ids
                            or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        raise ModelPairError(f"draft config {where} has target_layer_ids={ids!r:.80}; it must be a non-empty list "
                             "of target layer indices (the layers whose hidden states the drafter reads)")
    if ids is None:
        from dflash.model import build_target_layer_ids

        if ntl is None:
            raise ModelPairError(f"draft config {where} has neither 'target_layer_ids' nor 'num_target_layers'; "
                                 "add the target layers it reads to its dflash_config")
        ids = build_target_layer_ids(int(ntl), int(dcfg.get("num_hidden_layers", 1)))
    return DraftSettings(known[0] if known else "DFlashDraftModel", int(mask), int(block), [int(i) for i in ids],
                         None if ntl is None else int(ntl))


def check_pair(tcfg, ds: DraftSettings, dcfg: dict, target_dir: Path, draft_dir: Path) -> None:
    """Raise ModelPairError naming both values when the drafter cannot serve the target (``tcfg``: the
    target's text config)."""
    tv, n_layers = tcfg.vocab_size, tcfg.num_hidden_layers
    if ds.num_target_layers is not None and ds.num_target_layers != n_layers:
        raise ModelPairError(f"draft num_target_layers={ds.num_target_layers} ({draft_dir}) but the target has "
                             f"{n_layers} layers ({target_dir}): the drafter was trained for another target")
    wrong = pair_mismatch((tv, tcfg.hidden_size, n_layers),
                          (dcfg.get("vocab_size"), dcfg.get("hidden_size"), tuple(ds.target_layer_ids)))
    if wrong is not None:
        what, where = wrong
        raise ModelPairError(what if where == "draft" else
                             what.replace(" vs draft", f" ({target_dir}) vs draft") + f" ({draft_dir})")
    if not 0 <= ds.mask_token_id < tv:
        raise ModelPairError(f"draft mask_token_id {ds.mask_token_id} is outside the target's embedding of {tv} rows "
                             f"({target_dir})")
    positions = getattr(tcfg, "max_position_embeddings", None)
    if isinstance(positions, int) and ds.block_size >= positions:
        raise ModelPairError(f"draft config {draft_dir / 'config.json'} has block_size={ds.block_size} but the target "
                             f"has {positions} positions ({target_dir}): a block cannot be longer than the context, "
                             f"and every cycle would draft {ds.block_size} slots; the config is damaged (DFlash "
                             f"drafters use {DEFAULT_BLOCK_SIZE})")


MAX_PLAIN_BLOCK = 64  # past this a block size is far from what DFlash drafters are trained with: warned about


def block_note(ds: DraftSettings) -> str | None:
    if ds.block_size <= MAX_PLAIN_BLOCK:
        return None
    return (f"draft block_size={ds.block_size} is far above the {DEFAULT_BLOCK_SIZE} DFlash drafters are trained "
            f"with: every cycle drafts {ds.block_size} slots; check the drafter's config.json")


def last_layer_note(ds: DraftSettings, n_layers: int) -> str | None:
    """A note when the drafter reads the target's last layer, where engines hand it different tensors."""
    if n_layers - 1 not in ds.target_layer_ids:
        return None
    return (f"draft target_layer_ids {list(ds.target_layer_ids)} include the target's last layer ({n_layers - 1}), "
            "where engines differ: transformers (and this engine) give the final-normed output, vLLM the pre-norm "
            "residual, SGLang captures nothing; published drafters read layers 1 to N-3")


def mask_note(tokenizer, mask_id: int) -> str | None:
    """A note when the tokenizer has no string for the mask id (z-lab's Qwen3 drafters: the id is
    ``len(tokenizer)``). Harmless: the engine only embeds the id."""
    if mask_id < len(tokenizer) and tokenizer.convert_ids_to_tokens(mask_id) is not None:
        return None
    return f"mask_token_id {mask_id} has no string in the tokenizer ({len(tokenizer)} tokens); only its embedding is used"


# ------------------------------------------------------------------------------------------ the target
# Which targets a state verifies, and why not, is the registry's (workbench.models.registry): one place.
unverifiable = refusal


def remote_code_refusal(role: str, directory: Path, what: str) -> ModelPairError:
    return ModelPairError(f"{role} '{directory}' needs its own Python code ({what}); pass trust_remote_code=True "
                          "(CLI --trust-remote-code) if you trust that code")


def read_target_config(tdir: Path, trust_remote_code: bool):
    """The target's transformers config, refusing remote code unless it is trusted explicitly."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    raw = read_config(tdir)
    model_type = raw.get("model_type")
    if model_type not in CONFIG_MAPPING:
        if "AutoConfig" in (raw.get("auto_map") or {}):
            if not trust_remote_code:
                raise remote_code_refusal("target", tdir, f"model_type {model_type!r}, auto_map in config.json")
        else:
            import transformers

            raise ModelPairError(f"target config {tdir / 'config.json'} has model_type {model_type!r}, which "
                                 f"transformers {transformers.__version__} does not know")
    try:
        return AutoConfig.from_pretrained(tdir, local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - transformers' config validation (StrictDataclassFieldValidationError, ...)
        raise ModelPairError(f"target config {tdir / 'config.json'}: {_one_line(e)}") from None


def checkpoint_keys(directory: Path) -> list[str]:
    """Tensor names stored in a safetensors checkpoint (index file or single file); [] for other formats."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        check_weight_files(directory, "target")  # one line naming the file, not a JSONDecodeError
        return list(json.loads(index.read_text())["weight_map"])
    from safetensors import safe_open

    keys: list[str] = []
    for f in sorted(directory.glob("*.safetensors")):
        with safe_open(f, "pt") as st:
            keys.extend(st.keys())
    return keys


def text_key_mapping(keys: list[str]) -> tuple[dict[str, str], set[str]]:
    """For a multimodal wrapper checkpoint: (regex renames that put its text model's tensors where a
    ``*ForCausalLM`` expects them, the checkpoint's tensors outside the text model and its head)."""
    emb = sorted((k for k in keys if k.endswith("embed_tokens.weight")), key=len)
    if not emb:
        return {}, set()
    prefix = emb[0][: -len("embed_tokens.weight")]  # e.g. "language_model.model." or "model.language_model."
    mapping = {} if prefix == "model." else {"^" + re.escape(prefix): "model."}
    heads = sorted((k for k in keys if k == "lm_head.weight" or k.endswith(".lm_head.weight")), key=len)
    head = heads[0] if heads else None
    if head and head != "lm_head.weight":
        mapping["^" + re.escape(head[: -len("lm_head.weight")]) + r"lm_head\."] = "lm_head."
    return mapping, {k for k in keys if not k.startswith(prefix) and k != head}


def check_loading_info(info: dict, role: str, directory: Path, cls_name: str, allowed_unexpected=frozenset()) -> None:
    """Refuse missing, unexpected or misshapen weights, naming them (``allowed_unexpected``: tensors
    the caller leaves on disk on purpose, and says so)."""
    def names(keys) -> str:
        keys = sorted(keys)
        return ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")

    def shaped(k) -> str:  # transformers gives (name, checkpoint shape, the config's shape)
        if isinstance(k, str) or len(k) < 3:
            return k if isinstance(k, str) else k[0]
        return f"{k[0]} (checkpoint {list(k[1])}, config.json wants {list(k[2])})"

    unexpected = sorted(set(info.get("unexpected_keys", ())) - set(allowed_unexpected))
    missing = sorted(info.get("missing_keys", ()))
    mismatched = sorted(shaped(k) for k in info.get("mismatched_keys", ()))
    problems = [f"{len(v)} {what}: {names(v)}" for what, v in
                (("missing", missing), ("unexpected", unexpected), ("with the wrong shape", mismatched)) if v]
    if problems:
        raise ModelPairError(f"{role} checkpoint '{directory}' does not match {cls_name}: " + "; ".join(problems)
                             + (" (its config.json contradicts its weights)" if mismatched else "")
                             + " (nothing is dropped or left random)")


def _placement(device: torch.device, device_map) -> tuple[dict, str | None]:
    """(from_pretrained arguments that load weights straight onto their device, or a note saying they
    go through host memory: transformers places weights itself only with the accelerate package)."""
    if device_map is None and device.type == "cpu":
        return {}, None
    from transformers.utils import is_accelerate_available

    if is_accelerate_available():
        return {"device_map": device_map if device_map is not None else {"": device}}, None
    if device_map is not None:
        raise ModelPairError(f"device_map={device_map!r} needs the 'accelerate' package (pip install accelerate)")
    return {}, f"weights loaded on the host, then moved to {device}: pip install accelerate to load them onto it directly"


def load_target(tdir: Path, config, dtype: torch.dtype, device: torch.device, device_map, trust_remote_code: bool):
    """The target's causal LM. A nested checkpoint (``*ForConditionalGeneration`` with a ``text_config``)
    loads its text model and head only; the wrapper's other tensors are counted in the returned notes."""
    from transformers import AutoModelForCausalLM

    text = config.get_text_config(decoder=True)
    placement, moved = _placement(device, device_map)
    # ignore_mismatched_sizes: transformers reports the misshapen tensors instead of raising a bare error whose
    # report went to a silenced log; check_loading_info then refuses them, naming each (nothing stays random).
    kw = dict(local_files_only=True, dtype=dtype, output_loading_info=True, ignore_mismatched_sizes=True, **placement)
    notes: list[str] = [f"target: {moved}"] if moved else []
    if text is config:
        model, info = AutoModelForCausalLM.from_pretrained(tdir, config=config, trust_remote_code=trust_remote_code,
                                                           **kw)
        check_loading_info(info, "target", tdir, type(model).__name__)
        return (model.to(device) if moved else model), notes
    try:
        cls = AutoModelForCausalLM._model_mapping[type(text)]
    except KeyError:
        raise ModelPairError(f"target '{tdir}' nests a {text.model_type!r} text model that has no causal-LM class "
                             "in transformers") from None
    mapping, outside = text_key_mapping(checkpoint_keys(tdir))
    model, info = cls.from_pretrained(tdir, config=text, key_mapping=mapping or None, **kw)
    # Everything outside the text model and its head (vision tower, projector, MTP) stays on disk; say how much.
    check_loading_info(info, "target", tdir, cls.__name__, allowed_unexpected=outside)
    notes.append(f"target: the text model of a {type(config).__name__.replace('Config', '')} checkpoint"
                 + (f" ({len(outside)} other tensors left on disk)" if outside else ""))
    return (model.to(device) if moved else model), notes


def load_tokenizer(tdir: Path, trust_remote_code: bool):
    from transformers import AutoTokenizer

    if not any((tdir / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        raise ModelPairError(f"target path '{tdir}' has no tokenizer (tokenizer.json)")
    tc = tdir / "tokenizer_config.json"
    if not trust_remote_code and tc.is_file() and json.loads(tc.read_text()).get("auto_map"):
        cls = json.loads(tc.read_text()).get("tokenizer_class")
        from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

        if cls is None or tokenizer_class_from_name(cls) is None:
            raise remote_code_refusal("target tokenizer in", tdir, f"tokenizer_class {cls!r}, auto_map in "
                                      "tokenizer_config.json")
    return AutoTokenizer.from_pretrained(tdir, local_files_only=True, trust_remote_code=trust_remote_code)


def load_draft(ddir: Path, ds: DraftSettings, dtype: torch.dtype, device: torch.device, target_depth: int):
    import dflash.model

    cls = getattr(dflash.model, ds.cls_name)
    try:
        config = cls.config_class.from_pretrained(ddir, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers' config validation (StrictDataclassFieldValidationError, ...)
        raise ModelPairError(f"draft config {ddir / 'config.json'}: {_one_line(e)}") from None
    notes = [] if ds.cls_name == "DFlashDraftModel" else [f"draft: {ds.cls_name}"]
    if ds.num_target_layers is None:  # dflash's constructor reads it even when target_layer_ids are given
        config.num_target_layers = target_depth
        notes.append(f"draft config has no num_target_layers: the target's {target_depth} layers assumed")
    placement, moved = _placement(device, None)
    model, info = cls.from_pretrained(ddir, config=config, local_files_only=True, dtype=dtype,
                                      output_loading_info=True, ignore_mismatched_sizes=True, **placement)
    check_loading_info(info, "draft", ddir, cls.__name__)
    if moved:
        model = model.to(device)
    return model, notes


def pair_name(target, draft) -> str | None:
    """The embedded pair ``target`` names (``"hybrid"`` with no drafter and no such directory), or None."""
    if isinstance(target, str) and target in PAIRS and not draft and not Path(target).is_dir():
        return target
    return None


def pair_dirs(target, draft) -> tuple[Path, Path]:
    """(target dir, drafter dir): an embedded pair by name (``"hybrid"``), the default pair, or local
    directories; the one rule for every engine that loads a pair (ours, ``workbench.adapters.vllm_engine``)."""
    name = pair_name(target, draft)
    if name is not None:
        target, draft = PAIRS[name]
        if not (target / "config.json").is_file():
            raise ModelPairError(f"the embedded {name!r} pair is not in '{target.parent}'; train it: make train-{name}")
    tdir = model_dir(target or DEFAULT_TARGET, "target")
    if target is not None and draft is None:
        draft = own_drafter(tdir)
    return tdir, model_dir(draft or DEFAULT_DRAFT, "draft")


def own_drafter(tdir: Path) -> Path:
    """The drafter of a target given alone: ``<dir>/draft`` beside ``<dir>/target`` (the embedded pairs'
    layout, and a training run's); another drafter would load and run with another checkpoint's acceptance."""
    beside = tdir.parent / "draft"
    if tdir.name == "target" and (beside / "config.json").is_file():
        return beside
    raise ModelPairError(f"target '{tdir}' has no drafter beside it (a '{beside}' folder next to one named "
                         "'target'), and another checkpoint's drafter would run without a word: pass "
                         "draft=<the DFlash drafter trained for it>")


def require_dflash() -> None:
    """The drafter's model code is dflash's, an extra (its metadata pins tqdm, requests and datasets exactly):
    missing, one line naming the pip command, before anything loads."""
    try:
        import dflash.model  # noqa: F401
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "dflash":
            raise
        from workbench.extras import missing

        raise ModuleNotFoundError(missing("loading a DFlash drafter", "dflash"), name="dflash") from None


def load_models(target=None, draft=None, device="cpu", dtype="auto", device_map=None,
                trust_remote_code: bool = False) -> Models:
    """Load and validate a (target, drafter) pair from local directories (defaults: the embedded pair).

    ``dtype="auto"`` (or None): the target checkpoint's own dtype, which the drafter shares. ``device_map``
    goes to transformers for the target (e.g. ``"auto"`` for one larger than a GPU); the drafter goes on
    the device of the target's embedding. ``trust_remote_code``: run a checkpoint's own Python code.
    """
    tdir, ddir = pair_dirs(target, draft)
    require_dflash()
    dev = resolve_device(device)
    if dev.type == "cpu":
        from workbench.models.run import quiet_cpu_kernel_notes

        quiet_cpu_kernel_notes()
    if not isinstance(trust_remote_code, bool):
        raise ValueError(f"trust_remote_code={trust_remote_code!r} must be True or False")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    config = read_target_config(tdir, trust_remote_code)
    text = config.get_text_config(decoder=True)
    why = unverifiable(text)
    if why:
        raise ModelPairError(f"target '{tdir}' is {text.model_type} ({(config.architectures or ['?'])[0]}): {why}")
    dcfg = read_config(ddir)
    ds = draft_settings(dcfg, ddir)
    check_pair(text, ds, dcfg, tdir, ddir)
    check_weight_files(tdir, "target")
    check_weight_files(ddir, "draft")
    big, last = block_note(ds), last_layer_note(ds, text.num_hidden_layers)
    for warning in (big, last):  # before any weight loads or any cycle runs
        if warning:
            import warnings

            warnings.warn(warning, UserWarning, stacklevel=3)
    own = getattr(text, "dtype", None) or getattr(config, "dtype", None)
    dt = resolve_dtype("auto" if dtype is None else dtype, resolve_dtype(own) if own is not None else None)
    tokenizer = load_tokenizer(tdir, trust_remote_code)
    from transformers.utils import logging as hf_logging

    # Weight-loading progress bars are noise in a notebook (and in nbval's stored outputs); transformers'
    # load report is replaced by check_loading_info's errors.
    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        tmodel, notes = load_target(tdir, config, dt, dev, device_map, trust_remote_code)
        rows = tmodel.get_input_embeddings().weight.shape[0]
        if not ds.mask_token_id < rows:
            raise ModelPairError(f"draft mask_token_id {ds.mask_token_id} is outside the target's embedding of "
                                 f"{rows} rows ({tdir})")
        emb_dev = tmodel.get_input_embeddings().weight.device
        dmodel, dnotes = load_draft(ddir, ds, dt, emb_dev, text.num_hidden_layers)
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
    note = mask_note(tokenizer, ds.mask_token_id)
    notes = tuple(notes + dnotes + [n for n in (note, big, last) if n])
    for model in (tmodel, dmodel):  # the own forwards' linear layers through oneDNN, where they can run so
        packed_linear.enable(model)
    return Models(tmodel.eval(), dmodel.eval(), tokenizer, tdir, ddir, emb_dev, dt, notes)
