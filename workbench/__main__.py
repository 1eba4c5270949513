"""``python -m workbench`` (and the ``workbench`` console script): see workbench.cli."""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    from workbench.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
