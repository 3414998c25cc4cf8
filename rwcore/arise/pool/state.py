"""What the pool stores, and its state as JSON for an exact resume.

A held pair is an `Entry`, a retired one a `Retired`: checked when they are proposed (`check_proposals`,
`check_spec`), shown as `RubricSkillPair` snapshots and announced by a "created" event. The pool's whole
contents (`PoolContents`) are written by `write_state` and read back, checked against the pool's settings, by
`read_state` (`RubricSkillPool.state_dict` / `load_state_dict`).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from rwcore.arise.pool.records import PoolEvent, PoolUpdate, Rubric, RubricSkillPair, Skill, SkillStatus
from rwcore.arise.pool.window import WindowEvidence
from rwcore.tasks import check_state
from rwcore.types import RubricSkillProposal, RubricSpec

SPEC_FIELDS = ("rubric_id", "criterion", "applicability", "capability", "evaluator_prompt", "scored")


@dataclass(frozen=True)
class Entry:
    spec: RubricSpec
    skill: str
    status: SkillStatus
    revisions: int
    created_step: int


@dataclass(frozen=True)
class Retired:
    entry: Entry
    retired_step: int
    window: tuple[int, int, int, int]  # counts of the window it retired in


def check_proposals(
    proposals: Sequence, capabilities: tuple[str, ...], argument: str, taken: set[str], next_id: int
) -> tuple[list[tuple[RubricSpec, str]], int]:
    """Validated (spec, skill) pairs; an empty rubric id gets the next free "rubric-<n>"."""
    taken = set(taken)
    checked: list[tuple[RubricSpec, str]] = []
    for n, proposal in enumerate(proposals):
        at = f"{argument}[{n}]"
        if not isinstance(proposal, RubricSkillProposal):
            raise ValueError(f"{at} must be a rwcore.types.RubricSkillProposal, got {type(proposal).__name__}")
        spec = proposal.rubric
        if not isinstance(spec, RubricSpec):
            raise ValueError(f"{at}.rubric must be a rwcore.types.RubricSpec, got {type(spec).__name__}")
        check_spec(spec, capabilities, f"{at}.rubric", allow_empty_id=True)
        if spec.rubric_id == "":
            while f"rubric-{next_id}" in taken:
                next_id += 1
            spec = replace(spec, rubric_id=f"rubric-{next_id}")
            next_id += 1
        elif spec.rubric_id in taken:
            raise ValueError(
                f"{at}.rubric.rubric_id {spec.rubric_id!r} is already used in (or was retired from) the pool"
            )
        if not isinstance(proposal.skill, str) or not proposal.skill.strip():
            raise ValueError(f"{at}.skill must be non-empty text, got {proposal.skill!r}")
        taken.add(spec.rubric_id)
        checked.append((spec, proposal.skill))
    return checked, next_id


def check_spec(spec: RubricSpec, capabilities: tuple[str, ...], argument: str, *, allow_empty_id: bool = False) -> None:
    if not isinstance(spec.rubric_id, str) or not (spec.rubric_id or allow_empty_id):
        raise ValueError(f"{argument}.rubric_id must be a non-empty string, got {spec.rubric_id!r}")
    if not isinstance(spec.criterion, str) or not spec.criterion.strip():
        raise ValueError(f"{argument}.criterion must be non-empty text, got {spec.criterion!r}")
    for name in ("applicability", "evaluator_prompt"):
        if not isinstance(getattr(spec, name), str):
            raise ValueError(f"{argument}.{name} must be a string, got {getattr(spec, name)!r}")
    if not isinstance(spec.scored, bool):
        raise ValueError(f"{argument}.scored must be a bool, got {spec.scored!r}")
    if spec.capability not in capabilities:
        raise ValueError(
            f"{argument}.capability {spec.capability!r} is not one of the pool's capabilities {capabilities!r}"
        )


def load_entry(data, capabilities: tuple[str, ...], argument: str, last: int) -> Entry:
    if not isinstance(data, Mapping):
        raise ValueError(f"{argument} must be a mapping, got {type(data).__name__}")
    fields = data.get("rubric")
    if not isinstance(fields, Mapping) or set(fields) != set(SPEC_FIELDS):
        raise ValueError(f"{argument}['rubric'] must hold exactly the fields {SPEC_FIELDS}")
    spec = RubricSpec(**{name: fields[name] for name in SPEC_FIELDS})
    check_spec(spec, capabilities, f"{argument}['rubric']")
    skill, status, revisions, created = (data.get(k) for k in ("skill", "status", "revisions", "created_step"))
    if not isinstance(skill, str) or not skill.strip():
        raise ValueError(f"{argument}['skill'] must be non-empty text, got {skill!r}")
    if status not in (SkillStatus.HIDDEN.value, SkillStatus.ACTIVE.value):
        raise ValueError(f"{argument}['status'] must be 'hidden' or 'active', got {status!r}")
    if not is_int(revisions) or revisions < 0:
        raise ValueError(f"{argument}['revisions'] must be a non-negative integer, got {revisions!r}")
    if not is_int(created) or not -1 <= created <= last:
        raise ValueError(f"{argument}['created_step'] must be an integer in [-1, {last}], got {created!r}")
    return Entry(spec, skill, SkillStatus(status), int(revisions), int(created))


def is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def rubric_snapshot(spec: RubricSpec, counts: Sequence[int]) -> Rubric:
    return Rubric(
        rubric_id=spec.rubric_id,
        criterion=spec.criterion,
        applicability=spec.applicability,
        capability=spec.capability,
        evaluator_prompt=spec.evaluator_prompt,
        scored=spec.scored,
        passes=counts[0],
        fails=counts[1],
        not_applicable=counts[2],
        invalid=counts[3],
    )


def retired_pair(record: Retired) -> RubricSkillPair:
    entry = record.entry
    return RubricSkillPair(
        rubric=rubric_snapshot(entry.spec, record.window),
        skill=Skill(entry.skill, entry.status, entry.revisions),
        created_step=entry.created_step,
        retired_step=record.retired_step,
    )


def entry_state(entry: Entry) -> dict:
    return {
        "rubric": {name: getattr(entry.spec, name) for name in SPEC_FIELDS},
        "skill": entry.skill,
        "status": entry.status.value,
        "revisions": entry.revisions,
        "created_step": entry.created_step,
    }


def created_event(spec: RubricSpec, skill: str, step: int) -> PoolEvent:
    return PoolEvent(
        kind="created",
        rubric_id=spec.rubric_id,
        step=step,
        capability=spec.capability,
        pass_rate=None,
        applicable=0,
        passes=0,
        skill_status=SkillStatus.HIDDEN.value,
        revision=0,
        skill=skill,
    )


STATE_KIND = "RubricSkillPool"
STATE_FORMAT = 1


class PoolContents(NamedTuple):
    """What a pool holds besides its settings: its pairs, retired pairs, evidence window, history, the step of
    its last update and the next free number of a "rubric-<n>" id."""

    entries: dict[str, Entry]
    retired: dict[str, Retired]
    window: WindowEvidence
    events: list[PoolEvent]
    updates: list[PoolUpdate]
    last_update: int
    next_id: int


def write_state(config: Mapping, capabilities: Sequence[str], contents: PoolContents) -> dict:
    """The pool's state_dict: everything needed for an exact resume, JSON-serializable."""
    pairs = []
    for rubric_id, entry in contents.entries.items():
        pairs.append({**entry_state(entry), **contents.window.rubric_state(rubric_id)})
    retired = [
        {**entry_state(record.entry), "retired_step": record.retired_step, "window": list(record.window)}
        for record in contents.retired.values()
    ]
    return {
        "kind": STATE_KIND,
        "format": STATE_FORMAT,
        "config": {**config, "capabilities": list(capabilities)},
        "last_update_step": contents.last_update,
        "next_id": contents.next_id,
        "pairs": pairs,
        "retired": retired,
        "events": [event.to_dict() for event in contents.events],
        "updates": [update.to_dict() for update in contents.updates],
    }


def read_state(
    state: Mapping, config: Mapping, capabilities: tuple[str, ...], max_pool: int, max_failures: int
) -> PoolContents:
    """The contents a `write_state` output holds, checked against the pool's settings; ValueError naming the
    first bad field."""
    if isinstance(state, Mapping) and isinstance(state.get("config"), Mapping):
        # written before retire_while_shown existed: the paper's rule (retire whatever the skill's status)
        state = {**state, "config": {"retire_while_shown": True, **state["config"]}}
    check_state(state, STATE_KIND, STATE_FORMAT, config)
    last = state.get("last_update_step")
    if not is_int(last) or last < -1:
        raise ValueError(f"state_dict['last_update_step'] must be an integer >= -1, got {last!r}")
    next_id = state.get("next_id")
    if not is_int(next_id) or next_id < 0:
        raise ValueError(f"state_dict['next_id'] must be a non-negative integer, got {next_id!r}")
    pairs, retired_list = state.get("pairs"), state.get("retired")
    events, updates = state.get("events"), state.get("updates")
    for name, value in (("pairs", pairs), ("retired", retired_list), ("events", events), ("updates", updates)):
        if not isinstance(value, list):
            raise ValueError(f"state_dict[{name!r}] must be a list, got {type(value).__name__}")
    if len(pairs) > max_pool:
        raise ValueError(f"state_dict['pairs'] holds {len(pairs)} pairs, more than max_pool={max_pool}")

    entries: dict[str, Entry] = {}
    window = WindowEvidence(max_failures)
    for n, data in enumerate(pairs):
        argument = f"state_dict['pairs'][{n}]"
        entry = load_entry(data, capabilities, argument, last)
        if entry.spec.rubric_id in entries:
            raise ValueError(f"{argument} repeats rubric {entry.spec.rubric_id!r}")
        entries[entry.spec.rubric_id] = entry
        window.load_rubric(entry.spec.rubric_id, data, last, argument)
    retired: dict[str, Retired] = {}
    for n, data in enumerate(retired_list):
        argument = f"state_dict['retired'][{n}]"
        entry = load_entry(data, capabilities, argument, last)
        rubric_id = entry.spec.rubric_id
        if rubric_id in entries or rubric_id in retired:
            raise ValueError(f"{argument} repeats rubric {rubric_id!r}")
        step, counts = data.get("retired_step"), data.get("window")
        if not is_int(step) or not entry.created_step < step <= last:
            raise ValueError(f"{argument}['retired_step'] must be an update step after its creation, got {step!r}")
        if not isinstance(counts, list) or len(counts) != 4 or not all(is_int(x) and x >= 0 for x in counts):
            raise ValueError(f"{argument}['window'] must be four non-negative integer counts, got {counts!r}")
        retired[rubric_id] = Retired(entry, step, tuple(int(x) for x in counts))
    loaded_events = [PoolEvent.from_dict(data, f"state_dict['events'][{n}]") for n, data in enumerate(events)]
    loaded_updates = [PoolUpdate.from_dict(data, f"state_dict['updates'][{n}]") for n, data in enumerate(updates)]
    known = set(entries) | set(retired)
    for n, event in enumerate(loaded_events):
        if event.rubric_id not in known:
            raise ValueError(f"state_dict['events'][{n}] names rubric {event.rubric_id!r}, which the state lacks")
    return PoolContents(entries, retired, window, loaded_events, loaded_updates, last, next_id)
