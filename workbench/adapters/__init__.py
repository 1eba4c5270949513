"""Production engines behind the workbench's API, and what they silently lose.

- ``base``: the engine interface, ``BaseEngine`` and ``BaseSession``: what every engine and its sessions offer
  the views, traces, stepper, bench and comparison report (the workbench's own ``Engine`` derives from it).
- ``registry``: the engines by name (``workbench``, ``vllm``); ``wb.load(engine=...)`` and the CLI pick here.
- ``vllm_hooks``: what vLLM's DFlash step does not return (drafts and their logits, the drafter's context,
  the target's choice at every drafted slot, per-layer tensors), captured by hooks on its proposer and
  model runner; written against one vLLM version and refused on another.
- ``vllm_engine``: vLLM's ``LLMEngine`` in process, one engine step = one draft/verify cycle, recorded as
  the workbench's own ``Cycle`` / ``Trace`` (``wb.load(..., engine="vllm")``).
- ``vllm_workarounds``: runtime patches for known losses of one vLLM version, behind a flag of the report.
- ``reference``: the workbench's side of every comparison, from scratch: the target's feature per layer and
  the drafter's logits and per-layer outputs for a given context.
- ``compare``: ``wb.compare(...)``: the same pair and prompts on both engines, side by side, and where
  acceptance differs, the first divergence localised to a context-feature chunk and a drafter layer.
- ``served``: the same report against a running OpenAI-compatible server (``vllm serve``, SGLang), with
  acceptance from the server's own speculative counters.

vLLM is optional (``pip install 'ddtree-workbench[vllm]'``); nothing else in the workbench imports it.
"""
