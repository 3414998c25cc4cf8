"""`JudgedBatch`: one step's judge verdicts as dense arrays, built once and read by every consumer.

The sampler (verdicts per rubric and group), the pool (pass / fail counts and failed trajectory
ids), RewardWeaver (process-reward values, failure rates) and the advantages (verdict matrix)
all read the same object instead of reshaping the judge's reports each in its own way.

INVALID never pays. Evidence, coverage and pool counts read `codes` and `values`, where an INVALID
judgment (the judge failed, or its answer could not be read) is neither a pass nor a fail.
Rewards and advantages read the reward views instead (`reward_values`, `reward_verdict_matrix`,
or `reward_view` for plain arrays): there an INVALID judgment counts as a FAIL with value 0.0 -
the lowest value a FAIL can have - so a policy can never score higher by making its judge fail
than by failing the rubric. NA stays NaN (not applicable) in every view.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rwcore.types import JudgeReport
from rwcore.validation import check_ids
from rwcore.verdict import Verdict

__all__ = ["JudgedBatch", "report_matrix", "reward_view", "INVALID_REWARD"]

INVALID_REWARD = 0.0
"""What an INVALID judgment is worth in a reward: a FAIL's lowest value."""


def reward_view(values, codes) -> np.ndarray:
    """`values` [N, R] (NaN for NA / INVALID) with every INVALID cell of `codes` set to 0.0.

    What rewards and advantages must read (see the module docstring): INVALID scores as a FAIL,
    NA stays NaN. ValueError when the shapes differ.
    """
    values = np.array(values, dtype=np.float64)
    codes = np.asarray(codes)
    if values.shape != codes.shape:
        raise ValueError(f"values and codes must have the same shape, got {values.shape} and {codes.shape}")
    values[codes == Verdict.INVALID] = INVALID_REWARD
    return values


def report_matrix(
    reports: Sequence[JudgeReport],
    rubric_ids: Sequence[str],
    *,
    trajectory_ids: Sequence[str] | None = None,
    argument: str = "reports",
) -> tuple[np.ndarray, np.ndarray]:
    """(values float64 [N, R], codes uint8 [N, R]) of `rubric_ids` over `reports`.

    values: the judgment's `value` (score, else 1.0 PASS / 0.0 FAIL); NaN where the verdict is
        NA or INVALID or the report has no judgment for the rubric.
    codes: Verdict codes; a missing judgment counts as INVALID (the judge did not deliver it),
        never as a pass or a fail.
    trajectory_ids: when given, reports[i].trajectory_id must equal trajectory_ids[i].
    Extra judgments in a report (other rubrics) are ignored.
    """
    ids = check_ids(rubric_ids, "rubric_ids")
    if isinstance(reports, (str, bytes)) or not isinstance(reports, Sequence):
        raise ValueError(f"{argument} must be a sequence of JudgeReport, got {type(reports).__name__}")
    if trajectory_ids is not None and len(trajectory_ids) != len(reports):
        raise ValueError(f"{argument} has {len(reports)} reports for {len(trajectory_ids)} trajectories")
    n, r = len(reports), len(ids)
    values = np.full((n, r), np.nan, dtype=np.float64)
    codes = np.full((n, r), int(Verdict.INVALID), dtype=np.uint8)
    for i, report in enumerate(reports):
        if not isinstance(report, JudgeReport) or not isinstance(report.judgments, Mapping):
            raise ValueError(f"{argument}[{i}] must be a JudgeReport, got {type(report).__name__}")
        if trajectory_ids is not None and report.trajectory_id != trajectory_ids[i]:
            raise ValueError(
                f"{argument}[{i}].trajectory_id is {report.trajectory_id!r}, expected {trajectory_ids[i]!r}"
            )
        for j, rubric_id in enumerate(ids):
            judgment = report.judgments.get(rubric_id)
            if judgment is None:
                continue
            verdict = judgment.verdict
            if not isinstance(verdict, Verdict):
                raise ValueError(
                    f"{argument}[{i}].judgments[{rubric_id!r}].verdict must be a rwcore.Verdict, got {verdict!r}"
                )
            codes[i, j] = int(verdict)
            value = judgment.value
            if value is None:
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float, np.integer, np.floating))
                or not math.isfinite(float(value))
                or not 0.0 <= float(value) <= 1.0
            ):
                raise ValueError(
                    f"{argument}[{i}].judgments[{rubric_id!r}] has value {value!r}, expected a number in [0, 1]"
                )
            values[i, j] = float(value)
    return values, codes


@dataclass(frozen=True, eq=False)
class JudgedBatch:
    """Verdicts of R rubrics on N trajectories.

    trajectory_ids: (N,) in batch order (groups contiguous, as the rollouts were made).
    rubric_ids: (R,) the rubrics judged this step.
    codes: uint8 [N, R], `Verdict` codes (a judgment the judge did not deliver is INVALID).
    values: float64 [N, R], the judgment's number (score, else 1.0 PASS / 0.0 FAIL), NaN for
        NA and INVALID; rewards read `reward_values()` (INVALID -> 0.0, see the module docstring).
    uncovered: N tuples of the judge's uncovered-behaviour notes (Arise B.3 diagnostics).
    The arrays are read-only.
    """

    trajectory_ids: tuple[str, ...]
    rubric_ids: tuple[str, ...]
    codes: np.ndarray
    values: np.ndarray
    uncovered: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        n, r = len(self.trajectory_ids), len(self.rubric_ids)
        if self.codes.shape != (n, r) or self.values.shape != (n, r):
            raise ValueError(
                f"codes and values must have shape ({n}, {r}), got {self.codes.shape} and {self.values.shape}"
            )
        if len(self.uncovered) != n:
            raise ValueError(f"uncovered must hold {n} entries, got {len(self.uncovered)}")
        self.codes.setflags(write=False)
        self.values.setflags(write=False)

    @classmethod
    def from_reports(
        cls, reports: Sequence[JudgeReport], rubric_ids: Sequence[str], trajectory_ids: Sequence[str] | None = None
    ) -> JudgedBatch:
        """The batch of `reports` (one per trajectory, in order) over `rubric_ids`."""
        values, codes = report_matrix(reports, rubric_ids, trajectory_ids=trajectory_ids)
        uncovered = tuple(
            tuple(text for text in report.uncovered if isinstance(text, str) and text.strip()) for report in reports
        )
        ids = tuple(trajectory_ids) if trajectory_ids is not None else tuple(r.trajectory_id for r in reports)
        return cls(ids, tuple(rubric_ids), codes, values, uncovered)

    @classmethod
    def empty(cls, trajectory_ids: Sequence[str]) -> JudgedBatch:
        """No rubric judged (outcome-only steps, or an empty pool)."""
        n = len(trajectory_ids)
        return cls(tuple(trajectory_ids), (), np.zeros((n, 0), np.uint8), np.zeros((n, 0)), ((),) * n)

    # -- shape --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.trajectory_ids)

    def __contains__(self, rubric_id) -> bool:
        return rubric_id in self.rubric_ids

    def index(self, rubric_ids: Sequence[str]) -> list[int]:
        """Column positions of `rubric_ids`; ValueError naming a rubric that was not judged."""
        position = {rid: j for j, rid in enumerate(self.rubric_ids)}
        missing = [rid for rid in rubric_ids if rid not in position]
        if missing:
            raise ValueError(
                f"rubric_ids {missing[:5]} were not judged in this batch (judged: {list(self.rubric_ids)[:10]})"
            )
        return [position[rid] for rid in rubric_ids]

    # -- views --------------------------------------------------------------------------------
    def columns(self, rubric_ids: Sequence[str]) -> JudgedBatch:
        """The same trajectories over a subset of the rubrics, in the order given."""
        cols = self.index(list(rubric_ids))
        return JudgedBatch(
            self.trajectory_ids,
            tuple(rubric_ids),
            self.codes[:, cols].copy(),
            self.values[:, cols].copy(),
            self.uncovered,
        )

    def rows(self, start: int, stop: int) -> JudgedBatch:
        """Trajectories [start, stop) (e.g. one rollout group)."""
        return JudgedBatch(
            self.trajectory_ids[start:stop],
            self.rubric_ids,
            self.codes[start:stop].copy(),
            self.values[start:stop].copy(),
            self.uncovered[start:stop],
        )

    def take(self, rows: Sequence[int]) -> JudgedBatch:
        """The trajectories at `rows`, in that order."""
        rows = list(rows)
        return JudgedBatch(
            tuple(self.trajectory_ids[i] for i in rows),
            self.rubric_ids,
            self.codes[rows].copy(),
            self.values[rows].copy(),
            tuple(self.uncovered[i] for i in rows),
        )

    def verdicts(self, rubric_id: str) -> list[Verdict]:
        """The column of `rubric_id` as Verdicts."""
        (col,) = self.index([rubric_id])
        return [Verdict(int(code)) for code in self.codes[:, col]]

    def verdict_matrix(self) -> np.ndarray:
        """float64 [N, R]: 1.0 pass, 0.0 fail, NaN for NA / INVALID (a scored judgment counts by its
        verdict, not its score). Advantages read `reward_verdict_matrix()`, where INVALID is 0.0."""
        matrix = np.full(self.codes.shape, np.nan)
        matrix[self.codes == Verdict.PASS] = 1.0
        matrix[self.codes == Verdict.FAIL] = 0.0
        return matrix

    def reward_values(self) -> np.ndarray:
        """float64 [N, R] for rewards: `values` with INVALID scored 0.0 like a FAIL, NaN only for NA."""
        return reward_view(self.values, self.codes)

    def reward_verdict_matrix(self) -> np.ndarray:
        """float64 [N, R] for rubric advantages: 1.0 pass, 0.0 fail and INVALID, NaN for NA."""
        matrix = self.verdict_matrix()
        matrix[self.codes == Verdict.INVALID] = INVALID_REWARD
        return matrix

    def invalid_fraction(self) -> float:
        return float((self.codes == Verdict.INVALID).mean()) if self.codes.size else 0.0

    def invalid_rates(self) -> dict[str, float]:
        """rubric id -> share of this batch's judgments of it that are INVALID."""
        if not len(self):
            return {rid: 0.0 for rid in self.rubric_ids}
        rates = (self.codes == Verdict.INVALID).mean(axis=0)
        return {rid: float(rate) for rid, rate in zip(self.rubric_ids, rates)}

    def rubric_rates(self) -> dict[str, tuple[float, float | None]]:
        """rubric id -> (applicable, pass): the share of the batch's trajectories the rubric applied to (a
        valid PASS or FAIL) and its pass rate among those (None when it applied to none)."""
        rates = {}
        for j, rubric_id in enumerate(self.rubric_ids):
            codes = self.codes[:, j]
            passed, failed = int((codes == Verdict.PASS).sum()), int((codes == Verdict.FAIL).sum())
            rates[rubric_id] = (
                (passed + failed) / len(codes) if len(codes) else 0.0,
                passed / (passed + failed) if passed + failed else None,
            )
        return rates

    def rubric_rate_metrics(self, prefix: str = "rubric/") -> dict[str, float | None]:
        """`rubric_rates` as metric names: `rubric/<id>/applicable` and `rubric/<id>/pass`."""
        metrics: dict[str, float | None] = {}
        for rubric_id, (applicable, passed) in self.rubric_rates().items():
            metrics[f"{prefix}{rubric_id}/applicable"] = applicable
            metrics[f"{prefix}{rubric_id}/pass"] = passed
        return metrics

    def invalid_rate_metrics(self, prefix: str = "judge/invalid_rate/") -> dict[str, float]:
        """`invalid_rates` as metric names (`judge/invalid_rate/<rubric id>`), for a metrics row."""
        return {prefix + rid: rate for rid, rate in self.invalid_rates().items()}
