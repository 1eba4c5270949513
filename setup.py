"""Package discovery only; everything else is in pyproject.toml.

pyproject.toml alone cannot both discover packages and map kernels/ to the import name
ddtree_kernels, so the list is computed here: every package under workbench/ plus ddtree_kernels."""
from setuptools import find_packages, setup

setup(packages=find_packages(include=["workbench", "workbench.*"]) + ["ddtree_kernels"])
