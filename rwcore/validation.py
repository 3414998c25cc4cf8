"""Argument checks shared by every rwcore module: one rule per kind of value.

Each check returns the value in its canonical type or raises ValueError naming
`argument` (the caller's parameter, e.g. "eta_high" or "trajectories[3].outcome").
Rules, everywhere the same:

- numbers are Python or NumPy reals; bools and strings are refused (a string "0.5"
  is a config-parsing job, not an argument); NaN and infinities are refused;
- a unit number lies in [0, 1] (or a half-open interval when asked);
- integers are Python or NumPy integers (bools refused), optionally bounded;
- trajectory and rubric sequences are real sequences (not a string, not a single item).

Nothing here imports above `rwcore.types`, so every layer can use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rwcore.settings import is_int, is_real
from rwcore.types import RubricSpec, Trajectory

__all__ = [
    "check_bool",
    "check_count",
    "check_finite",
    "check_ids",
    "check_int",
    "check_number",
    "check_optional_count",
    "check_rubrics",
    "check_str",
    "check_trajectories",
    "check_trajectory",
    "check_unit",
    "is_int",
]


def check_int(value, argument: str, *, low: int | None = None, high: int | None = None) -> int:
    """`value` as an int within [low, high]; ValueError naming `argument` otherwise (bools refused)."""
    if not is_int(value):
        raise ValueError(f"{argument} must be an integer, got {value!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]"
        raise ValueError(f"{argument} must be in {bounds}, got {value}")
    return value


def check_count(value, argument: str, *, low: int = 0) -> int:
    """An integer >= `low` (a count, a size)."""
    if not is_int(value) or int(value) < low:
        raise ValueError(f"{argument} must be an integer >= {low}, got {value!r}")
    return int(value)


def check_optional_count(value, argument: str, *, low: int = 1) -> int | None:
    return None if value is None else check_count(value, argument, low=low)


def _real(value, argument: str, what: str) -> float:
    if not is_real(value):
        raise ValueError(f"{argument} must be {what}, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{argument} must be {what}, got {value!r}")
    return number


def check_finite(value, argument: str) -> float:
    """A finite real number, as a float."""
    return _real(value, argument, "a finite number")


def check_number(
    value,
    argument: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """A finite real number within the interval given by `low` / `high` (closed unless *_open)."""
    left = "-inf" if low is None else f"{low:g}"
    right = "inf" if high is None else f"{high:g}"
    opening = "(" if low_open or low is None else "["
    closing = ")" if high_open or high is None else "]"
    what = f"a finite number in {opening}{left}, {right}{closing}"
    number = _real(value, argument, what)
    if low is not None and (number < low or (low_open and number == low)):
        raise ValueError(f"{argument} must be {what}, got {value!r}")
    if high is not None and (number > high or (high_open and number == high)):
        raise ValueError(f"{argument} must be {what}, got {value!r}")
    return number


def check_unit(value, argument: str, *, optional: bool = False, low_open: bool = False) -> float | None:
    """A finite number in [0, 1] ((0, 1] with `low_open`); None passes when `optional`."""
    if value is None and optional:
        return None
    return check_number(value, argument, low=0.0, high=1.0, low_open=low_open)


def check_bool(value, argument: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{argument} must be True or False, got {value!r}")
    return bool(value)


def check_str(value, argument: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{argument} must be a string, got {type(value).__name__} {value!r}")
    if not allow_empty and not value.strip():
        raise ValueError(f"{argument} must be a non-empty string")
    return value


def check_ids(values, argument: str) -> tuple[str, ...]:
    """A sequence (or set, sorted) of distinct non-empty string ids, as a tuple."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, set, frozenset, np.ndarray)):
        raise ValueError(f"{argument} must be a sequence of ids, got {type(values).__name__}")
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


def check_trajectory(trajectory, argument: str = "trajectory") -> Trajectory:
    if not isinstance(trajectory, Trajectory):
        raise ValueError(f"{argument} must be a rwcore.types.Trajectory, got {type(trajectory).__name__}")
    return trajectory


def check_trajectories(
    trajectories, argument: str = "trajectories", *, need_ids: bool = False, finite_outcomes: bool = False
) -> list[Trajectory]:
    """A list of Trajectory; with `finite_outcomes` every outcome is finite, with `need_ids` every
    trajectory id is a distinct non-empty string."""
    if isinstance(trajectories, (str, bytes, Trajectory)) or not isinstance(trajectories, Sequence):
        raise ValueError(f"{argument} must be a sequence of rwcore.types.Trajectory, got {type(trajectories).__name__}")
    out = list(trajectories)
    seen: set[str] = set()
    for i, trajectory in enumerate(out):
        check_trajectory(trajectory, f"{argument}[{i}]")
        if finite_outcomes:
            check_finite(trajectory.outcome, f"{argument}[{i}].outcome")
        if need_ids:
            if not isinstance(trajectory.trajectory_id, str) or not trajectory.trajectory_id:
                raise ValueError(f"{argument}[{i}].trajectory_id must be a non-empty string")
            if trajectory.trajectory_id in seen:
                raise ValueError(f"{argument}[{i}].trajectory_id {trajectory.trajectory_id!r} appears twice")
            seen.add(trajectory.trajectory_id)
    return out


def check_rubrics(rubrics, argument: str = "rubrics") -> list[RubricSpec]:
    """A list of RubricSpec with distinct, non-empty ids."""
    if isinstance(rubrics, (str, bytes, RubricSpec)) or not isinstance(rubrics, Sequence):
        raise ValueError(f"{argument} must be a sequence of RubricSpec, got {type(rubrics).__name__}")
    seen: set[str] = set()
    for index, rubric in enumerate(rubrics):
        if not isinstance(rubric, RubricSpec):
            raise ValueError(f"{argument}[{index}] must be a RubricSpec, got {type(rubric).__name__}")
        if not isinstance(rubric.rubric_id, str) or not rubric.rubric_id:
            raise ValueError(f"{argument}[{index}].rubric_id must be a non-empty string, got {rubric.rubric_id!r}")
        if rubric.rubric_id in seen:
            raise ValueError(f"{argument} has rubric id {rubric.rubric_id!r} more than once")
        seen.add(rubric.rubric_id)
    return list(rubrics)
