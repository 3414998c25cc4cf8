"""The stage's process reward R(tau) = R_o(tau) + 1/|A| sum_{d in A} Jbar_d(tau) (RewardWeaver §2.4).

Non-applicable and invalid judgments. Jbar_d(tau) is the judge's normalized
score (`RubricJudgment.value`, in [0, 1]). A capability that does not apply to
a trajectory (NA) has no Jbar_d(tau). A judgment that failed (INVALID) is
scored as a FAIL, Jbar_d(tau) = 0, so that a policy never gains by making its
judge fail: the arrays given here hold NaN for NA only, and callers turn
INVALID into 0.0 first (`rwcore.judged.reward_view`, `JudgedBatch.reward_values`;
`RewardWeaver.reward` and `AdaptiveMethod` do). Two normalizations, chosen with
`normalize`:

- "active_set" (default, the paper's formula read literally): P(tau) =
  1/|A| * sum_{d in A} Jbar_d(tau), an undefined Jbar_d contributing 0. Credit
  goes to checks a trajectory reached and passed; a check it never reached earns
  what a failed one earns.
- "applicable": the mean over the active capabilities that apply,
  P(tau) = 1/|A_v(tau)| * sum_{d in A_v(tau)} Jbar_d(tau). Where
  applicability depends on the policy's own moves this penalizes reaching a
  check (a trajectory that stops before a stage keeps a higher mean than one that
  reaches it and fails), which a policy under RL learns to exploit - measured on
  the built-in negotiation environment, where it trained sellers never to ask the
  budget. Kept for settings whose applicability only the scenario decides.

Both equal the paper's 1/|A| sum when every active judgment is defined, and stay
in [0, 1]. R(tau) = R_o(tau) + P(tau). When no active judgment is defined (or
|A| = 0), P(tau) = `empty_value` (0 by default): there is no process evidence,
so R falls back to the outcome reward alone.
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


NORMALIZATIONS: tuple[str, ...] = ("active_set", "applicable")


def process_terms(
    judgments, *, normalize: str = "active_set", empty_value: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """(P [N], number of defined judgments per trajectory [N]) for a [N, |A|] array with NaN for NA
    (INVALID already 0.0, see the module docstring); `normalize` as in the module docstring."""
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")
    values = _check_values(judgments, None, "judgments")
    empty = float(empty_value)
    if not np.isfinite(empty):
        raise ValueError(f"empty_value must be finite, got {empty_value!r}")
    defined = ~np.isnan(values)
    count = defined.sum(axis=1)
    total = np.where(defined, values, 0.0).sum(axis=1)
    divisor = np.maximum(count, 1) if normalize == "applicable" else max(values.shape[1], 1)
    term = np.where(count > 0, total / divisor, empty)
    return term, count.astype(np.int64)


def process_reward(outcomes, judgments, *, normalize: str = "active_set", empty_value: float = 0.0) -> np.ndarray:
    """R = R_o + P over N trajectories (float64 [N]); see the module docstring for NA/INVALID.

    outcomes: R_o, shape [N], finite.
    judgments: Jbar, shape [N, |A|] in [0, 1], NaN where NA, 0.0 where INVALID (e.g.
        `rwcore.judged.reward_view(*judgment_matrix(...))`).
    normalize: "active_set" (1/|A|, undefined judgments count 0) or "applicable" (mean over defined).
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
    term, _ = process_terms(judgments, normalize=normalize, empty_value=empty_value)
    return r_o + term
