"""Baseline samplers for the papers' ablations, with `CapabilitySampler`'s interface.

- `UniformSampler`: distinct tasks uniformly at random ("w/o adaptive sampling").
- `OutcomeSampler`: VADE-style outcome-based sampling ("w/ VADE sampling"):
  per-task Beta evidence from task success with the same two-scale decay and
  the same p (1 - p)^2 weighting, but no rubric or capability structure.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from rwcore.arise.evidence import EvidenceStore
from rwcore.tasks import (
    DEFAULT_CAPABILITIES,
    TaskSamplerBase,
    check_gamma,
    check_rubrics,
    check_state,
    check_version,
    numpy_generator,
    parse_group,
    parse_outcomes,
    restore_generator,
)

_STATE_FORMAT = 1
_OUTCOME_RUBRIC = 0  # OutcomeSampler keeps one evidence cell per task: (task index, 0)


class UniformSampler(TaskSamplerBase):
    """Batches of distinct tasks drawn uniformly; records are validated and otherwise ignored."""

    def __init__(
        self,
        tasks: Mapping[Hashable, Sequence[Hashable]],
        batch_size: int = 32,
        group_size: int = 8,
        seed: int = 0,
        capabilities: Sequence[str] = DEFAULT_CAPABILITIES,
    ) -> None:
        self._init_base(tasks, batch_size, group_size, seed, capabilities)
        self._rng = numpy_generator(self._config["seed"])
        self._rubrics: dict = {}

    @property
    def rubrics(self) -> dict:
        return dict(self._rubrics)

    def set_rubrics(self, rubrics: Mapping[Hashable, str]) -> None:
        self._rubrics = check_rubrics(rubrics, self._capabilities)

    def record_group(self, task_id, verdicts, policy_version: int, outcomes=None) -> None:
        self._tasks.lookup(task_id)
        check_version(policy_version)
        parse_group(verdicts, self._rubrics, self.group_size)
        parse_outcomes(outcomes, self.group_size, required=False)

    def sample(self, policy_version: int) -> list:
        check_version(policy_version)
        chosen = self._rng.choice(len(self._tasks), size=self.batch_size, replace=False)
        return [self._tasks.ids[i] for i in chosen]

    def state_dict(self) -> dict:
        return {
            "kind": "UniformSampler",
            "format": _STATE_FORMAT,
            "config": dict(self._config),
            "rubrics": dict(self._rubrics),
            "rng": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: Mapping) -> None:
        check_state(state, "UniformSampler", _STATE_FORMAT, self._config)
        rubrics = check_rubrics(state.get("rubrics", {}), self._capabilities)
        rng = restore_generator(state.get("rng"))
        self._rubrics, self._rng = rubrics, rng


class OutcomeSampler(TaskSamplerBase):
    """VADE-style sampling from per-task outcome evidence.

    Each recorded group adds (sum of outcomes, sum of 1 - outcomes) to its
    task's (S, F) with the two-scale decay of `EvidenceStore`. A batch draws
    p_x ~ Beta(1 + S_x, 1 + F_x) once per task and takes `batch_size`
    distinct tasks by weighted sampling without replacement with weights
    p (1 - p)^2 (Efraimidis-Spirakis keys u^(1/w)). Tasks never seen have the
    uniform Beta(1, 1) prior.
    """

    def __init__(
        self,
        tasks: Mapping[Hashable, Sequence[Hashable]],
        batch_size: int = 32,
        group_size: int = 8,
        gamma_obs: float = 0.2,
        gamma_unobs: float = 0.999,
        seed: int = 0,
        capabilities: Sequence[str] = DEFAULT_CAPABILITIES,
    ) -> None:
        self._init_base(tasks, batch_size, group_size, seed, capabilities)
        self._config.update(
            gamma_obs=check_gamma(gamma_obs, "gamma_obs"), gamma_unobs=check_gamma(gamma_unobs, "gamma_unobs")
        )
        self._store = EvidenceStore(self._config["gamma_obs"], self._config["gamma_unobs"])
        self._rng = numpy_generator(self._config["seed"])
        self._rubrics: dict = {}
        self._task_indices = np.arange(len(self._tasks), dtype=np.int64)
        self._outcome_rubric = np.full(len(self._tasks), _OUTCOME_RUBRIC, dtype=np.int64)

    @property
    def rubrics(self) -> dict:
        return dict(self._rubrics)

    def set_rubrics(self, rubrics: Mapping[Hashable, str]) -> None:
        self._rubrics = check_rubrics(rubrics, self._capabilities)

    def record_group(self, task_id, verdicts, policy_version: int, outcomes=None) -> None:
        """Adds one group's task outcomes (required: `group_size` values in [0, 1]); verdicts are only checked."""
        task = self._tasks.lookup(task_id)
        version = check_version(policy_version)
        parse_group(verdicts, self._rubrics, self.group_size)
        values = parse_outcomes(outcomes, self.group_size, required=True)
        self._store.observe(task, _OUTCOME_RUBRIC, float(values.sum()), float((1.0 - values).sum()), version)

    def task_evidence(self, task_id, policy_version: int) -> tuple[float, float]:
        """(S_x, F_x) of one task as seen at `policy_version`."""
        return self._store.query(self._tasks.lookup(task_id), _OUTCOME_RUBRIC, check_version(policy_version))

    def sample(self, policy_version: int) -> list:
        version = check_version(policy_version)
        success, failure = self._store.query_many(self._task_indices, self._outcome_rubric, version)
        p = self._rng.beta(1.0 + success, 1.0 + failure)
        weight = p * (1.0 - p) ** 2
        uniform = self._rng.random(len(weight))
        with np.errstate(divide="ignore"):
            keys = np.where(weight > 0, np.log(uniform) / np.where(weight > 0, weight, 1.0), -np.inf)
        chosen = np.argpartition(-keys, self.batch_size - 1)[: self.batch_size]
        chosen = chosen[np.argsort(-keys[chosen], kind="stable")]
        return [self._tasks.ids[i] for i in chosen]

    def state_dict(self) -> dict:
        return {
            "kind": "OutcomeSampler",
            "format": _STATE_FORMAT,
            "config": dict(self._config),
            "rubrics": dict(self._rubrics),
            "store": self._store.to_bytes(),
            "rng": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: Mapping) -> None:
        check_state(state, "OutcomeSampler", _STATE_FORMAT, self._config)
        rubrics = check_rubrics(state.get("rubrics", {}), self._capabilities)
        store = EvidenceStore.from_bytes(state.get("store"), what="state_dict['store']")
        rng = restore_generator(state.get("rng"))
        self._rubrics, self._store, self._rng = rubrics, store, rng
