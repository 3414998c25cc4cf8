"""Analyses of the reward adaptation (RewardWeaver §3.3, appendices E and G), NumPy only.

Bottleneck attribution vs subsequent failure reduction (appendix E). For
capability d at stage k: F_fail_{k,d} and F_succ_{k,d}, the attributed failure
frequencies among failure and success trajectories; bottleneck importance
I_{k,d} = F_fail_{k,d} - F_succ_{k,d}; next-stage failure reduction
dF_{k,d} = F_fail_{k,d} - F_fail_{k+1,d}. The association is measured with

- `spearman`: Pearson correlation of the ranks, ties given their average rank.
- `partial_spearman(x, y, z)`: the standard first-order partial correlation
  formula applied to the three Spearman correlations,
  (r_xy - r_xz r_yz) / sqrt((1 - r_xz^2)(1 - r_yz^2)). This is identical to the
  Pearson correlation of the residuals of rank(x) and rank(y) after a least-
  squares fit on rank(z) (the residuals are not re-ranked).
- `within_stage_spearman(x, y, stages)`: appendix E compares capabilities
  "within the same training stage" without saying how stages are combined.
  Default `combine="pooled"`: x and y are ranked within each stage (average
  ties), each stage's mean rank is subtracted, and the Pearson correlation of
  the pooled centred ranks is returned — a fixed-effects rank correlation that
  removes every between-stage difference in level. With equal-size stages and
  no ties it equals the plain mean of the per-stage Spearman coefficients;
  otherwise larger and more spread stages weigh more. `combine="mean"` returns
  the unweighted mean of the per-stage coefficients (stages where it is
  undefined are skipped); `spearman_by_stage` gives them individually.

Undefined correlations (fewer than 2 points, a constant input, a partial
correlation with |r_xz| or |r_yz| = 1) are NaN.

Capability retention after deactivation (appendix G): for a capability active
at stage k and inactive at k+1, dS_{t,d} = S_{k+t,d} - S_{k,d} for t = 1, 2, ...
until it is active again or the stages end, where S_{k,d} is its mean
normalized score on a fixed diagnostic set (see `judgments.mean_scores`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rwcore.validation import check_ids


def rankdata(values) -> np.ndarray:
    """1-based ranks of a 1-D array, ties given their average rank (scipy's "average")."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"values must be 1-D, got shape {x.shape}")
    if np.isnan(x).any():
        raise ValueError("values must not hold NaN")
    n = x.shape[0]
    ranks = np.empty(n, dtype=np.float64)
    if n == 0:
        return ranks
    order = np.argsort(x, kind="mergesort")
    ordered = x[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    ends = np.append(starts[1:], n)
    average = (starts + 1 + ends) / 2.0  # mean of the ranks start+1 .. end
    run = np.cumsum(np.concatenate(([True], ordered[1:] != ordered[:-1]))) - 1
    ranks[order] = average[run]
    return ranks


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    if x.shape[0] < 2:
        return float("nan")
    xc = x - x.mean()
    yc = y - y.mean()
    denominator = np.sqrt((xc * xc).sum() * (yc * yc).sum())
    if denominator == 0.0:
        return float("nan")
    return float(np.clip((xc * yc).sum() / denominator, -1.0, 1.0))


def _columns(arrays: Sequence, names: Sequence[str], nan_policy: str) -> list[np.ndarray]:
    if nan_policy not in ("raise", "omit"):
        raise ValueError(f"nan_policy must be 'raise' or 'omit', got {nan_policy!r}")
    out = []
    for array, name in zip(arrays, names):
        try:
            column = np.asarray(array, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a numeric 1-D array") from None
        if column.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {column.shape}")
        if np.isinf(column).any():
            raise ValueError(f"{name} holds an infinite value")
        out.append(column)
    n = out[0].shape[0]
    for column, name in zip(out, names):
        if column.shape[0] != n:
            raise ValueError(f"{name} has length {column.shape[0]}, expected {n} (the length of {names[0]})")
    missing = np.zeros(n, dtype=bool)
    for column in out:
        missing |= np.isnan(column)
    if missing.any():
        if nan_policy == "raise":
            name = next(nm for col, nm in zip(out, names) if np.isnan(col).any())
            raise ValueError(f"{name} holds NaN (pass nan_policy='omit' to drop incomplete points)")
        out = [column[~missing] for column in out]
    return out


def spearman(x, y, *, nan_policy: str = "raise") -> float:
    """Spearman's rho: Pearson correlation of average-tie ranks. NaN when undefined."""
    x, y = _columns((x, y), ("x", "y"), nan_policy)
    return _pearson(rankdata(x), rankdata(y))


def partial_spearman(x, y, z, *, nan_policy: str = "raise") -> float:
    """Spearman correlation of x and y controlling for z (the partial-correlation formula on rank correlations)."""
    x, y, z = _columns((x, y, z), ("x", "y", "z"), nan_policy)
    rx, ry, rz = rankdata(x), rankdata(y), rankdata(z)
    r_xy, r_xz, r_yz = _pearson(rx, ry), _pearson(rx, rz), _pearson(ry, rz)
    denominator = (1.0 - r_xz * r_xz) * (1.0 - r_yz * r_yz)
    if not np.isfinite(r_xy) or not np.isfinite(r_xz) or not np.isfinite(r_yz) or denominator <= 0.0:
        return float("nan")
    return float(np.clip((r_xy - r_xz * r_yz) / np.sqrt(denominator), -1.0, 1.0))


def _stage_labels(stages, n: int) -> np.ndarray:
    labels = np.asarray(stages)
    if labels.ndim != 1 or labels.shape[0] != n:
        raise ValueError(f"stages must be 1-D of length {n}, got shape {labels.shape}")
    return labels


def spearman_by_stage(x, y, stages, *, nan_policy: str = "raise") -> dict:
    """Stage label -> Spearman rho of the points in that stage (labels in sorted order)."""
    x_arr = np.asarray(x, dtype=np.float64)
    y_arr = np.asarray(y, dtype=np.float64)
    if x_arr.ndim != 1 or y_arr.shape != x_arr.shape:
        raise ValueError(f"x and y must be 1-D of equal length, got shapes {x_arr.shape} and {y_arr.shape}")
    labels = _stage_labels(stages, x_arr.shape[0])
    out = {}
    for label in np.unique(labels):
        keep = labels == label
        key = label.item() if isinstance(label, np.generic) else label
        out[key] = spearman(x_arr[keep], y_arr[keep], nan_policy=nan_policy)
    return out


def within_stage_spearman(x, y, stages, *, combine: str = "pooled", nan_policy: str = "raise") -> float:
    """Rank association within stages, combined as the module docstring describes ("pooled" or "mean")."""
    if combine not in ("pooled", "mean"):
        raise ValueError(f"combine must be 'pooled' or 'mean', got {combine!r}")
    x_arr = np.asarray(x, dtype=np.float64)
    if x_arr.ndim != 1:
        raise ValueError(f"x must be 1-D, got shape {x_arr.shape}")
    labels = _stage_labels(stages, x_arr.shape[0])
    codes = np.unique(labels, return_inverse=True)[1].astype(np.float64)
    x_arr, y_arr, codes = _columns((x_arr, y, codes), ("x", "y", "stages"), nan_policy)
    if combine == "mean":
        values = [spearman(x_arr[codes == c], y_arr[codes == c]) for c in np.unique(codes)]
        values = [v for v in values if np.isfinite(v)]
        return float(np.mean(values)) if values else float("nan")
    cx = np.zeros_like(x_arr)
    cy = np.zeros_like(y_arr)
    for c in np.unique(codes):
        keep = codes == c
        rx, ry = rankdata(x_arr[keep]), rankdata(y_arr[keep])
        cx[keep] = rx - rx.mean()
        cy[keep] = ry - ry.mean()
    denominator = np.sqrt((cx * cx).sum() * (cy * cy).sum())
    if denominator == 0.0:
        return float("nan")
    return float(np.clip((cx * cy).sum() / denominator, -1.0, 1.0))


def _matrix(values, name: str, shape: tuple | None = None) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a numeric array [K, D]") from None
    if array.ndim != 2:
        raise ValueError(f"{name} must be 2-D [K stages, D capabilities], got shape {array.shape}")
    if shape is not None and array.shape != shape:
        raise ValueError(f"{name} has shape {array.shape}, expected {shape}")
    if np.isinf(array).any():
        raise ValueError(f"{name} holds an infinite value")
    return array


def bottleneck_importance(fail_rates, succ_rates) -> np.ndarray:
    """I = F_fail - F_succ, elementwise (NaN where either is unknown)."""
    fail = np.asarray(fail_rates, dtype=np.float64)
    succ = np.asarray(succ_rates, dtype=np.float64)
    if fail.shape != succ.shape:
        raise ValueError(f"succ_rates has shape {succ.shape}, expected {fail.shape} (the shape of fail_rates)")
    return fail - succ


def failure_reduction(fail_rates) -> np.ndarray:
    """dF_{k,d} = F_fail_{k,d} - F_fail_{k+1,d}: [K, D] -> [K-1, D]."""
    fail = _matrix(fail_rates, "fail_rates")
    return fail[:-1] - fail[1:]


@dataclass(frozen=True)
class AssociationResult:
    """Appendix E table E1 from [K, D] failure / success frequencies.

    importance_rho: spearman(I_{k,d}, dF_{k,d}); failure_rate_rho: spearman(F_fail_{k,d}, dF_{k,d});
    partial_rho: partial_spearman(I, dF | F_fail); within_stage_rho: within_stage_spearman(I, dF, k).
    n_pairs: capability-stage pairs used (k < K-1, every quantity defined).
    """

    importance_rho: float
    failure_rate_rho: float
    partial_rho: float
    within_stage_rho: float
    n_pairs: int


def bottleneck_association(fail_rates, succ_rates, *, combine: str = "pooled") -> AssociationResult:
    """Associates stage-k importance with the next stage's failure reduction (appendix E).

    fail_rates, succ_rates: [K stages, D capabilities], NaN where unknown; pairs with any
    unknown quantity are dropped.
    """
    fail = _matrix(fail_rates, "fail_rates")
    succ = _matrix(succ_rates, "succ_rates", fail.shape)
    if fail.shape[0] < 2:
        raise ValueError("fail_rates needs at least 2 stages")
    importance = (fail - succ)[:-1].ravel()
    reduction = failure_reduction(fail).ravel()
    current = fail[:-1].ravel()
    stage = np.repeat(np.arange(fail.shape[0] - 1), fail.shape[1])
    keep = np.isfinite(importance) & np.isfinite(reduction) & np.isfinite(current)
    importance, reduction, current, stage = importance[keep], reduction[keep], current[keep], stage[keep]
    return AssociationResult(
        importance_rho=spearman(importance, reduction),
        failure_rate_rho=spearman(current, reduction),
        partial_rho=partial_spearman(importance, reduction, current),
        within_stage_rho=within_stage_spearman(importance, reduction, stage, combine=combine),
        n_pairs=int(keep.sum()),
    )


@dataclass(frozen=True)
class RetentionEvent:
    """A deactivation: capability, its final active stage k, and (t, dS_{t,d}) for the stages after it."""

    capability_id: str
    last_active_stage: int
    deltas: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class RetentionResult:
    """Every deactivation event and the summary over all post-deactivation observations (NaN when none)."""

    events: tuple[RetentionEvent, ...]
    n: int
    mean: float
    median: float
    min: float
    max: float


def capability_retention(scores, active, capability_ids: Sequence[str] | None = None) -> RetentionResult:
    """dS_{t,d} = S_{k+t,d} - S_{k,d} after each deactivation (see the module docstring).

    scores: [K, D] diagnostic scores S_{k,d} (NaN where not measured; such stages are skipped).
    active: [K, D] bool, capability d active at stage k (e.g. `RewardHistory.active_matrix`).
    capability_ids: D names for the events (default "0", "1", ...).
    """
    s = _matrix(scores, "scores")
    a = np.asarray(active)
    if a.dtype != np.bool_ or a.shape != s.shape:
        raise ValueError(f"active must be a bool array of shape {s.shape}, got {a.dtype} {a.shape}")
    k_total, d_total = s.shape
    names = (
        tuple(str(d) for d in range(d_total)) if capability_ids is None else check_ids(capability_ids, "capability_ids")
    )
    if len(names) != d_total:
        raise ValueError(f"capability_ids has {len(names)} ids for {d_total} columns")
    events = []
    observations = []
    for d in range(d_total):
        for k in range(k_total - 1):
            if not (a[k, d] and not a[k + 1, d]):
                continue
            deltas = []
            for later in range(k + 1, k_total):
                if a[later, d]:
                    break
                if np.isfinite(s[later, d]) and np.isfinite(s[k, d]):
                    deltas.append((later - k, float(s[later, d] - s[k, d])))
            events.append(RetentionEvent(names[d], k, tuple(deltas)))
            observations.extend(delta for _, delta in deltas)
    values = np.asarray(observations, dtype=np.float64)
    if values.size == 0:
        nan = float("nan")
        return RetentionResult(tuple(events), 0, nan, nan, nan, nan)
    return RetentionResult(
        tuple(events),
        int(values.size),
        float(values.mean()),
        float(np.median(values)),
        float(values.min()),
        float(values.max()),
    )
