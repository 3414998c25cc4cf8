"""The pool's typed records: rubrics, skills, their pairs, lifecycle events and update summaries.

Everything here is an immutable snapshot; `RubricSkillPool` builds them from
its own state, so holding one never changes the pool. Every record has a
JSON-serializable `to_dict()`.

Steps are the trainer's 0-based training iterations k of Arise Algorithm 1.
An update runs at the end of iteration k when (k + 1) % delta_pool == 0, and
its events carry step k; the paper's appendix F labels the same update
"step k + 1" (steps completed), e.g. step 9 here is its "Step 10". Pairs given
to the constructor are created at step -1 (before training).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from rwcore.types import RubricSpec
from rwcore.validation import check_unit


class SkillStatus(str, enum.Enum):
    """Whether a skill's guidance is injected into the policy's system prompt."""

    HIDDEN = "hidden"
    ACTIVE = "active"


EVENT_KINDS: tuple[str, ...] = ("created", "activated", "hidden", "refined", "retired", "retained")
"""Lifecycle event kinds. "retained": an update kept the pair unchanged (logged with its window pass rate,
None when the rubric had no applicable evaluation in the window), as appendix F reports such steps."""


def pass_rate(passes: int, fails: int) -> float | None:
    """Eq. 2: passes / (passes + fails) over applicable evaluations; None when there were none."""
    applicable = passes + fails
    return passes / applicable if applicable else None


@dataclass(frozen=True)
class Rubric:
    """An Arise rubric with its pass / fail evidence in the current window.

    The evidence counts cover everything recorded since the last update
    (normally exactly the open window): `passes` / `fails` are the applicable
    evaluations, `not_applicable` (NA) and `invalid` (judge failures) are kept
    for diagnostics and never enter the pass rate.
    """

    rubric_id: str
    criterion: str
    applicability: str
    capability: str
    evaluator_prompt: str = ""
    scored: bool = False
    passes: int = 0
    fails: int = 0
    not_applicable: int = 0
    invalid: int = 0

    @property
    def applicable(self) -> int:
        """N_i of eq. 2: evaluations where the rubric applied (pass or fail)."""
        return self.passes + self.fails

    @property
    def pass_rate(self) -> float | None:
        """Eq. 2 over the current window; None without an applicable evaluation."""
        return pass_rate(self.passes, self.fails)

    @property
    def spec(self) -> RubricSpec:
        """The RubricSpec a judge takes (evidence dropped)."""
        return RubricSpec(
            rubric_id=self.rubric_id,
            criterion=self.criterion,
            applicability=self.applicability,
            capability=self.capability,
            evaluator_prompt=self.evaluator_prompt,
            scored=self.scored,
        )

    def to_dict(self) -> dict:
        return {
            "rubric_id": self.rubric_id,
            "criterion": self.criterion,
            "applicability": self.applicability,
            "capability": self.capability,
            "evaluator_prompt": self.evaluator_prompt,
            "scored": self.scored,
            "passes": self.passes,
            "fails": self.fails,
            "not_applicable": self.not_applicable,
            "invalid": self.invalid,
        }


@dataclass(frozen=True)
class Skill:
    """A rubric's paired guidance: its text, whether it is injected (active) and how often it was refined."""

    text: str
    status: SkillStatus = SkillStatus.HIDDEN
    revisions: int = 0

    @property
    def active(self) -> bool:
        return self.status == SkillStatus.ACTIVE

    def to_dict(self) -> dict:
        return {"text": self.text, "status": self.status.value, "revisions": self.revisions}


@dataclass(frozen=True)
class RubricSkillPair:
    """One entry of the pool: (r_i, s_i), the step it was created at and, once retired, the step it left."""

    rubric: Rubric
    skill: Skill
    created_step: int
    retired_step: int | None = None

    @property
    def rubric_id(self) -> str:
        return self.rubric.rubric_id

    def to_dict(self) -> dict:
        return {
            "rubric": self.rubric.to_dict(),
            "skill": self.skill.to_dict(),
            "created_step": self.created_step,
            "retired_step": self.retired_step,
        }


@dataclass(frozen=True)
class PoolEvent:
    """One lifecycle event of one pair (Arise appendix F).

    kind: one of EVENT_KINDS. step: the update's step (see the module docstring).
    pass_rate: the window pass rate that caused it (None for "created" and for a
        "retained" rubric without applicable evaluations). applicable / passes: its counts.
    skill_status: the skill's status after the event (a retired pair keeps its last status).
    revision: the skill's revision count after the event.
    skill: the skill text for "created" and "refined" (the new text); None otherwise.
    """

    kind: str
    rubric_id: str
    step: int
    capability: str
    pass_rate: float | None
    applicable: int
    passes: int
    skill_status: str
    revision: int
    skill: str | None = None

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "rubric_id": self.rubric_id,
            "step": self.step,
            "capability": self.capability,
            "pass_rate": self.pass_rate,
            "applicable": self.applicable,
            "passes": self.passes,
            "skill_status": self.skill_status,
            "revision": self.revision,
            "skill": self.skill,
        }

    @classmethod
    def from_dict(cls, data: Mapping, argument: str = "event") -> PoolEvent:
        if not isinstance(data, Mapping):
            raise ValueError(f"{argument} must be a mapping, got {type(data).__name__}")
        try:
            event = cls(**{key: data[key] for key in _EVENT_FIELDS})
        except KeyError as missing:
            raise ValueError(f"{argument} lacks {missing.args[0]!r}") from None
        event.check(argument)
        return event

    def check(self, argument: str) -> None:
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"{argument}.kind must be one of {EVENT_KINDS}, got {self.kind!r}")
        if not isinstance(self.rubric_id, str) or not self.rubric_id:
            raise ValueError(f"{argument}.rubric_id must be a non-empty string, got {self.rubric_id!r}")
        for name in ("step", "applicable", "passes", "revision"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{argument}.{name} must be an integer, got {value!r}")
        if self.step < -1 or self.applicable < 0 or not 0 <= self.passes <= self.applicable or self.revision < 0:
            raise ValueError(f"{argument} has out-of-range counts or step")
        check_unit(self.pass_rate, f"{argument}.pass_rate", optional=True)
        if self.skill_status not in (SkillStatus.HIDDEN.value, SkillStatus.ACTIVE.value):
            raise ValueError(f"{argument}.skill_status must be 'hidden' or 'active', got {self.skill_status!r}")
        if self.skill is not None and not isinstance(self.skill, str):
            raise ValueError(f"{argument}.skill must be a string or None, got {self.skill!r}")
        if not isinstance(self.capability, str):
            raise ValueError(f"{argument}.capability must be a string, got {self.capability!r}")


_EVENT_FIELDS = (
    "kind",
    "rubric_id",
    "step",
    "capability",
    "pass_rate",
    "applicable",
    "passes",
    "skill_status",
    "revision",
    "skill",
)


@dataclass(frozen=True)
class PoolUpdate:
    """What one scheduled update did (Arise figure 4a counts come from these).

    pass_rates: every pair present before the update -> its window pass rate (None: no
        applicable evaluation in the window, so its state was kept).
    activated / refined / hidden / retired / retained / created: rubric ids, in pool order
        (created: in the reflector's order).
    dropped: proposals the reflector returned beyond the room it was given (discarded).
    active_rubrics / active_skills: pool size and number of injected skills after the update.
    added_total / retired_total: pairs ever created / retired up to and including this update
        (pairs given to the constructor count as added).
    """

    step: int
    pass_rates: dict
    activated: tuple[str, ...] = ()
    refined: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()
    retired: tuple[str, ...] = ()
    retained: tuple[str, ...] = ()
    created: tuple[str, ...] = ()
    dropped: int = 0
    active_rubrics: int = 0
    active_skills: int = 0
    added_total: int = 0
    retired_total: int = 0

    def counts(self) -> dict:
        """One row of figure 4a: active / added / retired counts at this update (and running totals)."""
        return {
            "step": self.step,
            "active_rubrics": self.active_rubrics,
            "active_skills": self.active_skills,
            "added": len(self.created),
            "retired": len(self.retired),
            "activated": len(self.activated),
            "hidden": len(self.hidden),
            "refined": len(self.refined),
            "added_total": self.added_total,
            "retired_total": self.retired_total,
        }

    def to_dict(self) -> dict:
        return {
            "step": self.step,
            "pass_rates": dict(self.pass_rates),
            "activated": list(self.activated),
            "refined": list(self.refined),
            "hidden": list(self.hidden),
            "retired": list(self.retired),
            "retained": list(self.retained),
            "created": list(self.created),
            "dropped": self.dropped,
            "active_rubrics": self.active_rubrics,
            "active_skills": self.active_skills,
            "added_total": self.added_total,
            "retired_total": self.retired_total,
        }

    @classmethod
    def from_dict(cls, data: Mapping, argument: str = "update") -> PoolUpdate:
        if not isinstance(data, Mapping):
            raise ValueError(f"{argument} must be a mapping, got {type(data).__name__}")
        try:
            rates = data["pass_rates"]
            if not isinstance(rates, Mapping):
                raise ValueError(f"{argument}.pass_rates must be a mapping")
            for rubric_id, rate in rates.items():
                check_unit(rate, f"{argument}.pass_rates[{rubric_id!r}]", optional=True)
            lists = {}
            for name in ("activated", "refined", "hidden", "retired", "retained", "created"):
                ids = data[name]
                if isinstance(ids, str) or not all(isinstance(x, str) for x in ids):
                    raise ValueError(f"{argument}.{name} must be a list of rubric ids")
                lists[name] = tuple(ids)
            numbers = {}
            for name in ("step", "dropped", "active_rubrics", "active_skills", "added_total", "retired_total"):
                value = data[name]
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"{argument}.{name} must be a non-negative integer, got {value!r}")
                numbers[name] = value
        except KeyError as missing:
            raise ValueError(f"{argument} lacks {missing.args[0]!r}") from None
        except TypeError:
            raise ValueError(f"{argument} is malformed") from None
        return cls(pass_rates=dict(rates), **lists, **numbers)
