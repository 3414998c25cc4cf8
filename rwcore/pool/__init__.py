"""Deprecated: Arise's rubric-skill pool moved to `rwcore.arise.pool` (this path works for one more release)."""

from rwcore._deprecated import warn_moved

warn_moved("rwcore.pool", "rwcore.arise.pool")

from rwcore.arise.pool import *  # noqa: E402, F403
from rwcore.arise.pool import __all__  # noqa: E402,F401
