"""Rubric-skill pool: exact resume, all-or-nothing updates when the reflector fails, and bad input."""

import copy
import json
import math
import random

import pytest
from pool_fakes import FakeReflector, proposal, reports, trajectory

from rwcore import CapabilitySampler
from rwcore.arise.pool import RubricSkillPool
from rwcore.types import RubricSkillProposal, RubricSpec


def simulate(pool, reflector, steps, rng):
    """A seeded run: each rubric passes with a rate drawn per (rubric, 5-step window) from a few
    levels, 4 judged trajectories per rubric and step (plus NA ones); updates when scheduled."""
    for step in steps:
        recent = []
        for rubric_id in pool.rubric_ids():
            rate = random.Random(f"{rubric_id}/{step // 5}").choice([0.05, 0.2, 0.5, 0.97])
            passes = sum(rng.random() < rate for _ in range(4))
            batch = reports(rubric_id, passes, 4 - passes, rng.randrange(2), prefix=f"s{step}")
            pool.record(batch, step)
            recent += [trajectory(r.trajectory_id) for r in batch]
        pool.maybe_update(step, recent, reflector=reflector)


def fresh(reflector=None):
    return RubricSkillPool(reflector, max_pool=12, max_new=4, delta_pool=5, eta_low=0.35, eta_high=0.8)


def test_resume_is_exact_mid_window():
    reflector_a = FakeReflector(per_call=3)
    pool_a = fresh(reflector_a)
    simulate(pool_a, None, range(0, 37), random.Random(7))  # 37 steps: evidence pending for 35, 36
    state = json.loads(json.dumps(pool_a.state_dict()))
    assert pool_a.pass_rates() and any(r is not None for r in pool_a.pass_rates().values())

    reflector_b = copy.deepcopy(reflector_a)
    pool_b = fresh(reflector_b)
    pool_b.load_state_dict(state)
    assert pool_b.state_dict() == pool_a.state_dict()
    assert pool_b.events == pool_a.events and pool_b.updates == pool_a.updates
    assert pool_b.pairs() == pool_a.pairs() and pool_b.retired_pairs() == pool_a.retired_pairs()
    assert pool_b.system_prompt("x") == pool_a.system_prompt("x")

    simulate(pool_a, None, range(37, 80), random.Random(11))
    simulate(pool_b, None, range(37, 80), random.Random(11))
    assert pool_b.state_dict() == pool_a.state_dict()
    kinds = {e.kind for e in pool_a.events}
    assert {"created", "activated", "refined", "hidden", "retired"} <= kinds  # the run exercised everything


def test_save_and_load_files(tmp_path):
    pool = fresh(FakeReflector(per_call=2))
    simulate(pool, None, range(12), random.Random(1))
    path = tmp_path / "pool.json"
    pool.save(path)
    other = fresh()
    other.load(path)
    assert other.state_dict() == pool.state_dict()
    path.write_text("{not json")
    with pytest.raises(ValueError, match="does not hold a saved pool"):
        other.load(path)
    assert other.state_dict() == pool.state_dict()


def corrupt(state, edit):
    state = json.loads(json.dumps(state))
    edit(state)
    return state


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s["config"].update(max_pool=10), "max_pool"),
        (lambda s: s.update(kind="CapabilitySampler"), "RubricSkillPool"),
        (lambda s: s.update(format=99), "format"),
        (lambda s: s["events"][-1].update(pass_rate=math.nan), "pass_rate"),
        (lambda s: s["events"][-1].update(pass_rate=1.5), "pass_rate"),
        (lambda s: s["events"][0].update(kind="exploded"), "kind"),
        (lambda s: s["updates"][0]["pass_rates"].update(p0=math.nan), "pass_rates"),
        (lambda s: s["pairs"][0].update(status="on"), "status"),
        (lambda s: s["pairs"][0]["rubric"].update(capability="Cooking"), "capability"),
        (lambda s: s["pairs"].__setitem__(-1, s["pairs"][0]), "repeats"),
        (lambda s: s["pairs"][0].update(evidence=[[3, 1, 1, 0, 0]]), "closed window"),
        (lambda s: s["pairs"][0].update(evidence=[[99, -1, 1, 0, 0]]), "evidence"),
        (lambda s: s["pairs"][0].update(skill=""), "skill"),
        (lambda s: s.update(last_update_step="9"), "last_update_step"),
        (lambda s: s["retired"][0].update(retired_step=1000), "retired_step"),
        (lambda s: s.pop("events"), "events"),
    ],
)
def test_corrupted_state_is_refused_and_nothing_changes(edit, message):
    pool = fresh(FakeReflector(per_call=3))
    simulate(pool, None, range(27), random.Random(3))
    assert pool.retired_pairs() and pool.pairs()
    good = pool.state_dict()
    other = fresh()
    before = other.state_dict()
    with pytest.raises(ValueError, match=message):
        other.load_state_dict(corrupt(good, edit))
    assert other.state_dict() == before


def test_proposals_of_held_or_retired_ids_are_dropped_not_fatal():
    pool = RubricSkillPool(FakeReflector(bad=[proposal("a"), proposal("x")]), proposals=[proposal("a"), proposal("b")])
    pool.record(reports("b", passes=2), 0)
    update = pool.update(9)  # b retires; a is still held
    assert update.retired == ("b",) and update.created == ("x",) and update.dropped == 1
    pool.record(reports("x", fails=1), 12)
    update = pool.update(19, reflector=FakeReflector(bad=[proposal("b")]))  # b was retired: never reused
    assert update.created == () and update.dropped == 1 and "b" not in pool


def test_reflector_failure_leaves_the_pool_unchanged():
    reflector = FakeReflector(per_call=2)
    pool = RubricSkillPool(reflector, proposals=[proposal("a"), proposal("b"), proposal("c")])
    pool.record(reports("a", fails=2), 0)
    pool.update(9)  # a active, + p0 p1
    pool.record(reports("a", fails=2) + reports("b", passes=2) + reports("c", passes=1, fails=1), 12)
    pool.record(reports("c", fails=1), 21)  # pending for the next window
    before = json.dumps(pool.state_dict())
    prompt = pool.system_prompt("x")

    for broken, message in (
        (FakeReflector(fail_refine=True), "refinement failed"),
        (FakeReflector(fail_propose=True), "reflection model is down"),
        (FakeReflector(refine_result=""), "refine_skill returned"),
        (FakeReflector(refine_result=None, bad=[proposal("x", capability="Cooking")]), "capability 'Cooking'"),
        (FakeReflector(bad=[proposal("x"), proposal("x")]), "already used"),
        (FakeReflector(bad=[proposal("x", skill="  ")]), r"\[0\].skill"),
        (FakeReflector(bad=["not a proposal"]), "RubricSkillProposal"),
        (FakeReflector(bad="p9"), "must return a list"),
        (FakeReflector(bad=[RubricSkillProposal(RubricSpec("y", ""), "s")]), "criterion"),
    ):
        with pytest.raises((RuntimeError, ValueError), match=message):
            pool.update(19, [trajectory("t-a-fail-0")], reflector=broken)
        assert json.dumps(pool.state_dict()) == before
        assert pool.system_prompt("x") == prompt and pool.last_update_step == 9

    update = pool.update(19, [trajectory("t-a-fail-0")])  # the same update, retried
    assert update.refined == ("a",) and update.retired == ("b",) and update.retained == ("c", "p0", "p1")
    assert pool.pass_rates()["c"] == 0.0  # pending evidence survived


def test_bad_constructor_arguments():
    cases = [
        (dict(max_pool=0), "max_pool"),
        (dict(max_new=-1), "max_new"),
        (dict(delta_pool=0), "delta_pool"),
        (dict(eta_high=0.0), "eta_high"),
        (dict(eta_high=1.2), "eta_high"),
        (dict(eta_high=math.nan), "eta_high"),
        (dict(eta_low=0.9), "eta_low"),
        (dict(eta_low=-0.1), "eta_low"),
        (dict(eta_low=math.nan), "eta_low"),
        (dict(eta_low=True), "eta_low"),
        (dict(capabilities="Verification"), "capabilities"),
        (dict(capabilities=("A", "A")), "capabilities"),
        (dict(base_prompt=3), "base_prompt"),
        (dict(max_failures=-1), "max_failures"),
        (dict(proposals=proposal("a")), "proposals"),
        (dict(proposals=[proposal("a", capability="Cooking")]), r"proposals\[0\].rubric.capability"),
        (dict(proposals=[proposal("a"), proposal("a")]), r"proposals\[1\].rubric.rubric_id"),
        (dict(proposals=[proposal(f"r{n}") for n in range(3)], max_pool=2), "max_pool"),
        (dict(capabilities=("A", "B"), proposals=[proposal("a")]), "capability 'Verification'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            RubricSkillPool(FakeReflector(), **kwargs)
    with pytest.raises(ValueError, match="reflector must implement"):
        RubricSkillPool(object())
    pool = RubricSkillPool(None)
    with pytest.raises(ValueError, match="reflector must implement"):
        pool.update(9, reflector="llm")
    with pytest.raises(ValueError, match=r"trajectories\[0\]"):
        pool.update(9, ["t"], reflector=FakeReflector())
    with pytest.raises(ValueError, match="rubric_id 'nope'"):
        pool.pair("nope")
    assert pool.last_update_step == -1


def test_rubric_capabilities_feed_the_sampler():
    pool = RubricSkillPool(FakeReflector(per_call=4))
    pool.update(9)
    sampler = CapabilitySampler({"t1": ["x"], "t2": ["y"]}, batch_size=1, group_size=2, seed=0)
    sampler.set_rubrics(pool.rubric_capabilities())
    assert pool.rubric_capabilities() == {
        "p0": "Verification",
        "p1": "Efficiency",
        "p2": "Verification",
        "p3": "Efficiency",
    }
    assert [r.rubric_id for r in pool.active_rubrics()] == list(pool.rubric_capabilities())
