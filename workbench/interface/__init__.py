"""The engine interface: what every engine implements, and the engines by name.

- ``base``: ``BaseEngine``, ``BaseSession`` and ``EngineLacks`` (a part an engine does not offer, said in one line).
- ``registry``: ``wb.load(engine=NAME)`` and the CLI's ``--engine`` pick an engine class from here; entries
  name their class as 'module:Class' and are imported only when that engine loads.

This floor sits under every engine (the workbench's own in ``workbench.engine``, the production adapters in
``workbench.adapters``, the served client in ``workbench.serve``), so ``wb.load`` dispatches downward.
"""
