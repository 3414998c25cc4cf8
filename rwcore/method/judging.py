"""Judging a step's trajectories group by group: `judge_groups` on `AdaptiveMethod.rubrics_to_judge`'s plans, and
`safe_evaluate`, which turns a judge that raises into INVALID judgments instead of ending the run."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rwcore.judges.client import MissingAPIKeyError
from rwcore.types import Judge, JudgeReport, RubricJudgment, RubricSpec, Trajectory
from rwcore.verdict import Verdict

logger = logging.getLogger("rwcore.method")

__all__ = ["judge_groups", "safe_evaluate"]


def judge_groups(
    judge: Judge, trajectories: Sequence[Trajectory], plans: Sequence[Sequence[RubricSpec]], group_size: int
) -> list[JudgeReport]:
    """Judges trajectories group by group on `rubrics_to_judge`'s plans (one rubric list per group of
    `group_size` contiguous trajectories); consecutive groups with the same rubrics go to the judge in
    one call. One report per trajectory, in order; a group with no rubric gets empty reports.

    A judge call that raises (an LLM judge's bug, a user-supplied judge tripping over the policy's
    text) never ends the run: its trajectories get INVALID judgments of every planned rubric with the
    error recorded (`safe_evaluate`), and one warning per call of this function says what failed."""
    if len(trajectories) != len(plans) * group_size:
        raise ValueError(f"{len(trajectories)} trajectories are not {len(plans)} groups of {group_size}")
    reports: list[JudgeReport] = []
    failures: list[str] = []
    start = 0
    while start < len(plans):
        key = tuple(spec.rubric_id for spec in plans[start])
        end = start + 1
        while end < len(plans) and tuple(spec.rubric_id for spec in plans[end]) == key:
            end += 1
        block = list(trajectories[start * group_size : end * group_size])
        if key:
            reports.extend(safe_evaluate(judge, block, list(plans[start]), failures))
        else:
            reports.extend(JudgeReport(t.trajectory_id, {}) for t in block)
        start = end
    if failures:
        logger.warning(
            "judge %s raised in %d of its calls; those trajectories' judgments are INVALID (first: %s)",
            type(judge).__name__,
            len(failures),
            failures[0],
        )
    return reports


def safe_evaluate(
    judge: Judge, trajectories: Sequence[Trajectory], rubrics: Sequence[RubricSpec], failures: list[str] | None = None
) -> list[JudgeReport]:
    """`judge.evaluate(trajectories, rubrics)`, with any exception turned into INVALID judgments.

    The error ("<type>: <message>", cut to 500 characters) is in each INVALID judgment's `error` and
    appended to `failures` when given (the caller logs it; nothing is logged here). A judge that
    returns the wrong number of reports breaks its contract: ValueError naming the judge. A
    configuration error that no judgment can cure (`MissingAPIKeyError`) is raised as it is.
    """
    try:
        got = judge.evaluate(trajectories, rubrics)
    except MissingAPIKeyError:
        raise
    except Exception as exc:  # see the docstring: a judge failure is INVALID, never a crash
        error = f"{type(exc).__name__}: {exc}"[:500]
        if failures is not None:
            failures.append(error)
        message = f"the judge raised {error}"
        return [
            JudgeReport(
                t.trajectory_id,
                {r.rubric_id: RubricJudgment(r.rubric_id, Verdict.INVALID, error=message) for r in rubrics},
            )
            for t in trajectories
        ]
    if len(got) != len(trajectories):
        raise ValueError(
            f"judge.evaluate returned {len(got)} reports for {len(trajectories)} trajectories ({type(judge).__name__})"
        )
    return list(got)
