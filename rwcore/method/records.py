"""What `AdaptiveMethod` takes and returns besides its settings: `Providers` (what it calls out to), `Scored`
(one step's rewards and advantages) and `AdaptReport` (what an adaptation changed)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rwcore.judged import JudgedBatch
from rwcore.types import (
    Attributor,
    CapabilityProposer,
    EvaluatorReviser,
    InstanceRubricWriter,
    Judge,
    RubricReflector,
    RubricSkillProposal,
)

__all__ = ["AdaptReport", "Providers", "Scored"]


@dataclass
class Providers:
    """What the method calls out to; a variant needs only its own (a missing one is a ValueError
    naming it when the method is built).

    library: RewardWeaver's validated capability library (`CapabilityLibrary`, already admitted
        with `evaluator`) - library strategies.
    attributor: RewardWeaver's failure attribution - strategies that attribute, and appendix E.
    evaluator: the judge that scores training; controlled expansion admits new capabilities with
        this same object, so the admitted evaluator is the one that scores.
    proposer: capability proposals - controlled expansion and open-vocabulary dimensions.
    acceptance_cases: candidate -> labelled cases for its admission test (expansion).
    reviser: evaluator revision from a rejected candidate's development partition (optional).
    reflector: Arise's reflection model - the evolving pool and skill refinement.
    frozen_rubrics: the fixed rubric-skill pairs of `arise_frozen_rubrics`.
    instance_writer: rubrics per task instance - `rw_instance_specific`.
    """

    library: object | None = None
    attributor: Attributor | None = None
    evaluator: Judge | None = None
    proposer: CapabilityProposer | None = None
    acceptance_cases: Callable | None = None
    reviser: EvaluatorReviser | None = None
    reflector: RubricReflector | None = None
    frozen_rubrics: Sequence[RubricSkillProposal] = ()
    instance_writer: InstanceRubricWriter | None = None


@dataclass(frozen=True)
class Scored:
    """What `score` returns for one step (N trajectories).

    rewards: float64 [N], R = length-regularized outcome + process term.
    advantages: float64 [N], eq. 16 over `advantage_rubrics` (under the settings' scale_rewards, aggregation
        and process_gate).
    task_rewards: float64 [N], the length-regularized outcome alone.
    process_terms: float64 [N], RewardWeaver's mean over `process_rubrics` (0 without, and 0 where
        `MethodSettings.process_gate` gates process credit off).
    judged: the step's JudgedBatch (every rubric judged).
    process_rubrics / advantage_rubrics: where each rubric was counted (disjoint).
    shared_rubrics: the pool's rubrics that are also in RewardWeaver's set (counted in the process reward only).
    """

    rewards: np.ndarray
    advantages: np.ndarray
    task_rewards: np.ndarray
    process_terms: np.ndarray
    judged: JudgedBatch
    process_rubrics: tuple[str, ...]
    advantage_rubrics: tuple[str, ...]
    shared_rubrics: tuple[str, ...] = ()


@dataclass(frozen=True)
class AdaptReport:
    """What `adapt` changed: the pool update and / or the new stage (None when not due)."""

    pool_update: object | None = None
    stage: int | None = None
    reflection_error: str | None = None

    @property
    def changed(self) -> bool:
        return self.pool_update is not None or self.stage is not None
