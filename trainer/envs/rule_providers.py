"""Programmatic reflector and attributor over any environment's rules (used with judge.kind=rule; with
judge.kind=openai the LLM reflector / attributor are used instead when the environment brings none). Shared
by env.name=textarena and env.name=verifiers (their `reflector()` / `attributor()` providers)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rwcore.types import AttributionRecord, RubricSkillProposal, RubricSpec, Trajectory


class RuleReflector:
    """Arise reflection without an LLM: proposes the rules not yet in the pool, each with its fixed skill text
    (in rule order, at most max_new); a refinement restates the skill with the failures' count."""

    def __init__(self, rules: Sequence, skills: Mapping[str, str]) -> None:
        self.rules = list(rules)
        self.skills = dict(skills)

    def propose_rubric_skills(
        self, trajectories: Sequence[Trajectory], existing: Sequence[RubricSpec], max_new: int
    ) -> list[RubricSkillProposal]:
        have = {spec.rubric_id for spec in existing}
        out = []
        for rule in self.rules:
            if rule.spec.rubric_id in have or len(out) >= max_new:
                continue
            failing = sum(1 for t in trajectories if _safe(rule.check, t) is False)
            out.append(
                RubricSkillProposal(
                    rule.spec,
                    self.skills.get(rule.spec.rubric_id, rule.spec.criterion),
                    evidence=f"{failing} of {len(trajectories)} trajectories fail it",
                )
            )
        return out

    def refine_skill(self, rubric: RubricSpec, skill: str, failures: Sequence[Trajectory]) -> str:
        base = self.skills.get(rubric.rubric_id, skill)
        return f"{base} (this still failed in {len(failures)} recent games)" if failures else base


class RuleAttributor:
    """RewardWeaver attribution without an LLM: a candidate that is one of the rules gets a deficit when its
    check fails on the trajectory (evidence: the check's name and the agent's last move), no deficit when it
    passes, nothing when it does not apply; a partner failure is attributed to the partner."""

    def __init__(self, rules: Sequence) -> None:
        self.checks = {rule.spec.rubric_id: rule.check for rule in rules}

    def attribute(self, trajectory: Trajectory, candidates: Sequence[RubricSpec]) -> list[AttributionRecord]:
        tid = trajectory.trajectory_id
        failure = trajectory.partner_failure
        last = next((t.content for t in reversed(trajectory.turns) if t.role == "assistant"), "")
        out = []
        for spec in candidates:
            if failure:
                out.append(
                    AttributionRecord(
                        tid, spec.rubric_id, True, 0.9, f"partner failure: {failure}"[:300], cause="partner"
                    )
                )
                continue
            check = self.checks.get(spec.rubric_id)
            if check is None:
                continue
            verdict = _safe(check, trajectory)
            if verdict is None:
                continue
            out.append(
                AttributionRecord(
                    tid,
                    spec.rubric_id,
                    verdict is False,
                    0.8 if verdict is False else 0.6,
                    f"rule {spec.rubric_id} {'failed' if verdict is False else 'passed'}; last move: {last[:200]}",
                )
            )
        return out


def _safe(check, trajectory):
    try:
        value = check(trajectory)
    except Exception:  # a trajectory the rule cannot read is no evidence either way
        return None
    return value if value is None else bool(value)
