"""The production-engine surfaces check their arguments before anything loads: wb.compare,
bench --engine vllm (in process and --served), the vLLM engine's load options. No vLLM model loads here."""
from __future__ import annotations

import socket
import time

import pytest

import workbench as wb
from workbench.__main__ import main


@pytest.mark.parametrize("kw,why", [
    (dict(prompts="def f():"), r"prompts='def f\(\):' is one text; give a list of texts"),
    (dict(prompts=[]), r"prompts=\[\] holds no prompt"),
    (dict(workarounds="no"), r"workarounds='no' must be True or False"),
    (dict(max_new_tokens=0), r"max_new_tokens=0 must be a positive integer"),
    (dict(max_new_tokens=8.5), r"max_new_tokens=8.5 must be a positive integer"),
    (dict(repeats=0), r"repeats=0 must be a positive integer"),
])
def test_compare_refuses_bad_arguments_before_loading(kw, why):
    t = time.perf_counter()
    with pytest.raises(ValueError, match=why):
        wb.compare(**kw)
    assert time.perf_counter() - t < 2  # nothing loaded


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("extra,why", [
    (["--served", "URL", "--policies", "ar,dflash"], "--policies is not used by --engine vllm --served"),
    (["--served", "URL", "--repeats", "5"], "--repeats is not used by --engine vllm --served"),
    (["--served", "URL", "--device", "cuda"], "--device is not used by --engine vllm --served"),
    (["--policies", "ddtree:32"], "--policies is not used by --engine vllm (the report runs AR and DFlash"),
    (["--api-key", "k"], "--api-key is the key of a --served engine"),
])
def test_bench_engine_vllm_refuses_what_it_would_ignore(capsys, extra, why):
    url = _closed_port_url()
    argv = ["bench", "--engine", "vllm", "--limit", "1", *[url if a == "URL" else a for a in extra]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert why in err and len(err.strip().splitlines()) == 1, err
    assert main(["bench", "--api-key", "k", "--limit", "1"]) == 2  # the workbench's own bench too
    assert "--api-key is the key of a --served engine" in capsys.readouterr().err


def test_the_vllm_engine_refuses_workbench_options_before_loading():
    import torch

    for kw, why in ((dict(kernel_backend="sglang"), "kernel_backend= is an option of the workbench's engine"),
                    (dict(threads=2), "threads= is an option of the workbench's engine")):
        with pytest.raises(ValueError, match=why):
            wb.load(engine="vllm", **kw)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda' but CUDA is not available on this machine"):
            wb.load(engine="vllm", device="cuda")


def test_a_refused_pair_names_vllms_reason_not_its_error_count():
    """vLLM refuses the hybrid pair with a config ValidationError whose first line only counts errors
    ("1 validation error for ModelConfig"): the one line carries the messages."""
    import pydantic

    from workbench.adapters.vllm_engine import refusal_reason

    class ModelConfig(pydantic.BaseModel):
        architecture: str

        @pydantic.field_validator("architecture")
        @classmethod
        def known(cls, v):
            raise ValueError(f"Model architectures ['{v}'] failed to be inspected")

    with pytest.raises(pydantic.ValidationError) as e:
        ModelConfig(architecture="Qwen3_5ForCausalLM")
    assert str(e.value).splitlines()[0] == "1 validation error for ModelConfig"
    assert refusal_reason(e.value) == "Value error, Model architectures ['Qwen3_5ForCausalLM'] failed to be inspected"
    assert refusal_reason(RuntimeError("first\nsecond")) == "first"
