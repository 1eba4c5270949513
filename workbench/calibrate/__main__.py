"""``python -m workbench.calibrate ...``: see ``workbench.calibrate.command``."""
import sys

from workbench.calibrate.command import main

sys.exit(main())
