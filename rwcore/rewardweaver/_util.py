"""Argument checks, content hashing and JSON/YAML files shared by the RewardWeaver modules."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from rwcore._io import atomic_write_bytes
from rwcore.tasks import check_int  # noqa: F401 - re-exported for the RewardWeaver modules
from rwcore.types import Trajectory


def digest(payload) -> str:
    """sha256 of the canonical JSON of `payload` (sorted keys, UTF-8)."""
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_unit(value, argument: str) -> float:
    """`value` as a finite float in [0, 1]; ValueError naming `argument` otherwise."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{argument} must be a number in [0, 1], got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{argument} must be a number in [0, 1], got {value!r}") from None
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"{argument} must be in [0, 1], got {value!r}")
    return number


def check_finite(value, argument: str) -> float:
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{argument} must be a finite number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{argument} must be a finite number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{argument} must be a finite number, got {value!r}")
    return number


def check_str(value, argument: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{argument} must be a string, got {type(value).__name__} {value!r}")
    if not allow_empty and not value.strip():
        raise ValueError(f"{argument} must be a non-empty string")
    return value


def check_ids(values, argument: str) -> tuple[str, ...]:
    """A sequence of distinct non-empty string ids, as a tuple."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, set, frozenset, np.ndarray)):
        raise ValueError(f"{argument} must be a sequence of capability ids, got {type(values).__name__}")
    if isinstance(values, (set, frozenset)):
        values = sorted(values)
    ids = tuple(values)
    seen = set()
    for j, value in enumerate(ids):
        check_str(value, f"{argument}[{j}]")
        if value in seen:
            raise ValueError(f"{argument} lists {value!r} twice")
        seen.add(value)
    return ids


def check_trajectories(trajectories, argument: str = "trajectories", *, need_ids: bool = True) -> list[Trajectory]:
    """A list of Trajectory with finite outcomes and (when need_ids) distinct, non-empty ids."""
    if isinstance(trajectories, (str, bytes)) or not isinstance(trajectories, Sequence):
        raise ValueError(f"{argument} must be a sequence of Trajectory, got {type(trajectories).__name__}")
    out = list(trajectories)
    seen: set[str] = set()
    for i, trajectory in enumerate(out):
        if not isinstance(trajectory, Trajectory):
            raise ValueError(f"{argument}[{i}] must be a rwcore.types.Trajectory, got {type(trajectory).__name__}")
        check_finite(trajectory.outcome, f"{argument}[{i}].outcome")
        if need_ids:
            if not isinstance(trajectory.trajectory_id, str) or not trajectory.trajectory_id:
                raise ValueError(f"{argument}[{i}].trajectory_id must be a non-empty string")
            if trajectory.trajectory_id in seen:
                raise ValueError(f"{argument}[{i}].trajectory_id {trajectory.trajectory_id!r} appears twice")
            seen.add(trajectory.trajectory_id)
    return out


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
