"""The task set and argument checks shared by every task sampler."""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from rwcore.validation import check_int, check_unit
from rwcore.verdict import verdict_codes

DEFAULT_CAPABILITIES = ("Understanding", "Execution", "Verification", "Debugging", "Efficiency")
"""Arise table 3: the behavioural capability a rubric evaluates."""


def check_fraction(value, argument: str) -> float:
    """A number in [0, 1] (rwcore.validation.check_unit)."""
    return check_unit(value, argument)


def check_gamma(value, argument: str) -> float:
    """A decay factor in (0, 1]."""
    return check_unit(value, argument, low_open=True)


def check_version(value) -> int:
    return check_int(value, "policy_version", low=0, high=2**63 - 1)


class TaskSet:
    """Task ids and their task-type tags, numbered densely in the mapping's order.

    `tasks` maps each task id to a sequence of tags (repeats are dropped). Ids
    and tags may be any hashable values; strings and ints keep state dicts
    portable.
    """

    def __init__(self, tasks: Mapping[Hashable, Sequence[Hashable]]) -> None:
        if not isinstance(tasks, Mapping):
            raise ValueError(f"tasks must be a mapping of task id -> tags, got {type(tasks).__name__}")
        if not tasks:
            raise ValueError("tasks must not be empty")
        self.ids: list = []
        self.tags: list = []
        self.tag_index: dict = {}
        self.task_tags: list[list[int]] = []
        for task_id, tags in tasks.items():
            if isinstance(tags, (str, bytes)) or not isinstance(tags, Sequence | set | frozenset | np.ndarray):
                raise ValueError(f"tasks[{task_id!r}] must be a sequence of tags, got {type(tags).__name__} {tags!r}")
            if isinstance(tags, (set, frozenset)):
                # A set's order changes between processes (hash seeds); numbering
                # tags by it would make a resumed sampler disagree with its state.
                tags = sorted(tags, key=repr)
            indices: list[int] = []
            for tag in tags:
                try:
                    index = self.tag_index.setdefault(tag, len(self.tag_index))
                except TypeError:
                    raise ValueError(f"tasks[{task_id!r}] holds an unhashable tag {tag!r}") from None
                if index == len(self.tags):
                    self.tags.append(tag)
                if index not in indices:
                    indices.append(index)
            self.ids.append(task_id)
            self.task_tags.append(indices)
        self.index = {task_id: i for i, task_id in enumerate(self.ids)}
        self.fingerprint = hashlib.sha256(
            repr([(task_id, [self.tags[t] for t in tags]) for task_id, tags in zip(self.ids, self.task_tags)]).encode()
        ).hexdigest()

    def __len__(self) -> int:
        return len(self.ids)

    def lookup(self, task_id, argument: str = "task_id") -> int:
        try:
            return self.index[task_id]
        except (KeyError, TypeError):
            raise ValueError(f"{argument} {task_id!r} is not one of the sampler's tasks") from None

    def lookup_tag(self, tag, argument: str = "tag") -> int:
        try:
            return self.tag_index[tag]
        except (KeyError, TypeError):
            raise ValueError(f"{argument} {tag!r} is not a tag of any task") from None


def check_capabilities(capabilities: Sequence[str]) -> tuple[str, ...]:
    if isinstance(capabilities, str) or not isinstance(capabilities, Sequence):
        raise ValueError(f"capabilities must be a sequence of names, got {capabilities!r}")
    names = tuple(capabilities)
    if not 1 <= len(names) <= 64:
        raise ValueError(f"capabilities must hold between 1 and 64 names, got {len(names)}")
    if len(set(names)) != len(names):
        raise ValueError(f"capabilities must be distinct, got {names!r}")
    return names


def check_rubrics(rubrics: Mapping, capabilities: Sequence[str]) -> dict:
    """A validated copy of a {rubric_id: capability} pool."""
    if not isinstance(rubrics, Mapping):
        raise ValueError(f"rubrics must be a mapping of rubric id -> capability, got {type(rubrics).__name__}")
    for rubric_id, capability in rubrics.items():
        if capability not in capabilities:
            raise ValueError(
                f"capability {capability!r} of rubric {rubric_id!r} is not one of the sampler's capabilities "
                f"{tuple(capabilities)!r}"
            )
    return dict(rubrics)


def parse_group(verdicts: Mapping, rubric_ids: Mapping, group_size: int) -> tuple[list, np.ndarray]:
    """Checks one group's verdicts -> (rubric ids, uint8 codes [R, group_size]).

    Every rubric must be in `rubric_ids` (the active pool) and hold exactly
    `group_size` verdicts.
    """
    if not isinstance(verdicts, Mapping):
        raise ValueError(
            f"verdicts must be a mapping of rubric id -> per-trajectory verdicts, got {type(verdicts).__name__}"
        )
    rubrics = list(verdicts)
    codes = np.empty((len(rubrics), group_size), dtype=np.uint8)
    for row, rubric_id in enumerate(rubrics):
        if rubric_id not in rubric_ids:
            raise ValueError(f"verdicts: rubric {rubric_id!r} is not in the active pool (see set_rubrics)")
        argument = f"verdicts[{rubric_id!r}]"
        values = verdict_codes(verdicts[rubric_id], argument)
        if len(values) != group_size:
            raise ValueError(f"{argument} holds {len(values)} verdicts, but group_size is {group_size}")
        codes[row] = values
    return rubrics, codes


def parse_outcomes(outcomes, group_size: int, *, required: bool) -> np.ndarray | None:
    """Per-trajectory task outcomes in [0, 1] (1 = success), float64 [group_size]."""
    if outcomes is None:
        if required:
            raise ValueError("outcomes are required: this sampler learns from per-trajectory task outcomes in [0, 1]")
        return None
    array = np.asarray(outcomes, dtype=np.float64) if not isinstance(outcomes, (str, bytes)) else None
    if array is None or array.ndim != 1:
        raise ValueError(f"outcomes must be a 1-D sequence of numbers in [0, 1], got {outcomes!r}")
    if len(array) != group_size:
        raise ValueError(f"outcomes holds {len(array)} values, but group_size is {group_size}")
    if not np.all(np.isfinite(array)) or np.any(array < 0) or np.any(array > 1):
        raise ValueError(f"outcomes must be finite and in [0, 1], got {array.tolist()}")
    return array


def check_state(state: Mapping, kind: str, format_version: int, expected_config: Mapping) -> None:
    """Refuses a state dict of another sampler kind, format, configuration or task set."""
    if not isinstance(state, Mapping):
        raise ValueError(f"state_dict must be a mapping, got {type(state).__name__}")
    if state.get("kind") != kind:
        raise ValueError(f"state_dict is of a {state.get('kind')!r}, not a {kind}")
    if state.get("format") != format_version:
        raise ValueError(f"state_dict has format {state.get('format')!r}; this version reads {format_version}")
    config = state.get("config")
    if not isinstance(config, Mapping):
        raise ValueError("state_dict['config'] is missing")
    for key, value in expected_config.items():
        if key == "seed":
            continue  # the saved generator state replaces the seed's
        saved = config.get(key)
        if saved != value:
            if key == "tasks_fingerprint":
                raise ValueError("state_dict was saved by a sampler over a different task set")
            raise ValueError(f"state_dict was saved with {key}={saved!r}, this sampler has {key}={value!r}")


class TaskSamplerBase:
    """What every task sampler shares: its tasks, capabilities, validated settings and their accessors.

    Subclasses call `_init_base` first and add their own settings to `_config`,
    which `state_dict` saves and `check_state` compares on load.
    """

    def _init_base(self, tasks, batch_size, group_size, seed, capabilities) -> None:
        self._tasks = TaskSet(tasks)
        self._capabilities = check_capabilities(capabilities)
        self._config = dict(
            batch_size=check_int(batch_size, "batch_size", low=1, high=len(self._tasks)),
            group_size=check_int(group_size, "group_size", low=1),
            seed=check_int(seed, "seed", low=0, high=2**64 - 1),
            capabilities=list(self._capabilities),
            tasks_fingerprint=self._tasks.fingerprint,
        )

    @property
    def batch_size(self) -> int:
        return self._config["batch_size"]

    @property
    def group_size(self) -> int:
        return self._config["group_size"]

    @property
    def capabilities(self) -> tuple[str, ...]:
        return self._capabilities

    @property
    def task_ids(self) -> list:
        """Every task id, in the order of the `tasks` mapping."""
        return list(self._tasks.ids)

    @property
    def tags(self) -> list:
        """Every task-type tag, in order of first appearance."""
        return list(self._tasks.tags)


def numpy_generator(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


def restore_generator(state) -> np.random.Generator:
    """The PCG64 generator whose `bit_generator.state` dict a state dict saved under 'rng'."""
    generator = numpy_generator(0)
    try:
        generator.bit_generator.state = state
    except (KeyError, TypeError, ValueError):
        raise ValueError("state_dict['rng'] is missing or not a PCG64 generator state") from None
    return generator
