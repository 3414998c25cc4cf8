"""A setting declared once: a dataclass field that carries its default, its help, its `rw train` config key and its
range, and the checks every consumer derives from that declaration.

    @dataclass(frozen=True)
    class PoolSettings:
        eta_low: float = setting(0.3, "Pass rate at or below which ...", "pool.eta_low", ge=0, le=1)
        eta_high: float = setting(0.9, "Pass rate at or above which ...", "pool.eta_high", le=1, above="eta_low")

        def __post_init__(self) -> None:
            check_settings(self)

Declarations built this way: `rwcore.kernels.loss_settings.LossSettings` (the policy loss) and
`rwcore.method.MethodSettings` (the method). `rw train`'s config sections, `rw config --describe`, the YAML files,
the integrations' keyword arguments and their range checks are generated from the fields' metadata: `help`,
`config` (`section.key`, or None for a setting that is no config key), the bounds `ge` / `gt` / `le` / `lt` and
`above` (the name of a setting this one must exceed).

The checks by declared type (`check_settings`), with the rules of `rwcore.validation`: a `Literal` is one of its
values, a bool is True or False, an int an integer (not a bool) within the bounds, a float a finite real number
within them; other types are not checked. Errors are `SettingError`s (ValueErrors) naming the settings at fault, so
that a caller that spells them its own way (a config key, verl's clip_ratio_c) can say which of its keys is wrong.

It is a leaf module (the standard library and NumPy only, nothing else of rwcore), so that the kernels, the lowest
layer, declare the loss with it without loading anything else, and the method declares its settings with it without
loading the kernels (and torch).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import typing
from typing import Any, Literal

import numpy as np

__all__ = [
    "BOUNDS",
    "SettingError",
    "check_setting",
    "check_settings",
    "config_keys",
    "describe_settings",
    "is_int",
    "is_real",
    "setting",
    "setting_types",
    "settings_dict",
]

BOUNDS = ("ge", "gt", "le", "lt")
"""The range a numeric setting may declare: >=, >, <=, < a number."""


class SettingError(ValueError):
    """A value outside its setting's declaration; `names` are the settings at fault."""

    def __init__(self, message: str, names: typing.Iterable[str]) -> None:
        super().__init__(message)
        self.names = tuple(names)


def setting(default: Any, help: str, config: str | None = None, *, above: str | None = None, **bounds) -> Any:
    """A settings-dataclass field declared once: its default, its help, the `rw train` config key it appears
    under (`section.key`; None = not a config key), its range (ge / gt / le / lt) and, with `above`, the
    setting it must exceed. `rw train`'s config sections, `rw config --describe` and the YAML files are
    generated from these fields."""
    unknown = set(bounds) - set(BOUNDS)
    if unknown:
        raise TypeError(f"setting(): unknown bounds {sorted(unknown)}")
    metadata = {"help": help, "config": config, **bounds}
    if above is not None:
        metadata["above"] = above
    return dataclasses.field(default=default, metadata=metadata)


@functools.cache
def setting_types(cls: type) -> dict[str, Any]:
    """Field name -> declared type of the settings dataclass `cls` (resolved once per class)."""
    return typing.get_type_hints(cls)


def _int_range(metadata: typing.Mapping) -> tuple[int | None, int | None]:
    low = high = None
    if "ge" in metadata:
        low = math.ceil(metadata["ge"])
    if "gt" in metadata:
        low = math.floor(metadata["gt"]) + 1
    if "le" in metadata:
        high = math.floor(metadata["le"])
    if "lt" in metadata:
        high = math.ceil(metadata["lt"]) - 1
    return low, high


def is_int(value: Any) -> bool:
    """A Python or NumPy integer that is not a bool."""
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_real(value: Any) -> bool:
    """A Python or NumPy real number that is not a bool (finite or not)."""
    return isinstance(value, (numbers.Real, np.floating, np.integer)) and not isinstance(value, (bool, np.bool_))


def _range_text(metadata: typing.Mapping) -> str:
    """The declared range of a float as an interval: [0, 1], (1, inf), ..."""
    low, high = metadata.get("gt", metadata.get("ge")), metadata.get("lt", metadata.get("le"))
    opening = "(" if low is None or "gt" in metadata else "["
    closing = ")" if high is None or "lt" in metadata else "]"
    return f"{opening}{'-inf' if low is None else f'{low:g}'}, {'inf' if high is None else f'{high:g}'}{closing}"


def _in_range(value: float, metadata: typing.Mapping) -> bool:
    return not (
        ("ge" in metadata and not value >= metadata["ge"])
        or ("gt" in metadata and not value > metadata["gt"])
        or ("le" in metadata and not value <= metadata["le"])
        or ("lt" in metadata and not value < metadata["lt"])
    )


def _problem(value: Any, kind: Any, metadata: typing.Mapping) -> str | None:
    """What is wrong with `value` as a setting of type `kind` and range `metadata` ("must be ..."), or None."""
    if typing.get_origin(kind) is Literal:
        allowed = typing.get_args(kind)
        return None if value in allowed else f"must be one of {allowed}, got {value!r}"
    if kind is bool:
        return None if isinstance(value, (bool, np.bool_)) else f"must be True or False, got {value!r}"
    if kind is int:
        if not is_int(value):
            return f"must be an integer, got {value!r}"
        if _in_range(int(value), metadata):
            return None
        low, high = _int_range(metadata)
        return f"must be in [{'-inf' if low is None else low}, {'inf' if high is None else high}], got {int(value)}"
    if kind is float:
        bounded = any(bound in metadata for bound in BOUNDS)
        what = f"a finite number in {_range_text(metadata)}" if bounded else "a finite number"
        if not (is_real(value) and math.isfinite(float(value)) and _in_range(float(value), metadata)):
            return f"must be {what}, got {value!r}"
    return None


def check_setting(name: str, value: Any, kind: Any, metadata: typing.Mapping) -> None:
    """SettingError naming `name` when `value` does not fit its declared type `kind` and range (`metadata`)."""
    problem = _problem(value, kind, metadata)
    if problem is not None:
        raise SettingError(f"{name} {problem}", [name])


def check_settings(settings: Any) -> None:
    """Every field of the settings dataclass instance `settings` against its declaration (type, range, `above`);
    SettingError naming the first one that does not fit."""
    hints = setting_types(type(settings))
    fields = dataclasses.fields(settings)
    for f in fields:
        check_setting(f.name, getattr(settings, f.name), hints[f.name], f.metadata)
    for f in fields:
        low = f.metadata.get("above")
        if low is not None and not getattr(settings, low) < getattr(settings, f.name):
            raise SettingError(
                f"{low} must be below {f.name}, got {getattr(settings, low)} and {getattr(settings, f.name)}",
                [low, f.name],
            )


def settings_dict(settings: Any) -> dict:
    """name -> value of every setting (tuples as lists: JSON-ready)."""
    return {
        f.name: (list(v) if isinstance(v := getattr(settings, f.name), tuple) else v)
        for f in dataclasses.fields(settings)
    }


def config_keys(cls: type) -> dict[str, str]:
    """Field name -> its config key (`section.key`), for every setting of `cls` that has one."""
    return {f.name: f.metadata["config"] for f in dataclasses.fields(cls) if f.metadata.get("config")}


def describe_settings(cls: type) -> str:
    """One line per setting of `cls`: name, config key, default and help."""
    lines = []
    for f in dataclasses.fields(cls):
        key = f.metadata.get("config") or "(not a config key)"
        lines.append(f"{f.name} [{key}] = {f.default!r}: {f.metadata.get('help', '')}")
    return "\n".join(lines)
