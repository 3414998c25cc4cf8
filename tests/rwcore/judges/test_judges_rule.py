"""RuleJudge: rubrics as Python callables."""

from __future__ import annotations

import numpy as np
import pytest

from rwcore.judges import RuleJudge
from rwcore.types import Judge, RubricJudgment, RubricSpec, Trajectory, Turn
from rwcore.verdict import Verdict


def trajectory(text: str = "order 1234", trajectory_id: str = "t/g/0") -> Trajectory:
    return Trajectory("t", [Turn("assistant", text, generated=True)], 1.0, trajectory_id=trajectory_id)


def judge_one(result, *, scored: bool = False, threshold: float = 0.5) -> RubricJudgment:
    judge = RuleJudge({"r": lambda t: result}, pass_threshold=threshold)
    [report] = judge.evaluate([trajectory()], [RubricSpec("r", "criterion", scored=scored)])
    return report.judgments["r"]


def test_is_a_judge():
    assert isinstance(RuleJudge({}), Judge)


@pytest.mark.parametrize(
    "result, verdict",
    [
        (True, Verdict.PASS),
        (False, Verdict.FAIL),
        (np.bool_(True), Verdict.PASS),
        (np.bool_(False), Verdict.FAIL),
        (None, Verdict.NA),
        (Verdict.NA, Verdict.NA),
        (Verdict.PASS, Verdict.PASS),
        (Verdict.FAIL, Verdict.FAIL),
    ],
)
def test_booleans_none_and_verdicts(result, verdict):
    judgment = judge_one(result)
    assert judgment.verdict == verdict and judgment.score is None and judgment.error == ""


def test_booleans_on_scored_rubrics_carry_the_score():
    assert judge_one(True, scored=True).score == 1.0
    assert judge_one(False, scored=True).score == 0.0
    assert judge_one(None, scored=True).score is None


@pytest.mark.parametrize(
    "value, verdict",
    [(0.5, Verdict.PASS), (0.49, Verdict.FAIL), (1, Verdict.PASS), (0, Verdict.FAIL), (np.float32(0.75), Verdict.PASS)],
)
def test_scores_on_unscored_rubrics_threshold_and_drop_the_score(value, verdict):
    judgment = judge_one(value)
    assert judgment.verdict == verdict and judgment.score is None
    assert judgment.value == (1.0 if verdict == Verdict.PASS else 0.0)


def test_scores_on_scored_rubrics_are_kept():
    judgment = judge_one(0.3, scored=True)
    assert (judgment.verdict, judgment.score, judgment.value) == (Verdict.FAIL, 0.3, 0.3)
    judgment = judge_one(0.3, scored=True, threshold=0.25)
    assert (judgment.verdict, judgment.score) == (Verdict.PASS, 0.3)


@pytest.mark.parametrize(
    "value, message",
    [
        (1.5, "outside [0, 1]"),
        (-0.1, "outside [0, 1]"),
        (float("nan"), "outside [0, 1]"),
        ("pass", "unsupported type"),
        ([True], "unsupported type"),
        (Verdict.INVALID, "INVALID"),
    ],
)
def test_bad_results_are_invalid(value, message):
    judgment = judge_one(value)
    assert judgment.verdict == Verdict.INVALID and message in judgment.error and judgment.value is None


def test_raising_rule_is_invalid_and_isolated():
    def broken(trajectory):
        raise KeyError("tool_calls")

    judge = RuleJudge({"broken": broken, "fine": lambda t: "1234" in t.transcript()})
    reports = judge.evaluate(
        [trajectory(), trajectory("no id", "t/g/1")], [RubricSpec("broken", "x"), RubricSpec("fine", "y")]
    )
    assert [r.trajectory_id for r in reports] == ["t/g/0", "t/g/1"]
    for report in reports:
        assert report.judgments["broken"].verdict == Verdict.INVALID
        assert report.judgments["broken"].error == "rule raised KeyError: 'tool_calls'"
        assert report.uncovered == ()
    assert [r.judgments["fine"].verdict for r in reports] == [Verdict.PASS, Verdict.FAIL]


def test_rule_may_return_a_full_judgment():
    judgment = judge_one(RubricJudgment("whatever", Verdict.PASS, confidence=0.9, evidence="turn 0"))
    assert (judgment.rubric_id, judgment.verdict, judgment.confidence, judgment.evidence) == (
        "r",
        Verdict.PASS,
        0.9,
        "turn 0",
    )


def test_unknown_rubric_raises_before_running_anything():
    calls = []
    judge = RuleJudge({"known": lambda t: calls.append(t) or True})
    with pytest.raises(ValueError, match="'unknown'"):
        judge.evaluate([trajectory()], [RubricSpec("known", "x"), RubricSpec("unknown", "y")])
    assert calls == []


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"rules\['r'\]"):
        RuleJudge({"r": "not callable"})
    with pytest.raises(ValueError, match="rules"):
        RuleJudge([("r", bool)])
    with pytest.raises(ValueError, match="pass_threshold"):
        RuleJudge({}, pass_threshold=2)
    judge = RuleJudge({"r": bool})
    with pytest.raises(ValueError, match="more than once"):
        judge.evaluate([trajectory()], [RubricSpec("r", "x"), RubricSpec("r", "x")])
    with pytest.raises(ValueError, match=r"trajectories\[1\]"):
        judge.evaluate([trajectory(), {"task_id": "t"}], [RubricSpec("r", "x")])


def test_report_order_follows_rubrics():
    judge = RuleJudge({"a": lambda t: True, "b": lambda t: False, "c": lambda t: None})
    [report] = judge.evaluate([trajectory()], [RubricSpec("c", "."), RubricSpec("a", "."), RubricSpec("b", ".")])
    assert list(report.judgments) == ["c", "a", "b"]
