"""Self-checks of the pure-Python reference model and the statistics helpers.

These tests do not import rwcore: they pin the reference model to values
worked out by hand from the paper (Arise eq. 9-14, 20) so that the model can
be trusted as an oracle for the compiled implementation.
"""

import math
import random
from collections import Counter

import pytest
from reference_sampler import RefCapabilitySampler, RefEvidenceStore, RefOutcomeSampler, Verdict
from stats_util import (
    P_FAIL,
    chi2_sf,
    gof_pvalue,
    homogeneity_pvalue,
    pair_q_monte_carlo,
    single_selection_probabilities,
)

G_OBS, G_UNOBS = 0.2, 0.999


def close(a, b, rel=1e-12):
    return all(math.isclose(x, y, rel_tol=rel, abs_tol=1e-300) for x, y in zip(a, b))


# ----------------------------------------------------------------------------
# Evidence store, hand-worked
# ----------------------------------------------------------------------------
def test_store_decay_on_new_version_and_query_decay():
    s = RefEvidenceStore()
    s.observe(0, 0, 1.0, 0.0, 0)
    # dv = 2: (S, F) <- 0.2 * 0.999**1 * (1, 0) + (0, 1) = (0.1998, 1)
    s.observe(0, 0, 0.0, 1.0, 2)
    assert close(s.query(0, 0, 2), (0.1998, 1.0))
    # query 3 versions later: * 0.999**3
    f = 0.999**3
    assert close(s.query(0, 0, 5), (0.1998 * f, f))
    # query older than v_last: no decay
    assert close(s.query(0, 0, 1), (0.1998, 1.0))
    assert s.query(0, 1, 5) == (0.0, 0.0)
    assert len(s) == 1


def test_store_same_version_adds_and_dv1_is_gamma_obs():
    s = RefEvidenceStore()
    s.observe(2, 2, 1.0, 1.0, 7)
    s.observe(2, 2, 0.5, 0.0, 7)
    assert close(s.query(2, 2, 7), (1.5, 1.0))
    s.observe(3, 3, 1.0, 0.0, 0)
    s.observe(3, 3, 0.0, 0.0, 1)  # dv = 1: factor gamma_obs alone
    assert close(s.query(3, 3, 1), (0.2, 0.0))


def test_store_late_observation():
    s = RefEvidenceStore()
    s.observe(1, 1, 2.0, 0.0, 5)
    # late by 2: contribution * 0.2 * 0.999, v_last stays 5
    s.observe(1, 1, 0.0, 3.0, 3)
    assert close(s.query(1, 1, 5), (2.0, 3 * 0.1998))
    assert close(s.query(1, 1, 6), (2.0 * 0.999, 3 * 0.1998 * 0.999))
    # a later in-order observation decays from v_last = 5
    s.observe(1, 1, 1.0, 0.0, 6)
    assert close(s.query(1, 1, 6), (2.0 * 0.2 + 1.0, 3 * 0.1998 * 0.2))


def test_store_remove_rubric_and_query_sum():
    s = RefEvidenceStore(gamma_obs=0.5, gamma_unobs=0.5)
    for tag in range(3):
        s.observe(tag, 7, 1.0, 2.0, 0)
    s.observe(0, 8, 4.0, 0.0, 0)
    # query_sum over rubrics 7, 8 and a missing one at v=2: factor 0.25
    assert close(s.query_sum(0, [7, 8, 9], 2), (1.25, 0.5))
    assert s.remove_rubric(7) == 3
    assert s.remove_rubric(7) == 0
    assert len(s) == 1
    assert s.query(1, 7, 0) == (0.0, 0.0)
    # re-created cell starts fresh
    s.observe(1, 7, 1.0, 0.0, 9)
    assert s.query(1, 7, 9) == (1.0, 0.0)


def test_store_many_variants():
    a, b = RefEvidenceStore(), RefEvidenceStore()
    rows = [(0, 1, 1.0, 0.0, 0), (0, 1, 0.0, 2.0, 3), (2, 1, 1.0, 1.0, 1), (0, 1, 1.0, 0.0, 1)]
    for row in rows:
        a.observe(*row)
    b.observe_many(*zip(*rows))
    assert a.cells() == b.cells()
    assert b.query_many([0, 2, 5], [1, 1, 1], 4) == (
        [a.query(0, 1, 4)[0], a.query(2, 1, 4)[0], 0.0],
        [a.query(0, 1, 4)[1], a.query(2, 1, 4)[1], 0.0],
    )
    with pytest.raises(ValueError, match="successes"):
        b.observe_many([0, 0], [1, 1], [1.0, float("nan")], [0.0, 0.0], [5, 5])
    assert a.cells() == b.cells()


def test_store_rejects_bad_values():
    for g in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            RefEvidenceStore(gamma_obs=g)
    s = RefEvidenceStore()
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="success"):
            s.observe(0, 0, bad, 0.0, 0)
    with pytest.raises(ValueError, match="version"):
        s.observe(0, 0, 0.0, 0.0, -1)
    assert len(s) == 0


# ----------------------------------------------------------------------------
# Capability sampler accounting, hand-worked
# ----------------------------------------------------------------------------
def make_hand_sampler():
    cs = RefCapabilitySampler({"t0": ["A", "B"], "t1": ["A"]}, batch_size=1, group_size=2)
    cs.set_rubrics({"r1": "Execution", "r2": "Execution", "r3": "Verification"})
    # j=0: Execution rubrics r1, r2 both PASS -> +1/2 success each; r3 FAIL -> +1 failure
    # j=1: Execution only r1 applicable (r2 NA) -> r1 +1 failure; r3 INVALID -> nothing
    cs.record_group("t0", {"r1": [True, False], "r2": [True, Verdict.NA], "r3": [Verdict.FAIL, Verdict.INVALID]}, 0)
    return cs


def test_sampler_hand_worked_record_group():
    cs = make_hand_sampler()
    for tag in ("A", "B"):
        assert close(cs.rubric_evidence(tag, "r1", 0), (0.5, 1.0))
        assert close(cs.rubric_evidence(tag, "r2", 0), (0.5, 0.0))
        assert close(cs.rubric_evidence(tag, "r3", 0), (0.0, 1.0))
        assert close(cs.evidence(tag, "Execution", 0), (1.0, 1.0))
        assert close(cs.evidence(tag, "Verification", 0), (0.0, 1.0))
        assert cs.evidence(tag, "Debugging", 0) == (0.0, 0.0)
    assert cs.task_state("t0") == {"attempts": 1, "evaluated": {"r1", "r2"}, "applicable": {"r1", "r2", "r3"}}
    assert cs.task_state("t1") == {"attempts": 0, "evaluated": set(), "applicable": set()}
    # coverage: capabilities Execution (2 rubrics), Verification (1):
    # t0 -> 2/2 + 0/1, t1 -> 0 + 0; C = 1 / (2 tasks * 2 caps) = 0.25
    assert math.isclose(cs.coverage(), 0.25)
    assert math.isclose(cs.rho(), 0.75)
    assert cs.discovery_candidates() == ["t0", "t1"]
    assert cs.pair_members() == {
        ("A", "Execution"): ["t0"],
        ("A", "Verification"): ["t0"],
        ("B", "Execution"): ["t0"],
        ("B", "Verification"): ["t0"],
    }


def test_sampler_hand_worked_na_only_empty_and_pool_change():
    cs = make_hand_sampler()
    cs.record_group("t1", {"r3": [Verdict.NA, Verdict.NA]}, 1)  # covered, no evidence
    cs.record_group("t1", {}, 1)  # an attempt with no verdicts
    assert cs.task_state("t1") == {"attempts": 2, "evaluated": {"r3"}, "applicable": set()}
    assert math.isclose(cs.coverage(), 0.5)  # (1 + 0 + 0 + 1) / 4
    # r2 changes capability, r3 disappears, r4 is new
    cs.set_rubrics({"r1": "Execution", "r2": "Verification", "r4": "Debugging"})
    assert cs.task_state("t0") == {"attempts": 1, "evaluated": {"r1"}, "applicable": {"r1"}}
    assert cs.task_state("t1") == {"attempts": 2, "evaluated": set(), "applicable": set()}
    assert math.isclose(cs.coverage(), 1 / 6)
    assert close(cs.evidence("A", "Execution", 0), (0.5, 1.0))
    assert cs.evidence("A", "Verification", 0) == (0.0, 0.0)
    assert cs.rubric_evidence("B", "r3", 0) == (0.0, 0.0)
    assert len(cs.store) == 2  # (A, r1), (B, r1)
    cs.set_rubrics({})
    assert cs.coverage() == 0.0


def test_sampler_rejects_before_applying():
    cs = make_hand_sampler()
    sd = cs.state_dict()
    with pytest.raises(ValueError, match="task_id"):
        cs.record_group("nope", {}, 0)
    with pytest.raises(ValueError, match="verdicts"):
        cs.record_group("t0", {"r1": [True, True], "zz": [True, True]}, 0)
    with pytest.raises(ValueError, match="group_size"):
        cs.record_group("t0", {"r1": [True, True, True]}, 0)
    with pytest.raises(ValueError, match="verdict"):
        cs.record_group("t0", {"r1": [True, "pass"]}, 0)
    with pytest.raises(ValueError, match="capability"):
        cs.set_rubrics({"r1": "Execution", "r9": "Cooking"})
    assert cs.state_dict() == sd


# ----------------------------------------------------------------------------
# Statistics helpers
# ----------------------------------------------------------------------------
def test_chi2_sf_known_values():
    assert math.isclose(chi2_sf(3.841458820694124, 1), 0.05, rel_tol=1e-9)
    assert math.isclose(chi2_sf(11.070497693516351, 5), 0.05, rel_tol=1e-9)
    for x in (0.1, 1.0, 5.0, 30.0, 200.0):  # dof 2: exp(-x/2)
        assert math.isclose(chi2_sf(x, 2), math.exp(-x / 2), rel_tol=1e-9)
    assert chi2_sf(0.0, 3) == 1.0


def test_gof_and_homogeneity_behave():
    rng = random.Random(1)
    probs = {"a": 0.5, "b": 0.3, "c": 0.2}
    counts = Counter(rng.choices(list(probs), weights=list(probs.values()), k=20000))
    assert gof_pvalue(counts, probs)[0] > 1e-4
    assert gof_pvalue(counts, {"a": 0.45, "b": 0.35, "c": 0.2})[0] < P_FAIL
    counts2 = Counter(rng.choices(list(probs), weights=list(probs.values()), k=30000))
    assert homogeneity_pvalue(counts, counts2)[0] > 1e-4
    counts3 = Counter(rng.choices(list(probs), weights=[0.45, 0.35, 0.2], k=30000))
    assert homogeneity_pvalue(counts, counts3)[0] < P_FAIL


# ----------------------------------------------------------------------------
# The reference sample() agrees with the closed-form single-selection model
# ----------------------------------------------------------------------------
def test_reference_sample_matches_selection_probabilities():
    tasks = {f"t{i}": tags for i, tags in enumerate([["A"], ["A", "B"], ["B"], ["C"], ["C"], ["A"]])}
    cs = RefCapabilitySampler(tasks, batch_size=1, group_size=4, seed=3)
    cs.set_rubrics({"e": "Execution", "v": "Verification"})
    cs.record_group("t0", {"e": [True] * 4, "v": [False] * 4}, 0)
    cs.record_group("t1", {"e": [False, False, False, True], "v": [Verdict.NA] * 4}, 0)
    cs.record_group("t3", {"e": [True, False, True, False]}, 0)
    cs.record_group("t4", {"e": [Verdict.INVALID] * 4}, 0)
    cs.record_group("t4", {}, 0)
    q = {k: v[0] for k, v in pair_q_monte_carlo(cs.pair_evidence(0), draws=400_000).items()}
    probs = single_selection_probabilities(cs, q)
    assert math.isclose(sum(probs.values()), 1.0)
    n = 30000
    counts = Counter(cs.sample(0)[0] for _ in range(n))
    assert gof_pvalue(counts, probs)[0] > 1e-4
    # and the pure-Python pair_probabilities agrees with numpy Monte Carlo
    pp = cs.pair_probabilities(0, num_draws=20000, seed=5)
    for k, v in q.items():
        assert abs(pp[k] - v) < 0.02


def test_reference_quota_and_distinct():
    tasks = {f"{tag}{i}": [tag] for tag in "PQRS" for i in range(5)}
    cs = RefCapabilitySampler(tasks, batch_size=8, group_size=2, rho_min=0.0, quota_fraction=0.25, seed=0)
    cs.set_rubrics({"e": "Execution"})
    for _i, t in enumerate(tasks):
        # tag P: near certain failure is favoured by p(1-p)^2
        cs.record_group(t, {"e": [t.startswith("S"), False]}, 0)
    assert cs.coverage() == 1.0
    for _ in range(200):
        batch = cs.sample(0)
        assert len(set(batch)) == 8
        assert Counter(t[0] for t in batch) == {"P": 2, "Q": 2, "R": 2, "S": 2}


def test_ref_outcome_sampler_evidence():
    os_ = RefOutcomeSampler({"a": [], "b": []}, batch_size=1, group_size=2)
    os_.record_group("a", {}, 0, outcomes=[1.0, 0.25])
    os_.record_group("a", {}, 1, outcomes=[0.0, 0.0])
    assert close(os_.task_evidence("a", 1), (1.25 * 0.2, 0.75 * 0.2 + 2.0))
    with pytest.raises(ValueError, match="outcomes"):
        os_.record_group("a", {}, 0)
