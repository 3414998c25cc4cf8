"""`python -m rwcore.trainer.cli` runs the `rw` command line."""

import sys

from rwcore.trainer.cli import main

sys.exit(main())
