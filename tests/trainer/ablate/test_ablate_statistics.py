"""The statistics of `rw ablate` / `rw compare` (trainer/ablate/statistics.py): the normalized area under a held-out
curve and the steps to reach the baseline's step-150 success worked out by hand on tiny curves; the interquartile
mean on hand-worked sets of 5 and 8 values; the bootstrap intervals against an independent percentile bootstrap
written here in numpy; the probability of improvement against its definition, P(X > Y) + 0.5 P(X = Y) over every
pair; no interval from fewer than five seeds."""

import json

import numpy as np
import pytest

from rwcore.trainer.ablate import statistics as ablate_stats
from rwcore.trainer.ablate.statistics import (
    MIN_SEEDS,
    NEEDS_SEEDS,
    eval_ceiling,
    format_estimate,
    improvement_estimates,
    iqm,
    iqm_estimate,
    normalized_auc,
    pairwise_improvement,
    probability_of_improvement,
    reach_target,
    sorted_iqm,
    steps_to_reach,
)

# ---------------------------------------------------------------------------- per run


def test_normalized_auc_by_hand():
    # trapezoids: 10 x (0 + 0.5)/2 = 2.5, then 20 x (0.5 + 0.5)/2 = 10 -> 12.5 over 30 steps at ceiling 1
    curve = [(0, 0.0, None), (10, 0.5, 0.1), (30, 0.5, None)]
    assert normalized_auc(curve) == pytest.approx(12.5 / 30)
    # the same area against a ceiling of 0.5 (the best any policy can do): twice the fraction
    assert normalized_auc(curve, 0.5) == pytest.approx(12.5 / 15)
    # a curve that starts later is normalized over its own span: 50 x (0.2 + 0.4)/2 = 15 over 50 steps
    assert normalized_auc([(50, 0.2), (100, 0.4)]) == pytest.approx(0.3)
    # at the ceiling from the first evaluation on: 1.0
    assert normalized_auc([(0, 0.8), (5, 0.8), (40, 0.8)], 0.8) == pytest.approx(1.0)
    # one evaluation has no area
    assert normalized_auc([(0, 0.3)]) is None and normalized_auc([]) is None


@pytest.mark.parametrize("ceiling", [0.0, -0.5, 1.5, float("nan"), "1"])
def test_normalized_auc_refuses_a_bad_ceiling(ceiling):
    with pytest.raises(ValueError, match="ceiling"):
        normalized_auc([(0, 0.1), (1, 0.2)], ceiling)


def test_reach_target_reads_step_150_or_the_last_evaluation_before_it():
    # both seeds evaluated at 150: the mean of 0.3 and 0.5; later evaluations do not count
    at_150 = [[(0, 0.0), (50, 0.1), (150, 0.3), (200, 0.9)], [(0, 0.0), (150, 0.5)]]
    assert reach_target(at_150) == {"value": pytest.approx(0.4), "at_step": 150, "steps": [150, 150], "seeds": 2,
                                    "exact": True}  # fmt: skip
    # evaluated every 100 steps: step 100 is the last one at or before 150 -> mean of 0.2 and 0.4
    every_100 = [[(0, 0.0), (100, 0.2), (200, 0.6)], [(0, 0.0), (100, 0.4), (200, 0.8)]]
    found = reach_target(every_100)
    assert found["value"] == pytest.approx(0.3) and found["steps"] == [100, 100] and found["exact"] is False
    # runs shorter than 150 steps: their final evaluation
    assert reach_target([[(0, 0.1), (50, 0.25)]])["value"] == pytest.approx(0.25)
    # no evaluation at or before the step: no target
    assert reach_target([[(200, 0.5)]]) is None and reach_target([]) is None
    # another step on request
    assert reach_target(at_150, at_step=50)["value"] == pytest.approx((0.1 + 0.0) / 2)


def test_steps_to_reach_by_hand():
    curve = [(0, 0.0, None), (50, 0.2, None), (100, 0.41, None), (150, 0.3, None)]
    assert steps_to_reach(curve, 0.4) == 100  # the first step at or above, not the last
    assert steps_to_reach(curve, 0.0) == 0 and steps_to_reach(curve, 0.5) is None


def write_metrics(folder, rows):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_the_ceiling_comes_from_the_eval_rows_or_is_1(tmp_path):
    plain = write_metrics(tmp_path / "a", [{"step": 0, "kind": "eval", "eval/success_rate": 0.1}])
    assert eval_ceiling(plain) == (1.0, "default")
    logged = write_metrics(
        tmp_path / "b",
        [
            {"step": 1, "kind": "train", "eval/ceiling": 0.2},  # a training row: not read
            {"step": 0, "kind": "eval", "eval/success_rate": 0.1, "eval/ceiling": 0.7},
            {"step": 5, "kind": "eval", "eval/success_rate": 0.3, "eval/ceiling": 0.75},
        ],
    )
    assert eval_ceiling(logged) == (0.75, "eval/ceiling")  # the last evaluation's
    broken = write_metrics(tmp_path / "c", [{"step": 0, "kind": "eval", "eval/success_rate": 0.1, "eval/ceiling": 0}])
    value, source = eval_ceiling(broken)
    assert value == 1.0 and source.startswith("default") and "not in (0, 1]" in source


# ---------------------------------------------------------------------------- over seeds: point estimates


def test_iqm_on_hand_worked_sets():
    # 5 values: rliable's IQM is scipy's 25% trimmed mean, which cuts int(0.25 x 5) = 1 from each end:
    # sorted 0.0 0.2 0.3 0.7 1.0 -> mean(0.2, 0.3, 0.7) = 0.4
    assert iqm([1.0, 0.3, 0.0, 0.7, 0.2]) == pytest.approx(0.4)
    # 8 values: 2 from each end: sorted 0 .1 .2 .4 .5 .6 .9 1 -> mean(.2, .4, .5, .6) = 0.425
    assert iqm([0.9, 0.0, 0.5, 1.0, 0.2, 0.6, 0.1, 0.4]) == pytest.approx(0.425)
    # one outlying seed moves the mean, not the IQM
    assert iqm([0.5, 0.5, 0.5, 0.5, 0.0]) == pytest.approx(0.5)


def test_probability_of_improvement_by_its_definition():
    # X = (0.2, 0.5, 0.5), Y = (0.5, 0.1); the six pairs: 0.2 vs 0.5 -> 0, 0.2 vs 0.1 -> 1, 0.5 vs 0.5 -> 1/2 (twice),
    # 0.5 vs 0.1 -> 1 (twice): (0 + 1 + 0.5 + 1 + 0.5 + 1) / 6 = 4/6
    x, y = [0.2, 0.5, 0.5], [0.5, 0.1]
    assert probability_of_improvement(x, y) == pytest.approx(4 / 6)
    assert probability_of_improvement(y, x) == pytest.approx(2 / 6)  # P(X>Y) + P(Y>X) + P(=) = 1
    assert probability_of_improvement([0.3, 0.3], [0.3, 0.3]) == 0.5
    assert probability_of_improvement([0.9] * 5, [0.1] * 5) == 1.0


def test_the_bootstraps_own_statistics_are_rliables():
    """Inside the bootstrap the IQM is one sort and the probability of improvement a pair count in numpy: both must
    equal rliable's (scipy trim_mean, Mann-Whitney U) on any input, ties and every size from 1 to 12 included."""
    from rliable import metrics

    rng = np.random.default_rng(7)
    for _ in range(300):
        n, m = rng.integers(1, 13, size=2)
        x = np.round(rng.random((n, 1)), 1)  # rounded: many ties
        y = np.round(rng.random((m, 1)), 1)
        assert pairwise_improvement(x, y) == pytest.approx(metrics.probability_of_improvement(x, y), abs=1e-12)
        assert sorted_iqm(x) == pytest.approx(metrics.aggregate_iqm(x), abs=1e-12)
    same = np.array([[0.1], [0.4], [0.4]])
    assert pairwise_improvement(same, same.copy()) == 0.5


# ---------------------------------------------------------------------------- over seeds: intervals


def own_iqm(samples: np.ndarray) -> np.ndarray:
    """Rows of resampled seeds -> the mean of each row's middle half after cutting floor(n / 4) from each end."""
    n = samples.shape[-1]
    cut = n // 4
    return np.sort(samples, axis=-1)[..., cut : n - cut].mean(axis=-1)


def own_percentile_bootstrap(statistic, samples, reps: int, seed: int) -> tuple[float, float]:
    """An independent percentile bootstrap: each sample's seeds resampled with replacement, on its own."""
    rng = np.random.default_rng(seed)
    drawn = [np.asarray(s)[rng.integers(0, len(s), size=(reps, len(s)))] for s in samples]
    values = statistic(*drawn)
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


SCORES = np.array([0.05, 0.12, 0.2, 0.22, 0.31, 0.33, 0.38, 0.4, 0.45, 0.5, 0.52, 0.58, 0.6, 0.63, 0.7, 0.74, 0.8,
                   0.85, 0.9, 0.97])  # fmt: skip
BASELINE = np.array([0.0, 0.1, 0.15, 0.18, 0.25, 0.3, 0.31, 0.36, 0.42, 0.44, 0.47, 0.55, 0.6, 0.61, 0.66, 0.7])


# 20 and 16 seeds, so the bootstrap distributions are nearly continuous. With 10,000 resamples the 2.5% and 97.5%
# points move by about 0.0025 (sd) between bootstrap seeds; the reference bootstrap below draws 100,000 or more.
TOLERANCE = 0.015


def test_the_iqm_interval_agrees_with_an_independent_percentile_bootstrap():
    found = iqm_estimate(SCORES, reps=10_000)
    low, high = own_percentile_bootstrap(own_iqm, [SCORES], 400_000, seed=123)
    assert found["point"] == pytest.approx(float(own_iqm(SCORES)))
    assert found["low"] == pytest.approx(low, abs=TOLERANCE) and found["high"] == pytest.approx(high, abs=TOLERANCE)
    assert found["low"] < found["point"] < found["high"] and found["note"] is None and found["n"] == 20


def test_the_comparison_intervals_agree_with_an_independent_percentile_bootstrap():
    found = improvement_estimates(SCORES, BASELINE, reps=10_000)

    def difference(x, y):
        return own_iqm(x) - own_iqm(y)

    def improvement(x, y):  # the definition, per resample: mean over pairs of [x > y] + 0.5 [x = y]
        pairs = x[:, :, None] - y[:, None, :]
        return (pairs > 0).mean(axis=(1, 2)) + 0.5 * (pairs == 0).mean(axis=(1, 2))

    low, high = own_percentile_bootstrap(difference, [SCORES, BASELINE], 400_000, seed=5)
    assert found["iqm_difference"]["point"] == pytest.approx(float(own_iqm(SCORES) - own_iqm(BASELINE)))
    assert found["iqm_difference"]["low"] == pytest.approx(low, abs=TOLERANCE)
    assert found["iqm_difference"]["high"] == pytest.approx(high, abs=TOLERANCE)
    low, high = own_percentile_bootstrap(improvement, [SCORES, BASELINE], 100_000, seed=6)
    point = float(improvement(SCORES[None], BASELINE[None])[0])
    assert found["probability_of_improvement"]["point"] == pytest.approx(point)
    assert found["probability_of_improvement"]["low"] == pytest.approx(low, abs=TOLERANCE)
    assert found["probability_of_improvement"]["high"] == pytest.approx(high, abs=TOLERANCE)
    assert found["probability_of_improvement"]["n"] == 20 and found["probability_of_improvement"]["n_baseline"] == 16


def test_intervals_are_reproducible_and_leave_numpys_global_generator_alone():
    values = [0.1, 0.4, 0.35, 0.6, 0.2, 0.5]
    np.random.seed(99)
    expected_next = np.random.random()
    np.random.seed(99)
    first = iqm_estimate(values, reps=500)
    comparison = improvement_estimates(values, [0.0, 0.3, 0.2, 0.25, 0.1], reps=500)
    assert np.random.random() == expected_next  # the caller's random stream is where it was
    assert iqm_estimate(values, reps=500) == first
    assert improvement_estimates(values, [0.0, 0.3, 0.2, 0.25, 0.1], reps=500) == comparison
    assert iqm_estimate(values, reps=500, seed=1) != first  # the seed is what fixes it


def test_fewer_than_five_seeds_give_no_interval():
    four = [0.2, 0.9, 0.4, 0.6]
    found = iqm_estimate(four)
    # the point estimate stays: 4 values, int(0.25 x 4) = 1 cut from each end -> mean(0.4, 0.6)
    assert found == {"point": pytest.approx(0.5), "low": None, "high": None, "n": 4, "note": NEEDS_SEEDS}
    assert NEEDS_SEEDS == "needs >= 5 seeds" and MIN_SEEDS == 5
    # five variant seeds against a four-seed baseline: still no interval (both sides need five)
    compared = improvement_estimates([0.3, 0.5, 0.6, 0.7, 0.8], four)
    for estimate in compared.values():
        assert estimate["low"] is None and estimate["high"] is None and estimate["note"] == NEEDS_SEEDS
    assert compared["probability_of_improvement"]["point"] == pytest.approx(
        np.mean([[a > b or 0.5 * (a == b) for b in four] for a in [0.3, 0.5, 0.6, 0.7, 0.8]])
    )
    assert format_estimate(found) == "0.500 (needs >= 5 seeds)"
    assert iqm_estimate([])["point"] is None and format_estimate(iqm_estimate([])) == "—"


def test_five_seeds_give_an_interval_and_the_text_shows_it():
    found = iqm_estimate([0.1, 0.2, 0.3, 0.4, 0.5], reps=500)
    assert found["low"] is not None and found["low"] <= 0.3 <= found["high"]
    assert format_estimate(found) == f"0.300 [{found['low']:.3f}, {found['high']:.3f}]"
    assert format_estimate({"point": 0.1, "low": -0.05, "high": 0.2}, signed=True) == "+0.100 [-0.050, +0.200]"


@pytest.mark.parametrize("reps", [0, -3, 2.5, True])
def test_bad_bootstrap_reps_are_refused(reps):
    with pytest.raises(ValueError, match="bootstrap reps"):
        iqm_estimate([0.1] * 5, reps=reps)


def test_every_metric_has_a_sentence():
    notes = ablate_stats.metric_notes("outcome_only")
    for key in ("final", "best", "auc", "ceiling", "steps_to_baseline", "steps_to_reach", "iqm", "interval",
                "probability_of_improvement", "iqm_difference"):  # fmt: skip
        assert notes[key].endswith(".") and len(notes[key]) > 40
    assert "outcome_only's mean held-out success at step 150" in notes["steps_to_reach"]
    assert NEEDS_SEEDS in notes["interval"]
