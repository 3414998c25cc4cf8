"""Event history (Arise appendix F), figure 4a counts and the system-prompt rendering of active skills."""

import json

import pytest
from pool_fakes import FakeReflector, proposal, reports, trajectory

from rwcore.arise.pool import EVENT_KINDS, RubricSkillPool, render_system_prompt


def test_event_history_follows_a_table_8_lifecycle():
    """Created (hidden), activated at a low rate, hidden at a middling one, retired at a high one."""
    reflector = FakeReflector(per_call=1, capabilities=("Verification",))
    pool = RubricSkillPool(reflector, max_new=1, max_pool=1)
    pool.update(39)  # creates p0 (paper: "Step 40")
    for step, (passes, fails) in ((49, (9, 26)), (59, (16, 21)), (99, (35, 1))):
        pool.record(reports("p0", passes=passes, fails=fails, na=4, invalid=1), step - 3)
        pool.update(step)
    history = pool.history("p0")
    assert history == [
        {
            "kind": "created",
            "rubric_id": "p0",
            "step": 39,
            "capability": "Verification",
            "pass_rate": None,
            "applicable": 0,
            "passes": 0,
            "skill_status": "hidden",
            "revision": 0,
            "skill": "skill of p0",
        },
        {
            "kind": "activated",
            "rubric_id": "p0",
            "step": 49,
            "capability": "Verification",
            "pass_rate": 9 / 35,
            "applicable": 35,
            "passes": 9,
            "skill_status": "active",
            "revision": 0,
            "skill": None,
        },
        {
            "kind": "hidden",
            "rubric_id": "p0",
            "step": 59,
            "capability": "Verification",
            "pass_rate": 16 / 37,
            "applicable": 37,
            "passes": 16,
            "skill_status": "hidden",
            "revision": 0,
            "skill": None,
        },
        {
            "kind": "retired",
            "rubric_id": "p0",
            "step": 99,
            "capability": "Verification",
            "pass_rate": 35 / 36,
            "applicable": 36,
            "passes": 35,
            "skill_status": "hidden",
            "revision": 0,
            "skill": None,
        },
    ]
    assert json.loads(json.dumps(pool.history())) == pool.history()
    assert {e["kind"] for e in pool.history()} <= set(EVENT_KINDS)
    # the pool had room again after p0 retired, so p1 was created at step 99 too
    assert [(e.kind, e.rubric_id) for e in pool.events if e.step == 99] == [("retired", "p0"), ("created", "p1")]


def test_refined_events_carry_the_new_skill_and_revision():
    pool = RubricSkillPool(FakeReflector(), max_new=0, proposals=[proposal("a")])
    assert [(e.kind, e.step) for e in pool.events] == [("created", -1)]
    pool.record(reports("a", fails=2), 0)
    pool.update(9)
    pool.record(reports("a", fails=2), 10)
    window = [trajectory(f"t-a-fail-{n}") for n in range(3)]  # the window's failed rollouts
    pool.update(19, window)
    pool.record(reports("a", passes=1, fails=3), 20)
    pool.update(29, window)
    refined = [e for e in pool.events if e.kind == "refined"]
    assert [(e.step, e.revision, e.skill, e.pass_rate) for e in refined] == [
        (19, 1, "skill of a [rev]", 0.0),
        (29, 2, "skill of a [rev] [rev]", 0.25),
    ]


def test_figure_4a_counts():
    reflector = FakeReflector(per_call=3)
    pool = RubricSkillPool(reflector, max_new=3, retire_while_shown=True)  # eq. 5 read alone, as in fig. 4a's counts
    pool.update(9)  # + p0 p1 p2
    pool.record(reports("p0", passes=10) + reports("p1", fails=10), 12)
    pool.update(19)  # - p0, p1 active, + p3 p4 p5
    pool.record(reports("p1", passes=10) + reports("p2", passes=10), 22)
    pool.update(29)  # - p1 p2, + p6 p7 p8
    assert pool.counts() == [
        {
            "step": 9,
            "active_rubrics": 3,
            "active_skills": 0,
            "added": 3,
            "retired": 0,
            "activated": 0,
            "hidden": 0,
            "refined": 0,
            "added_total": 3,
            "retired_total": 0,
        },
        {
            "step": 19,
            "active_rubrics": 5,
            "active_skills": 1,
            "added": 3,
            "retired": 1,
            "activated": 1,
            "hidden": 0,
            "refined": 0,
            "added_total": 6,
            "retired_total": 1,
        },
        {
            "step": 29,
            "active_rubrics": 6,
            "active_skills": 0,
            "added": 3,
            "retired": 2,
            "activated": 0,
            "hidden": 0,
            "refined": 0,
            "added_total": 9,
            "retired_total": 3,
        },
    ]
    assert json.loads(json.dumps([u.to_dict() for u in pool.updates])) == [u.to_dict() for u in pool.updates]
    assert pool.updates[1].pass_rates == {"p0": 1.0, "p1": 0.0, "p2": None}


def test_counts_include_constructor_pairs_in_added_total():
    pool = RubricSkillPool(FakeReflector(), max_new=0, proposals=[proposal("a"), proposal("b")])
    pool.record(reports("a", passes=1), 0)
    assert pool.update(9).counts()["added_total"] == 2


EXPECTED = """You are an agent.

<skills>
Guidance from earlier attempts at similar tasks. Apply a skill whenever its situation arises.

[skill 1]
Read back the artifact.
Compare it with the spec.

[skill 2]
Inspect tool responses.
</skills>"""


def test_prompt_lists_active_skills_in_pool_order():
    pool = RubricSkillPool(
        FakeReflector(),
        max_new=0,
        base_prompt="You are an agent.\n\n",
        proposals=[
            proposal("a", skill="  Read back the artifact.\nCompare it with the spec.\n"),
            proposal("hidden", skill="never shown"),
            proposal("c", skill="Inspect tool responses."),
        ],
    )
    assert pool.system_prompt() == "You are an agent.\n\n"  # nothing active: base unchanged
    pool.record(reports("c", fails=1) + reports("a", fails=1) + reports("hidden", passes=1, fails=1), 0)
    pool.update(9)
    assert pool.system_prompt() == EXPECTED
    assert pool.system_prompt() == pool.system_prompt()
    assert pool.system_prompt("Other.") == EXPECTED.replace("You are an agent.", "Other.")
    assert pool.system_prompt("").startswith("<skills>\n")
    assert "never shown" not in pool.system_prompt() and "criterion" not in pool.system_prompt()


def test_render_system_prompt_checks_its_arguments():
    assert render_system_prompt("base", []) == "base"
    with pytest.raises(ValueError, match="base_prompt"):
        render_system_prompt(None, ["x"])
    with pytest.raises(ValueError, match="skills"):
        render_system_prompt("base", "a skill")
