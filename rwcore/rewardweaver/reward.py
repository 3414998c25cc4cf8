"""The stage's process reward R(tau) = R_o(tau) + 1/|A| sum_{d in A} Jbar_d(tau) (RewardWeaver §2.4).

Non-applicable and invalid judgments. Jbar_d(tau) is the judge's normalized
score (`RubricJudgment.value`, in [0, 1]). A capability that does not apply to
a trajectory (NA), or whose judgment failed (INVALID), has no Jbar_d(tau); it
is left out of the average for that trajectory, so the process term is the mean
over the active capabilities that apply and were validly judged:

    P(tau) = 1/|A_v(tau)| * sum_{d in A_v(tau)} Jbar_d(tau),   A_v(tau) = {d in A: Jbar_d(tau) defined}

and R(tau) = R_o(tau) + P(tau). When every active judgment is defined this is
exactly the paper's 1/|A| sum. Why: counting NA as 0 would penalize a
trajectory for a behaviour its situation never called for, counting it as 1
would pay for it; both would move R by up to 1/|A| per missing judgment for
reasons unrelated to the policy. A judge failure is likewise never turned into a
pass or a fail. The process term stays in [0, 1] whatever |A_v(tau)| is.

When no active capability applies (or |A| = 0), P(tau) = `empty_value` (0 by
default): there is no process evidence, so R falls back to the outcome reward
alone — the paper's outcome-only reward, which is also what an empty active set
means. Under group-normalized advantages this places such a trajectory level
with one that failed every applicable check; pass `empty_value=0.5` (or a
group mean) if that bias matters for a task mix where applicability varies a lot.
"""

from __future__ import annotations

import numpy as np


def _check_values(judgments, n: int | None, argument: str) -> np.ndarray:
    try:
        values = np.asarray(judgments, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{argument} must be a numeric array [N, |A|] with NaN for NA/INVALID") from None
    if values.ndim != 2:
        raise ValueError(f"{argument} must be 2-D [N, |A|], got shape {values.shape}")
    if n is not None and values.shape[0] != n:
        raise ValueError(f"{argument} has {values.shape[0]} rows for {n} outcomes")
    finite = ~np.isnan(values)
    if np.isinf(values).any():
        raise ValueError(f"{argument} holds an infinite value; use NaN for NA/INVALID")
    bad = finite & ((values < 0.0) | (values > 1.0))
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(f"{argument}[{i}, {j}] = {float(values[i, j])!r} is outside [0, 1]")
    return values


def process_terms(judgments, *, empty_value: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(P [N], number of defined judgments per trajectory [N]) for a [N, |A|] array with NaN for NA/INVALID."""
    values = _check_values(judgments, None, "judgments")
    empty = float(empty_value)
    if not np.isfinite(empty):
        raise ValueError(f"empty_value must be finite, got {empty_value!r}")
    defined = ~np.isnan(values)
    count = defined.sum(axis=1)
    total = np.where(defined, values, 0.0).sum(axis=1)
    term = np.where(count > 0, total / np.maximum(count, 1), empty)
    return term, count.astype(np.int64)


def process_reward(outcomes, judgments, *, empty_value: float = 0.0) -> np.ndarray:
    """R = R_o + P over N trajectories (float64 [N]); see the module docstring for NA/INVALID.

    outcomes: R_o, shape [N], finite.
    judgments: Jbar, shape [N, |A|] in [0, 1], NaN where NA or INVALID (e.g. from `judgment_matrix`).
    empty_value: P for a trajectory with no defined judgment [0].
    """
    try:
        r_o = np.asarray(outcomes, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("outcomes must be a numeric array [N]") from None
    if r_o.ndim != 1:
        raise ValueError(f"outcomes must be 1-D [N], got shape {r_o.shape}")
    if not np.isfinite(r_o).all():
        i = int(np.flatnonzero(~np.isfinite(r_o))[0])
        raise ValueError(f"outcomes[{i}] = {float(r_o[i])!r} is not finite")
    _check_values(judgments, r_o.shape[0], "judgments")
    term, _ = process_terms(judgments, empty_value=empty_value)
    return r_o + term
