"""``python -m workbench.train``: see workbench.train.pipeline."""
from workbench.train.pipeline import main

if __name__ == "__main__":
    raise SystemExit(main())
