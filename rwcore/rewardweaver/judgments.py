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
