"""Running from a checkout: keep its root from shadowing installed packages.

The checkout's `kernels/` and `trainer/` folders are installed as `rwcore.kernels` and `rwcore.trainer`
(docs/design.md#layout-and-layers). When the checkout's root is on `sys.path` — `python -m ...`, `torchrun -m ...`,
`python -c` or a script run from it put the working directory first — the folders are also importable as
top-level `kernels` and `trainer` and hide installed packages of those names. Hugging Face's `kernels`
is one: transformers (5.2x and later depend on it) imports it at start and fails with "cannot import
name ... from 'kernels' (<checkout>/kernels/__init__.py)", so `rw ablate`'s runs and the test suite
failed on a fresh set-up. `import rwcore` moves the root behind every other entry; nothing of rwcore
needs it in front (`rwcore` is already found, its submodules come from `rwcore.__path__`, and the
editable install maps the two folders itself).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_FOLDERS = ("kernels", "trainer")


def _is_root(entry: str) -> bool:
    try:
        return Path(entry or os.getcwd()).resolve() == ROOT
    except (OSError, ValueError):
        return False


def move_root_last() -> bool:
    """Moves this checkout's root to the end of sys.path; True when it was in front of something.
    A no-op for an installed rwcore (no checkout around it) and when the root is not on sys.path."""
    if not (ROOT / "setup.py").is_file() or not all((ROOT / name / "__init__.py").is_file() for name in SOURCE_FOLDERS):
        return False
    at_root = [entry for entry in sys.path if _is_root(entry)]
    if not at_root:
        return False
    others = [entry for entry in sys.path if not _is_root(entry)]
    if sys.path == others + at_root:
        return False
    sys.path[:] = others + at_root
    importlib.invalidate_caches()
    return True
