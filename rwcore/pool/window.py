"""Deprecated: moved to rwcore.arise.pool.window."""

from rwcore._deprecated import alias_module

alias_module(__name__)
