"""The verifiers environment's own rewards as programmatic rubrics: one rule per reward function, read from
the scores verifiers recorded, and the rule reflector and attributor over them (judge.kind=rule runs).
"""

from __future__ import annotations

from rwcore.trainer.envs.base import Rule
from rwcore.types import RubricSpec, Trajectory


def reward_rules(names: list[str]) -> list[Rule] | None:
    """One rubric per reward name (None when there is none): "the episode earned full marks on <name>"."""
    return [
        Rule(
            RubricSpec(
                f"vf_{name}",
                f"The agent earned full marks on the environment's reward '{name}'.",
                "Every episode of the environment.",
                capability="Execution",
                scored=False,
            ),
            "verifiers",
            _reward_check(name),
        )
        for name in names
    ] or None


def reflector(rules: list[Rule] | None):
    if not rules:
        return None
    from rwcore.trainer.envs.rule_providers import RuleReflector

    return RuleReflector(
        rules, {r.spec.rubric_id: f"aim for full marks on the reward {r.spec.rubric_id[3:]}" for r in rules}
    )


def attributor(rules: list[Rule] | None):
    if not rules:
        return None
    from rwcore.trainer.envs.rule_providers import RuleAttributor

    return RuleAttributor(rules)


def _reward_check(name: str):
    def check(trajectory: Trajectory):
        details = trajectory.metadata.get("outcome_details") or {}
        rewards = details.get("rewards") or {}
        if name not in rewards:
            return None
        return float(rewards[name]) >= 1.0

    check.__name__ = f"check_vf_{name}"
    return check
