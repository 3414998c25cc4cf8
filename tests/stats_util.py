"""Small statistics helpers for the sampler tests (no scipy in the venv)."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping

import numpy as np

# A statistical test "fails" below this p-value.  With a few dozen such tests
# in the suite, the false-alarm rate of the whole suite stays around 1e-5.
P_FAIL = 1e-6


def _gammainc_upper_regularized(a: float, x: float) -> float:
    """Q(a, x) = Gamma(a, x) / Gamma(a) (Numerical Recipes gser / gcf)."""
    if x < 0 or a <= 0:
        raise ValueError("bad arguments")
    if x == 0:
        return 1.0
    gln = math.lgamma(a)
    if x < a + 1.0:
        # series for P(a, x)
        ap = a
        total = delta = 1.0 / a
        for _ in range(10000):
            ap += 1.0
            delta *= x / ap
            total += delta
            if abs(delta) < abs(total) * 1e-15:
                break
        p = total * math.exp(-x + a * math.log(x) - gln)
        return max(0.0, 1.0 - p)
    # continued fraction for Q(a, x) (modified Lentz)
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        if abs(d) < tiny:
            d = tiny
        c = b + an / c
        if abs(c) < tiny:
            c = tiny
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - gln) * h


def chi2_sf(stat: float, dof: int) -> float:
    """Survival function of the chi-square distribution."""
    return _gammainc_upper_regularized(dof / 2.0, stat / 2.0)


def gof_pvalue(
    counts: Mapping[Hashable, int], probs: Mapping[Hashable, float], min_expected: float = 5.0
) -> tuple[float, float, int]:
    """Pearson goodness-of-fit of observed ``counts`` against ``probs``.

    Cells whose expected count is below ``min_expected`` are pooled.  An
    observation in a cell of probability 0 gives p-value 0.
    Returns (p_value, statistic, dof).
    """
    n = sum(counts.values())
    keys = set(counts) | set(probs)
    for k in keys:
        if counts.get(k, 0) > 0 and probs.get(k, 0.0) <= 0.0:
            return 0.0, math.inf, 0
    big, small_obs, small_exp = [], 0.0, 0.0
    for k in keys:
        e = n * probs.get(k, 0.0)
        o = counts.get(k, 0)
        if e >= min_expected:
            big.append((o, e))
        else:
            small_obs += o
            small_exp += e
    if small_exp > 0:
        big.append((small_obs, small_exp))
    stat = sum((o - e) ** 2 / e for o, e in big)
    dof = len(big) - 1
    if dof <= 0:
        return 1.0, stat, 0
    return chi2_sf(stat, dof), stat, dof


def homogeneity_pvalue(
    counts_a: Mapping[Hashable, int], counts_b: Mapping[Hashable, int], min_expected: float = 5.0
) -> tuple[float, float, int]:
    """Two-sample chi-square test that two count vectors share a distribution."""
    na, nb = sum(counts_a.values()), sum(counts_b.values())
    n = na + nb
    big = []
    pool_a = pool_b = 0
    for k in set(counts_a) | set(counts_b):
        a, b = counts_a.get(k, 0), counts_b.get(k, 0)
        tot = a + b
        if min(na, nb) * tot / n >= min_expected:
            big.append((a, b))
        else:
            pool_a += a
            pool_b += b
    if pool_a + pool_b > 0:
        big.append((pool_a, pool_b))
    stat = 0.0
    for a, b in big:
        tot = a + b
        ea, eb = na * tot / n, nb * tot / n
        stat += (a - ea) ** 2 / ea + (b - eb) ** 2 / eb
    dof = len(big) - 1
    if dof <= 0:
        return 1.0, stat, 0
    return chi2_sf(stat, dof), stat, dof


def pair_q_monte_carlo(
    evidence: Mapping[Hashable, tuple[float, float]],
    draws: int = 1_000_000,
    seed: int = 12345,
    weight=lambda p: p * (1.0 - p) ** 2,
    prior: float = 1.0,
) -> dict[Hashable, tuple[float, float]]:
    """E[w_k / sum_j w_j] with p_k ~ Beta(prior + S_k, prior + F_k) independently.

    Returns key -> (estimate, standard error).
    """
    keys = sorted(evidence, key=repr)
    if not keys:
        return {}
    rng = np.random.default_rng(seed)
    out = {}
    chunk = 250_000
    sums = np.zeros(len(keys))
    sq = np.zeros(len(keys))
    done = 0
    while done < draws:
        m = min(chunk, draws - done)
        ps = np.stack([rng.beta(prior + evidence[k][0], prior + evidence[k][1], size=m) for k in keys], axis=1)
        w = weight(ps)
        tot = w.sum(axis=1, keepdims=True)
        r = np.where(tot > 0, w / np.where(tot > 0, tot, 1.0), 1.0 / len(keys))
        sums += r.sum(axis=0)
        sq += (r * r).sum(axis=0)
        done += m
    mean = sums / draws
    var = np.maximum(sq / draws - mean**2, 0.0)
    for i, k in enumerate(keys):
        out[k] = (float(mean[i]), float(math.sqrt(var[i] / draws)))
    return out


def single_selection_probabilities(
    ref, q_pair: Mapping[Hashable, float], *, rho: float = None, discovery_weight=lambda a: 1.0 / (1.0 + a)
) -> dict[Hashable, float]:
    """Exact probability that a batch of size 1 is task x, given the pair
    selection probabilities ``q_pair`` (pairs eligible at batch start).

    ``ref`` is a RefCapabilitySampler holding the same state as the sampler
    under test.  ``rho`` and ``discovery_weight`` can be overridden to build
    deliberately wrong models (for power checks).
    """
    if rho is None:
        rho = ref.rho()
    tasks = list(ref.tasks)
    attempts = {t: ref.task_state(t)["attempts"] for t in tasks}
    disc = ref.discovery_candidates()
    members = ref.pair_members()

    def weighted(pool):
        ws = {t: discovery_weight(attempts[t]) for t in pool}
        tot = sum(ws.values())
        return {t: w / tot for t, w in ws.items()}

    adaptive = {}
    if members:
        qtot = sum(q_pair[p] for p in members)
        for p, ms in members.items():
            for t in ms:
                adaptive[t] = adaptive.get(t, 0.0) + q_pair[p] / qtot / len(ms)
    probs = {t: 0.0 for t in tasks}
    if disc:
        pd = weighted(disc)
        for t, v in pd.items():
            probs[t] += rho * v
        rest = adaptive if adaptive else pd
        for t, v in rest.items():
            probs[t] += (1.0 - rho) * v
    elif adaptive:
        for t, v in adaptive.items():
            probs[t] += v
    else:
        for t, v in weighted(tasks).items():
            probs[t] += v
    return probs
