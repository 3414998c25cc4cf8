"""The named variants of `AdaptiveMethod`: each paper's full method and every ablation row.

A variant is four components; an ablation differs from its parent in exactly the component the
paper removes or replaces, everything else (settings, judge, loss, schedule) stays identical:

- ``process_reward``: RewardWeaver's process reward R = R_o + mean of the active rubrics' scores,
  and how its rubrics are chosen - a selection strategy over the frozen, validated capability
  library ("attribution", "static_topk", "random", "dynamic_topk", "random_trajectory",
  "success_failure_contrast"), dimensions proposed freely each stage ("open_vocabulary"),
  rubrics written per task instance ("instance_specific"), or None (no process reward).
- ``arise_rubrics``: Arise's rubric-skill pool - "evolving" (eq. 4-8), "frozen" (the rubrics a
  previous Arise run's lifecycle produced, fixed), or None (no rubric advantages).
- ``skills``: Arise's skills injected into the training prompt (True / False).
- ``sampler``: task sampling - "capability" (Arise §3.2.2), "outcome" (VADE-style), "uniform".

`outcome_only` is the shared baseline of both papers (outcome-only GRPO): it has no parent and
resolves to the same components as `rw_outcome_grpo`.

A variant may also pin method settings (`Variant.pinned`): a reading of a paper's rule that differs from the
default, kept as a row of its own (`arise_retire_while_shown`: eq. 5 read alone), same components as its parent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rwcore.rewardweaver.process_rewards import get_process_reward, process_reward_names
from rwcore.sampling.registry import sampler_names

__all__ = [
    "COMPONENTS",
    "LIBRARY_STRATEGIES",
    "PROCESS_REWARDS",
    "VARIANTS",
    "Variant",
    "differing_components",
    "differing_pins",
    "get_variant",
]

LIBRARY_STRATEGIES: tuple[str, ...] = tuple(
    name for name in process_reward_names() if get_process_reward(name).uses_library
)
"""Process rewards that select a budgeted active set from the validated capability library (the registry's
`uses_library` entries: `rwcore.rewardweaver.selection.STRATEGIES`)."""

PROCESS_REWARDS: tuple[str | None, ...] = (None, *process_reward_names())
COMPONENTS: dict[str, tuple] = {
    "process_reward": PROCESS_REWARDS,
    "arise_rubrics": (None, "evolving", "frozen"),
    "skills": (False, True),
    "sampler": sampler_names(),
}


@dataclass(frozen=True)
class Variant:
    """One named configuration of the method.

    name: what `train.method` takes. description: one line. paper_row: the row it reproduces.
    parent: the full method it ablates (None for a full method or the baseline).
    components: the four components (see the module docstring).
    pinned: `MethodSettings` fields the variant fixes, name -> value (applied by `AdaptiveMethod`; the config
        key may then only be left at its default or set to that value).
    """

    name: str
    description: str
    paper_row: str
    parent: str | None
    components: Mapping[str, object] = field(default_factory=dict)
    pinned: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if set(self.components) != set(COMPONENTS):
            raise ValueError(f"variant {self.name!r}: components must be exactly {sorted(COMPONENTS)}")
        choices = {**COMPONENTS, "process_reward": (None, *process_reward_names()), "sampler": sampler_names()}
        for key, value in self.components.items():  # the registries, as they are now (a registered one counts)
            if value not in choices[key]:
                raise ValueError(f"variant {self.name!r}: component {key}={value!r} is not one of {choices[key]}")
        if self.components["skills"] and self.components["arise_rubrics"] is None:
            raise ValueError(f"variant {self.name!r}: skills need Arise's rubric-skill pool")

    @property
    def process_reward(self) -> str | None:
        return self.components["process_reward"]

    @property
    def arise_rubrics(self) -> str | None:
        return self.components["arise_rubrics"]

    @property
    def skills(self) -> bool:
        return bool(self.components["skills"])

    @property
    def sampler(self) -> str:
        return str(self.components["sampler"])

    @property
    def uses_library(self) -> bool:
        """RewardWeaver with the frozen, validated capability library and a selection strategy."""
        return self.process_reward is not None and get_process_reward(self.process_reward).uses_library

    @property
    def has_stages(self) -> bool:
        """RewardWeaver's stage-wise outer loop runs (the registry says: library strategies, open vocabulary)."""
        return self.process_reward is not None and get_process_reward(self.process_reward).has_stages

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "paper_row": self.paper_row,
            "parent": self.parent,
            "components": dict(self.components),
            "pinned": dict(self.pinned),
        }


def _c(process_reward=None, arise_rubrics=None, skills=False, sampler="uniform") -> dict:
    return {"process_reward": process_reward, "arise_rubrics": arise_rubrics, "skills": skills, "sampler": sampler}


_RW = dict(process_reward="attribution", sampler="uniform")  # RewardWeaver trains with uniform task sampling
_ARISE = dict(arise_rubrics="evolving", skills=True, sampler="capability")

_ROWS: tuple[Variant, ...] = (
    Variant(
        "combined",
        "RewardWeaver's process reward and Arise's pool, skills and capability sampler together; "
        "a rubric in RewardWeaver's active set is counted in the process reward only",
        "both papers' full methods, composed",
        None,
        _c(process_reward="attribution", **_ARISE),
    ),
    # RewardWeaver, table 2
    Variant(
        "rewardweaver",
        "failure attribution selects a budgeted active set of validated capabilities every stage",
        "RewardWeaver table 2: RewardWeaver",
        None,
        _c(**_RW),
    ),
    Variant(
        "rw_outcome_grpo",
        "no process reward: GRPO on the task outcome alone",
        "RewardWeaver table 2: Outcome-only GRPO",
        "rewardweaver",
        _c(process_reward=None),
    ),
    Variant(
        "rw_static_topk",
        "the first stage's top-B capabilities stay active for the whole run",
        "RewardWeaver table 2: Static Top-K",
        "rewardweaver",
        _c(process_reward="static_topk"),
    ),
    Variant(
        "rw_random_active_set",
        "a random active set of B capabilities every stage",
        "RewardWeaver table 2: Random Active Set",
        "rewardweaver",
        _c(process_reward="random"),
    ),
    Variant(
        "rw_failure_frequency",
        "every stage the B capabilities the judge fails most on low-outcome trajectories (no attribution)",
        "RewardWeaver table 2: Dynamic Top-K by Failure Frequency",
        "rewardweaver",
        _c(process_reward="dynamic_topk"),
    ),
    Variant(
        "rw_random_trajectory",
        "attribution on randomly chosen trajectories instead of low-outcome ones",
        "RewardWeaver table 2: Random-Trajectory Attribution",
        "rewardweaver",
        _c(process_reward="random_trajectory"),
    ),
    Variant(
        "rw_success_failure",
        "attribution contrasts failed with successful trajectories",
        "RewardWeaver table 2: Success-Failure Trajectory Attribution",
        "rewardweaver",
        _c(process_reward="success_failure_contrast"),
    ),
    Variant(
        "rw_open_vocabulary",
        "dimensions proposed freely from each stage's failures; no frozen library, no admission",
        "RewardWeaver table 2: Open-Vocabulary Dimensions",
        "rewardweaver",
        _c(process_reward="open_vocabulary"),
    ),
    Variant(
        "rw_instance_specific",
        "rubrics written for each task instance (no library, no stages)",
        "RewardWeaver table 2: Instance-Specific Rubrics",
        "rewardweaver",
        _c(process_reward="instance_specific"),
    ),
    # Arise, figure 3(a)
    Variant(
        "arise",
        "evolving rubric-skill pool, rubric advantages, skills in the training prompt and "
        "capability-based adaptive sampling",
        "Arise fig. 3(a): Arise",
        None,
        _c(**_ARISE),
    ),
    Variant(
        "arise_retire_while_shown",
        "eq. 5 read alone: a pair retires once its window pass rate reaches eta_high even while its skill is "
        "shown (pool.retire_while_shown=true); components as arise",
        "Arise eq. 5 as written (retire while shown)",
        "arise",
        _c(**_ARISE),
        pinned={"retire_while_shown": True},
    ),
    Variant(
        "arise_frozen_rubrics",
        "the pool fixed to every rubric a previous Arise run produced "
        "(pool.frozen_from=RUN_DIR); skills still activate, hide and refine",
        "Arise fig. 3(a): w/o rubric evolution (frozen rubrics)",
        "arise",
        _c(**{**_ARISE, "arise_rubrics": "frozen"}),
    ),
    Variant(
        "arise_no_skills",
        "no skills in the prompt; rubrics, advantages and sampling unchanged",
        "Arise fig. 3(a): w/o skills",
        "arise",
        _c(**{**_ARISE, "skills": False}),
    ),
    Variant(
        "arise_no_adaptive_sampling",
        "uniform task sampling instead of capability-based sampling",
        "Arise fig. 3(a): w/o adaptive sampling",
        "arise",
        _c(**{**_ARISE, "sampler": "uniform"}),
    ),
    Variant(
        "arise_vade_sampling",
        "outcome-based (VADE-style) sampling instead of capability-based sampling",
        "Arise fig. 3(a): VADE sampling",
        "arise",
        _c(**{**_ARISE, "sampler": "outcome"}),
    ),
    Variant(
        "outcome_only",
        "no rubric rewards, no skills, uniform sampling: outcome-only GRPO (both papers' "
        "baseline; the same components as rw_outcome_grpo)",
        "Arise fig. 3(a) / RewardWeaver table 2: outcome-only RL",
        None,
        _c(),
    ),
)

VARIANTS: dict[str, Variant] = {variant.name: variant for variant in _ROWS}
"""Every variant by name, full methods first within each paper."""


def get_variant(name: str, argument: str = "variant") -> Variant:
    """The variant called `name`; ValueError listing the known ones otherwise."""
    variant = VARIANTS.get(name) if isinstance(name, str) else None
    if variant is None:
        raise ValueError(f"{argument} {name!r} is not a known variant; known: {', '.join(VARIANTS)}")
    return variant


def differing_components(a: Variant, b: Variant) -> list[str]:
    """The component names in which two variants differ."""
    return [key for key in COMPONENTS if a.components[key] != b.components[key]]


def differing_pins(a: Variant, b: Variant) -> list[str]:
    """The `MethodSettings` fields that one of two variants pins and the other pins otherwise or not at all."""
    return sorted(name for name in set(a.pinned) | set(b.pinned) if a.pinned.get(name) != b.pinned.get(name))
