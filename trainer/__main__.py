"""`python -m rwcore.trainer` runs the `rw` command line."""

import os
import sys

# `python -m` puts the current folder first on sys.path; a config read from a run folder names environment
# code (env.options.taskset, ...) by module, which must come from the installed packages or PYTHONPATH,
# never from whatever folder the command happens to run in (`cd RUN && python -m rwcore.trainer eval .`).
# Python 3.11's -P / PYTHONSAFEPATH does the same; this keeps it without the flag.
if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from rwcore.trainer.cli import main  # (after sys.path is made safe)

sys.exit(main())
