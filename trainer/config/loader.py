"""Loading a configuration: the defaults, then a YAML file nested by section, then `section.key=value` overrides.

    cfg = load_config("my.yaml", ["train.steps=20", "pool.skills=off", "model.name=null"])

Override values are parsed with `yaml.safe_load` and then coerced to the field's declared type:
`optim.lr=1e-3` is a float even though YAML 1.1 reads `1e-3` as a string, a string field keeps the
text as typed (`pool.skills=off` is "off", not False), `null` gives None where the type allows it,
and a `dict` field takes a flow mapping (`env.options={difficulty: 2}`) or deeper dotted keys
(`env.options.difficulty=2`). Enumerated fields are `typing.Literal` types and are checked against
their allowed values.

Every problem raises `ValueError` naming the full dotted key: an unknown section or key (the
message lists the valid ones), a value of the wrong type (with the expected type and the value),
a value outside an enumeration (with the allowed values) or outside a declared range. The loader is generic
over the schema's dataclass fields: a new field needs nothing here.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import yaml

from rwcore.method.variants import LIBRARY_STRATEGIES
from rwcore.sampling import sampler_names
from rwcore.trainer.config.checks import validate
from rwcore.trainer.config.coercion import (
    NotCoercible,
    coerce,
    field_types,
    is_section,
    key_label,
    literal_of,
    show_value,
    type_name,
)
from rwcore.trainer.config.schema import Config, config_sections
from rwcore.trainer.config.yaml_input import (
    MAX_CONFIG_BYTES,
    MAX_KEY_PARTS,
    check_plain,
    load_yaml,
    parse_config_text,
    read_config_text,
)

__all__ = ["config_from_dict", "load_config"]


_INT_LIMIT = 2**63 - 1  # what torch and numpy hold in an int64; beyond it a setting overflows far from here


def _check_number(key: str, value: Any) -> None:
    """Every number of a config, nested ones included, is finite and fits an int64."""
    if isinstance(value, bool):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"config key {key!r}: must be a finite number, got {value!r}")
    if isinstance(value, int) and abs(value) > _INT_LIMIT:
        raise ValueError(f"config key {key!r}: {value} does not fit a 64-bit integer")
    if isinstance(value, Mapping):
        for inner, item in value.items():
            _check_number(f"{key}.{inner}", item)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_number(f"{key}[{index}]", item)


def _check_range(key: str, value: Any, meta: Mapping[str, Any]) -> None:
    _check_number(key, value)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    checks = (
        ("ge", ">=", lambda v, b: v >= b),
        ("gt", ">", lambda v, b: v > b),
        ("le", "<=", lambda v, b: v <= b),
        ("lt", "<", lambda v, b: v < b),
    )
    for name, symbol, ok in checks:
        if name in meta and not ok(value, meta[name]):
            raise ValueError(f"config key {key!r}: must be {symbol} {meta[name]}, got {value!r}")


# Keys that only repeated what train.method sets (earlier configs and run folders have them): accepted when they
# say what the variant says (with a DeprecationWarning), refused naming the variant otherwise; never stored.
_VARIANT_KEYS: dict[str, Any] = {
    "sampler.kind": Literal[sampler_names()] | None,  # type: ignore[valid-type]
    "pool.skills": Literal["on", "off"] | None,
    "rewardweaver.selection": Literal[LIBRARY_STRATEGIES] | None,  # type: ignore[valid-type]
}


def _set_field(section: Any, section_name: str, key: str, value: Any, raw: str | None) -> None:
    """Sets one field of one section after coercion and checks (or raises ValueError)."""
    fields = {f.name: f for f in dataclasses.fields(section)}
    dotted = f"{section_name}.{key}"
    if dotted in _VARIANT_KEYS:
        check_plain(dotted, value)
        try:
            coerced = coerce(value, _VARIANT_KEYS[dotted], raw)
        except NotCoercible:
            allowed = ", ".join(str(a) for a in typing.get_args(typing.get_args(_VARIANT_KEYS[dotted])[0]))
            shown = raw.strip() if raw is not None else value
            raise ValueError(
                f"config key {dotted!r}: {show_value(shown)} is not an allowed value; allowed: {allowed}, null "
                "(train.method sets it: leave it out)"
            ) from None
        section.__dict__.setdefault("_variant_keys", {})[key] = coerced
        return
    if key not in fields:
        raise ValueError(f"unknown config key {dotted!r}; valid keys in section {section_name!r}: " + ", ".join(fields))
    check_plain(dotted, value)
    tp = field_types(type(section))[key]
    if is_section(tp):  # a nested section (model.lora): a mapping of its own keys, each set and checked alike
        nested = getattr(section, key)
        if not isinstance(value, Mapping):
            keys = ", ".join(f.name for f in dataclasses.fields(nested))
            raise ValueError(f"config key {dotted!r}: expected a mapping of its keys ({keys}), got {show_value(value)}")
        for inner, item in value.items():
            _set_field(nested, dotted, str(inner), item, None)
        return
    try:
        coerced = coerce(value, tp, raw)
    except NotCoercible:
        shown = raw.strip() if raw is not None and not isinstance(value, str) else value
        if key == "api_key_env" or section_name == "judge" and "key" in key:
            shown = "<hidden>"  # never echo what may be a pasted secret
        literal = literal_of(tp)
        if literal is not None:
            allowed = ", ".join(str(a) for a in typing.get_args(literal))
            if literal is not tp:
                allowed += ", null"
            raise ValueError(
                f"config key {dotted!r}: {show_value(shown)} is not an allowed value; allowed: {allowed}"
            ) from None
        raise ValueError(
            f"config key {dotted!r}: expected {type_name(tp)}, got {show_value(shown)} ({type(value).__name__})"
        ) from None
    _check_range(dotted, coerced, fields[key].metadata)
    setattr(section, key, coerced)


def _unknown_section(name: str, cfg: Config) -> ValueError:
    return ValueError(f"unknown config section {name!r}; valid sections: " + ", ".join(config_sections(cfg)))


def _takes_text(section: Any, key: str) -> bool:
    """Whether `key` of `section` is a string field (`str` or `str | None`)."""
    if key not in {f.name for f in dataclasses.fields(section)}:
        return False
    tp = field_types(type(section))[key]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return set(typing.get_args(tp)) == {str, type(None)}
    return tp is str


def _apply_mapping(
    cfg: Config, data: Mapping[str, Any], source: str, texts: Mapping[tuple[str, str], str] | None = None
) -> None:
    """Sets every `section: {key: value}` of `data`. `texts` holds the text as typed of the numbers and booleans
    at that level of a file (`_load_document`), which a string field keeps, as it does an override's."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{source}: expected a mapping of sections, got {type(data).__name__}")
    sections = config_sections(cfg)
    for name, values in data.items():
        if name not in sections:
            raise _unknown_section(str(name), cfg)
        if values is None:
            continue
        if not isinstance(values, Mapping):
            raise ValueError(
                f"config section {name!r} in {source}: expected a mapping of keys, got {show_value(values)}"
            )
        for key, value in values.items():
            raw = (texts or {}).get((name, key))
            if raw is not None and not _takes_text(sections[name], str(key)):
                raw = None
            _set_field(sections[name], name, str(key), value, raw)


def _apply_override(cfg: Config, override: str) -> None:
    if not isinstance(override, str) or "=" not in override:
        raise ValueError(f"override {show_value(override)}: expected section.key=value")
    dotted, _, text = override.partition("=")
    dotted = dotted.strip()
    if dotted == "model":  # `model=<HF name or local path>`: the short form of model.name=...
        dotted = "model.name"
    parts = dotted.split(".")
    if len(parts) > MAX_KEY_PARTS:
        shown = ".".join(key_label(part) for part in parts[:6]) + "..."
        raise ValueError(f"override {shown!r}: a dotted key of {len(parts)} parts; at most {MAX_KEY_PARTS} are allowed")
    if len(override) > MAX_CONFIG_BYTES:
        raise ValueError(
            f"override {show_value(dotted)}: {len(override)} characters, more than the 4 MiB an override may hold"
        )
    sections = config_sections(cfg)
    if len(parts) < 2 or not all(parts):
        raise ValueError(
            f"override {override!r}: expected section.key=value with a section among " + ", ".join(sections)
        )
    name, key, rest = parts[0], parts[1], parts[2:]
    if name not in sections:
        raise _unknown_section(name, cfg)
    section = sections[name]
    try:
        value = load_yaml(text, dotted) if text.strip() else ""
    except yaml.constructor.ConstructorError as error:
        if "given twice" in str(error):
            raise ValueError(f"override {dotted!r}: {error.problem}") from None
        value = text  # not YAML: the text itself (coerced or rejected by type below)
    except yaml.composer.ComposerError as error:
        raise ValueError(f"override {dotted!r}: {error.problem}") from None
    except yaml.YAMLError:
        value = text  # not YAML: the text itself (coerced or rejected by type below)
    if rest:
        # env.options.difficulty=2: set one key inside a dict field.
        fields = {f.name for f in dataclasses.fields(section)}
        if key not in fields:
            _set_field(section, name, key, None, None)  # raises the unknown-key error
        tp = field_types(type(section))[key]
        if is_section(tp):  # model.lora.rank=8: a key of a nested section
            for part in reversed(rest[1:]):
                value = {part: value}
            _set_field(getattr(section, key), f"{name}.{key}", rest[0], value, text if len(rest) == 1 else None)
            return
        if not (tp is dict or typing.get_origin(tp) is dict):
            raise ValueError(
                f"config key {dotted!r}: {name}.{key} is {type_name(tp)}, "
                "not a mapping; deeper keys are only allowed in dict fields"
            )
        current = dict(getattr(section, key) or {})
        node = current
        for part in rest[:-1]:
            child = node.get(part)
            node[part] = dict(child) if isinstance(child, Mapping) else {}
            node = node[part]
        node[rest[-1]] = value
        _set_field(section, name, key, current, None)
        return
    _set_field(section, name, key, value, text)


def config_from_dict(data: Mapping[str, Any] | None, overrides: Sequence[str] = ()) -> Config:
    """A validated Config from a nested mapping {section: {key: value}} plus dotted overrides."""
    cfg = Config()
    if data:
        _apply_mapping(cfg, data, "config")
    return _finish(cfg, overrides)


def _finish(cfg: Config, overrides: Sequence[str]) -> Config:
    """`cfg` with the overrides applied, validated."""
    if isinstance(overrides, str):
        overrides = [overrides]
    for override in overrides:
        _apply_override(cfg, override)
    return validate(cfg)


def load_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = ()) -> Config:
    """Defaults, then the YAML file at `path` (if any), then `section.key=value` overrides.

    Raises ValueError for an unreadable or malformed file, an unknown key, a wrong type or a
    value outside its allowed set, always naming the dotted key. The file must be a regular file of at
    most MAX_CONFIG_BYTES (a FIFO or device is refused unread).
    """
    cfg = Config()
    if path is not None:
        name = f"config file {str(path)!r}"
        data, texts = parse_config_text(read_config_text(path, name), name)
        if data is not None and not isinstance(data, Mapping):
            raise ValueError(f"{name}: expected a mapping of sections, got {type(data).__name__}")
        try:
            _apply_mapping(cfg, data or {}, name, texts)
        except ValueError as error:
            raise ValueError(f"{error} (in {str(path)!r})") from None
    return _finish(cfg, overrides)
