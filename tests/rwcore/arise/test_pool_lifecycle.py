"""Rubric-skill pool lifecycle (Arise eq. 4-8, Algorithm 1 lines 17-26), at the exact thresholds."""

import math

import pytest
from pool_fakes import FakeReflector, proposal, reports, trajectory

from rwcore.arise.pool import RubricSkillPool, SkillStatus, transition
from rwcore.types import RubricSpec

HIDDEN, ACTIVE = SkillStatus.HIDDEN, SkillStatus.ACTIVE


def make_pool(ids, reflector=None, **kwargs):
    kwargs.setdefault("max_new", 0)
    return RubricSkillPool(
        reflector if reflector is not None else FakeReflector(), proposals=[proposal(i) for i in ids], **kwargs
    )


def run_window(pool, counts, step, trajectories=None):
    """Records {rubric: (passes, fails)} at `step` and runs the update at `step` (by default with the
    window's rollouts, so refinement finds the failures)."""
    recorded = []
    for rubric_id, (passes, fails) in counts.items():
        batch = reports(rubric_id, passes, fails, prefix=f"s{step}")
        pool.record(batch, step)
        recorded += [trajectory(r.trajectory_id) for r in batch]
    return pool.update(step, recorded if trajectories is None else trajectories)


def status(pool, rubric_id):
    return pool.pair(rubric_id).skill.status


below = lambda x: math.nextafter(x, -1.0)  # noqa: E731
above = lambda x: math.nextafter(x, 2.0)  # noqa: E731


@pytest.mark.parametrize(
    "rate, hidden_kind, active_kind",
    [
        (None, "retained", "retained"),
        (0.0, "activated", "refined"),
        (below(0.3), "activated", "refined"),
        (0.3, "activated", "refined"),  # p <= eta_low
        (above(0.3), "retained", "hidden"),  # eta_low < p
        (0.5, "retained", "hidden"),
        (below(0.9), "retained", "hidden"),  # p < eta_high
        (0.9, "retired", "retired"),  # p >= eta_high
        (above(0.9), "retired", "retired"),
        (1.0, "retired", "retired"),
    ],
)
def test_transition_table(rate, hidden_kind, active_kind):
    assert transition(rate, HIDDEN, 0.3, 0.9) == hidden_kind
    assert transition(rate, ACTIVE, 0.3, 0.9) == active_kind


@pytest.mark.parametrize("rate", [math.nan, -0.1, 1.1, math.inf])
def test_transition_refuses_bad_rates(rate):
    with pytest.raises(ValueError, match="rate"):
        transition(rate, HIDDEN, 0.3, 0.9)


def test_eta_low_zero_activates_only_at_zero():
    assert transition(0.0, HIDDEN, 0.0, 0.9) == "activated"
    assert transition(1e-12, HIDDEN, 0.0, 0.9) == "retained"
    assert transition(1.0, ACTIVE, 0.0, 1.0) == "retired"
    assert transition(below(1.0), ACTIVE, 0.0, 1.0) == "hidden"


def test_hidden_skills_at_exact_thresholds_through_the_pool():
    pool = make_pool(["at_low", "above_low", "below_low", "at_high", "below_high", "above_high"])
    update = run_window(
        pool,
        {
            "at_low": (3, 7),  # 0.3
            "below_low": (29, 71),  # 0.29
            "above_low": (31, 69),  # 0.31
            "at_high": (9, 1),  # 0.9
            "below_high": (89, 11),  # 0.89
            "above_high": (91, 9),  # 0.91
        },
        step=9,
    )
    assert update.pass_rates == {
        "at_low": 0.3,
        "above_low": 0.31,
        "below_low": 0.29,
        "at_high": 0.9,
        "below_high": 0.89,
        "above_high": 0.91,
    }
    assert update.activated == ("at_low", "below_low")
    assert update.retired == ("at_high", "above_high")
    assert update.retained == ("above_low", "below_high")
    assert update.hidden == () and update.refined == ()
    assert status(pool, "at_low") == ACTIVE and status(pool, "below_low") == ACTIVE
    assert status(pool, "above_low") == HIDDEN and status(pool, "below_high") == HIDDEN
    assert pool.rubric_ids() == ["at_low", "above_low", "below_low", "below_high"]


def test_active_skills_at_exact_thresholds_through_the_pool():
    ids = ["at_low", "above_low", "below_low", "at_high", "below_high", "above_high"]
    reflector = FakeReflector()
    pool = make_pool(ids, reflector, retire_while_shown=True)  # eq. 5 read alone: active pairs retire at eta_high
    run_window(pool, {i: (0, 1) for i in ids}, step=9)  # p = 0: every skill activated
    assert all(status(pool, i) == ACTIVE for i in ids)
    update = run_window(
        pool,
        {
            "at_low": (30, 70),
            "below_low": (29, 71),
            "above_low": (31, 69),
            "at_high": (90, 10),
            "below_high": (89, 11),
            "above_high": (91, 9),
        },
        step=19,
    )
    assert update.refined == ("at_low", "below_low")
    assert update.hidden == ("above_low", "below_high")
    assert update.retired == ("at_high", "above_high")
    assert update.activated == () and update.retained == ()
    assert status(pool, "at_low") == ACTIVE and pool.pair("at_low").skill.revisions == 1
    assert status(pool, "above_low") == HIDDEN and status(pool, "below_high") == HIDDEN
    assert [c[1] for c in reflector.calls if c[0] == "refine"] == ["at_low", "below_low"]


@pytest.mark.parametrize("rate", [0.9, above(0.9), 1.0])
def test_a_shown_skill_is_hidden_before_it_retires_when_retire_while_shown_is_off(rate):
    assert transition(rate, ACTIVE, 0.3, 0.9, retire_while_shown=False) == "hidden"
    assert transition(rate, HIDDEN, 0.3, 0.9, retire_while_shown=False) == "retired"
    assert transition(below(0.9), ACTIVE, 0.3, 0.9, retire_while_shown=False) == "hidden"
    assert transition(0.3, ACTIVE, 0.3, 0.9, retire_while_shown=False) == "refined"


def test_retire_while_shown_off_through_the_pool_activate_hide_retire():
    pool = make_pool(["a", "b"], retire_while_shown=False)
    run_window(pool, {"a": (0, 4), "b": (0, 4)}, step=9)  # both activated
    assert status(pool, "a") == ACTIVE and status(pool, "b") == ACTIVE
    update = run_window(pool, {"a": (10, 0), "b": (9, 1)}, step=19)  # mastered while shown: hidden, kept
    assert update.hidden == ("a", "b") and update.retired == ()
    assert status(pool, "a") == HIDDEN and pool.rubric_ids() == ["a", "b"]
    update = run_window(pool, {"a": (9, 1), "b": (1, 3)}, step=29)  # measured hidden: a retires, b comes back
    assert update.retired == ("a",) and update.activated == ("b",)
    assert pool.rubric_ids() == ["b"]
    # hide-first is the default; the setting is part of the pool's state: a pool with eq. 5 read alone refuses it,
    # and an older state without it loads only into such a pool (written when eq. 5 alone was the rule)
    assert make_pool(["a"]).state_dict()["config"]["retire_while_shown"] is False
    state = pool.state_dict()
    with pytest.raises(ValueError, match="retire_while_shown"):
        make_pool(["a", "b"], retire_while_shown=True).load_state_dict(state)
    make_pool(["a", "b"]).load_state_dict(state)
    eq5 = make_pool(["a"], retire_while_shown=True)
    old = eq5.state_dict()
    del old["config"]["retire_while_shown"]
    make_pool(["a"], retire_while_shown=True).load_state_dict(old)
    with pytest.raises(ValueError, match="retire_while_shown"):
        make_pool(["a"]).load_state_dict(old)
    with pytest.raises(ValueError, match="retire_while_shown must be True or False"):
        make_pool(["a"], retire_while_shown=1)


def test_custom_thresholds():
    pool = make_pool(["a", "b", "c"], eta_low=0.5, eta_high=0.75)
    update = run_window(pool, {"a": (1, 1), "b": (3, 1), "c": (2, 1)}, step=9)
    assert update.activated == ("a",) and update.retired == ("b",) and update.retained == ("c",)


def test_hidden_active_hidden_cycle_and_refine_keeps_the_rubric():
    reflector = FakeReflector()
    pool = make_pool(["r"], reflector)
    spec_before = pool.active_rubrics()[0]
    assert pool.active_skills() == {}

    run_window(pool, {"r": (2, 8)}, step=9)  # 0.2 -> activate
    assert pool.active_skills() == {"r": "skill of r"}
    assert not [c for c in reflector.calls if c[0] == "refine"]  # activation does not refine

    failed = [trajectory(f"s19-r-fail-{n}") for n in range(9)] + [trajectory("s19-r-pass-0"), trajectory("other")]
    run_window(pool, {"r": (1, 9)}, step=19, trajectories=failed)  # 0.1 while active -> refine
    pair = pool.pair("r")
    assert pair.skill.text == "skill of r [rev]" and pair.skill.revisions == 1 and pair.skill.active
    assert pool.active_rubrics() == [spec_before]  # rubric unchanged
    refine = [c for c in reflector.calls if c[0] == "refine"]
    assert refine == [("refine", "r", "skill of r", [f"s19-r-fail-{n}" for n in range(9)])]

    run_window(pool, {"r": (5, 5)}, step=29)  # 0.5 -> hide
    assert pool.active_skills() == {} and pool.pair("r").skill.status == HIDDEN
    assert pool.active_rubrics() == [spec_before]  # the pair stays

    run_window(pool, {"r": (5, 5)}, step=39)  # hidden, mid -> unchanged
    assert pool.pair("r").skill.status == HIDDEN

    run_window(pool, {"r": (0, 4)}, step=49)  # activate again, refined text kept
    assert pool.active_skills() == {"r": "skill of r [rev]"}
    assert [e.kind for e in pool.events] == ["created", "activated", "refined", "hidden", "retained", "activated"]


def test_retire_removes_the_pair_from_judging_and_sampling():
    pool = make_pool(["hidden_one", "active_one", "stays"], retire_while_shown=True)  # eq. 5 read alone
    run_window(pool, {"active_one": (0, 3)}, step=9)
    assert pool.active_skills() == {"active_one": "skill of active_one"}
    update = run_window(pool, {"hidden_one": (10, 0), "active_one": (19, 1), "stays": (1, 1)}, step=19)
    assert update.retired == ("hidden_one", "active_one")
    assert [r.rubric_id for r in pool.active_rubrics()] == ["stays"]
    assert pool.rubric_capabilities() == {"stays": "Verification"}
    assert pool.active_skills() == {} and "active_one" not in pool and len(pool) == 1
    retired = pool.pair("active_one")
    assert retired.retired_step == 19 and retired.rubric.pass_rate == 0.95 and retired.skill.active
    assert [p.rubric_id for p in pool.retired_pairs()] == ["hidden_one", "active_one"]
    with pytest.raises(ValueError, match="retired at step 19"):
        pool.record(reports("hidden_one", 1), 20)


def test_no_applicable_evaluation_keeps_state():
    pool = make_pool(["active", "hidden"])
    run_window(pool, {"active": (0, 1)}, step=9)
    pool.record(reports("active", na=5, invalid=3) + reports("hidden", na=2), 15)
    update = pool.update(19)
    assert update.pass_rates == {"active": None, "hidden": None}
    assert update.retained == ("active", "hidden")
    assert pool.pair("active").skill.active and not pool.pair("hidden").skill.active
    events = [e for e in pool.events if e.step == 19]
    assert [(e.kind, e.pass_rate, e.applicable) for e in events] == [("retained", None, 0), ("retained", None, 0)]


def test_na_and_invalid_do_not_enter_the_pass_rate():
    pool = make_pool(["low", "high"])
    pool.record(reports("low", passes=3, fails=7, na=50, invalid=50), 0)
    pool.record(reports("high", passes=9, fails=1, na=100, invalid=7), 4)
    pair = pool.pair("low")
    assert (pair.rubric.passes, pair.rubric.fails, pair.rubric.not_applicable, pair.rubric.invalid) == (3, 7, 50, 50)
    assert pool.pass_rates() == {"low": 0.3, "high": 0.9}
    update = pool.update(9)
    assert update.activated == ("low",) and update.retired == ("high",)


def test_first_update_generates_from_initial_rollouts_and_new_skills_start_hidden():
    reflector = FakeReflector(per_call=3)
    pool = RubricSkillPool(reflector)
    assert len(pool) == 0 and pool.system_prompt("base") == "base"
    assert pool.maybe_update(0) is None and pool.maybe_update(8) is None
    update = pool.maybe_update(9, [trajectory("a"), trajectory("b")])
    assert reflector.calls == [("propose", ["a", "b"], [], 8)]
    assert update.created == ("p0", "p1", "p2")
    assert all(not p.skill.active for p in pool.pairs())
    assert [(e.kind, e.step, e.skill_status) for e in pool.events] == [("created", 9, "hidden")] * 3
    assert pool.rubric_capabilities() == {"p0": "Verification", "p1": "Efficiency", "p2": "Verification"}
    assert pool.pair("p0").created_step == 9


def test_at_most_max_new_pairs_per_update():
    reflector = FakeReflector(per_call=20)
    pool = RubricSkillPool(reflector)
    update = pool.update(9)
    assert len(pool) == 8 and update.created == tuple(f"p{n}" for n in range(8)) and update.dropped == 12
    assert reflector.calls[0][3] == 8


def test_pool_never_exceeds_max_pool():
    reflector = FakeReflector()
    pool = RubricSkillPool(reflector, proposals=[proposal(f"r{n}") for n in range(60)])
    assert pool.update(9).created == ("p0", "p1", "p2", "p3")
    assert len(pool) == 64 and reflector.calls[-1][3] == 4
    calls = len(reflector.calls)
    assert pool.update(19).created == ()  # full and nothing retires: no call at all
    assert len(reflector.calls) == calls and len(pool) == 64
    for n in range(3):
        pool.record(reports(f"r{n}", passes=1), 25)
    update = pool.update(29)  # 3 retire -> room for 3
    assert update.retired == ("r0", "r1", "r2") and len(update.created) == 3 and len(pool) == 64
    assert reflector.calls[-1][3] == 3


def test_max_pool_smaller_than_max_new():
    pool = RubricSkillPool(FakeReflector(), max_pool=5, max_new=8)
    assert len(pool.update(9).created) == 5 and len(pool) == 5


def test_order_refine_then_retire_then_generate_with_the_whole_previous_pool():
    reflector = FakeReflector(per_call=1)
    pool = make_pool(["a", "b"], reflector, max_new=8, max_pool=3)
    run_window(pool, {"a": (0, 1)}, step=9)  # a active; p0 added (pool full: a, b, p0)
    assert pool.rubric_ids() == ["a", "b", "p0"]
    reflector.calls.clear()
    update = run_window(pool, {"a": (0, 1), "b": (1, 0)}, step=19)
    # a refined, b retired; the reflector sees P_k (b included) and room counts b's slot
    window = ["s19-a-fail-0", "s19-b-pass-0"]
    assert reflector.calls == [
        ("refine", "a", "skill of a", ["s19-a-fail-0"]),
        ("propose", window, ["a", "b", "p0"], 1),
    ]
    assert update.refined == ("a",) and update.retired == ("b",) and update.created == ("p1",)
    assert pool.rubric_ids() == ["a", "p0", "p1"]
    kinds = [(e.kind, e.rubric_id) for e in pool.events if e.step == 19]
    assert kinds == [("refined", "a"), ("retired", "b"), ("retained", "p0"), ("created", "p1")]


def test_pool_membership_fixed_between_updates():
    pool = make_pool(["a"])
    pool.record(reports("a", passes=10), 3)
    assert pool.rubric_ids() == ["a"] and pool.updates == ()
    with pytest.raises(ValueError, match="not an update step"):
        pool.update(3)
    assert pool.is_update_step(9) and not pool.is_update_step(10) and not pool.is_update_step(0)
    pool.update(9)
    with pytest.raises(ValueError, match="not after the last update"):
        pool.update(9)
    assert pool.maybe_update(9) is None


def test_delta_pool_one_updates_every_step():
    pool = make_pool(["a"], delta_pool=1)
    pool.record(reports("a", fails=1), 0)
    assert pool.maybe_update(0).activated == ("a",)
    pool.record(reports("a", passes=1, fails=1), 1)
    assert pool.maybe_update(1).hidden == ("a",)


def test_fixed_pool_needs_no_reflector_unless_a_skill_must_be_refined():
    pool = RubricSkillPool(None, max_new=0, proposals=[proposal("a")])
    pool.record(reports("a", fails=1), 0)
    pool.update(9)  # activation needs no reflector
    pool.record(reports("a", fails=1), 10)
    failed = [trajectory("t-a-fail-0")]
    with pytest.raises(ValueError, match="reflector"):
        pool.update(19, failed)
    assert pool.last_update_step == 9
    assert pool.update(19, failed, reflector=FakeReflector()).refined == ("a",)


def test_refinement_without_failure_evidence_asks_nobody_and_keeps_the_skill():
    """An active skill at a low pass rate whose failed rollouts are not in the window's trajectories
    (e.g. recorded from counts) is kept as it is: no reflector call with an empty failure list."""
    reflector = FakeReflector()
    pool = RubricSkillPool(reflector, max_new=0, proposals=[proposal("a")])
    pool.record(reports("a", fails=1), 0)
    pool.update(9)
    pool.record_counts({"a": (0, 3)}, 10)
    update = pool.update(19, [trajectory("unrelated")])
    assert update.refined == () and update.retained == ("a",)
    assert reflector.calls == [] and pool.pair("a").skill.text == "skill of a"
    with pytest.raises(ValueError, match="reflector"):
        RubricSkillPool(None).update(9)  # room for new pairs


def test_empty_rubric_ids_are_assigned():
    bad = [proposal(""), proposal("rubric-1"), proposal("")]
    pool = RubricSkillPool(FakeReflector(bad=bad))
    assert pool.update(9).created == ("rubric-0", "rubric-1", "rubric-2")
    assert isinstance(pool.active_rubrics()[0], RubricSpec)
