"""Judge reports -> dense arrays over (trajectory, capability), and the rates read from them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from rwcore.types import JudgeReport
from rwcore.verdict import Verdict
from rwcore.validation import check_ids


def judgment_matrix(
    reports: Sequence[JudgeReport],
    capability_ids: Sequence[str],
    *,
    trajectory_ids: Sequence[str] | None = None,
    argument: str = "reports",
) -> tuple[np.ndarray, np.ndarray]:
    """(values, codes) for `capability_ids` over `reports`.

    values: float64 [N, A], the judgment's `value` (score, else 1.0 PASS / 0.0 FAIL);
        NaN where the verdict is NA or INVALID or the report has no judgment for it.
    codes: uint8 [N, A], Verdict codes; a missing judgment counts as INVALID (the
        judge did not deliver it), never as a pass or a fail.
    trajectory_ids: when given, reports[i].trajectory_id must equal trajectory_ids[i].
    Extra judgments in a report (other rubrics) are ignored.
    """
    ids = check_ids(capability_ids, "capability_ids")
    if isinstance(reports, (str, bytes)) or not isinstance(reports, Sequence):
        raise ValueError(f"{argument} must be a sequence of JudgeReport, got {type(reports).__name__}")
    if trajectory_ids is not None and len(trajectory_ids) != len(reports):
        raise ValueError(f"{argument} has {len(reports)} reports for {len(trajectory_ids)} trajectories")
    n, a = len(reports), len(ids)
    values = np.full((n, a), np.nan, dtype=np.float64)
    codes = np.full((n, a), int(Verdict.INVALID), dtype=np.uint8)
    for i, report in enumerate(reports):
        if not isinstance(report, JudgeReport) or not isinstance(report.judgments, Mapping):
            raise ValueError(f"{argument}[{i}] must be a JudgeReport, got {type(report).__name__}")
        if trajectory_ids is not None and report.trajectory_id != trajectory_ids[i]:
            raise ValueError(
                f"{argument}[{i}].trajectory_id is {report.trajectory_id!r}, expected {trajectory_ids[i]!r}"
            )
        for j, cid in enumerate(ids):
            judgment = report.judgments.get(cid)
            if judgment is None:
                continue
            verdict = judgment.verdict
            if not isinstance(verdict, Verdict):
                raise ValueError(f"{argument}[{i}].judgments[{cid!r}].verdict must be a rwcore.Verdict, got {verdict!r}")
            codes[i, j] = int(verdict)
            value = judgment.value
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                    or not math.isfinite(float(value)) or not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"{argument}[{i}].judgments[{cid!r}] has value {value!r}, expected a number in [0, 1]")
            values[i, j] = float(value)
    return values, codes


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
