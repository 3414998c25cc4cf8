"""Statistical tests of batch construction (Arise eq. 12-14, appendix B.5).

The compiled sampler's RNG stream cannot be reproduced in Python, so its
selection frequencies are compared with exact selection probabilities derived
from the paper's rules:

* batch_size = 1: P(x) = [discovery candidates exist] * (rho * P_disc(x) +
  (1 - rho) * (P_adapt(x) if a pair is eligible else P_disc(x)))
  + [no discovery candidates] * (P_adapt(x) or inverse-attempt fallback),
  with P_disc(x) proportional to 1/(1 + a_x) over tasks with outstanding
  evaluations and P_adapt(x) = sum over pairs containing x of
  q_pair / |members(pair)|, q_pair = E[w_dc / sum w], w = p (1-p)^2,
  p ~ Beta(1 + S_dc, 1 + F_dc) (numpy Monte Carlo, 1e6 draws).
* structural rules that hold for every batch (per-pair quota, no repeats,
  discovery first) are asserted exactly on every batch.

Every goodness-of-fit test fails below p = 1e-6, and for the main scenarios we
show the same test on the same counts rejects plausible wrong models.
"""

import itertools
import math
from collections import Counter

import numpy as np
import pytest
from reference_sampler import RefCapabilitySampler
from stats_util import P_FAIL, gof_pvalue, homogeneity_pvalue, pair_q_monte_carlo, single_selection_probabilities

from rwcore import CapabilitySampler, Verdict

PASS, FAIL, NA, INVALID = Verdict.PASS, Verdict.FAIL, Verdict.NA, Verdict.INVALID
T, F = True, False


def build(tasks, groups, rubrics, **kw):
    """The sampler under test and the reference model, fed the same history."""
    cs = CapabilitySampler(tasks, **kw)
    ref = RefCapabilitySampler(tasks, **kw)
    for x in (cs, ref):
        x.set_rubrics(rubrics)
        for task, verdicts, v in groups:
            x.record_group(task, verdicts, v)
    return cs, ref


def check_state_agrees(cs, ref, v):
    """Precondition for the statistics: both hold the same evidence/coverage."""
    assert math.isclose(cs.coverage(), ref.coverage(), rel_tol=1e-12)
    for t in ref.tasks:
        ts = cs.task_state(t)
        assert int(ts["attempts"]) == ref.task_state(t)["attempts"]
        assert set(ts["evaluated"]) == ref.task_state(t)["evaluated"]
        assert set(ts["applicable"]) == ref.task_state(t)["applicable"]
    for (d, c), (s, f) in ref.pair_evidence(v).items():
        got = cs.evidence(d, c, v)
        assert math.isclose(got[0], s, rel_tol=1e-12, abs_tol=1e-300)
        assert math.isclose(got[1], f, rel_tol=1e-12, abs_tol=1e-300)


def single_counts(cs, v, n):
    counts = Counter()
    for _ in range(n):
        b = cs.sample(v)
        assert len(b) == 1
        counts[b[0]] += 1
    return counts


# ----------------------------------------------------------------------------
# Scenario 1: discovery + adaptive mixture, batch_size 1
# ----------------------------------------------------------------------------
S1_TASKS = {
    "t0": ["A"],
    "t1": ["A", "B"],
    "t2": ["B"],
    "t3": ["C"],
    "t4": ["C"],
    "t5": ["A"],
    "t6": ["D"],
    "t7": ["B", "D"],
}
S1_RUBRICS = {"e1": "Execution", "e2": "Execution", "v1": "Verification", "u1": "Understanding"}
S1_GROUPS = [
    ("t0", {"e1": [T, T, T, F], "e2": [T, T, T, T], "v1": [F, F, F, F], "u1": [NA] * 4}, 0),
    ("t0", {"e1": [T, T, F, F]}, 2),
    ("t1", {"e1": [F, F, F, F], "e2": [F, F, F, T], "v1": [NA] * 4, "u1": [T, F, T, F]}, 1),
    ("t2", {"e1": [T, T, T, T]}, 1),  # partially evaluated
    ("t3", {"e1": [INVALID] * 4}, 0),  # judge failure: attempt only
    ("t3", {}, 1),
    ("t4", {"v1": [T, T, T, T], "u1": [F, F, F, F], "e1": [NA] * 4, "e2": [NA] * 4}, 2),
    ("t6", {"u1": [PASS, FAIL, INVALID, PASS]}, 0),  # evidence, not evaluated
]
S1_KW = dict(batch_size=1, group_size=4, gamma_obs=0.5, gamma_unobs=0.8, seed=2024)
S1_VERSION = 4
N_SINGLE = 40_000


@pytest.fixture(scope="module")
def scenario1():
    cs, ref = build(S1_TASKS, S1_GROUPS, S1_RUBRICS, **S1_KW)
    check_state_agrees(cs, ref, S1_VERSION)
    # the scenario exercises what it should
    assert 0.3 < ref.rho() < 0.9
    assert set(ref.discovery_candidates()) == {"t2", "t3", "t5", "t6", "t7"}
    assert len(ref.pair_members()) == 8
    mc = pair_q_monte_carlo(ref.pair_evidence(S1_VERSION), draws=1_000_000, seed=7)
    q = {k: v[0] for k, v in mc.items()}
    counts = single_counts(cs, S1_VERSION, N_SINGLE)
    return cs, ref, mc, q, counts


def test_single_selection_frequencies_match_paper(scenario1):
    cs, ref, mc, q, counts = scenario1
    probs = single_selection_probabilities(ref, q)
    p, stat, dof = gof_pvalue(counts, probs)
    assert p > P_FAIL, (p, stat, dof, dict(counts), probs)


@pytest.mark.parametrize(
    "wrong",
    [
        "w=p(1-p)",
        "uniform pair",
        "rho=rho_min",
        "rho ignored (always adaptive)",
        "uniform discovery weights",
        "no query decay",
    ],
)
def test_single_selection_test_has_power(scenario1, wrong):
    """The same test on the same counts rejects plausible wrong models."""
    cs, ref, mc, q, counts = scenario1
    if wrong == "w=p(1-p)":
        q_alt = {
            k: v[0]
            for k, v in pair_q_monte_carlo(
                ref.pair_evidence(S1_VERSION), draws=400_000, seed=8, weight=lambda p: p * (1 - p)
            ).items()
        }
        probs = single_selection_probabilities(ref, q_alt)
    elif wrong == "uniform pair":
        probs = single_selection_probabilities(ref, {k: 1.0 for k in q})
    elif wrong == "rho=rho_min":
        probs = single_selection_probabilities(ref, q, rho=ref.rho_min)
    elif wrong == "rho ignored (always adaptive)":
        probs = single_selection_probabilities(ref, q, rho=0.0)
    elif wrong == "uniform discovery weights":
        probs = single_selection_probabilities(ref, q, discovery_weight=lambda a: 1.0)
    else:  # evidence queried at the version of its last update
        ev = {
            k: ref.store.query_sum(k[0], [r for r, c in ref.rubrics.items() if c == k[1]], 0)
            for k in ref.pair_evidence(S1_VERSION)
        }
        q_alt = {k: v[0] for k, v in pair_q_monte_carlo(ev, draws=400_000, seed=9).items()}
        probs = single_selection_probabilities(ref, q_alt)
    p, stat, dof = gof_pvalue(counts, probs)
    assert p < P_FAIL, (wrong, p, stat, dof)


def test_pair_probabilities_match_monte_carlo(scenario1):
    cs, ref, mc, q, counts = scenario1
    before = cs.state_dict()
    n_draws = 200_000
    pp = cs.pair_probabilities(S1_VERSION, num_draws=n_draws, seed=1)
    assert {(d, c) for (d, c) in pp} == set(mc)
    assert math.isclose(sum(pp.values()), 1.0, rel_tol=1e-9)
    for k, (m, se) in mc.items():
        se_impl = se * math.sqrt(1_000_000 / n_draws)
        tol = 6 * math.sqrt(se**2 + se_impl**2) + 1e-4
        assert abs(pp[k] - m) < tol, (k, pp[k], m, tol)
    # seeded: the same seed gives the same estimate
    assert cs.pair_probabilities(S1_VERSION, num_draws=1000, seed=3) == cs.pair_probabilities(
        S1_VERSION, num_draws=1000, seed=3
    )
    # default num_draws works and sums to one
    assert math.isclose(sum(cs.pair_probabilities(S1_VERSION).values()), 1.0, rel_tol=1e-9)
    cs.load_state_dict(before)


def test_pair_probabilities_does_not_consume_rng(scenario1):
    cs, ref, *_ = scenario1
    sd = cs.state_dict()
    a = [cs.sample(S1_VERSION) for _ in range(20)]
    cs.load_state_dict(sd)
    cs.pair_probabilities(S1_VERSION, num_draws=500, seed=99)
    b = [cs.sample(S1_VERSION) for _ in range(20)]
    assert a == b
    cs.load_state_dict(sd)


def test_pair_probabilities_empty_when_no_evidence():
    cs = CapabilitySampler({"a": ["X"], "b": ["Y"]}, batch_size=1, group_size=2)
    assert dict(cs.pair_probabilities(0)) == {}
    cs.set_rubrics({"r": "Execution"})
    cs.record_group("a", {"r": [NA, NA]}, 0)
    assert dict(cs.pair_probabilities(0)) == {}
    cs.record_group("b", {"r": [T, NA]}, 0)
    assert dict(cs.pair_probabilities(0)) == {("Y", "Execution"): 1.0}


# ----------------------------------------------------------------------------
# Scenario 2: full coverage -> no discovery candidates -> adaptive only
# ----------------------------------------------------------------------------
def test_full_coverage_selects_adaptively_only():
    tasks = {"a0": ["A"], "a1": ["A"], "b0": ["B"], "c0": ["A", "C"], "z0": ["Z"], "z1": ["Z"]}
    rubrics = {"e": "Execution", "v": "Verification"}
    groups = [
        ("a0", {"e": [T, T, F, F], "v": [NA] * 4}, 0),
        ("a1", {"e": [F, F, F, F], "v": [NA] * 4}, 0),
        ("b0", {"e": [T, T, T, T], "v": [F, F, T, F]}, 0),
        ("c0", {"e": [NA] * 4, "v": [T, F, NA, NA]}, 0),
        ("z0", {"e": [NA] * 4, "v": [NA] * 4}, 0),  # covered, no applicable evidence
        ("z1", {"e": [NA] * 4, "v": [NA] * 4}, 0),
    ]
    cs, ref = build(tasks, groups, rubrics, batch_size=1, group_size=4, rho_min=0.3, seed=5)
    check_state_agrees(cs, ref, 0)
    assert ref.coverage() == 1.0 and ref.discovery_candidates() == []
    q = {k: v[0] for k, v in pair_q_monte_carlo(ref.pair_evidence(0), draws=1_000_000, seed=11).items()}
    counts = single_counts(cs, 0, 30_000)
    assert counts["z0"] == 0 and counts["z1"] == 0  # never adaptive members, and adaptive is available
    probs = single_selection_probabilities(ref, q)
    p, stat, dof = gof_pvalue(counts, probs)
    assert p > P_FAIL, (p, stat, dict(counts), probs)
    # power: "rho_min applied even without discovery candidates" would pick z* 30% of the time
    wrong = {t: 0.7 * probs[t] + 0.3 / len(tasks) for t in tasks}
    assert gof_pvalue(counts, wrong)[0] < P_FAIL


# ----------------------------------------------------------------------------
# Scenario 2b: high coverage -> the rho_min floor binds
# ----------------------------------------------------------------------------
def test_rho_min_floor_binds_at_high_coverage():
    tasks = {f"t{i}": ["A" if i < 5 else "B"] for i in range(10)}
    rubrics = {"e": "Execution", "v": "Verification"}
    groups = [(f"t{i}", {"e": [T, F, T, F], "v": [NA, T, F, F] if i % 2 else [NA] * 4}, 0) for i in range(9)]
    groups.append(("t9", {"e": [T, T, T, F]}, 0))  # t9: Verification outstanding
    cs, ref = build(tasks, groups, rubrics, batch_size=1, group_size=4, rho_min=0.3, seed=13)
    check_state_agrees(cs, ref, 1)
    assert ref.discovery_candidates() == ["t9"]
    assert math.isclose(ref.coverage(), 0.95) and ref.rho() == 0.3
    q = {k: v[0] for k, v in pair_q_monte_carlo(ref.pair_evidence(1), draws=1_000_000, seed=3).items()}
    counts = single_counts(cs, 1, 30_000)
    probs = single_selection_probabilities(ref, q)
    assert gof_pvalue(counts, probs)[0] > P_FAIL, (counts, probs)
    # power: the unclamped rho = 1 - C = 0.05
    assert gof_pvalue(counts, single_selection_probabilities(ref, q, rho=0.05))[0] < P_FAIL


# ----------------------------------------------------------------------------
# Scenario 3: discovery first (no evidence yet)
# ----------------------------------------------------------------------------
def test_discovery_first_inverse_attempt_weights():
    tasks = {f"t{i}": ["A" if i % 2 else "B"] for i in range(8)}
    rubrics = {"e": "Execution", "v": "Verification"}
    groups = []
    # attempts 0, 1, 2, 4 for t0..t3 (judge failures / partial NA: no evidence, not fully evaluated)
    for t, k in (("t1", 1), ("t2", 2), ("t3", 4)):
        for j in range(k):
            groups.append((t, {"e": [INVALID, NA, NA]} if j % 2 else {}, j))
    groups.append(("t2", {"e": [NA, NA, NA]}, 3))  # t2: e evaluated, v outstanding (3 attempts)
    for t in ("t4", "t5", "t6", "t7"):  # covered, only NA: not candidates
        groups.append((t, {"e": [NA] * 3, "v": [NA] * 3}, 0))
    cs, ref = build(tasks, groups, rubrics, batch_size=1, group_size=3, seed=9)
    check_state_agrees(cs, ref, 3)
    assert ref.pair_members() == {}
    assert set(ref.discovery_candidates()) == {"t0", "t1", "t2", "t3"}
    counts = single_counts(cs, 3, 30_000)
    assert set(counts) <= {"t0", "t1", "t2", "t3"}
    att = {t: ref.task_state(t)["attempts"] for t in ("t0", "t1", "t2", "t3")}
    assert att == {"t0": 0, "t1": 1, "t2": 3, "t3": 4}
    w = {t: 1 / (1 + a) for t, a in att.items()}
    probs = {t: w[t] / sum(w.values()) for t in w}
    assert gof_pvalue(counts, probs)[0] > P_FAIL
    assert gof_pvalue(counts, {t: 0.25 for t in w})[0] < P_FAIL  # power: uniform
    wa = {t: 1 / (1 + a) ** 2 for t, a in att.items()}  # power: 1/(1+a)^2
    assert gof_pvalue(counts, {t: wa[t] / sum(wa.values()) for t in wa})[0] < P_FAIL


def test_discovery_batches_come_from_outstanding_tasks():
    tasks = {f"t{i}": ["A"] for i in range(10)}
    rubrics = {"e": "Execution"}
    groups = [(f"t{i}", {"e": [NA, NA]}, 0) for i in range(5, 10)]  # t5..t9 covered, no evidence
    cs, _ = build(tasks, groups, rubrics, batch_size=3, group_size=2, seed=1)
    outstanding = {f"t{i}" for i in range(5)}
    for _ in range(300):
        b = cs.sample(0)
        assert len(set(b)) == 3 and set(b) <= outstanding
    # more positions than candidates: all candidates first, then fallback
    cs, _ = build(tasks, groups, rubrics, batch_size=7, group_size=2, seed=1)
    for _ in range(300):
        b = cs.sample(0)
        assert len(set(b)) == 7 and outstanding <= set(b)


def test_discovery_without_replacement_two_positions():
    """Sequential weighted sampling without replacement over discovery candidates."""
    tasks = {f"t{i}": ["A"] for i in range(4)}
    groups = []
    for t, k in (("t1", 1), ("t2", 3), ("t3", 7)):
        groups += [(t, {}, 0)] * k
    cs, ref = build(tasks, groups, {"e": "Execution"}, batch_size=2, group_size=2, seed=4)
    w = {t: 1 / (1 + ref.task_state(t)["attempts"]) for t in tasks}
    W = sum(w.values())
    probs = {}
    for x, y in itertools.combinations(sorted(tasks), 2):
        probs[(x, y)] = w[x] / W * w[y] / (W - w[x]) + w[y] / W * w[x] / (W - w[y])
    n = 30_000
    counts = Counter(tuple(sorted(cs.sample(0))) for _ in range(n))
    assert gof_pvalue(counts, probs)[0] > P_FAIL
    # power: "independent draws, product of weights" (conditional Poisson) model
    prod = {k: w[k[0]] * w[k[1]] for k in probs}
    assert gof_pvalue(counts, {k: v / sum(prod.values()) for k, v in prod.items()})[0] < P_FAIL


# ----------------------------------------------------------------------------
# Per-pair quota (exact, every batch)
# ----------------------------------------------------------------------------
def _quota_sampler(tags_members, batch_size, quota_fraction, extra=(), rho_min=0.0, seed=0, caps=None):
    tasks = {}
    groups = []
    rubrics = {"e": "Execution", "v": "Verification"}
    for tag, n in tags_members.items():
        for i in range(n):
            t = f"{tag}{i}"
            tasks[t] = [tag]
            cap_rubric = (caps or {}).get(tag, "e")
            other = "v" if cap_rubric == "e" else "e"
            # tag P: all failures, the others mostly passes (different weights)
            y = [F, F, F, F] if tag == "P" else [T, T, T, F]
            groups.append((t, {cap_rubric: y, other: [NA] * 4}, 0))
    for t in extra:  # covered, no applicable evidence
        tasks[t] = ["Z"]
        groups.append((t, {"e": [NA] * 4, "v": [NA] * 4}, 0))
    cs, ref = build(
        tasks,
        groups,
        rubrics,
        batch_size=batch_size,
        group_size=4,
        rho_min=rho_min,
        quota_fraction=quota_fraction,
        seed=seed,
    )
    assert ref.coverage() == 1.0
    return cs, ref


def test_quota_limits_adaptive_targeting_per_pair():
    # 4 pairs x quota max(1, ceil(0.25 * 8)) = 2 -> exactly 2 tasks of every tag, every batch
    cs, _ = _quota_sampler({"P": 5, "Q": 5, "R": 5, "S": 5}, batch_size=8, quota_fraction=0.25)
    for _ in range(300):
        b = cs.sample(0)
        assert len(set(b)) == 8
        assert Counter(t[0] for t in b) == {"P": 2, "Q": 2, "R": 2, "S": 2}, b


def test_quota_is_at_least_one():
    # quota_fraction 0 -> max(1, 0) = 1 selection per pair
    cs, _ = _quota_sampler({"P": 3, "Q": 3, "R": 3, "S": 3}, batch_size=4, quota_fraction=0.0)
    for _ in range(300):
        assert Counter(t[0] for t in cs.sample(0)) == {"P": 1, "Q": 1, "R": 1, "S": 1}


def test_quota_rounds_up():
    # 3 pairs x quota max(1, ceil(0.3 * 6)) = 2 -> exactly 2 of every tag
    cs, _ = _quota_sampler({"P": 4, "Q": 4, "R": 4}, batch_size=6, quota_fraction=0.3)
    for _ in range(300):
        assert Counter(t[0] for t in cs.sample(0)) == {"P": 2, "Q": 2, "R": 2}


def test_quota_counts_tag_capability_pairs():
    # one tag, two capabilities with disjoint members: quota ceil(0.5 * 4) = 2 per (tag, capability)
    cs = CapabilitySampler(
        {f"x{i}": ["A"] for i in range(10)}, batch_size=4, group_size=2, rho_min=0.0, quota_fraction=0.5, seed=3
    )
    cs.set_rubrics({"e": "Execution", "v": "Verification"})
    for i in range(10):
        if i < 5:  # Execution evidence, near-certain failure: the heavy pair
            cs.record_group(f"x{i}", {"e": [F, F], "v": [NA, NA]}, 0)
        else:
            cs.record_group(f"x{i}", {"e": [NA, NA], "v": [T, T]}, 0)
    for _ in range(300):
        b = cs.sample(0)
        assert sum(int(t[1:]) < 5 for t in b) == 2 and len(set(b)) == 4, b


def test_quota_then_inverse_attempt_fallback():
    # 3 pairs x quota 2 = 6 adaptive picks, then 2 fallback picks among the 14
    # remaining free tasks (all with one attempt -> uniform): #Z ~ hypergeometric
    cs, _ = _quota_sampler(
        {"P": 5, "Q": 5, "R": 5}, batch_size=8, quota_fraction=0.25, extra=[f"Z{i}" for i in range(5)]
    )
    n = 6000
    zcounts = Counter()
    for _ in range(n):
        b = cs.sample(0)
        c = Counter(t[0] for t in b)
        assert len(set(b)) == 8 and c["P"] >= 2 and c["Q"] >= 2 and c["R"] >= 2, b
        zcounts[c["Z"]] += 1
    probs = {0: math.comb(9, 2) / math.comb(14, 2), 1: 9 * 5 / math.comb(14, 2), 2: math.comb(5, 2) / math.comb(14, 2)}
    assert gof_pvalue(zcounts, probs)[0] > P_FAIL
    # power: a fallback that skipped pair members (only Z) or preferred them
    assert gof_pvalue(zcounts, {0: 0.0, 1: 0.0, 2: 1.0})[0] < P_FAIL


def test_pair_without_free_member_is_not_eligible():
    # three single-member pairs (quota 2 each) + five uncovered-evidence tasks:
    # every batch holds the three pair members (adaptive), then two fallback picks
    cs, _ = _quota_sampler(
        {"P": 1, "Q": 1, "R": 1}, batch_size=5, quota_fraction=0.5, extra=[f"Z{i}" for i in range(5)]
    )
    for _ in range(300):
        b = cs.sample(0)
        assert len(set(b)) == 5 and {"P0", "Q0", "R0"} <= set(b), b


def test_discovery_does_not_count_toward_quota():
    tasks = {f"p{i}": ["P"] for i in range(6)}
    tasks.update({f"z{i}": ["Z"] for i in range(5)})
    cs = CapabilitySampler(tasks, batch_size=5, group_size=2, rho_min=1.0, quota_fraction=0.2, seed=8)
    cs.set_rubrics({"e": "Execution", "v": "Verification"})
    for i in range(3):  # p0..p2: Execution evidence, Verification outstanding -> discovery candidates
        cs.record_group(f"p{i}", {"e": [T, F]}, 0)
    for i in range(3, 6):  # p3..p5: covered, many attempts (tiny fallback weight)
        for _ in range(50):
            cs.record_group(f"p{i}", {"e": [T, F], "v": [NA, NA]}, 0)
    for i in range(5):  # z*: covered, no evidence
        cs.record_group(f"z{i}", {"e": [NA, NA], "v": [NA, NA]}, 0)
    # positions 1-3: discovery (rho = 1) takes p0..p2; position 4: adaptive on (P, Execution)
    # (its quota of 1 is untouched by discovery) -> one of p3..p5; position 5: fallback.
    for _ in range(300):
        b = set(cs.sample(0))
        assert {"p0", "p1", "p2"} <= b, b
        assert b & {"p3", "p4", "p5"}, b


def test_beta_estimates_are_redrawn_at_each_adaptive_selection():
    """Two symmetric pairs with (decayed to) no evidence, quota 2, batch 2.
    With a fresh Beta draw per selection the two positions pick the same pair
    with probability exactly 1/2; re-using one draw per batch gives
    1/2 + 2 Var(q) instead."""
    tasks = {f"{tag}{i}": [tag] for tag in "PQ" for i in range(5)}
    cs = CapabilitySampler(
        tasks, batch_size=2, group_size=2, rho_min=0.0, quota_fraction=1.0, gamma_obs=0.5, gamma_unobs=0.5, seed=17
    )
    cs.set_rubrics({"e": "Execution"})
    for t in tasks:
        cs.record_group(t, {"e": [T, F]}, 0)
    v = 200  # evidence decayed by 0.5**200: Beta(1, 1) for both pairs
    assert max(cs.evidence("P", "Execution", v)) < 1e-50
    n = 8000
    same = Counter()
    for _ in range(n):
        b = cs.sample(v)
        assert len(set(b)) == 2
        same[b[0][0] == b[1][0]] += 1
    assert gof_pvalue(same, {True: 0.5, False: 0.5})[0] > P_FAIL, same
    rng = np.random.default_rng(0)
    p = rng.random((1_000_000, 2))
    w = p * (1 - p) ** 2
    qv = w[:, 0] / w.sum(axis=1)
    p_same_once = float(np.mean(qv**2 + (1 - qv) ** 2))
    assert gof_pvalue(same, {True: p_same_once, False: 1 - p_same_once})[0] < P_FAIL, p_same_once


# ----------------------------------------------------------------------------
# Multi-position batches: the whole distribution vs the reference model
# ----------------------------------------------------------------------------
def test_three_position_batches_match_reference_distribution():
    kw = dict(S1_KW, batch_size=3, quota_fraction=0.25, seed=77)
    cs, ref = build(S1_TASKS, S1_GROUPS, S1_RUBRICS, **kw)
    check_state_agrees(cs, ref, S1_VERSION)
    n_impl, n_ref = 20_000, 40_000
    got = Counter(frozenset(cs.sample(S1_VERSION)) for _ in range(n_impl))
    want = Counter(frozenset(ref.sample(S1_VERSION)) for _ in range(n_ref))
    for b in got:
        assert len(b) == 3
    p, stat, dof = homogeneity_pvalue(got, want)
    assert p > P_FAIL, (p, stat, dof)
    # power: wrong models simulated with the reference are distinguishable on
    # the same counts: coverage ignored (rho = rho_min), and discovery always
    for name, rho in (("rho=rho_min", lambda: kw.get("rho_min", 0.1)), ("rho=1", lambda: 1.0)):
        wrong = RefCapabilitySampler(S1_TASKS, **dict(kw, seed=78))
        wrong.set_rubrics(S1_RUBRICS)
        for task, verdicts, v in S1_GROUPS:
            wrong.record_group(task, verdicts, v)
        wrong.rho = rho
        wrong_counts = Counter(frozenset(wrong.sample(S1_VERSION)) for _ in range(n_ref))
        assert homogeneity_pvalue(got, wrong_counts)[0] < P_FAIL, name


def test_large_batch_mixed_structure():
    tasks = {f"t{i}": [f"g{i % 7}", f"h{i % 3}"] for i in range(60)}
    rubrics = {f"r{k}": c for k, c in enumerate(["Execution", "Verification", "Understanding", "Debugging"] * 2)}
    rng = np.random.default_rng(0)
    groups = []
    for i in range(40):
        verdicts = {r: [bool(x) for x in rng.integers(0, 2, 8)] for r in rubrics if rng.random() < 0.7}
        groups.append((f"t{i}", verdicts, int(i // 10)))
    cs, ref = build(tasks, groups, rubrics, batch_size=32, group_size=8, seed=0)
    check_state_agrees(cs, ref, 4)
    quota = max(1, math.ceil(0.25 * 32))
    assert quota == 8
    for _ in range(100):
        b = cs.sample(4)
        assert len(b) == 32 and len(set(b)) == 32 and set(b) <= set(tasks)
