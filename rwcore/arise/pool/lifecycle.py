"""A scheduled update: the per-pair decision (`transition`, Arise eq. 5 and 7, Algorithm 1 lines 19-22) and the
pool's contents once the decisions are made (`apply_update`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from rwcore.arise.pool.records import PoolEvent, PoolUpdate, SkillStatus
from rwcore.arise.pool.state import Entry, PoolContents, Retired, created_event
from rwcore.types import RubricSpec
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


# event order within an update ("refined" goes with "activated")
_ORDER = ("activated", "hidden", "retired", "retained")


def apply_update(
    contents: PoolContents,
    step: int,
    plan: Mapping[str, str],
    refined: Mapping[str, str],
    rates: Mapping[str, float | None],
    window: Mapping[str, list[int]],
    new_pairs: Sequence[tuple[RubricSpec, str]],
    dropped: int,
    next_id: int,
) -> tuple[PoolContents, PoolUpdate]:
    """The pool's contents after the update at step `step`, and its summary (nothing here can fail).

    plan: {rubric id: `transition`'s decision}; refined: {rubric id: new skill text} of the refined ones; rates
    and window: each pair's window pass rate and counts (passes, fails, NA, INVALID); new_pairs: the checked
    proposals, which start hidden; dropped: the proposals left out; next_id: the next free "rubric-<n>" number.
    The evidence of retired pairs and of steps up to `step` is discarded."""
    entries: dict[str, Entry] = {}
    retired: dict[str, Retired] = {}
    events: dict[str, list[PoolEvent]] = {kind: [] for kind in _ORDER}
    for rubric_id, entry in contents.entries.items():
        kind = plan[rubric_id]
        if kind == "activated":
            entry = replace(entry, status=SkillStatus.ACTIVE)
        elif kind == "refined":
            entry = replace(entry, skill=refined[rubric_id], revisions=entry.revisions + 1)
        elif kind == "hidden":
            entry = replace(entry, status=SkillStatus.HIDDEN)
        counts = window[rubric_id]
        event = PoolEvent(
            kind=kind,
            rubric_id=rubric_id,
            step=step,
            capability=entry.spec.capability,
            pass_rate=rates[rubric_id],
            applicable=counts[0] + counts[1],
            passes=counts[0],
            skill_status=entry.status.value,
            revision=entry.revisions,
            skill=entry.skill if kind == "refined" else None,
        )
        events["activated" if kind == "refined" else kind].append(event)
        if kind == "retired":
            retired[rubric_id] = Retired(entry, step, tuple(counts))
        else:
            entries[rubric_id] = entry
    created = []
    for spec, skill in new_pairs:
        entries[spec.rubric_id] = Entry(spec, skill, SkillStatus.HIDDEN, 0, step)
        created.append(created_event(spec, skill, step))
    evidence = contents.window.copy()
    for rubric_id in retired:
        evidence.remove(rubric_id)
    evidence.drop_through(step)
    ordered = [event for kind in _ORDER for event in events[kind]] + created

    def ids(kind: str) -> tuple[str, ...]:
        return tuple(rid for rid, k in plan.items() if k == kind)

    summary = PoolUpdate(
        step=step,
        pass_rates=dict(rates),
        activated=ids("activated"),
        refined=ids("refined"),
        hidden=ids("hidden"),
        retired=ids("retired"),
        retained=ids("retained"),
        created=tuple(spec.rubric_id for spec, _ in new_pairs),
        dropped=dropped,
        active_rubrics=len(entries),
        active_skills=sum(e.status == SkillStatus.ACTIVE for e in entries.values()),
        added_total=len(entries) + len(contents.retired) + len(retired),
        retired_total=len(contents.retired) + len(retired),
    )
    updated = PoolContents(
        entries,
        {**contents.retired, **retired},
        evidence,
        [*contents.events, *ordered],
        [*contents.updates, summary],
        step,
        next_id,
    )
    return updated, summary
