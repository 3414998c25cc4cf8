"""Old import paths of modules that moved, kept working until `REMOVED_IN` with a DeprecationWarning.

A shim module calls `alias_module(__name__, new_name)`: the old name then refers to the *same* module
object as the new one (classes keep their identity, private helpers stay reachable), and importing it
warns once per process.
"""

from __future__ import annotations

import importlib
import sys
import warnings

REMOVED_IN = "0.2.0"
"""The rwcore release that removes every deprecated import path and config spelling (this one is 0.1.0)."""

MOVED = {
    "rwcore.advantages": "rwcore.arise.advantages",
    "rwcore.evidence": "rwcore.arise.evidence",
    "rwcore.pool": "rwcore.arise.pool",
    "rwcore.pool.lifecycle": "rwcore.arise.pool.lifecycle",
    "rwcore.pool.pool": "rwcore.arise.pool.pool",
    "rwcore.pool.prompt": "rwcore.arise.pool.prompt",
    "rwcore.pool.records": "rwcore.arise.pool.records",
    "rwcore.pool.window": "rwcore.arise.pool.window",
    "rwcore.baselines": "rwcore.sampling.baselines",
    "rwcore.data": "rwcore.sampling.batch",
    "rwcore.demo_sampler": "rwcore.sampling.demo",
}
"""old module -> where it lives now (`rwcore.sampling`, once a module, is now a package: see its __getattr__)."""


def warn_moved(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(
        f"{old} moved to {new}; the old import path is deprecated and will be removed in rwcore {REMOVED_IN}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def alias_module(old: str) -> object:
    """Makes module `old` the module it moved to (MOVED[old]) and warns."""
    new = MOVED[old]
    warn_moved(old, new, stacklevel=4)
    module = importlib.import_module(new)
    sys.modules[old] = module
    return module
