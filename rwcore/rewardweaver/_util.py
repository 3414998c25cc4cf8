"""Content hashing, metric checks, generators and JSON/YAML files shared by the RewardWeaver modules
(argument checks live in `rwcore.validation`)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from rwcore._io import atomic_write_bytes
from rwcore.validation import check_finite, check_str


def digest(payload) -> str:
    """sha256 of the canonical JSON of `payload` (sorted keys, UTF-8)."""
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_metrics(values, argument: str) -> dict[str, float]:
    """A mapping str -> finite number, as a plain dict of floats (JSON-safe)."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ValueError(f"{argument} must be a mapping of name -> number, got {type(values).__name__}")
    out = {}
    for key, value in values.items():
        check_str(key, f"{argument} key")
        out[key] = check_finite(value, f"{argument}[{key!r}]")
    return out


def rng_state(rng: np.random.Generator) -> dict:
    return json.loads(json.dumps(rng.bit_generator.state))


def make_rng(state: Mapping) -> np.random.Generator:
    name = state.get("bit_generator") if isinstance(state, Mapping) else None
    if name != "PCG64":
        raise ValueError(f"state rng must be a PCG64 state, got bit_generator {name!r}")
    bit_generator = np.random.PCG64()
    try:
        bit_generator.state = dict(state)
    except (TypeError, ValueError, KeyError) as error:
        raise ValueError(f"state rng is malformed: {error}") from None
    return np.random.Generator(bit_generator)


def _file_format(path: Path, argument: str) -> str:
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "json"
    if suffix in (".yaml", ".yml"):
        return "yaml"
    raise ValueError(f"{argument} must end in .json, .yaml or .yml, got {str(path)!r}")


def write_document(path: str | os.PathLike, payload: dict, argument: str = "path") -> None:
    """Writes `payload` as JSON or YAML (by suffix) atomically."""
    target = Path(path)
    kind = _file_format(target, argument)
    if kind == "json":
        data = json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"
    else:
        yaml = _yaml()
        data = yaml.safe_dump(payload, sort_keys=True, allow_unicode=True, default_flow_style=False)
    atomic_write_bytes(target, data.encode("utf-8"))


def read_document(path: str | os.PathLike, argument: str = "path") -> dict:
    """Reads a JSON or YAML (by suffix) mapping; ValueError naming `argument` when unreadable."""
    source = Path(path)
    kind = _file_format(source, argument)
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"{argument} {str(source)!r} cannot be read: {error}") from None
    try:
        if kind == "json":
            payload = json.loads(text)
        else:
            payload = _yaml().safe_load(text)
    except ValueError as error:
        raise ValueError(f"{argument} {str(source)!r} is not valid {kind.upper()}: {error}") from None
    except Exception as error:  # yaml.YAMLError does not derive from ValueError
        raise ValueError(f"{argument} {str(source)!r} is not valid {kind.upper()}: {error}") from None
    if not isinstance(payload, dict):
        raise ValueError(f"{argument} {str(source)!r} must hold a mapping at the top level")
    return payload


def _yaml():
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is in the test environment
        raise ValueError("YAML files need PyYAML (pip install pyyaml); use a .json path otherwise") from None
    return yaml
