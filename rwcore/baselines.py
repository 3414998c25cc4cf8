"""Deprecated: moved (see rwcore._deprecated.MOVED)."""

from rwcore._deprecated import alias_module

alias_module(__name__)
