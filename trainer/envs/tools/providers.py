"""The tools environment's reflector and attributor without an LLM, both reading the rubric library's checks."""

from __future__ import annotations

from collections.abc import Sequence

from rwcore.trainer.envs.base import rule_spec
from rwcore.trainer.envs.tools.rubrics import RULE_DEFS, RULES_BY_ID, SKILLS, episode_state
from rwcore.types import AttributionRecord, RubricSkillProposal, RubricSpec, Trajectory


class ToolsReflector:
    """Arise's reflection and RewardWeaver's proposer without an LLM: rules not yet in use that FAIL on at least
    `min_fail_rate` of the trajectories where they apply, most failures first, with their first skill text;
    refine_skill cycles through a rule's skill texts."""

    def __init__(self, min_fail_rate: float = 0.2) -> None:
        self.min_fail_rate = float(min_fail_rate)

    def _ranked(self, trajectories: Sequence[Trajectory], taken: set[str]) -> list[tuple]:
        states = []
        for trajectory in trajectories:
            try:
                states.append((trajectory, episode_state(trajectory)))
            except KeyError:
                continue
        ranked = []
        for order, rule in enumerate(RULE_DEFS):
            if rule.rule_id in taken:
                continue
            fails = applicable = 0
            example = ""
            for trajectory, state in states:
                verdict, evidence = rule.check(state)
                if verdict is None:
                    continue
                applicable += 1
                if verdict is False:
                    fails += 1
                    example = example or f"{trajectory.trajectory_id or trajectory.task_id}: {evidence[:200]!r}"
            if fails and fails / applicable >= self.min_fail_rate:
                ranked.append((-fails, order, rule.rule_id, fails, applicable, example))
        return sorted(ranked)

    def propose_rubric_skills(
        self,
        trajectories: Sequence[Trajectory],
        existing: Sequence[RubricSpec],
        max_new: int,
        *,
        diagnostics: str | None = None,
    ) -> list[RubricSkillProposal]:
        if max_new <= 0:
            return []
        ranked = self._ranked(trajectories, {spec.rubric_id for spec in existing})
        return [
            RubricSkillProposal(
                rubric=rule_spec(RULES_BY_ID[rid]),
                skill=SKILLS[rid][0],
                evidence=f"{rid} failed on {fails} of {applicable} applicable trajectories, e.g. {example}",
            )
            for _, _, rid, fails, applicable, example in ranked[:max_new]
        ]

    def refine_skill(self, rubric: RubricSpec, skill: str, failures: Sequence[Trajectory]) -> str:
        variants = SKILLS.get(rubric.rubric_id)
        if not variants:
            return skill
        return variants[(variants.index(skill) + 1) % len(variants)] if skill in variants else variants[0]

    def propose_capabilities(
        self, failures: Sequence[Trajectory], library: Sequence[RubricSpec], max_new: int
    ) -> list[RubricSpec]:
        if max_new <= 0:
            return []
        ranked = self._ranked(failures, {spec.rubric_id for spec in library})
        return [rule_spec(RULES_BY_ID[rid]) for _, _, rid, *_ in ranked[:max_new]]


class ToolsAttributor:
    """rwcore.types.Attributor without an LLM: per candidate, deficit = its rule FAILs (confidence 0.9, the call
    quoted as evidence), a pass 0.8, not applicable 0.5. Every task is solvable, so the cause is "policy", except
    an episode the sandbox failed ("partner"); unknown candidates or uncheckable trajectories: "unclear"."""

    def attribute(self, trajectory: Trajectory, candidates: Sequence[RubricSpec]) -> list[AttributionRecord]:
        tid = trajectory.trajectory_id or trajectory.task_id
        try:
            state = episode_state(trajectory)
        except KeyError:
            state = None
        cause = "partner" if trajectory.partner_failure else "policy"
        records = []
        for spec in candidates:
            rule = RULES_BY_ID.get(spec.rubric_id)
            if rule is None or state is None:
                records.append(AttributionRecord(tid, spec.rubric_id, False, 0.0, "", "unclear"))
                continue
            verdict, evidence = rule.check(state)
            if verdict is False:
                records.append(AttributionRecord(tid, spec.rubric_id, True, 0.9, evidence or "(no call)", cause))
            elif verdict is True:
                records.append(AttributionRecord(tid, spec.rubric_id, False, 0.8, evidence, cause))
            else:
                records.append(AttributionRecord(tid, spec.rubric_id, False, 0.5, "", cause))
        return records
