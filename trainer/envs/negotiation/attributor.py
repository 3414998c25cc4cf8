"""The negotiation environment's attributor: RewardWeaver's failure attribution without an LLM, and who
controlled a failed episode's outcome (`failure_cause`: the policy, the partner or the scenario).
"""

from __future__ import annotations

from collections.abc import Sequence

from rwcore.trainer.envs.base import Environment
from rwcore.trainer.envs.negotiation.rubrics import RULES_BY_ID, _items, episode_state
from rwcore.types import AttributionRecord, RubricSpec, Trajectory

__all__ = ["NegotiationAttributor", "failure_cause"]


def failure_cause(state: dict) -> str:
    """Who controlled the outcome: "partner" (a hostile buyer, who walks out when it would agree whatever
    the seller does) or "scenario" (the item turns out sold out) when the task was unwinnable and the
    seller did not sell at a loss; else "policy" (a loss-making sale is always the policy's). A hard-tier
    episode ends on the first item that fails: the cause is that (last) item's."""
    state = _items(state)[-1]
    deal = state.get("deal")
    loss = deal is not None and deal["price"] < deal["cost"]
    if not state.get("winnable", True) and not loss:
        return "partner" if state.get("hostile") else "scenario"
    return "policy"


class NegotiationAttributor:
    """rwcore.types.Attributor without an LLM: one record per candidate.

    deficit: the candidate's rule FAILs on the trajectory; evidence: the quoted agent message
    (a deficit whose rule has no message to quote quotes the last partner turn); confidence
    0.9 for a deficit, 0.8 for a pass, 0.5 when the rule does not apply; cause from
    `failure_cause` ("partner" for hostile buyers, "scenario" for sold-out items). Candidates the
    environment has no rule for, or trajectories it cannot check, get deficit False, confidence 0,
    cause "unclear".
    """

    def __init__(self, env: Environment | None = None) -> None:
        self.env = env

    def attribute(self, trajectory: Trajectory, candidates: Sequence[RubricSpec]) -> list[AttributionRecord]:
        tid = trajectory.trajectory_id or trajectory.task_id
        try:
            state = episode_state(trajectory)
        except Exception:  # BLE001
            state = None
        cause = failure_cause(state) if state is not None else "unclear"
        partner_turns = [t.content for t in trajectory.turns if t.role == "partner"]
        records = []
        for spec in candidates:
            rule = RULES_BY_ID.get(spec.rubric_id)
            if rule is None or state is None:
                records.append(AttributionRecord(tid, spec.rubric_id, False, 0.0, "", "unclear"))
                continue
            verdict, evidence = rule.check(state)
            if verdict is False:
                quote = evidence or (partner_turns[-1] if partner_turns else "")
                records.append(AttributionRecord(tid, spec.rubric_id, True, 0.9, quote, cause))
            elif verdict is True:
                records.append(AttributionRecord(tid, spec.rubric_id, False, 0.8, evidence, cause))
            else:
                records.append(AttributionRecord(tid, spec.rubric_id, False, 0.5, "", cause))
        return records
