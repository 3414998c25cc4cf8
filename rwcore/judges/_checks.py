"""Argument checks shared by the judges and the reflector (ValueError naming the argument)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rwcore.types import RubricSpec, Trajectory


def check_trajectories(trajectories, argument: str = "trajectories") -> list[Trajectory]:
    if isinstance(trajectories, (str, bytes, Trajectory)) or not isinstance(trajectories, Sequence):
        raise ValueError(f"{argument} must be a sequence of Trajectory, got {type(trajectories).__name__}")
    for index, trajectory in enumerate(trajectories):
        if not isinstance(trajectory, Trajectory):
            raise ValueError(f"{argument}[{index}] must be a Trajectory, got {type(trajectory).__name__}")
    return list(trajectories)


def check_trajectory(trajectory, argument: str = "trajectory") -> Trajectory:
    if not isinstance(trajectory, Trajectory):
        raise ValueError(f"{argument} must be a Trajectory, got {type(trajectory).__name__}")
    return trajectory


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


def check_count(value, argument: str, *, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{argument} must be an integer >= {low}, got {value!r}")
    return value


def check_unit(value, argument: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0.0 <= value <= 1.0:
        raise ValueError(f"{argument} must be a number in [0, 1], got {value!r}")
    return float(value)


def check_bool(value, argument: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{argument} must be True or False, got {value!r}")
    return value


def check_optional_count(value, argument: str, *, low: int = 1) -> int | None:
    return None if value is None else check_count(value, argument, low=low)
