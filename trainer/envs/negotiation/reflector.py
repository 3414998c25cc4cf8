"""The negotiation environment's reflector: Arise's reflection model and RewardWeaver's capability proposer and
instance-rubric writer without an LLM, from the rules' failures and the scenario sheets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rwcore.trainer.envs.base import Environment, rule_spec
from rwcore.trainer.envs.negotiation.rubrics import RULE_DEFS, RULES_BY_ID, SKILLS, episode_state
from rwcore.types import RubricSkillProposal, RubricSpec, Trajectory

__all__ = ["INSTANCE_APPLICABILITY", "NegotiationReflector"]


class NegotiationReflector:
    """Arise's reflection model and RewardWeaver's proposers without an LLM.

    rwcore.types.RubricReflector - propose_rubric_skills: rules not in `existing` that FAIL on at
    least `min_fail_rate` of the trajectories where they apply (and at least once), most failures
    first (ties: library order), with the rule's first skill text; its evidence is the
    trajectories' episode state, so a `diagnostics` text is accepted and not needed.
    refine_skill: the next variant of the rule's skill texts (cycling); an unknown rubric keeps
    its skill.
    rwcore.types.CapabilityProposer - propose_capabilities: the same ranking over the failures,
    as capability candidates (unscored rule rubrics) not already in the library.
    rwcore.types.InstanceRubricWriter - instance_rubrics: the rules that can apply to the task
    instance (read from its scenario sheet), the ones specific to its kind first.
    """

    def __init__(self, env: Environment | None = None, min_fail_rate: float = 0.2) -> None:
        self.env = env
        self.min_fail_rate = float(min_fail_rate)

    def failure_stats(self, trajectories: Sequence[Trajectory]) -> dict[str, tuple[int, int, str]]:
        """rule id -> (fails, applicable, evidence of the first failure)."""
        stats = {}
        states = []
        for trajectory in trajectories:
            try:
                states.append((trajectory, episode_state(trajectory)))
            except Exception:  # an uncheckable trajectory gives no evidence
                continue
        for rule in RULE_DEFS:
            fails = applicable = 0
            example = ""
            for trajectory, state in states:
                verdict, evidence = rule.check(state)
                if verdict is None:
                    continue
                applicable += 1
                if verdict is False:
                    fails += 1
                    if not example:
                        example = f"{trajectory.trajectory_id or trajectory.task_id}: {evidence!r}"
            stats[rule.rule_id] = (fails, applicable, example)
        return stats

    def _ranked(self, trajectories: Sequence[Trajectory], taken: set[str]) -> list[tuple]:
        stats = self.failure_stats(trajectories)
        order = {r.rule_id: i for i, r in enumerate(RULE_DEFS)}
        candidates = []
        for rule_id, (fails, applicable, example) in stats.items():
            if rule_id in taken or fails == 0 or fails / applicable < self.min_fail_rate:
                continue
            candidates.append((-fails, order[rule_id], rule_id, fails, applicable, example))
        candidates.sort()
        return candidates

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
        candidates = self._ranked(trajectories, {spec.rubric_id for spec in existing})
        proposals = []
        for _, _, rule_id, fails, applicable, example in candidates[:max_new]:
            evidence = f"{rule_id} failed on {fails} of {applicable} applicable trajectories, e.g. {example}"
            proposals.append(
                RubricSkillProposal(rubric=rule_spec(RULES_BY_ID[rule_id]), skill=SKILLS[rule_id][0], evidence=evidence)
            )
        return proposals

    def refine_skill(self, rubric: RubricSpec, skill: str, failures: Sequence[Trajectory]) -> str:
        variants = SKILLS.get(rubric.rubric_id)
        if not variants:
            return skill
        if skill in variants:
            return variants[(variants.index(skill) + 1) % len(variants)]
        return variants[0]

    def propose_capabilities(
        self, failures: Sequence[Trajectory], library: Sequence[RubricSpec], max_new: int
    ) -> list[RubricSpec]:
        if max_new <= 0:
            return []
        candidates = self._ranked(failures, {spec.rubric_id for spec in library})
        return [rule_spec(RULES_BY_ID[rule_id]) for _, _, rule_id, *_ in candidates[:max_new]]

    def instance_rubrics(self, context: Trajectory, max_rubrics: int) -> list[RubricSpec]:
        data = dict((context.metadata or {}).get("task") or {})
        if not data:
            raise ValueError(f"context of task {context.task_id!r} has no scenario sheet (metadata['task'])")
        sheets = data["items"] if isinstance(data.get("items"), list) else [data]  # a hard-tier task: every item's
        specific, general = [], []
        for rule in RULE_DEFS:
            per_item = [INSTANCE_APPLICABILITY[rule.rule_id](sheet) for sheet in sheets]
            fits = True if any(per_item) else (None if any(f is None for f in per_item) else False)
            if fits is None:
                general.append(rule)
            elif fits:
                specific.append(rule)
        return [rule_spec(rule) for rule in (specific + general)[: max(0, int(max_rubrics))]]


def _covers(data: dict) -> bool:
    """A plain sale can be profitable: the buyer's budget covers the item cost."""
    return data.get("budget", 0) >= data.get("cost", 0)


def _bundle(data: dict) -> bool:
    return data.get("bundle_cost") is not None


# rule id -> on a scenario sheet: True (applies to this instance in particular), False (cannot
# apply), None (applies to any instance); what `instance_rubrics` writes per task.
INSTANCE_APPLICABILITY: dict[str, Callable[[dict], bool | None]] = {
    "asks_budget_first": lambda d: False if d.get("kind") in ("haggler", "quote") else None,
    "quotes_list_price": lambda d: d.get("kind") == "quote",
    "confirms_agreement": lambda d: None,
    "closes_after_confirmation": lambda d: None,
    # haggler and quote buyers never state their budget
    "offers_at_budget": lambda d: _covers(d) and not _bundle(d) and d.get("kind") not in ("haggler", "quote"),
    "proposes_bundle_when_wanted": lambda d: _bundle(d) and d.get("bundle_budget", 0) >= d.get("bundle_cost", 0),
    "offers_bundle_when_wanted": lambda d: _bundle(d) and d.get("bundle_budget", 0) >= d.get("bundle_cost", 0),
    "opens_at_list_with_haggler": lambda d: d.get("kind") == "haggler",
    "accepts_counter": lambda d: d.get("kind") == "haggler",
    "ends_hopeless_negotiation": lambda d: not bool(d.get("feasible", True)),
    "clear_actions": lambda d: None,
}
