"""The drafter's features in a cycle dump: what its forward was handed for each new context row, whole or as a
digest, the tolerance they are held to, and the input a checker must refuse before any model loads.

A context row is the target's hidden states at the drafter's L target layers, side by side: ``[L * H]``. Rows are
dumped whole while ``L * H <= ROWS_MAX_WIDTH`` (the embedded pairs: 4 x 256), and as a digest above it (a
full-size pair: 5 x 4096 floats a row, thousands of rows a run), per row and target layer:

- ``rms`` ``[c, L]``: the layer's root mean square over its H values;
- ``proj`` ``[c, L, DIGEST_DIMS]``: the layer's H values times one fixed matrix ``[H, DIGEST_DIMS]`` of
  independent normal draws / sqrt(H) (``projection``: ``torch.randn`` on a CPU generator seeded ``DIGEST_SEED``,
  float32), so each of its values has the size of the layer's RMS and a difference of ``d`` (RMS) between two
  rows shows as about ``d`` in each projected value.

Why a digest and not a hash: the checker holds a row to a *tolerance* (another engine computes in another order),
and a random projection keeps distances while a hash keeps none; 8 dims at 4 bytes are 64 bytes a layer.

The header says which (``"features": {"form": "rows" | "digest", "layers": L, "hidden": H, "seed", "dims"}``).
A digest is only comparable with the same projection, so one made with another seed or size is refused, as are
rows of another width than the pair's ``L * H``: one line each, before any model loads (``FeatureInputError``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

ROWS_MAX_WIDTH = 4096  # a context row of at most this many values is dumped whole
DIGEST_SEED = 20261205  # the one projection every writer and checker uses (module docstring)
DIGEST_DIMS = 8
FORMS = ("rows", "digest")


class FeatureInputError(ValueError):
    """Features a checker cannot hold to the pair (another digest, another width); one line naming the fix."""


@dataclass(frozen=True)
class FeatureTolerance:
    """A row's layer counts as the reference's when every value (rows) or every digest value is within
    ``atol + rtol * rms``, ``rms`` the reference layer's root mean square over its H values."""

    dtype: str
    atol: float
    rtol: float

    def __str__(self) -> str:
        return f"{self.dtype}: each value within {self.atol:g} + {self.rtol:g} x the layer's RMS"


# Measured on the embedded pairs (docs/conformance.md, "Tolerances"): the engine's features against the
# reference's differ by at most 3.2e-6 (dense) / 5.8e-6 (hybrid) of the layer's RMS in float32, 9.3e-3 in float16,
# 5.1e-2 in bfloat16 (whole rows; the digest's values by less). Neighbouring layers differ by 0.5 RMS or more and
# neighbouring positions by 1.1 RMS or more (median 4) on the dense pair, so the half types keep a 3x margin below.
TOLERANCES = {
    "float32": FeatureTolerance("float32", 1e-5, 1e-3),
    "float16": FeatureTolerance("float16", 1e-3, 3e-2),
    "bfloat16": FeatureTolerance("bfloat16", 1e-2, 1.5e-1),
}


def tolerance(dtype) -> FeatureTolerance:
    name = str(dtype).replace("torch.", "")
    if name not in TOLERANCES:
        raise ValueError(f"dtype {name!r}: the features have tolerances for {', '.join(TOLERANCES)}")
    return TOLERANCES[name]


@lru_cache(maxsize=8)
def projection(hidden: int, seed: int = DIGEST_SEED, dims: int = DIGEST_DIMS) -> Tensor:
    """float32 [hidden, dims]: normal draws / sqrt(hidden) from a CPU generator seeded ``seed`` (the same on
    every machine torch runs on)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(hidden, dims, generator=g, dtype=torch.float32) / math.sqrt(hidden)


def by_layer(rows: Tensor, layers: int) -> Tensor:
    """[c, L * H] -> float32 [c, L, H]."""
    return rows.float().reshape(rows.shape[0], layers, -1)


def digest(rows: Tensor, layers: int) -> tuple[Tensor, Tensor]:
    """(rms [c, L], proj [c, L, DIGEST_DIMS]) of context rows [c, L * H] (any device; float32 on the CPU)."""
    x = by_layer(rows.detach().cpu(), layers)  # [c, L, H]
    return x.pow(2).mean(-1).sqrt(), x @ projection(x.shape[-1])


@dataclass(frozen=True)
class FeatureSpec:
    """The header's ``features``: how the records hold them."""

    form: str  # "rows" or "digest"
    layers: int  # L: the drafter's target layers
    hidden: int  # H: the target's hidden size
    seed: int | None = None  # digest only
    dims: int | None = None

    @property
    def width(self) -> int:
        return self.layers * self.hidden

    def to_header(self) -> dict:
        out = {"form": self.form, "layers": self.layers, "hidden": self.hidden}
        if self.form == "digest":
            out.update(seed=self.seed, dims=self.dims, projection="torch.randn(hidden, dims, CPU generator "
                       "seeded seed) / sqrt(hidden), float32; per row and layer: rms and values @ projection")
        return out

    def fields(self, rows: Tensor) -> dict:
        """The cycle fields for context rows [c, L * H] as the forward was handed them."""
        if self.form == "rows":
            return {"draft_context_features": rows}
        rms, proj = digest(rows, self.layers)
        return {"draft_context_features_rms": rms, "draft_context_features_proj": proj}


def spec_for(layers: int, hidden: int) -> FeatureSpec:
    """Whole rows for a small pair, the digest above ``ROWS_MAX_WIDTH`` values a row."""
    if layers * hidden <= ROWS_MAX_WIDTH:
        return FeatureSpec("rows", layers, hidden)
    return FeatureSpec("digest", layers, hidden, DIGEST_SEED, DIGEST_DIMS)


# ------------------------------------------------------------------------------------------ reading
def pair_shape(target_dir, draft_dir) -> tuple[int, int]:
    """(the drafter's target layers L, the target's hidden size H) from their configs, read, not loaded."""
    from workbench.engine.loading import draft_settings, read_config
    from workbench.models.config_facts import text_fields

    hidden = int(text_fields(read_config(target_dir))["hidden_size"])
    return len(draft_settings(read_config(draft_dir), draft_dir).target_layer_ids), hidden


FIELDS = ("draft_context_features", "draft_context_features_rms", "draft_context_features_proj")


def has_features(rec) -> bool:
    return "draft_context_features" in rec or "draft_context_features_rms" in rec


def check_header(head: dict, path, layers: int | None, hidden: int | None) -> FeatureSpec | None:
    """The header's ``features`` against this checker's digest and the pair (``layers``: the drafter's target
    layers, ``hidden``: the target's hidden size, from their configs), or FeatureInputError. None: no features."""
    raw = head.get("features")
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.get("form") not in FORMS:
        raise FeatureInputError(f"{path}: the header's features {str(raw)[:60]} has no form "
                                f"{' or '.join(map(repr, FORMS))}; docs/dump-format.md, 'Features'")
    spec = FeatureSpec(raw["form"], raw.get("layers"), raw.get("hidden"), raw.get("seed"), raw.get("dims"))
    if spec.form == "digest" and (spec.seed, spec.dims) != (DIGEST_SEED, DIGEST_DIMS):
        raise FeatureInputError(
            f"{path}: the features digest was made with projection seed {spec.seed} and {spec.dims} dims; this "
            f"checker's digest is seed {DIGEST_SEED} with {DIGEST_DIMS} dims: write it with "
            "workbench.conform.features.digest (or dump whole rows)")
    if layers is not None and spec.layers != layers:
        raise FeatureInputError(f"{path}: the header's features hold {spec.layers} target layers a row but the "
                                f"pair's drafter reads {layers}: features of another drafter; check it on its pair")
    if hidden is not None and spec.hidden != hidden:
        raise FeatureInputError(f"{path}: the header's features are {spec.hidden} wide a layer but the target's "
                                f"hidden size is {hidden}: features of another target; check it on its pair")
    return spec


def check_record(rec, spec: FeatureSpec | None, layers: int | None, hidden: int | None) -> None:
    """One cycle record's features: of the header's form, ``layers * hidden`` wide (rows), ``[c, layers]`` and
    ``[c, layers, dims]`` (digest), one row per context position. FeatureInputError naming file:line."""
    if not any(f in rec for f in FIELDS):
        return
    where = rec.where
    if spec is None:
        raise FeatureInputError(f"{where}: the record holds drafter features but the header has no 'features' "
                                "(their form, layers and hidden size); docs/dump-format.md, 'Features'")
    want_layers = layers if layers is not None else spec.layers
    want_hidden = hidden if hidden is not None else spec.hidden
    n = rec["draft_context_positions"].shape[0] if "draft_context_positions" in rec else None
    if spec.form == "rows":
        if "draft_context_features" not in rec:
            raise FeatureInputError(f"{where}: a digest of the features under a header that says whole rows")
        x = rec["draft_context_features"]
        width = want_layers * want_hidden
        if x.dim() != 2 or x.shape[1] != width:
            raise FeatureInputError(
                f"{where}: draft_context_features {list(x.shape)} are {x.shape[-1] if x.dim() else 0} values a "
                f"row, but the drafter reads {want_layers} target layers of hidden size {want_hidden} = {width}: "
                "features of other layers or another model; dump the rows the drafter's forward was handed")
        rows = x.shape[0]
    else:
        if "draft_context_features_rms" not in rec or "draft_context_features_proj" not in rec:
            raise FeatureInputError(f"{where}: the header says a features digest; the record needs both "
                                    "draft_context_features_rms and draft_context_features_proj")
        rms, proj = rec["draft_context_features_rms"], rec["draft_context_features_proj"]
        if rms.dim() != 2 or rms.shape[1] != want_layers or list(proj.shape) != [rms.shape[0], want_layers, spec.dims]:
            raise FeatureInputError(
                f"{where}: the features digest has rms {list(rms.shape)} and proj {list(proj.shape)}; the pair's "
                f"drafter reads {want_layers} layers and the header's digest has {spec.dims} dims: [c, "
                f"{want_layers}] and [c, {want_layers}, {spec.dims}]")
        rows = rms.shape[0]
    if n is not None and rows != n:
        raise FeatureInputError(f"{where}: {rows} rows of drafter features for {n} draft_context_positions")


# ------------------------------------------------------------------------------------------ comparing
class EngineRows:
    """One record's features as the engine handed them, held against candidate reference layers ``[c, L, H]``
    (whole rows compared value by value; a digest by its RMS and projected values)."""

    def __init__(self, rec, spec: FeatureSpec, tol: FeatureTolerance):
        self.spec, self.tol = spec, tol
        if spec.form == "rows":
            self.rows = by_layer(rec["draft_context_features"], spec.layers)  # [c, L, H]
        else:
            self.rms = rec["draft_context_features_rms"].float()  # [c, L]
            self.proj = rec["draft_context_features_proj"].float()  # [c, L, dims]

    def __len__(self) -> int:
        return (self.rows if self.spec.form == "rows" else self.rms).shape[0]

    def off(self, ref: Tensor, rows: Tensor | None = None) -> Tensor:
        """float [c', L]: how far each row's layer is from ``ref`` [c', L, H], in tolerances (<= 1: equal).
        ``rows``: which of the engine's rows (default: all, in order)."""
        r = ref.float()
        want_rms = r.pow(2).mean(-1).sqrt()  # [c', L]
        scale = self.tol.atol + self.tol.rtol * want_rms
        if self.spec.form == "rows":
            mine = self.rows if rows is None else self.rows[rows]
            return (mine - r).abs().amax(-1) / scale
        rms, proj = (self.rms, self.proj) if rows is None else (self.rms[rows], self.proj[rows])
        want_proj = r @ projection(r.shape[-1], self.spec.seed, self.spec.dims)
        return torch.maximum((rms - want_rms).abs(), (proj - want_proj).abs().amax(-1)) / scale
