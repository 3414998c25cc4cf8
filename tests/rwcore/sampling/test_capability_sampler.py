"""rwcore.CapabilitySampler accounting against hand-worked values and the
reference model (Arise eq. 9-11, appendix B.5; docs/math.md, the rows of
those equations).

The RNG stream of the compiled sampler cannot be reproduced in Python, so the
batch construction is checked statistically in test_sampler_statistics.py;
here we check everything that is deterministic: evidence, coverage, task
state, pool changes, and the structural properties of batches.
"""

import math

import pytest
from _util import populated_sampler
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_sampler import DEFAULT_CAPABILITIES, RefCapabilitySampler

from rwcore import CapabilitySampler, Verdict

PROP = settings(max_examples=800, deadline=None, derandomize=True)
PASS, FAIL, NA, INVALID = Verdict.PASS, Verdict.FAIL, Verdict.NA, Verdict.INVALID


def assert_close(got, want, rel=1e-12, what=""):
    got = tuple(float(x) for x in got)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert math.isclose(g, w, rel_tol=rel, abs_tol=1e-300), f"{what}: got {got}, want {tuple(want)}"


def state_of(cs, task):
    ts = cs.task_state(task)
    return {"attempts": int(ts["attempts"]), "evaluated": set(ts["evaluated"]), "applicable": set(ts["applicable"])}


def snapshot(cs, tasks, tags, rubrics, versions):
    """Everything observable about the sampler's accounting (for no-change checks)."""
    return (
        {t: state_of(cs, t) for t in tasks},
        cs.coverage(),
        dict(cs.rubrics),
        {(d, c, v): tuple(cs.evidence(d, c, v)) for d in tags for c in DEFAULT_CAPABILITIES for v in versions},
        {(d, r, v): tuple(cs.rubric_evidence(d, r, v)) for d in tags for r in rubrics for v in versions},
    )


# ----------------------------------------------------------------------------
# Hand-worked example
# ----------------------------------------------------------------------------
def hand_sampler(**kw):
    cs = CapabilitySampler({"t0": ["A", "B"], "t1": ["A"]}, batch_size=1, group_size=2, **kw)
    cs.set_rubrics({"r1": "Execution", "r2": "Execution", "r3": "Verification"})
    # trajectory 0: Execution rubrics r1, r2 both PASS -> +1/2 success each;
    #               Verification r3 FAIL -> +1 failure.
    # trajectory 1: only r1 applicable among Execution (r2 NA) -> r1 +1 failure;
    #               r3 INVALID -> nothing.
    cs.record_group("t0", {"r1": [True, False], "r2": [PASS, NA], "r3": [FAIL, INVALID]}, 0)
    return cs


def test_hand_worked_record_group():
    cs = hand_sampler()
    ts = cs.task_state("t0")
    assert isinstance(ts["attempts"], int)
    assert isinstance(ts["evaluated"], (set, frozenset)) and isinstance(ts["applicable"], (set, frozenset))
    for tag in ("A", "B"):
        assert_close(cs.rubric_evidence(tag, "r1", 0), (0.5, 1.0))
        assert_close(cs.rubric_evidence(tag, "r2", 0), (0.5, 0.0))
        assert_close(cs.rubric_evidence(tag, "r3", 0), (0.0, 1.0))
        assert_close(cs.evidence(tag, "Execution", 0), (1.0, 1.0))
        assert_close(cs.evidence(tag, "Verification", 0), (0.0, 1.0))
        assert tuple(cs.evidence(tag, "Debugging", 0)) == (0.0, 0.0)
        # query decay: 3 versions later * 0.999**3
        assert_close(cs.evidence(tag, "Execution", 3), (0.999**3, 0.999**3))
    assert state_of(cs, "t0") == {"attempts": 1, "evaluated": {"r1", "r2"}, "applicable": {"r1", "r2", "r3"}}
    assert state_of(cs, "t1") == {"attempts": 0, "evaluated": set(), "applicable": set()}
    # Execution (2 rubrics), Verification (1): t0 -> 2/2 + 0/1; t1 -> 0. C = 1/(2*2)
    assert math.isclose(cs.coverage(), 0.25, rel_tol=1e-12)


def test_hand_worked_second_group_decays_and_na_only():
    cs = hand_sampler()
    # one version later, r1 PASS twice: (0.5, 1) * 0.2 + (2, 0)
    cs.record_group("t0", {"r1": [True, True]}, 1)
    assert_close(cs.rubric_evidence("A", "r1", 1), (0.5 * 0.2 + 2.0, 0.2))
    # r2 untouched by this group: its clock is still 0
    assert_close(cs.rubric_evidence("A", "r2", 1), (0.5 * 0.999, 0.0))
    assert_close(cs.evidence("B", "Execution", 1), (0.5 * 0.2 + 2.0 + 0.5 * 0.999, 0.2))
    # only NA verdicts: covered, no evidence, no applicable record
    cs.record_group("t1", {"r3": [NA, NA]}, 1)
    assert state_of(cs, "t1") == {"attempts": 1, "evaluated": {"r3"}, "applicable": set()}
    assert math.isclose(cs.coverage(), 0.5, rel_tol=1e-12)  # (1 + 0 + 0 + 1) / 4
    # an attempt without any verdict (judge failure of the whole group)
    cs.record_group("t1", {}, 2)
    assert state_of(cs, "t1")["attempts"] == 2
    # an all-INVALID verdict list: an attempt, no coverage, no evidence, no clock change
    cs.record_group("t0", {"r2": [INVALID, INVALID]}, 5)
    assert state_of(cs, "t0") == {"attempts": 3, "evaluated": {"r1", "r2"}, "applicable": {"r1", "r2", "r3"}}
    assert_close(cs.rubric_evidence("A", "r2", 5), (0.5 * 0.999**5, 0.0))


def test_na_does_not_dilute_and_late_group():
    cs = CapabilitySampler({"x": ["T"], "y": ["T"]}, batch_size=1, group_size=3)
    cs.set_rubrics({"a": "Efficiency", "b": "Efficiency", "c": "Efficiency"})
    # j0: a,b,c applicable: each 1/3; j1: a,b (c NA): 1/2; j2: a only: 1
    cs.record_group("x", {"a": [True, True, False], "b": [False, True, NA], "c": [True, NA, INVALID]}, 4)
    assert_close(cs.rubric_evidence("T", "a", 4), (1 / 3 + 1 / 2, 1.0))
    assert_close(cs.rubric_evidence("T", "b", 4), (1 / 2, 1 / 3))
    assert_close(cs.rubric_evidence("T", "c", 4), (1 / 3, 0.0))
    assert_close(cs.evidence("T", "Efficiency", 4), (1 / 3 + 1 / 2 + 1 / 2 + 1 / 3, 1 + 1 / 3))
    assert state_of(cs, "x")["evaluated"] == {"a", "b"}
    # a late group (version 2 < 4): discounted by 0.2 * 0.999, clock stays 4
    cs.record_group("y", {"a": [True, True, True]}, 2)
    assert_close(cs.rubric_evidence("T", "a", 4), (1 / 3 + 1 / 2 + 3 * 0.2 * 0.999, 1.0))
    assert_close(cs.rubric_evidence("T", "a", 6), ((1 / 3 + 1 / 2 + 3 * 0.2 * 0.999) * 0.999**2, 0.999**2))
    # coverage: 3 rubrics of one capability; x has 2/3, y has 1/3 -> (2/3 + 1/3) / 2
    assert math.isclose(cs.coverage(), 0.5, rel_tol=1e-12)


def test_custom_gammas_reach_the_store():
    cs = CapabilitySampler({"x": ["T"]}, batch_size=1, group_size=1, gamma_obs=0.5, gamma_unobs=0.5)
    cs.set_rubrics({"a": "Execution"})
    cs.record_group("x", {"a": [True]}, 0)
    cs.record_group("x", {"a": [False]}, 2)  # (1, 0) * 0.5 * 0.5 + (0, 1)
    assert_close(cs.rubric_evidence("T", "a", 2), (0.25, 1.0))
    assert_close(cs.evidence("T", "Execution", 3), (0.125, 0.5))


def test_set_rubrics_keeps_unchanged_and_drops_changed():
    cs = hand_sampler()
    cs.record_group("t1", {"r3": [NA, NA]}, 1)
    before_r1 = tuple(cs.rubric_evidence("A", "r1", 3))
    # r1 unchanged, r2 changes capability, r3 removed, r4 new
    cs.set_rubrics({"r1": "Execution", "r2": "Verification", "r4": "Debugging"})
    assert cs.rubrics == {"r1": "Execution", "r2": "Verification", "r4": "Debugging"}
    assert tuple(cs.rubric_evidence("A", "r1", 3)) == before_r1
    assert tuple(cs.rubric_evidence("A", "r2", 3)) == (0.0, 0.0)
    assert tuple(cs.evidence("A", "Verification", 3)) == (0.0, 0.0)
    assert state_of(cs, "t0") == {"attempts": 1, "evaluated": {"r1"}, "applicable": {"r1"}}
    # attempts are not a per-rubric record: kept
    assert state_of(cs, "t1") == {"attempts": 1, "evaluated": set(), "applicable": set()}
    # Execution {r1}, Verification {r2}, Debugging {r4}: only t0 has r1 -> 1/(2*3)
    assert math.isclose(cs.coverage(), 1 / 6, rel_tol=1e-12)
    # re-adding r3 later: fresh, outstanding evaluation
    cs.set_rubrics({"r1": "Execution", "r2": "Verification", "r4": "Debugging", "r3": "Verification"})
    assert tuple(cs.rubric_evidence("A", "r3", 0)) == (0.0, 0.0)
    assert "r3" not in state_of(cs, "t1")["evaluated"]
    # same mapping again: nothing changes
    snap = snapshot(cs, ["t0", "t1"], ["A", "B"], ["r1", "r2", "r3", "r4"], [0, 3])
    cs.set_rubrics(dict(cs.rubrics))
    assert snapshot(cs, ["t0", "t1"], ["A", "B"], ["r1", "r2", "r3", "r4"], [0, 3]) == snap


def test_empty_pool_coverage_zero_and_sampling_still_works():
    cs = CapabilitySampler({"a": ["X"], "b": ["Y"], "c": ["X"]}, batch_size=3, group_size=2)
    assert cs.coverage() == 0.0
    assert cs.rubrics == {}
    batch = cs.sample(0)
    assert sorted(batch) == ["a", "b", "c"]
    cs.set_rubrics({"r": "Execution"})
    cs.record_group("a", {"r": [True, False]}, 0)
    cs.set_rubrics({})
    assert cs.coverage() == 0.0
    assert state_of(cs, "a") == {"attempts": 1, "evaluated": set(), "applicable": set()}
    assert tuple(cs.evidence("X", "Execution", 0)) == (0.0, 0.0)


def test_full_coverage_is_one():
    tasks = {f"t{i}": ["A"] for i in range(4)}
    cs = CapabilitySampler(tasks, batch_size=2, group_size=2)
    cs.set_rubrics({"e": "Execution", "v": "Verification", "u": "Understanding"})
    for t in tasks:
        cs.record_group(t, {"e": [True, NA], "v": [NA, NA], "u": [False, True]}, 0)
    assert math.isclose(cs.coverage(), 1.0, rel_tol=1e-12)


def test_rubrics_property_is_a_copy():
    cs = hand_sampler()
    r = cs.rubrics
    r["zzz"] = "Execution"
    r.pop("r1")
    assert cs.rubrics == {"r1": "Execution", "r2": "Execution", "r3": "Verification"}


def test_custom_capabilities():
    cs = CapabilitySampler({"x": ["T"], "y": ["U"]}, batch_size=1, group_size=2, capabilities=("Alpha", "Beta"))
    cs.set_rubrics({"a": "Alpha", "b": "Beta"})
    cs.record_group("x", {"a": [True, True], "b": [False, NA]}, 0)
    assert_close(cs.evidence("T", "Alpha", 0), (2.0, 0.0))
    assert_close(cs.evidence("T", "Beta", 0), (0.0, 1.0))
    with pytest.raises(ValueError, match="capability"):
        cs.set_rubrics({"a": "Execution"})  # not one of this sampler's capabilities


def test_accepts_tuples_and_generators_for_verdicts():
    cs = CapabilitySampler({"x": ["T"]}, batch_size=1, group_size=3)
    cs.set_rubrics({"a": "Execution"})
    cs.record_group("x", {"a": (True, False, PASS)}, 0)
    assert_close(cs.rubric_evidence("T", "a", 0), (2.0, 1.0))


# ----------------------------------------------------------------------------
# Batches: structure
# ----------------------------------------------------------------------------
def test_batches_are_distinct_known_tasks():
    tasks, cs = populated_sampler(batch_size=10)
    for v in range(30):
        batch = cs.sample(v % 3)
        assert isinstance(batch, list)
        assert len(batch) == 10
        assert set(batch) == set(tasks)  # batch_size == |X|: a permutation
    tasks, cs = populated_sampler(batch_size=4)
    for _ in range(200):
        batch = cs.sample(2)
        assert len(batch) == 4 and len(set(batch)) == 4 and set(batch) <= set(tasks)


def test_sampling_is_seeded_and_does_not_change_accounting():
    tasks, a = populated_sampler(seed=11)
    _, b = populated_sampler(seed=11)
    _, c = populated_sampler(seed=12)
    tags = ["A", "B", "C", "D"]
    snap = snapshot(a, tasks, tags, ["e", "v"], [0, 2, 9])
    ba = [a.sample(2) for _ in range(50)]
    bb = [b.sample(2) for _ in range(50)]
    bc = [c.sample(2) for _ in range(50)]
    assert ba == bb
    assert ba != bc
    assert snapshot(a, tasks, tags, ["e", "v"], [0, 2, 9]) == snap


# ----------------------------------------------------------------------------
# Property: random operation sequences vs the reference model
# ----------------------------------------------------------------------------
TAGS = ["A", "B", "C", "D"]
RUBRIC_IDS = [f"r{i}" for i in range(7)]
CAPS = ["Understanding", "Execution", "Verification"]
verdict_value = st.sampled_from([True, False, PASS, FAIL, NA, INVALID, True, False, PASS, FAIL])


def compare(cs, ref, tasks, versions):
    assert dict(cs.rubrics) == ref.rubrics
    for t in tasks:
        assert state_of(cs, t) == ref.task_state(t), t
    assert math.isclose(cs.coverage(), ref.coverage(), rel_tol=1e-12, abs_tol=1e-15)
    for d in sorted({d for tags in tasks.values() for d in tags}):  # tags of some task
        for v in versions:
            for c in DEFAULT_CAPABILITIES:
                assert_close(cs.evidence(d, c, v), ref.evidence(d, c, v), rel=1e-11, what=f"evidence({d},{c},{v})")
            for r in ref.rubrics:
                assert_close(
                    cs.rubric_evidence(d, r, v), ref.rubric_evidence(d, r, v), what=f"rubric_evidence({d},{r},{v})"
                )


@PROP
@given(data=st.data())
def test_random_operation_sequences_match_reference(data):
    n_tasks = data.draw(st.integers(2, 6), label="n_tasks")
    tasks = {
        f"task{i}": data.draw(st.lists(st.sampled_from(TAGS), min_size=1, max_size=3, unique=True), label="tags")
        for i in range(n_tasks)
    }
    G = data.draw(st.integers(1, 3), label="G")
    g_obs, g_unobs = data.draw(st.sampled_from([(0.2, 0.999), (0.5, 0.8)]), label="gammas")
    kw = dict(batch_size=min(2, n_tasks), group_size=G, gamma_obs=g_obs, gamma_unobs=g_unobs, seed=3)
    cs = CapabilitySampler(tasks, **kw)
    ref = RefCapabilitySampler(tasks, **kw)
    clock = 0
    n_ops = data.draw(st.integers(1, 25), label="n_ops")
    for _ in range(n_ops):
        kind = data.draw(st.sampled_from(["set", "rec", "rec", "rec", "rec", "sample"]), label="op")
        if kind == "set":
            pool = data.draw(
                st.dictionaries(st.sampled_from(RUBRIC_IDS), st.sampled_from(CAPS), max_size=6), label="pool"
            )
            cs.set_rubrics(pool)
            ref.set_rubrics(pool)
        elif kind == "rec":
            task = data.draw(st.sampled_from(sorted(tasks)), label="task")
            active = sorted(ref.rubrics)
            chosen = (
                data.draw(st.lists(st.sampled_from(active), unique=True, max_size=len(active)), label="rubrics")
                if active
                else []
            )
            verdicts = {r: data.draw(st.lists(verdict_value, min_size=G, max_size=G), label="verdicts") for r in chosen}
            step = data.draw(st.sampled_from([0, 0, 1, 1, 2, 5, -1, -3]), label="dv")
            if step >= 0:
                clock += step
                v = clock
            else:
                v = max(0, clock + step)  # a late group
            cs.record_group(task, verdicts, v)
            ref.record_group(task, verdicts, v)
        else:
            batch = cs.sample(clock)
            assert len(batch) == kw["batch_size"] and len(set(batch)) == len(batch) and set(batch) <= set(tasks)
        compare(cs, ref, tasks, [clock])
    compare(cs, ref, tasks, [0, clock, clock + 4])
