"""The package's version, in a module of its own so that any module can read it without importing the
package's public API (workbench/__init__.py imports the engine: a circle for the modules it imports)."""
__version__ = "0.1.0"  # as pyproject.toml's [project] version
