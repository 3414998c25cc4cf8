"""The per-pair decision of a scheduled update (Arise eq. 5 and 7, Algorithm 1 lines 19-22)."""

from __future__ import annotations

from rwcore.arise.pool.records import SkillStatus
from rwcore.validation import check_unit


def transition(
    rate: float | None, status: SkillStatus, eta_low: float, eta_high: float, retire_while_shown: bool = True
) -> str:
    """What an update does to one pair given its window pass rate `rate` and its skill's `status`.

    - rate is None (no applicable evaluation in the window): "retained", nothing changes;
    - rate >= eta_high: "retired" (eq. 5; whether the skill is hidden or active). With
      `retire_while_shown=False` an active skill is "hidden" instead: its rate was measured with the skill in
      the policy's prompt, and the pair retires only on a window with the skill hidden (the lifecycle of
      Arise's appendix F - activate, hide, retire - and the mastery without guidance of appendix G);
    - rate <= eta_low: "activated" for a hidden skill, "refined" for an active one (eq. 7, 8);
    - eta_low < rate < eta_high: "hidden" for an active skill, "retained" for a hidden one.

    The comparisons are on the float rate passes / (passes + fails); Python's
    division is correctly rounded, so a rate that equals a threshold written in
    decimal (9/10 vs 0.9, 27/90 vs 0.3) compares equal to it. A NaN or out-of-range
    rate raises ValueError.
    """
    if rate is None:
        return "retained"
    check_unit(rate, "rate")
    if rate >= eta_high:
        return "retired" if retire_while_shown or status != SkillStatus.ACTIVE else "hidden"
    if rate <= eta_low:
        return "activated" if status == SkillStatus.HIDDEN else "refined"
    return "hidden" if status == SkillStatus.ACTIVE else "retained"
