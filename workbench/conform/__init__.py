"""Tree-verify conformance: a production engine's speculative steps, dumped cycle by cycle and checked.

- ``dump``: the cycle dump format (docs/dump-format.md): ``read_dump``, ``DumpWriter``, ``FIELDS``.
- ``engine_dump``: the workbench's own engine writes a dump (``engine.session(..., dump=PATH)``);
  ``vllm_dump``: the vLLM adapter's (``wb.load(engine="vllm").session(..., dump=PATH)``).
- ``check`` / ``contracts``: the checker (``wb.conform``, ``python -m workbench conform DUMP``).
- ``convert``: SGLang's verify inputs (``EagleVerifyInput``) and a vLLM-style per-request tree bias -> dump
  records; any visibility form -> a dense mask.
- ``check`` (``wb.conform``, ``python -m workbench conform``): a dump replayed against the reference, contract by
  contract; ``contracts``: the contracts themselves, pure functions over plain tensors (docs/conformance.md).
- ``hooks_sglang`` / ``hooks_vllm``: modules to drop into an engine on a GPU host (not run here).
"""
