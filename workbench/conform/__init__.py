"""Tree-verify conformance: a production engine's speculative steps, dumped cycle by cycle and checked.

- ``dump``: the cycle dump format (docs/dump-format.md): ``read_dump``, ``DumpWriter``, ``FIELDS``.
- ``engine_dump``: the workbench's own engine writes a dump (``engine.session(..., dump=PATH)``);
  ``vllm_dump``: the vLLM adapter's (``wb.load(engine="vllm").session(..., dump=PATH)``).
- ``convert``: SGLang's verify inputs (``EagleVerifyInput``) and a vLLM-style per-request tree bias -> dump
  records; any visibility form -> a dense mask.
- ``check`` (``wb.conform``, ``python -m workbench conform``): a dump replayed against the reference, contract by
  contract: ``inputs`` refuses a bad dump before any model loads, ``replay`` walks its cycles, ``replay_contracts``
  checks each contract on a cycle (``replay_reference`` computes what the reference would), ``report`` holds the
  verdicts; ``contracts``: the contracts themselves, pure functions over plain tensors (docs/conformance.md).
- ``selection``: which cycles a check judges (``cycles=(A, B)``, ``requests=[...]``); ``progress``: its progress lines.
- ``diagnosis``: which bug did it: the catalogue's candidate causes (``causes``, each with its published source)
  reproduced in the reference (``suspects``: the suspected input; ``reproduce``: its forward) against the records.
- ``fault_cost``: what the run lost, beside the reference's own decode of its prompts (lossless or not, tau);
  ``intended``: the fields a writer recorded as meant rather than read at the forward (the header's ``intended``).
- ``sglang_dump`` / ``vllm_tree_dump``: dump writers to drop into SGLang or a vLLM tree proposer on a GPU host
  (not run here).
"""
import sys
import types


class CallablePackage(types.ModuleType):
    """This package, callable: ``wb.conform(dump, ...)`` runs the checker (``workbench.conform.check.conform``).

    Why: ``wb.conform`` is documented as the checker, and ``workbench.conform`` is this package. Python binds a
    subpackage as an attribute of its parent the first time it is imported (a dump writer imports it), so a
    function of the same name on ``workbench`` is shadowed by the module from then on ("'module' object is not
    callable"), and a function bound over the module breaks ``import workbench.conform.dump as d``. A callable
    package is both, whichever is imported first. The checker itself is imported on the first call."""

    def __call__(self, dump, target=None, draft=None, *, models=None, device: str = "cpu", progress=None,
                 cycles=None, requests=None):
        from workbench.conform.check import conform

        return conform(dump, target, draft, models=models, device=device, progress=progress, cycles=cycles,
                       requests=requests)


sys.modules[__name__].__class__ = CallablePackage

# The cycle dump's writer registers the session keyword ``dump`` (workbench.engine.observers) as it is imported:
# the engine finds it there without importing this package (it sits a floor above the engine).
from workbench.conform import engine_dump  # noqa: E402,F401
