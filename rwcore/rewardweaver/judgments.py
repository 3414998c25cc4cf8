"""Judge reports -> dense arrays over (trajectory, capability), and the rates read from them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rwcore.judged import JudgedBatch, report_matrix
from rwcore.validation import check_ids
from rwcore.verdict import Verdict


def judgment_matrix(
    reports,
    capability_ids: Sequence[str],
    *,
    trajectory_ids: Sequence[str] | None = None,
    argument: str = "reports",
) -> tuple[np.ndarray, np.ndarray]:
    """(values float64 [N, A], codes uint8 [N, A]) for `capability_ids`.

    reports: a sequence of JudgeReport (one per trajectory) or a `rwcore.JudgedBatch` that
        judged every one of `capability_ids`. See `rwcore.judged.report_matrix` for the values
        (NaN for NA / INVALID / missing) and codes (a missing judgment is INVALID).
    trajectory_ids: when given, the reports' trajectory ids must equal them, in order.
    """
    if isinstance(reports, JudgedBatch):
        ids = check_ids(capability_ids, "capability_ids")
        if trajectory_ids is not None and tuple(trajectory_ids) != reports.trajectory_ids:
            raise ValueError(f"{argument} holds other trajectories than the ones given (ids differ)")
        part = reports.columns(ids)
        return part.values.copy(), part.codes.copy()
    return report_matrix(reports, capability_ids, trajectory_ids=trajectory_ids, argument=argument)


def judge_failure_rates(codes: np.ndarray, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per column: FAIL / (PASS + FAIL) over the rows in `mask` (default all), and that denominator.

    The rate is NaN for a column with no PASS/FAIL verdict among those rows.
    """
    codes = np.asarray(codes)
    if codes.ndim != 2:
        raise ValueError(f"codes must be 2-D [N, A], got shape {codes.shape}")
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_ or mask.shape != (codes.shape[0],):
            raise ValueError(f"mask must be a bool array of shape ({codes.shape[0]},), got {mask.dtype} {mask.shape}")
        codes = codes[mask]
    fails = (codes == Verdict.FAIL).sum(axis=0)
    applicable = fails + (codes == Verdict.PASS).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = np.where(applicable > 0, fails / np.maximum(applicable, 1), np.nan)
    return rates.astype(np.float64), applicable.astype(np.int64)


def mean_scores(values: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Per column: mean value over applicable, valid rows (NaN when none) — S_{k,d} of appendix G.1."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2:
        raise ValueError(f"values must be 2-D [N, A], got shape {values.shape}")
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_ or mask.shape != (values.shape[0],):
            raise ValueError(f"mask must be a bool array of shape ({values.shape[0]},)")
        values = values[mask]
    valid = ~np.isnan(values)
    count = valid.sum(axis=0)
    total = np.where(valid, values, 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def within_group_variation(values: np.ndarray, groups: Sequence) -> np.ndarray:
    """Per column: the share of groups in which the column's judgment varies, over the groups where it has at
    least two defined values (NaN when there is no such group).

    values: float64 [N, A], the reward view of the judgments (`rwcore.judged.reward_view`: INVALID already 0.0,
        NA NaN). groups: [N] group keys (a rollout group's trajectories share one).
    A capability whose judgment is the same in every trajectory of every group gives group-normalized credit
    nothing to tell apart: it carries no credit in that batch, however often it fails.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2:
        raise ValueError(f"values must be 2-D [N, A], got shape {values.shape}")
    keys = list(groups)
    if len(keys) != values.shape[0]:
        raise ValueError(f"groups holds {len(keys)} keys for {values.shape[0]} rows")
    index: dict = {}
    rows = np.array([index.setdefault(key, len(index)) for key in keys], dtype=np.int64)
    varied = np.zeros(values.shape[1], dtype=np.int64)
    counted = np.zeros(values.shape[1], dtype=np.int64)
    for g in range(len(index)):
        block = values[rows == g]
        defined = ~np.isnan(block)
        enough = defined.sum(axis=0) >= 2
        high = np.where(defined, block, -np.inf).max(axis=0)
        low = np.where(defined, block, np.inf).min(axis=0)
        counted += enough
        varied += enough & (high > low)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counted > 0, varied / np.maximum(counted, 1), np.nan)
