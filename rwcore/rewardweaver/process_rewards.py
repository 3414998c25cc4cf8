"""The process-reward registry: every way `AdaptiveMethod` builds RewardWeaver's rubric set A and its term
R = R_o + mean_{d in A} J_d (RewardWeaver §2.4 and the table-2 rows), under one name each.

    @register_process_reward("my_reward", needs=("proposer",), has_stages=True, description="...")
    def build(settings, providers):
        return MyProcessReward(...)

- The six selection strategies over the validated capability library (`selection.STRATEGIES`: attribution,
  static_topk, random, dynamic_topk, random_trajectory, success_failure_contrast) are registered with
  `uses_library=True` and build `RewardWeaver` itself.
- "open_vocabulary" (`OpenVocabularyReward`): dimensions a proposer writes freely from each stage's
  low-outcome trajectories, used without admission (table 2: Open-vocabulary rubrics).
- "instance_specific" (`InstanceSpecificReward`): rubrics written once per task instance from its context
  (table 2: Instance-specific rubrics); no stages.

An entry says which `Providers` fields it needs (`needs(settings)`); the method and `rw train` check and
fill exactly those, and the variant table's components come from these names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rwcore.types import RubricSpec, Trajectory

__all__ = [
    "InstanceSpecificReward",
    "OpenVocabularyReward",
    "ProcessRewardEntry",
    "get_process_reward",
    "process_reward_names",
    "register_process_reward",
]

logger = logging.getLogger("rwcore.method")


@dataclass(frozen=True)
class ProcessRewardEntry:
    """name; description; needs(settings) -> the `Providers` fields it calls; uses_library (a selection strategy
    over the validated capability library); has_stages (RewardWeaver's stage-wise outer loop runs); build."""

    name: str
    description: str
    needs: Callable
    uses_library: bool
    has_stages: bool
    build: Callable


_PROCESS_REWARDS: dict[str, ProcessRewardEntry] = {}


def register_process_reward(
    name: str,
    *,
    needs: Sequence[str] | Callable = (),
    uses_library: bool = False,
    has_stages: bool = False,
    description: str = "",
) -> Callable:
    """Decorator: registers `build(settings, providers) -> process reward` under `name` (ValueError if taken).
    `needs`: the `Providers` fields it calls, or a function of the settings returning them."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"process reward name must be an identifier, got {name!r}")
    needs_fn = needs if callable(needs) else (lambda settings, fixed=tuple(needs): fixed)

    def decorator(build: Callable) -> Callable:
        if name in _PROCESS_REWARDS:
            raise ValueError(f"a process reward named {name!r} is already registered")
        _PROCESS_REWARDS[name] = ProcessRewardEntry(
            name, description, needs_fn, bool(uses_library), bool(has_stages), build
        )
        return build

    return decorator


def process_reward_names() -> tuple[str, ...]:
    return tuple(_PROCESS_REWARDS)


def get_process_reward(name: str) -> ProcessRewardEntry:
    if name not in _PROCESS_REWARDS:
        raise ValueError(f"process_reward must be one of {process_reward_names()}, got {name!r}")
    return _PROCESS_REWARDS[name]


def distinct_specs(specs: Sequence[RubricSpec]) -> list[RubricSpec]:
    """`specs` without repeated rubric ids (first kept); ValueError for anything but a RubricSpec."""
    seen: dict[str, RubricSpec] = {}
    for spec in specs:
        if not isinstance(spec, RubricSpec):
            raise ValueError(f"expected RubricSpec, got {type(spec).__name__}")
        seen.setdefault(spec.rubric_id, spec)
    return list(seen.values())


def spec_dict(spec: RubricSpec) -> dict:
    return {
        "rubric_id": spec.rubric_id,
        "criterion": spec.criterion,
        "applicability": spec.applicability,
        "capability": spec.capability,
        "evaluator_prompt": spec.evaluator_prompt,
        "scored": spec.scored,
    }


# ---------------------------------------------------------------------------------- library strategies


def _library_needs(strategy: str) -> Callable:
    def needs(settings) -> tuple[str, ...]:
        attributes = strategy not in ("dynamic_topk", "random") or settings.success_sample > 0
        return ("library", "attributor") if attributes else ("library",)

    return needs


def _library_builder(strategy: str) -> Callable:
    def build(settings, providers):
        from rwcore.rewardweaver.selection import RELEASING_STRATEGIES
        from rwcore.rewardweaver.weaver import RewardWeaver

        s, p = settings, providers
        expansion = (
            s.expansion and p.proposer is not None and p.evaluator is not None and p.acceptance_cases is not None
        )
        return RewardWeaver(
            p.library,
            p.attributor,
            strategy=strategy,
            release_uninformative=s.release_uninformative and strategy in RELEASING_STRATEGIES,
            budget=s.budget,
            low_outcome=s.low_outcome,
            min_confidence=s.min_confidence,
            min_support=s.min_support,
            rank_by=s.rank_by,
            retrieve="verdicts",
            max_candidates=s.max_candidates,
            analyze_cohorts=s.success_sample > 0 and p.attributor is not None,
            max_success_attributions=s.success_sample if s.success_sample > 0 else None,
            proposer=p.proposer if expansion else None,
            evaluator=p.evaluator if expansion else None,
            acceptance_cases=p.acceptance_cases if expansion else None,
            max_new=s.max_new_capabilities,
            reviser=p.reviser if expansion else None,
            max_revisions=s.max_revisions,
            normalize=s.process_normalization,
            seed=s.seed,
        )

    return build


def _register_library_strategies() -> None:
    from rwcore.rewardweaver.selection import STRATEGIES

    for strategy in STRATEGIES:
        register_process_reward(
            strategy,
            needs=_library_needs(strategy),
            uses_library=True,
            has_stages=True,
            description=f"selection strategy {strategy!r} over the validated capability library",
        )(_library_builder(strategy))


_register_library_strategies()


# ---------------------------------------------------------------------------------- open vocabulary


class OpenVocabularyReward:
    """Table 2's open-vocabulary rubrics: at each stage boundary the proposer writes up to `budget` dimensions
    from the diagnosis batch's low-outcome trajectories; they are used as they come (no admission). No
    failures, or a proposer that fails: the dimensions stay. State: one record per stage."""

    def __init__(self, proposer, budget: int, low_outcome: float) -> None:
        self.proposer, self.budget, self.low_outcome = proposer, budget, low_outcome
        self.stages: list[dict] = []
        self.errors = 0

    def rubrics(self, task_id: str | None = None) -> list[RubricSpec]:
        return list(self.stages[-1]["specs"]) if self.stages else []

    def new_stage(self, step: int, trajectories: Sequence[Trajectory]) -> int:
        from rwcore.rewardweaver.attribution import low_outcome_mask

        cohort = [t for t, low in zip(trajectories, low_outcome_mask(trajectories, self.low_outcome)) if low]
        previous = self.stages[-1]["specs"] if self.stages else ()
        specs = list(previous)  # proposed afresh each stage (library=[]: nothing is frozen)
        if cohort:
            try:
                specs = list(self.proposer.propose_capabilities(cohort, [], self.budget))
            except Exception as exc:  # an LLM proposer may fail; keep the dimensions, keep training
                self.errors += 1
                logger.warning(
                    "stage boundary after step %d: the capability proposer failed (%s: %s); the current "
                    "dimensions stay for another stage",
                    step,
                    type(exc).__name__,
                    exc,
                )
        specs = distinct_specs(specs)[: self.budget]
        self.stages.append(
            {
                "stage": len(self.stages),
                "start_step": step + 1,
                "specs": tuple(specs),
                "cohort": len(cohort),
                "trajectories": len(trajectories),
            }
        )
        return len(self.stages) - 1

    def reward_stages(self) -> list[dict]:
        return [
            {
                "stage": r["stage"],
                "start_step": r["start_step"],
                "active": [s.rubric_id for s in r["specs"]],
                "families": {s.rubric_id: s.capability for s in r["specs"]},
                "strategy": "open_vocabulary",
                "reason": f"proposed from {r['cohort']} low-outcome of {r['trajectories']} trajectories (no admission)",
            }
            for r in self.stages
        ]

    def state_dict(self) -> list[dict]:
        return [{**r, "specs": [spec_dict(s) for s in r["specs"]]} for r in self.stages]

    def load_state_dict(self, state: Sequence[Mapping]) -> None:
        self.stages = [{**r, "specs": tuple(RubricSpec(**s) for s in r["specs"])} for r in state]


@register_process_reward(
    "open_vocabulary",
    needs=("proposer",),
    has_stages=True,
    description="dimensions proposed freely from each stage's failures, no admission",
)
def _open_vocabulary(settings, providers):
    return OpenVocabularyReward(providers.proposer, settings.budget, settings.low_outcome)


# ---------------------------------------------------------------------------------- instance-specific


class InstanceSpecificReward:
    """Table 2's instance-specific rubrics: up to `budget` rubrics written once per task from its context
    (`set_contexts`), each trajectory's process term over its own task's rubrics."""

    def __init__(self, writer, budget: int) -> None:
        self.writer, self.budget = writer, budget
        self.by_task: dict[str, tuple[RubricSpec, ...]] = {}

    def rubrics(self, task_id: str | None = None) -> list[RubricSpec]:
        return list(self.by_task.get(task_id, ())) if task_id is not None else []

    def missing(self, task_ids: Sequence[str]) -> bool:
        return len(self.by_task) < len(task_ids)

    def set_contexts(self, task_ids: Sequence[str], contexts: Mapping[str, Trajectory]) -> None:
        missing = [task_id for task_id in task_ids if task_id not in contexts]
        if missing:
            raise ValueError(f"contexts lacks tasks {missing[:5]}: every training task needs its rubrics")
        written = {}
        for task_id in task_ids:
            if task_id in self.by_task:
                continue
            specs = distinct_specs(list(self.writer.instance_rubrics(contexts[task_id], self.budget)))[: self.budget]
            written[task_id] = tuple(specs)
        self.by_task.update(written)

    def terms(self, trajectories: Sequence[Trajectory], judged, normalize: str) -> tuple[np.ndarray, list[str]]:
        from rwcore.rewardweaver.reward import process_terms

        terms = np.zeros(len(trajectories))
        used: dict[str, None] = {}
        for i, trajectory in enumerate(trajectories):
            ids = [spec.rubric_id for spec in self.by_task.get(trajectory.task_id, ())]
            used.update(dict.fromkeys(ids))
            if ids:
                terms[i] = process_terms(judged.columns(ids).reward_values()[i : i + 1], normalize=normalize)[0][0]
        return terms, list(used)

    def all_rubric_ids(self) -> set[str]:
        return {spec.rubric_id for specs in self.by_task.values() for spec in specs}

    def state_dict(self) -> dict:
        return {task: [spec_dict(s) for s in specs] for task, specs in self.by_task.items()}

    def load_state_dict(self, state: Mapping) -> None:
        self.by_task = {task: tuple(RubricSpec(**s) for s in specs) for task, specs in state.items()}


@register_process_reward(
    "instance_specific",
    needs=("instance_writer",),
    description="rubrics written once per task instance from its context",
)
def _instance_specific(settings, providers):
    return InstanceSpecificReward(providers.instance_writer, settings.budget)
