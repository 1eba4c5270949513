"""Production engines behind the workbench's API, and what they silently lose.

- ``vllm_tap``: what vLLM's DFlash step does not return (drafts and their logits, the drafter's context,
  the target's choice at every drafted slot, per-layer tensors), captured by a tap on its proposer and
  model runner; written against one vLLM version and refused on another.
- ``vllm_engine``: vLLM's ``LLMEngine`` in process, one engine step = one draft/verify cycle, recorded as
  the workbench's own ``Cycle`` / ``Trace`` (``wb.load(..., engine="vllm")``).
- ``vllm_workarounds``: runtime patches for known losses of one vLLM version, behind a flag of the report.
- ``compare``: ``wb.compare(...)``: the same pair and prompts on both engines, side by side, and where
  acceptance differs, the first divergence localised to a context-feature chunk and a drafter layer.
- ``served``: the same report against a running OpenAI-compatible server (``vllm serve``, SGLang), with
  acceptance from the server's own speculative counters.
- ``drafter_inputs``: a production drafter's inputs held against the reference's, one input at a time (the
  reference drafter itself is ``workbench.models.drafter_reference``).
- ``conventions``: which tensor each engine hands the drafter as a target layer's feature.
- ``spec_metrics``: vLLM's speculative-decoding counters, served or in process.

The engine interface every engine implements and the registry by name are ``workbench.interface``.

vLLM is optional (``pip install 'ddtree-workbench[vllm]'``); nothing else in the workbench imports it.
"""
