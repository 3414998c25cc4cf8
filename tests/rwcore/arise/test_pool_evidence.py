"""Evidence windows of the rubric-skill pool (Arise appendix B.3) and how evidence is recorded."""

import math

import numpy as np
import pytest
from pool_fakes import FakeReflector, proposal, reports, trajectory

from rwcore.arise.pool import RubricSkillPool
from rwcore.types import JudgeReport, RubricJudgment
from rwcore.verdict import Verdict


def make_pool(ids=("a", "b"), **kwargs):
    kwargs.setdefault("max_new", 0)
    return RubricSkillPool(FakeReflector(), proposals=[proposal(i) for i in ids], **kwargs)


def test_window_is_the_preceding_delta_pool_steps_and_resets():
    pool = make_pool(["a"])
    for step in range(10):  # steps 0..9 feed the update at step 9
        pool.record(reports("a", passes=step % 2, fails=1 - step % 2), step)
    assert pool.update(9).pass_rates == {"a": 0.5}
    assert pool.pass_rates() == {"a": None}  # window consumed
    assert pool.pair("a").rubric.applicable == 0
    assert pool.update(19).pass_rates == {"a": None}  # nothing new: no carry-over from the old window


def test_evidence_for_a_later_step_waits_for_its_window():
    pool = make_pool(["a"])
    pool.record(reports("a", passes=4, fails=1), 9)
    pool.record(reports("a", fails=3), 10)  # recorded before the update of step 9
    assert pool.update(9).pass_rates == {"a": 0.8}
    assert pool.pass_rates() == {"a": 0.0}
    assert pool.update(19).pass_rates == {"a": 0.0}


def test_evidence_from_a_skipped_update_is_discarded():
    pool = make_pool(["a"])
    pool.record(reports("a", fails=5), 3)  # window of step 9, which never runs
    pool.record(reports("a", passes=1, fails=1), 12)
    assert pool.pass_rates() == {"a": 1 / 7}  # pending evidence, all of it
    assert pool.update(19).pass_rates == {"a": 0.5}  # only steps 10..19 count
    assert pool.pass_rates() == {"a": None}


def test_closed_windows_take_no_evidence():
    pool = make_pool(["a"])
    pool.update(9)
    with pytest.raises(ValueError, match="step 9 lies in a window already closed"):
        pool.record(reports("a", passes=1), 9)
    with pytest.raises(ValueError, match="step"):
        pool.record_counts({"a": (1, 0)}, 4)
    pool.record(reports("a", passes=1), 10)


def test_multi_rubric_reports_and_counts():
    pool = make_pool(["a", "b"])
    report = JudgeReport("t0", {"a": RubricJudgment("a", Verdict.PASS), "b": RubricJudgment("b", Verdict.NA)})
    pool.record([report, report], 0)
    pool.record_counts({"a": (1, 3), "b": (np.int64(2), 0)}, 1)
    rubric_a, rubric_b = (p.rubric for p in pool.pairs())
    assert (rubric_a.passes, rubric_a.fails, rubric_a.not_applicable) == (3, 3, 0)
    assert (rubric_b.passes, rubric_b.fails, rubric_b.not_applicable) == (2, 0, 2)
    assert pool.pass_rates() == {"a": 0.5, "b": 1.0}


def test_refinement_gets_this_rubrics_failures_from_the_window():
    reflector = FakeReflector()
    pool = RubricSkillPool(reflector, max_new=0, max_failures=3, proposals=[proposal("a"), proposal("b")])
    pool.record(reports("a", fails=1, prefix="w0"), 0)
    pool.update(9)  # a active
    pool.record(reports("a", fails=1, prefix="old"), 10)
    pool.record(reports("a", passes=1, fails=4, prefix="new"), 15)
    pool.record(reports("b", fails=2, prefix="new"), 15)  # b's failures are not a's
    pool.record([JudgeReport("", {"a": RubricJudgment("a", Verdict.FAIL)})], 15)  # no id: counted only
    given = [
        trajectory(i)
        for i in (
            "w0-a-fail-0",
            "old-a-fail-0",
            "new-a-pass-0",
            "new-b-fail-0",
            "new-a-fail-0",
            "new-a-fail-1",
            "new-a-fail-2",
            "new-a-fail-3",
        )
    ]
    update = pool.update(19, given)
    assert update.pass_rates["a"] == 1 / 7 and update.refined == ("a",)
    # the latest max_failures=3 failed ids of a in steps 10..19, in the order they were given
    assert reflector.calls[-1] == ("refine", "a", "skill of a", ["new-a-fail-1", "new-a-fail-2", "new-a-fail-3"])


def test_bad_reports_are_refused_and_nothing_is_recorded():
    pool = make_pool(["a"])
    good = reports("a", passes=2)
    unknown = JudgeReport("t", {"zzz": RubricJudgment("zzz", Verdict.PASS)})
    with pytest.raises(ValueError, match=r"reports\[2\].judgments\['zzz'\].*not in the pool"):
        pool.record(good + [unknown], 0)
    assert pool.pass_rates() == {"a": None}
    with pytest.raises(ValueError, match="holds a judgment of rubric 'b'"):
        pool.record([JudgeReport("t", {"a": RubricJudgment("b", Verdict.PASS)})], 0)
    with pytest.raises(ValueError, match=r"verdict must be a rwcore.Verdict"):
        pool.record([JudgeReport("t", {"a": RubricJudgment("a", True)})], 0)
    with pytest.raises(ValueError, match=r"reports\[0\] must be a rwcore.types.JudgeReport"):
        pool.record([{"a": True}], 0)
    with pytest.raises(ValueError, match="reports must be a sequence"):
        pool.record(good[0], 0)
    with pytest.raises(ValueError, match="RubricJudgment"):
        pool.record([JudgeReport("t", {"a": Verdict.PASS})], 0)
    for step in (-1, 1.0, True, "3"):
        with pytest.raises(ValueError, match="step"):
            pool.record(good, step)
    assert pool.pass_rates() == {"a": None}


@pytest.mark.parametrize("value", [(math.nan, 1), (1.5, 1), (-1, 2), (True, 1), (1,), (1, 2, 3), "ab", 3])
def test_bad_counts_are_refused(value):
    pool = make_pool(["a", "b"])
    with pytest.raises(ValueError, match=r"counts\['a'\]"):
        pool.record_counts({"b": (1, 1), "a": value}, 0)
    assert pool.pass_rates() == {"a": None, "b": None}


def test_unknown_rubric_in_counts():
    pool = make_pool(["a"])
    with pytest.raises(ValueError, match=r"counts\['x'\].*not in the pool"):
        pool.record_counts({"x": (1, 1)}, 0)
    with pytest.raises(ValueError, match="counts must be a mapping"):
        pool.record_counts([("a", (1, 1))], 0)
