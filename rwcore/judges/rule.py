"""`RuleJudge`: rubrics checked by Python callables (programmatic rubrics, tests, baselines)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from rwcore.types import JudgeReport, RubricJudgment, RubricSpec, Trajectory
from rwcore.validation import check_rubrics, check_trajectories, check_unit
from rwcore.verdict import Verdict

RuleResult = bool | float | Verdict | RubricJudgment | None
Rule = Callable[[Trajectory], RuleResult]


class RuleJudge:
    """Judge (rwcore.types.Judge) whose rubrics are callables `rule(trajectory) -> result`.

    `rules` maps rubric ids to callables. What a callable returns becomes:
    - True / False (also numpy bools) -> PASS / FAIL (score 1.0 / 0.0 when the rubric is scored);
    - a number in [0, 1] -> unscored rubric: PASS when >= pass_threshold, score dropped;
      scored rubric: PASS / FAIL by the same threshold, score kept;
    - None or Verdict.NA -> NA (the rubric does not apply); Verdict.PASS / FAIL as given;
    - a RubricJudgment -> used as is (relabelled with the rubric id), e.g. to attach evidence;
    - anything else (a number outside [0, 1] or NaN, another type, Verdict.INVALID), or an
      exception -> INVALID with the reason (the exception's type and message) in `error`.
    A rule's failure on one trajectory never affects other rubrics or trajectories.

    `evaluate` raises ValueError, before running any rule, when a rubric has no rule.
    """

    def __init__(self, rules: Mapping[str, Rule], *, pass_threshold: float = 0.5) -> None:
        if not isinstance(rules, Mapping):
            raise ValueError(f"rules must be a mapping from rubric id to callable, got {type(rules).__name__}")
        for rubric_id, rule in rules.items():
            if not isinstance(rubric_id, str) or not rubric_id:
                raise ValueError(f"rules keys must be non-empty rubric id strings, got {rubric_id!r}")
            if not callable(rule):
                raise ValueError(f"rules[{rubric_id!r}] must be callable, got {type(rule).__name__}")
        self.rules: dict[str, Rule] = dict(rules)
        self.pass_threshold = check_unit(pass_threshold, "pass_threshold")

    def __repr__(self) -> str:
        return f"RuleJudge(rubrics={sorted(self.rules)!r}, pass_threshold={self.pass_threshold:g})"

    def evaluate(self, trajectories: Sequence[Trajectory], rubrics: Sequence[RubricSpec]) -> list[JudgeReport]:
        """One JudgeReport per trajectory (in order), one judgment per rubric (in order)."""
        trajectories = check_trajectories(trajectories)
        rubrics = check_rubrics(rubrics)
        unknown = [rubric.rubric_id for rubric in rubrics if rubric.rubric_id not in self.rules]
        if unknown:
            raise ValueError(f"rubrics: no rule for rubric id(s) {unknown}; known: {sorted(self.rules)}")
        return [
            JudgeReport(
                trajectory.trajectory_id, {rubric.rubric_id: self.judge_one(rubric, trajectory) for rubric in rubrics}
            )
            for trajectory in trajectories
        ]

    def judge_one(self, rubric: RubricSpec, trajectory: Trajectory) -> RubricJudgment:
        """The judgment of one rubric on one trajectory (the rule must exist)."""
        rubric_id = rubric.rubric_id
        try:
            result = self.rules[rubric_id](trajectory)
        except Exception as error:  # a failing rule is an INVALID verdict, by contract
            return RubricJudgment(rubric_id, Verdict.INVALID, error=f"rule raised {type(error).__name__}: {error}")
        return self._interpret(rubric, result)

    def _interpret(self, rubric: RubricSpec, result) -> RubricJudgment:
        rubric_id = rubric.rubric_id
        if result is None:
            return RubricJudgment(rubric_id, Verdict.NA)
        if isinstance(result, RubricJudgment):
            return RubricJudgment(
                rubric_id,
                result.verdict,
                score=result.score,
                confidence=result.confidence,
                evidence=result.evidence,
                error=result.error,
            )
        if isinstance(result, Verdict):
            if result == Verdict.INVALID:
                return RubricJudgment(rubric_id, Verdict.INVALID, error="rule returned Verdict.INVALID")
            score = None
            if rubric.scored and result in (Verdict.PASS, Verdict.FAIL):
                score = 1.0 if result == Verdict.PASS else 0.0
            return RubricJudgment(rubric_id, result, score=score)
        # numpy bools are not `bool`; recognise them by type name to avoid importing numpy here.
        if isinstance(result, bool) or type(result).__name__ == "bool_":
            passed = bool(result)
            return RubricJudgment(
                rubric_id,
                Verdict.PASS if passed else Verdict.FAIL,
                score=(1.0 if passed else 0.0) if rubric.scored else None,
            )
        try:
            number = float(result) if isinstance(result, (int, float)) or hasattr(result, "__float__") else None
        except (TypeError, ValueError):
            number = None
        if number is None:
            return RubricJudgment(
                rubric_id, Verdict.INVALID, error=f"rule returned unsupported type {type(result).__name__}"
            )
        if not math.isfinite(number) or not 0.0 <= number <= 1.0:
            return RubricJudgment(rubric_id, Verdict.INVALID, error=f"rule returned score {result!r} outside [0, 1]")
        verdict = Verdict.PASS if number >= self.pass_threshold else Verdict.FAIL
        return RubricJudgment(rubric_id, verdict, score=number if rubric.scored else None)
