"""Baseline samplers: OutcomeSampler (VADE-style per-task Beta evidence from
task outcomes, weights p(1-p)^2) and UniformSampler."""

import itertools
import math
from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_sampler import RefEvidenceStore
from stats_util import P_FAIL, gof_pvalue, pair_q_monte_carlo

from rwcore import OutcomeSampler, UniformSampler, Verdict

PROP = settings(max_examples=60, deadline=None, derandomize=True)


def close(a, b, rel=1e-12):
    return all(math.isclose(float(x), y, rel_tol=rel, abs_tol=1e-300) for x, y in zip(a, b))


# ----------------------------------------------------------------------------
# OutcomeSampler: evidence
# ----------------------------------------------------------------------------
def test_outcome_evidence_hand_worked():
    os_ = OutcomeSampler({"a": ["X"], "b": ["Y"]}, batch_size=1, group_size=4)
    assert tuple(os_.task_evidence("a", 0)) == (0.0, 0.0)
    os_.record_group("a", {}, 0, outcomes=[1.0, 0.0, 0.5, 1.0])  # (2.5, 1.5)
    assert close(os_.task_evidence("a", 0), (2.5, 1.5))
    os_.record_group("a", {}, 2, outcomes=[0.0, 0.0, 0.0, 0.0])  # (2.5, 1.5) * 0.2 * 0.999 + (0, 4)
    assert close(os_.task_evidence("a", 2), (2.5 * 0.1998, 1.5 * 0.1998 + 4.0))
    assert close(os_.task_evidence("a", 5), (2.5 * 0.1998 * 0.999**3, (1.5 * 0.1998 + 4.0) * 0.999**3))
    os_.record_group("a", {}, 1, outcomes=[1.0, 1.0, 1.0, 1.0])  # late by 1: * 0.2
    assert close(os_.task_evidence("a", 2), (2.5 * 0.1998 + 0.8, 1.5 * 0.1998 + 4.0))
    assert tuple(os_.task_evidence("b", 2)) == (0.0, 0.0)


@PROP
@given(
    gam=st.sampled_from([(0.2, 0.999), (0.5, 0.7)]),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=3, max_size=3),
            st.integers(0, 15),
        ),
        max_size=30,
    ),
)
def test_outcome_evidence_matches_reference_store(gam, ops):
    os_ = OutcomeSampler(
        {"a": ["X"], "b": ["X"], "c": ["Y"]}, batch_size=2, group_size=3, gamma_obs=gam[0], gamma_unobs=gam[1]
    )
    ref = RefEvidenceStore(*gam)
    for task, outs, v in ops:
        os_.record_group(task, {}, v, outcomes=outs)
        ref.observe(task, 0, sum(outs), sum(1.0 - o for o in outs), v)
    for t in "abc":
        for v in (0, 7, 20):
            assert close(os_.task_evidence(t, v), ref.query(t, 0, v)), (t, v)


# ----------------------------------------------------------------------------
# OutcomeSampler: sampling statistics
# ----------------------------------------------------------------------------
OUT_TASKS = {"good": ["X"], "bad": ["X"], "mid": ["Y"]}
OUT_HISTORY = [("good", [1.0, 1.0, 1.0, 1.0]), ("bad", [0.0, 0.0, 0.0, 0.0]), ("mid", [1.0, 0.0, 1.0, 0.5])]


def outcome_sampler(batch_size, seed):
    os_ = OutcomeSampler(OUT_TASKS, batch_size=batch_size, group_size=4, seed=seed)
    for t, outs in OUT_HISTORY:
        os_.record_group(t, {}, 0, outcomes=outs)
    return os_


def test_outcome_single_selection_frequencies():
    os_ = outcome_sampler(1, seed=3)
    ev = {t: tuple(os_.task_evidence(t, 0)) for t in OUT_TASKS}
    assert ev == {"good": (4.0, 0.0), "bad": (0.0, 4.0), "mid": (2.5, 1.5)}
    q = {k: v[0] for k, v in pair_q_monte_carlo(ev, draws=1_000_000, seed=1).items()}
    n = 30_000
    counts = Counter(os_.sample(0)[0] for _ in range(n))
    assert gof_pvalue(counts, q)[0] > P_FAIL, (counts, q)
    # power: w = p(1-p) and uniform are rejected on the same counts
    q2 = {k: v[0] for k, v in pair_q_monte_carlo(ev, draws=400_000, seed=2, weight=lambda p: p * (1 - p)).items()}
    assert gof_pvalue(counts, q2)[0] < P_FAIL
    assert gof_pvalue(counts, {t: 1 / 3 for t in OUT_TASKS})[0] < P_FAIL


def test_outcome_two_of_three_without_replacement():
    os_ = outcome_sampler(2, seed=4)
    ev = {t: tuple(os_.task_evidence(t, 0)) for t in OUT_TASKS}
    keys = sorted(OUT_TASKS)
    rng = np.random.default_rng(5)
    m = 1_000_000
    p = np.stack([rng.beta(1 + ev[k][0], 1 + ev[k][1], size=m) for k in keys], axis=1)
    w = p * (1 - p) ** 2
    W = w.sum(axis=1)
    probs = {}
    for i, j in itertools.combinations(range(3), 2):
        pij = w[:, i] / W * w[:, j] / (W - w[:, i]) + w[:, j] / W * w[:, i] / (W - w[:, j])
        probs[frozenset((keys[i], keys[j]))] = float(pij.mean())
    n = 30_000
    counts = Counter()
    for _ in range(n):
        b = os_.sample(0)
        assert len(b) == 2 and len(set(b)) == 2
        counts[frozenset(b)] += 1
    assert gof_pvalue(counts, probs)[0] > P_FAIL, (counts, probs)


def test_outcome_sampler_batches_distinct_and_seeded():
    tasks = {f"t{i}": ["X"] for i in range(20)}
    a = OutcomeSampler(tasks, batch_size=7, group_size=2, seed=9)
    b = OutcomeSampler(tasks, batch_size=7, group_size=2, seed=9)
    for i in range(20):
        for s in (a, b):
            s.record_group(f"t{i}", {}, i // 5, outcomes=[float(i % 2), 1.0])
    ba = [a.sample(4) for _ in range(100)]
    assert ba == [b.sample(4) for _ in range(100)]
    for batch in ba:
        assert len(batch) == 7 and len(set(batch)) == 7 and set(batch) <= set(tasks)


# ----------------------------------------------------------------------------
# UniformSampler
# ----------------------------------------------------------------------------
def test_uniform_sampler_subsets_uniform():
    tasks = {f"t{i}": [f"g{i % 2}"] for i in range(7)}
    us = UniformSampler(tasks, batch_size=3, group_size=2, seed=0)
    n = 20_000
    counts = Counter()
    for _ in range(n):
        b = us.sample(0)
        assert len(b) == 3 and len(set(b)) == 3 and set(b) <= set(tasks)
        counts[frozenset(b)] += 1
    subsets = [frozenset(c) for c in itertools.combinations(tasks, 3)]
    probs = {s: 1 / len(subsets) for s in subsets}
    assert gof_pvalue(counts, probs)[0] > P_FAIL
    # feedback does not bias it
    us.set_rubrics({"e": "Execution"})
    for _ in range(30):
        us.record_group("t0", {"e": [True, True]}, 0)
        us.record_group("t1", {"e": [False, Verdict.NA]}, 0)
    counts2 = Counter(frozenset(us.sample(0)) for _ in range(n))
    assert gof_pvalue(counts2, probs)[0] > P_FAIL
    # per-task inclusion close to 3/7
    incl = Counter(t for s, c in counts2.items() for t in s for _ in range(c))
    for t in tasks:
        assert abs(incl[t] / n - 3 / 7) < 6 * math.sqrt((3 / 7) * (4 / 7) / n)


def test_uniform_sampler_seeded():
    tasks = {f"t{i}": ["X"] for i in range(10)}
    a = UniformSampler(tasks, batch_size=4, group_size=2, seed=1)
    b = UniformSampler(tasks, batch_size=4, group_size=2, seed=1)
    c = UniformSampler(tasks, batch_size=4, group_size=2, seed=2)
    ba = [a.sample(0) for _ in range(30)]
    assert ba == [b.sample(0) for _ in range(30)]
    assert ba != [c.sample(0) for _ in range(30)]
