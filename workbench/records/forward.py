"""Forward modes, named as SGLang names them, and the ForwardRecord every forward leaves.

The forwards themselves are in ``workbench.models.run``.

- target prefill: EXTEND
- plain decoding (AR): DECODE
- target verify of a chain or a tree: TARGET_VERIFY
- the DFlash drafter's block forward: TARGET_VERIFY on the draft model (as SGLang's
  DFlash worker runs it; ``supports_target_verify_for_draft()``)
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field



class ForwardMode(str, enum.Enum):
    """The subset of ``sglang...forward_batch_info.ForwardMode`` this engine runs (same names)."""

    EXTEND = "EXTEND"
    DECODE = "DECODE"
    TARGET_VERIFY = "TARGET_VERIFY"

    def __str__(self) -> str:
        return self.value


def shape_of(x) -> dict:
    """{"shape", "dtype", "device"} of a tensor: what a ForwardRecord keeps of it."""
    return {"shape": list(x.shape), "dtype": str(x.dtype).replace("torch.", ""), "device": str(x.device)}


@dataclass(frozen=True)
class ForwardRecord:
    """What one forward saw and returned: shapes and dtypes only, never tensor copies."""

    model: str  # "target" or "draft"
    mode: ForwardMode
    inputs: dict = field(default_factory=dict)  # name -> {"shape": [...], "dtype": str, "device": str}
    outputs: dict = field(default_factory=dict)
    kv_before: int = 0
    kv_after: int = 0
    modules: tuple = ()  # per-module shapes, filled only while a shape capture is on
    # Recurrent state a hybrid target's linear layers read or wrote: {"name", "io", "layers", "shape", "dtype",
    # "device"} per tensor kind (one layer's shape; "layers" lists the linear layers). Empty for attention-only.
    states: tuple = ()

    def to_dict(self) -> dict:
        return {"model": self.model, "mode": self.mode.value, "inputs": self.inputs, "outputs": self.outputs,
                "kv_before": self.kv_before, "kv_after": self.kv_after, "modules": [dict(m) for m in self.modules],
                **({"states": [dict(x) for x in self.states]} if self.states else {})}

    def devices(self) -> dict:
        """{tensor name: device} over inputs and outputs; records saved before devices were kept say "unknown"."""
        return {k: v.get("device", "unknown") for k, v in {**self.inputs, **self.outputs}.items()}

    @classmethod
    def from_dict(cls, d: dict) -> "ForwardRecord":
        return cls(d["model"], ForwardMode(d["mode"]), d["inputs"], d["outputs"], d["kv_before"], d["kv_after"],
                   tuple(d.get("modules", ())), tuple(d.get("states", ())))
