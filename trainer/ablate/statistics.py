"""Statistics of `rw ablate` and `rw compare`: what one run's held-out curve says, and what the seeds of a variant
say together (with how sure that is).

Per run (a held-out curve is a list of (step, success rate, standard error or None) rows, sorted by step, read
from metrics.jsonl by `eval_curve`):
  - `normalized_auc`: the area under the curve over its evaluated steps, as a fraction of the ceiling held
    from the first to the last evaluated step (1.0 = at the ceiling throughout); the ceiling is the run's
    logged `eval/ceiling` or 1.0 (`eval_ceiling`).
  - `steps_to_reach`: the first evaluated step at or above a level; `reach_target`: the level Arise fig. 3(b)
    uses, the baseline's mean held-out success at step `REACH_STEP`; `meaningful_level`: where the baseline
    never rose above its start (outcome-only RL at 0 throughout, the hard tier), that level is reached at step 0
    by every run and says nothing, so half the ceiling is measured against instead.

Over the seeds of a variant (rliable, Agarwal et al. 2021, arXiv 2108.13264; one "task" = the held-out set,
so scores are (seeds x 1) arrays and each variant's seeds are resampled independently of the baseline's):
  - `iqm_estimate`: the interquartile mean (`metrics.aggregate_iqm`) with a 95% stratified-bootstrap
    percentile interval (`rly.get_interval_estimates`);
  - `improvement_estimates`: the probability of improvement over the baseline
    (`metrics.probability_of_improvement`: P(X > Y) + 0.5 P(X = Y) over every pair of a variant's and the
    baseline's seeds) and the IQM difference (variant minus baseline), each with its interval.
An interval needs at least `MIN_SEEDS` seeds (on each side of a comparison): with fewer, a bootstrap interval
is too narrow to trust (it resamples a handful of values, and misses the true value more often than its 95%
promises); the point estimate is given alone.

Point estimates are rliable's functions. Inside the bootstrap (rliable resamples and takes the percentiles), the
same two statistics are computed in numpy (`sorted_iqm`, `pairwise_improvement`; tests hold them equal to
rliable's), since scipy's trim_mean and Mann-Whitney U cost 0.2 and 0.6 ms a call: thousands of resamples a
second instead of a few hundred.

The bootstrap is reproducible: every interval is computed from a fixed seed (`BOOTSTRAP_SEED`). rliable draws its
resamples from numpy's global generator, so that generator is seeded for the call and restored afterwards.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

__all__ = [
    "MIN_SEEDS",
    "NEEDS_SEEDS",
    "BOOTSTRAP_REPS",
    "BOOTSTRAP_SEED",
    "CONFIDENCE",
    "REACH_STEP",
    "DEFAULT_CEILING",
    "eval_curve",
    "eval_ceiling",
    "normalized_auc",
    "steps_to_reach",
    "reach_target",
    "meaningful_level",
    "mean_sd",
    "iqm",
    "probability_of_improvement",
    "iqm_estimate",
    "improvement_estimates",
    "pairwise_improvement",
    "sorted_iqm",
    "seed_statistics",
    "ceilings_used",
    "bootstrap_note",
    "format_estimate",
    "metric_notes",
]

MIN_SEEDS = 5
"""Finished seeds a variant (and, for a comparison, the baseline) needs before an interval is reported."""
NEEDS_SEEDS = f"needs >= {MIN_SEEDS} seeds"
BOOTSTRAP_REPS = 5000
"""Bootstrap resamples per interval. rliable's resampling loop runs in Python (some 50 microseconds a resample
here), so its own default of 50,000 would take a minute for a seven-row table; 5000 take a few seconds, and move
an interval's bounds by well under its width between seeds of the bootstrap."""
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
REACH_STEP = 150
"""Arise fig. 3(b): steps each method needs to reach outcome-only RL's held-out success at step 150."""
DEFAULT_CEILING = 1.0
"""The ceiling of held-out success where a run's evaluation rows do not log `eval/ceiling`."""


# --------------------------------------------------------------------------------------------
# Reading a run's held-out curve
# --------------------------------------------------------------------------------------------


def _eval_rows(run_dir: str | os.PathLike) -> list[dict]:
    """A run's held-out evaluation rows of metrics.jsonl (kind "eval", an integer step), in file order."""
    from rwcore.trainer.report import load_jsonl

    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    rows, _ = load_jsonl(path)
    return [row for row in rows if row.get("kind") == "eval" and isinstance(row.get("step"), int)]


def eval_curve(run_dir: str | os.PathLike) -> list[tuple[int, float, float | None]]:
    """(step, held-out success rate, its standard error or None) of a run, one per evaluated step (the
    last row wins for a step a resumed run repeated)."""
    curve: dict[int, tuple[float, float | None]] = {}
    for row in _eval_rows(run_dir):
        value = row.get("eval/success_rate")
        if isinstance(value, (int, float)):
            se = row.get("eval/success_se")
            curve[row["step"]] = (float(value), float(se) if isinstance(se, (int, float)) else None)
    return [(step, *curve[step]) for step in sorted(curve)]


def eval_ceiling(run_dir: str | os.PathLike) -> tuple[float, str]:
    """(ceiling, where it came from) of a run: the last evaluation row's `eval/ceiling` (the best held-out success
    any policy can reach on the environment) when it logs one in (0, 1], else DEFAULT_CEILING. The source is
    "eval/ceiling", "default" (not logged) or "default (eval/ceiling X is not in (0, 1])"."""
    logged = [row["eval/ceiling"] for row in _eval_rows(run_dir) if "eval/ceiling" in row]
    if not logged:
        return DEFAULT_CEILING, "default"
    value = logged[-1]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 < value <= 1:
        return float(value), "eval/ceiling"
    return DEFAULT_CEILING, f"default (eval/ceiling {value!r} is not in (0, 1])"


# --------------------------------------------------------------------------------------------
# Per run
# --------------------------------------------------------------------------------------------


def normalized_auc(curve: Sequence[Sequence[float]], ceiling: float = DEFAULT_CEILING) -> float | None:
    """Trapezoid area under a held-out curve divided by (last step - first step) x ceiling.

    curve: (step, success rate, ...) rows sorted by step (extra fields, such as the standard error, are ignored).
    ceiling: the best held-out success any policy can reach, in (0, 1].
    Returns a float (1.0 = at the ceiling from the first evaluated step on), or None for a curve with fewer than
    two evaluated steps (no area to speak of)."""
    if not (isinstance(ceiling, (int, float)) and math.isfinite(ceiling) and 0.0 < ceiling <= 1.0):
        raise ValueError(f"ceiling must be a number in (0, 1], got {ceiling!r}")
    if len(curve) < 2:
        return None
    steps = np.array([row[0] for row in curve], dtype=np.float64)
    values = np.array([row[1] for row in curve], dtype=np.float64)
    if np.any(np.diff(steps) <= 0):
        raise ValueError("curve: steps must be strictly increasing")
    area = float(np.sum((values[1:] + values[:-1]) * np.diff(steps)) / 2.0)
    return area / (float(steps[-1] - steps[0]) * float(ceiling))


def steps_to_reach(curve: Sequence[tuple], target: float) -> int | None:
    """The first evaluated step whose held-out success is at least `target` (None: never)."""
    for step, value, *_ in curve:
        if value >= target - 1e-12:
            return step
    return None


def reach_target(curves: Sequence[Sequence[Sequence[float]]], at_step: int = REACH_STEP) -> dict | None:
    """The level 'steps to reach' measures against: the mean, over the baseline's seeds, of each seed's held-out
    success at step `at_step`, or at its last evaluated step before `at_step` where `at_step` was not evaluated.

    curves: one (step, success rate, ...) curve per finished baseline seed.
    Returns {"value": float, "at_step": int, "steps": [the step read, per seed], "seeds": int, "exact": bool
    (every seed was evaluated at `at_step`)}, or None when no seed has an evaluation at or before `at_step`."""
    read = []
    for curve in curves:
        before = [(row[0], row[1]) for row in curve if row[0] <= at_step]
        if before:
            read.append(before[-1])
    if not read:
        return None
    return {
        "value": float(np.mean([value for _, value in read])),
        "at_step": int(at_step),
        "steps": [int(step) for step, _ in read],
        "seeds": len(read),
        "exact": all(step == at_step for step, _ in read),
    }


def meaningful_level(level: float, start: float, ceiling: float) -> tuple[float, str]:
    """(the level 'steps to' measures against, why): the baseline's `level` when it is above the baseline's
    `start` (its mean held-out success at the first evaluation), else half the `ceiling` - a baseline that never
    moved gives a level every run holds from step 0, so 'steps to' it would read 0 for every row.
    Returns (value, "baseline") or (ceiling / 2, "half the ceiling")."""
    if level > start + 1e-12:
        return float(level), "baseline"
    return 0.5 * float(ceiling), "half the ceiling"


# --------------------------------------------------------------------------------------------
# Over the seeds of a variant
# --------------------------------------------------------------------------------------------


def mean_sd(values: Sequence[float]) -> dict:
    """{"mean", "sd" (ddof 1; 0.0 for one value), "n"} of floats; mean and sd None without values."""
    array = np.asarray(values, dtype=float)
    if not len(array):
        return {"mean": None, "sd": None, "n": 0}
    return {
        "mean": float(array.mean()),
        "sd": float(array.std(ddof=1)) if len(array) > 1 else 0.0,
        "n": int(len(array)),
    }


def _column(values: Sequence[float]) -> np.ndarray:
    """Seeds as rliable's (runs x tasks) score matrix with one task, the held-out set: float64 (n, 1)."""
    return np.asarray(values, dtype=np.float64).reshape(-1, 1)


def iqm(values: Sequence[float]) -> float:
    """rliable's interquartile mean of per-seed scores (a 25% trimmed mean: scipy.stats.trim_mean)."""
    from rliable import metrics

    return float(metrics.aggregate_iqm(_column(values)))


def probability_of_improvement(values: Sequence[float], baseline_values: Sequence[float]) -> float:
    """rliable's probability that a seed of `values` beats a seed of `baseline_values` (ties count half)."""
    from rliable import metrics

    return float(metrics.probability_of_improvement(_column(values), _column(baseline_values)))


@contextmanager
def _seeded_global_numpy(seed: int) -> Iterator[None]:
    """rliable's bootstrap draws from numpy's global generator (np.random.choice): seed it for reproducible
    intervals, and give the caller its own state back."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def pairwise_improvement(scores: np.ndarray, baseline_scores: np.ndarray) -> float:
    """P(X > Y) + 0.5 P(X = Y) over every pair of a seed of `scores` and one of `baseline_scores`: float64 (n, 1)
    and (m, 1) with one task. The same number as rliable's `metrics.probability_of_improvement` (its Mann-Whitney
    U statistic over n m is this count; equal arrays give 0.5 either way), without scipy's millisecond a call."""
    difference = scores[:, 0][:, None] - baseline_scores[:, 0][None, :]
    return float(((difference > 0).sum() + 0.5 * (difference == 0).sum()) / difference.size)


def sorted_iqm(scores: np.ndarray) -> float:
    """rliable's interquartile mean (`metrics.aggregate_iqm`: scipy's trim_mean cutting int(0.25 n) scores from each
    end) of float64 (n, 1) scores, by one sort: the same number (to the last bit or so: the middle scores are summed
    in sorted order) at a tenth of scipy's cost per bootstrap resample."""
    ordered = np.sort(scores, axis=None)
    cut = int(0.25 * ordered.size)
    return float(ordered[cut : ordered.size - cut].mean())


def _check_reps(reps: int) -> None:
    if not isinstance(reps, (int, np.integer)) or isinstance(reps, bool) or reps < 1:
        raise ValueError(f"bootstrap reps must be a positive integer, got {reps!r}")


def _estimate(point: float | None, interval: np.ndarray | None, n: int, note: str | None) -> dict:
    low, high = (float(interval[0]), float(interval[1])) if interval is not None else (None, None)
    return {"point": point, "low": low, "high": high, "n": n, "note": note}


def iqm_estimate(values: Sequence[float], reps: int = BOOTSTRAP_REPS, seed: int = BOOTSTRAP_SEED) -> dict:
    """IQM of per-seed scores with its 95% stratified-bootstrap percentile interval.

    values: one score per finished seed (floats).
    Returns {"point", "low", "high", "n", "note"}: point None without values; low / high None and note
    NEEDS_SEEDS with fewer than MIN_SEEDS values."""
    from rliable import library as rly

    _check_reps(reps)
    values = [float(v) for v in values]
    if not values:
        return _estimate(None, None, 0, NEEDS_SEEDS)
    point = iqm(values)
    if len(values) < MIN_SEEDS:
        return _estimate(point, None, len(values), NEEDS_SEEDS)
    with _seeded_global_numpy(seed):
        _, intervals = rly.get_interval_estimates(
            {"scores": _column(values)},
            lambda scores: np.array([sorted_iqm(scores)]),
            reps=int(reps),
            confidence_interval_size=CONFIDENCE,
        )
    return _estimate(point, intervals["scores"][:, 0], len(values), None)


def improvement_estimates(
    values: Sequence[float],
    baseline_values: Sequence[float],
    reps: int = BOOTSTRAP_REPS,
    seed: int = BOOTSTRAP_SEED,
) -> dict:
    """A variant against the baseline, each side's seeds resampled independently (rliable's
    StratifiedIndependentBootstrap, which `rly.get_interval_estimates` uses for a list of score arrays).

    values, baseline_values: one score per finished seed of the variant / the baseline (floats).
    Returns {"probability_of_improvement": estimate, "iqm_difference": estimate} (estimate as in
    `iqm_estimate`, plus "n_baseline"); intervals need MIN_SEEDS seeds on each side."""
    from rliable import library as rly

    _check_reps(reps)
    values = [float(v) for v in values]
    baseline_values = [float(v) for v in baseline_values]
    if not values or not baseline_values:
        empty = {**_estimate(None, None, len(values), NEEDS_SEEDS), "n_baseline": len(baseline_values)}
        return {"probability_of_improvement": dict(empty), "iqm_difference": dict(empty)}
    poi = probability_of_improvement(values, baseline_values)
    difference = iqm(values) - iqm(baseline_values)
    intervals = None
    if min(len(values), len(baseline_values)) >= MIN_SEEDS:

        def statistics(scores: np.ndarray, baseline_scores: np.ndarray) -> np.ndarray:
            return np.array(
                [pairwise_improvement(scores, baseline_scores), sorted_iqm(scores) - sorted_iqm(baseline_scores)]
            )

        with _seeded_global_numpy(seed):
            _, found = rly.get_interval_estimates(
                {"pair": [_column(values), _column(baseline_values)]},
                statistics,
                reps=int(reps),
                confidence_interval_size=CONFIDENCE,
            )
        intervals = found["pair"]  # (2 bounds, 2 statistics)
    note = None if intervals is not None else NEEDS_SEEDS
    return {
        name: {
            **_estimate(point, intervals[:, column] if intervals is not None else None, len(values), note),
            "n_baseline": len(baseline_values),
        }
        for column, (name, point) in enumerate((("probability_of_improvement", poi), ("iqm_difference", difference)))
    }


def seed_statistics(finished: Sequence[dict], baseline: Sequence[dict] | None, reps: int = BOOTSTRAP_REPS) -> dict:
    """IQM of final success and normalized AUC over `finished` runs, and (when `baseline` runs are given) the
    probability of improvement and IQM difference against them, each with its bootstrap interval.

    finished, baseline: one dict per finished run with "final" (float) and "auc" (float or None).
    Returns {"iqm": {"final": estimate, "auc": estimate}, "vs_baseline": None or {"final": {...}, "auc": {...}}}
    (estimates as in `iqm_estimate` / `improvement_estimates`)."""
    finals = [e["final"] for e in finished]
    aucs = [e["auc"] for e in finished if e.get("auc") is not None]
    found = {"iqm": {"final": iqm_estimate(finals, reps), "auc": iqm_estimate(aucs, reps)}, "vs_baseline": None}
    if baseline is not None:
        base_aucs = [e["auc"] for e in baseline if e.get("auc") is not None]
        found["vs_baseline"] = {
            "final": improvement_estimates(finals, [e["final"] for e in baseline], reps),
            "auc": improvement_estimates(aucs, base_aucs, reps),
        }
    return found


def ceilings_used(entries: Sequence[dict]) -> list[dict]:
    """The ceilings finished runs used: [{"value", "source", "runs"}], one per distinct (value, source)."""
    counted: dict[tuple[float, str], int] = {}
    for entry in entries:
        if "ceiling" in entry:
            counted[(entry["ceiling"], entry["ceiling_source"])] = (
                counted.get((entry["ceiling"], entry["ceiling_source"]), 0) + 1
            )
    return [{"value": value, "source": source, "runs": runs} for (value, source), runs in sorted(counted.items())]


def bootstrap_note(reps: int) -> dict:
    """How the intervals were computed, for ablation.json / rw compare."""
    return {
        "method": "rliable stratified bootstrap, percentile interval; each variant's seeds resampled "
        "independently, one task (the held-out set)",
        "reps": reps,
        "seed": BOOTSTRAP_SEED,
        "confidence": CONFIDENCE,
        "min_seeds": MIN_SEEDS,
    }


# --------------------------------------------------------------------------------------------
# In words
# --------------------------------------------------------------------------------------------


def format_estimate(estimate: dict | None, digits: int = 3, signed: bool = False) -> str:
    """'0.420 [0.300, 0.510]', '0.420 (needs >= 5 seeds)', or '—' without a point estimate."""
    if not estimate or estimate.get("point") is None:
        return "—"

    def number(value: float) -> str:
        return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"

    if estimate.get("low") is None:
        return f"{number(estimate['point'])} ({estimate.get('note') or NEEDS_SEEDS})"
    return f"{number(estimate['point'])} [{number(estimate['low'])}, {number(estimate['high'])}]"


def metric_notes(baseline: str | None, reach_step: int = REACH_STEP, reps: int = BOOTSTRAP_REPS) -> dict[str, str]:
    """One plain sentence per metric of an ablation table or a comparison, keyed as in ablation.json."""
    versus = baseline or "the baseline"
    return {
        "final": "Final: held-out success at the last evaluated step (one sampled episode per held-out task).",
        "best": "Best: the highest held-out success at any evaluated step (an optimistic pick, for reference).",
        "auc": "Normalized AUC: the area under the held-out success curve (trapezoids between evaluated steps) "
        "divided by (last step - first step) x the ceiling; 1.0 means at the ceiling from the first evaluation "
        "on, so it rewards learning early as well as ending high.",
        "ceiling": "Ceiling: the best held-out success any policy can reach on the environment, read from the "
        f"evaluation rows' eval/ceiling, or {DEFAULT_CEILING} where a run does not log it.",
        "steps_to_baseline": f"Steps to baseline: the first evaluated step at which a seed reaches {versus}'s mean "
        "final success, averaged over the seeds that reach it (with how many do); half the ceiling instead where "
        f"{versus} ended no higher than it started (a level every run holds at step 0).",
        "steps_to_reach": f"Steps to reach: the first evaluated step at which a seed reaches {versus}'s mean "
        f"held-out success at step {reach_step} (Arise fig. 3(b)), averaged over the seeds that reach it; half "
        f"the ceiling instead where {versus} was no higher there than at its start.",
        "iqm": "IQM: the interquartile mean over seeds (the mean of the middle half; rliable's 25% trimmed mean), "
        "less swayed by one lucky or broken seed than the mean.",
        "interval": f"[low, high]: a {CONFIDENCE:.0%} stratified-bootstrap percentile interval over seeds "
        f"({reps} resamples, fixed seed, so the table is reproducible). With fewer than {MIN_SEEDS} finished "
        f"seeds no interval is given ('{NEEDS_SEEDS}'): from so few seeds a bootstrap interval comes out too "
        "narrow to trust; the point estimate is still shown.",
        "probability_of_improvement": f"P(improvement): the probability that a seed of the variant scores higher "
        f"than a seed of {versus} (ties count half), over every pair of their seeds; 0.5 = no difference.",
        "iqm_difference": f"IQM difference: the variant's IQM minus {versus}'s; an interval that excludes 0 says "
        "the seeds separate the two.",
    }
