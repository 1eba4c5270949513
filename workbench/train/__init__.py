"""Training the embedded pairs (python -m workbench.train)."""
