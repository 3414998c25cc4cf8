"""Process reward R = R_o + mean of the defined active judgments, against hand-worked values."""

import numpy as np
import pytest
from rewardweaver_fakes import judgment

from rwcore.rewardweaver import judge_failure_rates, judgment_matrix, mean_scores, process_reward, process_terms
from rwcore.types import JudgeReport
from rwcore.verdict import Verdict

nan = float("nan")


def test_hand_worked_rewards_with_na_and_invalid():
    """normalize="applicable": the mean over the judgments that are defined."""
    outcomes = [1.0, 0.0, 0.5, 0.2]
    jbar = [
        [1.0, 0.5, nan],  # third rubric NA: (1 + 0.5) / 2 = 0.75          -> 1.75
        [0.0, 0.0, 0.0],  # all applicable, all failed: 0                  -> 0.0
        [nan, nan, nan],  # nothing applies / all invalid: process term 0  -> 0.5
        [0.2, nan, 0.8],  # (0.2 + 0.8) / 2 = 0.5                          -> 0.7
    ]
    kw = {"normalize": "applicable"}
    np.testing.assert_allclose(process_reward(outcomes, jbar, **kw), [1.75, 0.0, 0.5, 0.7])
    np.testing.assert_allclose(process_reward(outcomes, jbar, empty_value=0.5, **kw), [1.75, 0.0, 1.0, 0.7])
    term, count = process_terms(jbar, **kw)
    np.testing.assert_allclose(term, [0.75, 0.0, 0.0, 0.5])
    assert count.tolist() == [2, 3, 0, 2]


def test_hand_worked_rewards_active_set_normalization_is_the_default():
    """The paper's 1/|A| sum over the active set (the default): NA and INVALID add 0 but still count in |A| = 3,
    so reaching a check that then fails is never worse than not reaching it."""
    outcomes = [1.0, 0.0, 0.5, 0.2]
    jbar = [
        [1.0, 0.5, nan],  # (1 + 0.5 + 0) / 3 = 0.5                        -> 1.5
        [0.0, 0.0, 0.0],  # 0                                               -> 0.0
        [nan, nan, nan],  # nothing defined: empty_value (0)                -> 0.5
        [0.2, nan, 0.8],  # (0.2 + 0 + 0.8) / 3 = 1/3                       -> 0.2 + 1/3
    ]
    np.testing.assert_allclose(process_reward(outcomes, jbar), [1.5, 0.0, 0.5, 0.2 + 1 / 3])
    np.testing.assert_allclose(process_reward(outcomes, jbar, empty_value=0.5), [1.5, 0.0, 1.0, 0.2 + 1 / 3])
    term, _ = process_terms(jbar)
    np.testing.assert_allclose(term, [0.5, 0.0, 0.0, 1 / 3])
    with pytest.raises(ValueError, match="normalize"):
        process_terms(jbar, normalize="mean")


def test_all_defined_is_the_papers_formula():
    rng = np.random.default_rng(0)
    outcomes = rng.random(50)
    jbar = rng.random((50, 6))
    np.testing.assert_allclose(process_reward(outcomes, jbar), outcomes + jbar.sum(axis=1) / 6)


def test_empty_active_set_is_outcome_only():
    outcomes = np.array([0.3, 0.9])
    np.testing.assert_array_equal(process_reward(outcomes, np.zeros((2, 0))), outcomes)


def test_bad_input():
    with pytest.raises(ValueError, match=r"outcomes\[1\]"):
        process_reward([0.0, nan], [[1.0], [1.0]])
    with pytest.raises(ValueError, match="judgments has 3 rows for 2 outcomes"):
        process_reward([0.0, 1.0], np.zeros((3, 2)))
    with pytest.raises(ValueError, match="2-D"):
        process_reward([0.0, 1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"judgments\[0, 1\] = 1.5"):
        process_reward([0.0], [[0.5, 1.5]])
    with pytest.raises(ValueError, match="infinite"):
        process_reward([0.0], [[np.inf]])
    with pytest.raises(ValueError, match="outcomes must be 1-D"):
        process_reward([[0.0]], [[0.5]])


def test_judgment_matrix_from_reports():
    reports = [
        JudgeReport(
            "t1",
            {
                "a": judgment("a", Verdict.PASS),
                "b": judgment("b", Verdict.FAIL, 0.25),
                "other": judgment("other", Verdict.PASS),
            },
        ),
        JudgeReport("t2", {"a": judgment("a", Verdict.NA), "b": judgment("b", Verdict.INVALID)}),
        JudgeReport("t3", {"b": judgment("b", Verdict.PASS, 0.75)}),  # "a" missing -> INVALID
    ]
    values, codes = judgment_matrix(reports, ["a", "b"], trajectory_ids=["t1", "t2", "t3"])
    np.testing.assert_array_equal(values, [[1.0, 0.25], [nan, nan], [nan, 0.75]])
    assert codes.tolist() == [
        [Verdict.PASS, Verdict.FAIL],
        [Verdict.NA, Verdict.INVALID],
        [Verdict.INVALID, Verdict.PASS],
    ]
    # active set |A| = 2: t1 (1 + 0.25) / 2, t3 (0 + 0.75) / 2 = 0.375
    np.testing.assert_allclose(process_reward([0.0, 0.0, 1.0], values), [0.625, 0.0, 1.375])
    rates, n = judge_failure_rates(codes)
    np.testing.assert_array_equal(rates, [0.0, 0.5])
    assert n.tolist() == [1, 2]
    rates, n = judge_failure_rates(codes, np.array([False, True, False]))
    assert np.isnan(rates).all() and n.tolist() == [0, 0]
    np.testing.assert_allclose(mean_scores(values), [1.0, 0.5])
    with pytest.raises(ValueError, match=r"reports\[1\].trajectory_id"):
        judgment_matrix(reports, ["a"], trajectory_ids=["t1", "tX", "t3"])
    with pytest.raises(ValueError, match="3 reports for 2 trajectories"):
        judgment_matrix(reports, ["a"], trajectory_ids=["t1", "t2"])
    bad = [JudgeReport("t1", {"a": judgment("a", Verdict.PASS, 2.0)})]
    with pytest.raises(ValueError, match=r"reports\[0\].judgments\['a'\]"):
        judgment_matrix(bad, ["a"])
    with pytest.raises(ValueError, match="twice"):
        judgment_matrix(reports, ["a", "a"])


def test_within_group_variation_counts_groups_whose_judgments_differ():
    from rwcore.rewardweaver.judgments import within_group_variation

    nan = float("nan")
    # columns: a varies in group x only; b is constant in both groups; c has one defined value per group (NaN);
    # d varies in x, and in y its two defined values (0.5, 0.5) are equal.
    values = np.array(
        [
            [1.0, 0.0, 1.0, 0.5],  # x
            [0.0, 0.0, nan, 1.0],  # x
            [1.0, 0.0, nan, nan],  # x
            [1.0, 1.0, 0.0, 0.5],  # y
            [1.0, 1.0, nan, 0.5],  # y
        ]
    )
    shares = within_group_variation(values, ["x", "x", "x", "y", "y"])
    assert shares[0] == 0.5 and shares[1] == 0.0 and np.isnan(shares[2]) and shares[3] == 0.5
    # group keys need not be contiguous
    assert within_group_variation(values[[0, 3, 1, 4, 2]], ["x", "y", "x", "y", "x"])[0] == 0.5
    with pytest.raises(ValueError, match="groups holds 2 keys for 5 rows"):
        within_group_variation(values, ["x", "y"])
