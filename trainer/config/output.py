"""A configuration written out: plain nested dicts (`config_to_dict`), YAML text and files (`dump_config`,
`save_config`), and the reference of every key with its default, type and help (`describe_config` for
`rw config --describe`, `config_markdown` for docs/configs.md)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import yaml

from rwcore.trainer.config.coercion import field_types, is_section, type_name
from rwcore.trainer.config.loader import config_from_dict
from rwcore.trainer.config.schema import Config, config_sections

__all__ = ["config_markdown", "config_to_dict", "describe_config", "dump_config", "save_config"]


def config_to_dict(cfg: Config) -> dict[str, dict[str, Any]]:
    """The configuration as plain nested dicts (YAML/JSON-safe)."""
    out: dict[str, dict[str, Any]] = {}
    for name, section in config_sections(cfg).items():
        out[name] = {}
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if isinstance(value, tuple):
                value = list(value)
            out[name][f.name] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # a nested section
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def dump_config(cfg: Config) -> str:
    """The configuration as YAML text (sections in declaration order)."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False)


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    """Writes the configuration as YAML, atomically. It holds no secrets (only env var names)."""
    from rwcore._io import atomic_write_bytes

    atomic_write_bytes(path, dump_config(cfg).encode("utf-8"))


def describe_config(cfg: Config | None = None) -> str:
    """One line per key: `section.key = value  (type)  help`, for `rw config --describe` (the defaults,
    resolved for the default train.method, when `cfg` is None)."""
    cfg = cfg or config_from_dict(None)
    lines = []
    for name, section in config_sections(cfg).items():
        lines.append(f"[{name}] {(type(section).__doc__ or '').strip().splitlines()[0]}")
        for key, value, tp, text in _keys(section, name):
            value = yaml.safe_dump(_plain(value), default_flow_style=True)
            value = value.strip().removesuffix("...").strip()
            lines.append(f"  {key} = {value}  ({type_name(tp)})  {text}".rstrip())
    return "\n".join(lines)


def _keys(section: Any, prefix: str) -> list[tuple[str, Any, Any, str]]:
    """(dotted key, value, type, help) of every key of a section; a nested section's keys (model.lora.*) stand
    in its place."""
    rows = []
    hints = field_types(type(section))
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if is_section(hints[f.name]):
            rows += _keys(value, f"{prefix}.{f.name}")
        else:
            rows.append((f"{prefix}.{f.name}", value, hints[f.name], f.metadata.get("help", "")))
    return rows


def config_markdown(cfg: Config | None = None) -> str:
    """Every section and key as markdown tables (key, default, type, meaning): docs/configs.md's reference,
    generated from the same fields as `describe_config` (tests/docs/test_docs_site.py checks the page against it)."""
    cfg = cfg or config_from_dict(None)
    lines = ["Generated from the config's fields (`rw config --describe`; defaults of the embedded default)."]
    for name, section in config_sections(cfg).items():
        lines += ["", f"### `{name}`", "", (type(section).__doc__ or "").strip().splitlines()[0], ""]
        lines += ["| key | default | type | meaning |", "|---|---|---|---|"]
        for key, value, tp, text in _keys(section, name):
            value = yaml.safe_dump(_plain(value), default_flow_style=True)
            value = value.strip().removesuffix("...").strip()
            cells = [f"`{key}`", f"`{value}`", type_name(tp), text]
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"
