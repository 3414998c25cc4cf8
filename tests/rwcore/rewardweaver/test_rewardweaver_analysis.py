"""Rank statistics and retention against hand-computed values and independent formulas."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rwcore.rewardweaver import (
    bottleneck_association,
    bottleneck_importance,
    capability_retention,
    failure_reduction,
    partial_spearman,
    rankdata,
    spearman,
    spearman_by_stage,
    within_stage_spearman,
)


def pearson_on_ranks(x, y):
    """Independent Spearman: ranks by counting (average for ties), then np.corrcoef."""

    def ranks(v):
        v = np.asarray(v, dtype=float)
        return np.array([(v < a).sum() + ((v == a).sum() + 1) / 2 for a in v])

    with np.errstate(invalid="ignore", divide="ignore"):
        return float(np.corrcoef(ranks(x), ranks(y))[0, 1]), ranks


def test_rankdata_average_ties():
    np.testing.assert_array_equal(rankdata([10, 20, 20, 5, 20]), [2, 4, 4, 1, 4])
    np.testing.assert_array_equal(rankdata([3.0, 1.0, 2.0]), [3, 1, 2])


def test_spearman_hand_worked():
    # No ties: d = [0, -1, 1, 0], rho = 1 - 6 * 2 / (4 * 15) = 0.8.
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    # Ties in y: ranks y = [1, 2, 3.5, 5, 3.5]; centred products sum 8, sums of squares 10 and 9.5.
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(8 / np.sqrt(95))
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert np.isnan(spearman([1, 2, 3], [4, 4, 4]))
    assert np.isnan(spearman([1], [2]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=3, max_size=25))
def test_spearman_matches_pearson_on_ranks(pairs):
    x, y = np.array(pairs, dtype=float).T
    expected, _ = pearson_on_ranks(x, y)
    got = spearman(x, y)
    if np.isnan(expected):
        assert np.isnan(got)
    else:
        assert got == pytest.approx(expected, abs=1e-12)


def test_partial_spearman_hand_worked():
    # Ranks already: r_xy = 0.8, r_xz = 0.8 (d = [0, 0, -1, 1]), r_yz = 0.4 (d = [0, 1, -2, 1]).
    # partial = (0.8 - 0.8 * 0.4) / sqrt((1 - 0.64) (1 - 0.16)) = 0.48 / sqrt(0.3024) = 0.872872...
    x, y, z = [1, 2, 3, 4], [1, 3, 2, 4], [1, 2, 4, 3]
    assert partial_spearman(x, y, z) == pytest.approx(0.48 / np.sqrt(0.3024))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1), st.integers(0, 4)), min_size=5, max_size=30))
def test_partial_spearman_equals_correlation_of_rank_residuals(rows):
    x, y, z = np.array(rows, dtype=float).T
    _, ranks = pearson_on_ranks(x, y)
    rx, ry, rz = ranks(x), ranks(y), ranks(z)
    design = np.column_stack([np.ones_like(rz), rz])
    res_x = rx - design @ np.linalg.lstsq(design, rx, rcond=None)[0]
    res_y = ry - design @ np.linalg.lstsq(design, ry, rcond=None)[0]
    got = partial_spearman(x, y, z)
    if np.std(res_x) < 1e-9 or np.std(res_y) < 1e-9 or np.std(rz) == 0 or np.isnan(got):
        return  # degenerate: undefined either way
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = np.corrcoef(res_x, res_y)[0, 1]
    assert got == pytest.approx(expected, abs=1e-9)


def test_within_stage_spearman_hand_worked():
    # Stage A (n=2): rho 1, centred ranks [-.5, .5] for both. Stage B (n=3): x ranks [1,2,3], y ranks [1,3,2],
    # rho 0.5; centred [-1,0,1] and [-1,1,0]. Pooled: (0.25+0.25+1) / sqrt(2.5 * 2.5) = 0.6; mean: 0.75.
    x = [10, 20, 1, 2, 3]
    y = [0, 5, 7, 9, 8]
    stages = ["A", "A", "B", "B", "B"]
    assert within_stage_spearman(x, y, stages) == pytest.approx(0.6)
    assert within_stage_spearman(x, y, stages, combine="mean") == pytest.approx(0.75)
    assert spearman_by_stage(x, y, stages) == {"A": pytest.approx(1.0), "B": pytest.approx(0.5)}
    # Equal sizes and no ties: pooled == mean of per-stage coefficients, and between-stage shifts do not matter.
    x = [1, 2, 3, 100, 200, 300]
    y = [1, 2, 3, 30, 20, 10]
    stages = [0, 0, 0, 1, 1, 1]
    assert within_stage_spearman(x, y, stages) == pytest.approx(0.0)
    assert within_stage_spearman(x, y, stages, combine="mean") == pytest.approx(0.0)
    assert spearman(x, y) > 0.5  # pooled across stages it looks positive


def test_nan_policy_and_shapes():
    with pytest.raises(ValueError, match="x holds NaN"):
        spearman([1, np.nan, 3], [1, 2, 3])
    assert spearman([1, np.nan, 3, 4], [1, 2, 3, 5], nan_policy="omit") == pytest.approx(1.0)
    with pytest.raises(ValueError, match="y has length 2"):
        spearman([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="stages"):
        within_stage_spearman([1, 2], [1, 2], [0])


def test_importance_reduction_and_association():
    fail = np.array([[0.5, 0.4, 0.1, 0.3], [0.2, 0.35, 0.1, 0.25], [0.1, 0.3, 0.2, 0.05]])
    succ = np.array([[0.1, 0.3, 0.1, 0.2], [0.1, 0.3, 0.0, 0.05], [0.0, 0.0, 0.0, 0.0]])
    importance = bottleneck_importance(fail, succ)
    np.testing.assert_allclose(importance[0], [0.4, 0.1, 0.0, 0.1])
    reduction = failure_reduction(fail)
    np.testing.assert_allclose(reduction, [[0.3, 0.05, 0.0, 0.05], [0.1, 0.05, -0.1, 0.2]])
    result = bottleneck_association(fail, succ)
    flat_i, flat_r, flat_f = importance[:2].ravel(), reduction.ravel(), fail[:2].ravel()
    assert result.n_pairs == 8
    assert result.importance_rho == pytest.approx(spearman(flat_i, flat_r))
    assert result.failure_rate_rho == pytest.approx(spearman(flat_f, flat_r))
    assert result.partial_rho == pytest.approx(partial_spearman(flat_i, flat_r, flat_f))
    assert result.within_stage_rho == pytest.approx(within_stage_spearman(flat_i, flat_r, [0] * 4 + [1] * 4))
    # Unknown rates drop their pairs.
    fail[0, 3] = np.nan
    assert bottleneck_association(fail, succ).n_pairs == 7  # only (k=0, d=3); stage 1 still has F_fail_{1,3}
    with pytest.raises(ValueError, match="succ_rates has shape"):
        bottleneck_association(fail, succ[:, :2])


def test_capability_retention_hand_worked():
    scores = np.array([[0.6, 0.5, 0.9], [0.7, 0.6, 0.9], [0.55, 0.9, np.nan], [0.8, 0.4, 1.0]])
    active = np.array([[True, True, True], [False, True, True], [False, False, True], [False, True, True]])
    result = capability_retention(scores, active, ["switch", "benefits", "empathy"])
    # switch: deactivated after stage 0 -> +0.1, -0.05, +0.2; benefits: after stage 1 -> +0.3, then active again.
    assert [(e.capability_id, e.last_active_stage) for e in result.events] == [("switch", 0), ("benefits", 1)]
    np.testing.assert_allclose([d for _, d in result.events[0].deltas], [0.1, -0.05, 0.2])
    assert [t for t, _ in result.events[0].deltas] == [1, 2, 3]
    np.testing.assert_allclose([d for _, d in result.events[1].deltas], [0.3])
    assert result.n == 4
    assert result.mean == pytest.approx(0.1375) and result.median == pytest.approx(0.15)
    assert result.min == pytest.approx(-0.05) and result.max == pytest.approx(0.3)
    empty = capability_retention(scores, np.ones_like(active))
    assert empty.n == 0 and np.isnan(empty.mean)
    with pytest.raises(ValueError, match="active must be a bool array"):
        capability_retention(scores, active.astype(int))
