"""Config values against their declared types: `coerce` turns a YAML or override value into a field's type (or
raises `NotCoercible`), `type_name` and `literal_of` describe a type in a message, and `show_value` / `key_label`
shorten a value or a key for an error line."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

__all__ = ["NotCoercible", "coerce", "field_types", "is_section", "key_label", "literal_of", "show_value", "type_name"]


def field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(tp))
        return f"{origin.__name__}[{args}]"
    return getattr(tp, "__name__", str(tp))


class NotCoercible(Exception):
    """Internal: the value does not fit the type."""


def coerce(value: Any, tp: Any, raw: str | None) -> Any:
    """Coerces `value` to `tp`; raises NotCoercible. `raw` is the override text, if any."""
    if tp is Any or tp is object:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        # Prefer a member the value already is, so `int | str` keeps 3 an int.
        for member in members:
            if isinstance(member, type) and type(value) is member:
                return value
        for member in members:
            try:
                return coerce(value, member, raw)
            except NotCoercible:
                continue
        raise NotCoercible
    if origin is Literal:
        allowed = args
        if isinstance(value, bool) and all(isinstance(a, str) for a in allowed):
            if raw is not None:
                value = raw.strip()
            elif "on" in allowed or "off" in allowed:  # YAML 1.1 reads a bare on / off as a boolean
                value = "on" if value else "off"
            elif {"true", "false"} <= set(allowed):
                value = "true" if value else "false"
        if value in allowed and type(value) in {type(a) for a in allowed}:
            return value
        if raw is not None and raw.strip() in allowed:
            return raw.strip()
        raise NotCoercible
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "on", "off"):
            return value.strip().lower() in ("true", "on")  # on / off: what earlier configs wrote
        raise NotCoercible
    if tp is int:
        if isinstance(value, bool):
            raise NotCoercible
        if isinstance(value, int):
            return value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip().replace("_", ""))
            except ValueError:
                try:
                    number = float(value)
                except ValueError:
                    raise NotCoercible from None
                if math.isfinite(number) and number.is_integer():
                    return int(number)
        raise NotCoercible
    if tp is float:
        if isinstance(value, bool):
            raise NotCoercible
        if isinstance(value, (int, float)):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                raise NotCoercible from None
        else:
            raise NotCoercible
        if math.isnan(number):
            raise NotCoercible
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (bool, int, float)):
            # A scalar YAML read as something else: keep the text the user typed.
            if raw is not None:
                return raw.strip()
            if isinstance(value, bool):
                return "true" if value else "false"
            return str(value)
        raise NotCoercible
    if tp is dict or origin is dict:
        if not isinstance(value, Mapping):
            raise NotCoercible
        key_tp, val_tp = args if args else (Any, Any)
        return {coerce(k, key_tp, None): coerce(v, val_tp, None) for k, v in value.items()}
    if tp is list or origin is list:
        if not isinstance(value, (list, tuple)):
            raise NotCoercible
        (item_tp,) = args if args else (Any,)
        return [coerce(v, item_tp, None) for v in value]
    if tp is tuple or origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise NotCoercible
        if not args:
            return tuple(value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(coerce(v, args[0], None) for v in value)
        if len(args) != len(value):
            raise NotCoercible
        return tuple(coerce(v, a, None) for v, a in zip(value, args))
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise NotCoercible
    return value


def literal_of(tp: Any) -> Any:
    """The Literal type of an enumerated field (`Literal[...]` or `Literal[...] | None`), else None."""
    if typing.get_origin(tp) is Literal:
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(members) == 1 and typing.get_origin(members[0]) is Literal:
            return members[0]
    return None


def show_value(value: Any, limit: int = 80) -> str:
    """repr(value), shortened to about `limit` characters for an error line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 20]}...{text[-12:]} ({len(text)} characters)"


def key_label(key: Any) -> str:
    """A mapping key as one part of a key path in a message (a long key shortened)."""
    text = key if isinstance(key, str) else repr(key)
    return text if len(text) <= 40 else text[:30] + "..."
