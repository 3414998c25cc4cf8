"""A table's results (ablation.json's content): per variant and seed the run's status and held-out figures, per
variant the statistics over its seeds (statistics.py), and the machine the table ran on."""

from __future__ import annotations

import datetime as _dt
import os
import platform
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rwcore.method import VARIANTS
from rwcore.trainer.ablate.plan import BASELINES, AblationPlan
from rwcore.trainer.ablate.statistics import (
    REACH_STEP,
    bootstrap_note,
    ceilings_used,
    eval_ceiling,
    eval_curve,
    mean_sd,
    meaningful_level,
    metric_notes,
    normalized_auc,
    reach_target,
    seed_statistics,
    steps_to_reach,
)
from rwcore.trainer.ablate.status import _read_status
from rwcore.trainer.machine import cpu_model

__all__ = ["summarize", "summarize_runs", "machine_note"]


def _run_entry(run_dir: Path) -> dict:
    """A run's status and, when finished with held-out evaluations, its per-run metrics (final, best, normalized
    AUC with the ceiling used, the curve)."""
    status = _read_status(run_dir) or {"status": "not run"}
    entry = {"status": status["status"], "run_dir": str(run_dir)}
    if status["status"] == "failed":
        entry["error"] = status.get("error", "")
    curve = eval_curve(run_dir)
    if status["status"] == "finished" and curve:
        ceiling, source = eval_ceiling(run_dir)
        entry.update(
            final=curve[-1][1],
            final_se=curve[-1][2],
            final_step=curve[-1][0],
            best=max(v for _, v, _ in curve),
            start=curve[0][1],
            curve=[list(c) for c in curve],
            auc=normalized_auc(curve, ceiling),
            ceiling=ceiling,
            ceiling_source=source,
        )
    return entry


def _reached(entries: Sequence[dict], key: str) -> dict:
    reached = [e[key] for e in entries if e.get(key) is not None]
    return {"mean": float(np.mean(reached)) if reached else None, "reached": len(reached), "of": len(entries)}


def summarize(plan: AblationPlan) -> dict:
    """Per variant and seed: status, final / best held-out success, normalized AUC, steps to reach the baseline's
    mean final success and its mean success at step REACH_STEP; per variant: mean and sd over finished seeds, and
    with MIN_SEEDS finished seeds the IQM and the comparison with the baseline with bootstrap intervals."""
    runs = {
        variant: {seed: _run_entry(plan.runs_dir / f"{variant}-s{seed}") for seed in plan.seeds}
        for variant in plan.variants
    }
    labels = {row: ", ".join(plan.points[row]) for row in plan.variants} if plan.points else None
    summary = summarize_runs(plan.paper, runs, plan.bootstrap_reps, baseline=plan.baseline, labels=labels)
    if plan.points:  # the grid's keys and values, in order
        grid: dict[str, list[str]] = {}
        for settings in plan.points.values():
            for key, _, value in (setting.partition("=") for setting in settings):
                grid.setdefault(key, []).extend([value] if value not in grid.get(key, []) else [])
        summary["grid"] = grid
    summary.update(
        seeds=plan.seeds,
        steps=plan.steps,
        machine=machine_note(plan.jobs),
        inapplicable=[
            {"variant": variant, **cell} for variant in plan.variants for cell in plan.inapplicable.get(variant, ())
        ],
    )
    return summary


def summarize_runs(
    paper: str,
    runs: dict[str, dict[int, dict]],
    bootstrap_reps: int,
    baseline: str | None = None,
    labels: dict[str, str] | None = None,
) -> dict:
    """The table's figures from run entries (variant -> seed -> an entry as `_run_entry` gives it, or as an earlier
    ablation.json stored it: "status", and when finished "final", "best", "start", "curve", "auc", "ceiling"):
    what `summarize` computes, for entries that may come from several folders (a table merged from two grids).
    baseline: the row compared with (default: the paper's, BASELINES); labels: each row's second column for a
    grid (its settings; default: the variant's paper row). The caller adds "seeds", "steps", "machine" and
    "inapplicable"."""
    baseline = baseline or BASELINES[paper]
    base_runs = [e for e in runs.get(baseline, {}).values() if "final" in e]
    base_finals = [e["final"] for e in base_runs]
    target = target_rule = None
    reach = reach_target([e["curve"] for e in base_runs], REACH_STEP)
    if base_runs:
        start = float(np.mean([e["start"] for e in base_runs]))
        ceiling = float(np.mean([e["ceiling"] for e in base_runs]))
        target, target_rule = meaningful_level(float(np.mean(base_finals)), start, ceiling)
        if reach:
            reach["baseline_value"] = reach["value"]
            reach["value"], reach["rule"] = meaningful_level(reach["value"], start, ceiling)
    rows = []
    for variant, seeds in runs.items():
        finished = [e for e in seeds.values() if "final" in e]
        for entry in finished:
            entry["steps_to_baseline"] = steps_to_reach(entry["curve"], target) if target is not None else None
            entry["steps_to_reach"] = steps_to_reach(entry["curve"], reach["value"]) if reach else None
        compared = base_runs if variant != baseline and baseline in runs else None
        rows.append(
            {
                "variant": variant,
                "paper_row": labels[variant] if labels else VARIANTS[variant].paper_row,
                "final": mean_sd([e["final"] for e in finished]),
                "best": mean_sd([e["best"] for e in finished]),
                "steps_to_baseline": _reached(finished, "steps_to_baseline"),
                "failed": sum(e["status"] == "failed" for e in seeds.values()),
                "seeds": {str(seed): entry for seed, entry in seeds.items()},
                "auc": mean_sd([e["auc"] for e in finished if e.get("auc") is not None]),
                "steps_to_reach": _reached(finished, "steps_to_reach"),
                "ceilings": ceilings_used(finished),
                **seed_statistics(finished, compared, bootstrap_reps),
            }
        )
    return {
        "paper": paper,
        "baseline": baseline,
        "baseline_final_mean": float(np.mean(base_finals)) if base_finals else None,
        "baseline_target": {"value": target, "rule": target_rule} if target is not None else None,
        "seeds": None,
        "steps": None,
        "rows": rows,
        "machine": None,
        "written": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "reach_target": reach,
        "ceilings": ceilings_used([e for variant in runs.values() for e in variant.values()]),
        "bootstrap": bootstrap_note(bootstrap_reps),
        "inapplicable": [],
        "notes": metric_notes(baseline, REACH_STEP, bootstrap_reps),
    }


def machine_note(jobs: int) -> dict:
    """The machine a table ran on. `cpu_capability` is the vector ISA torch's CPU kernels dispatch to
    (DEFAULT / AVX2 / AVX512): it changes float rounding, and these runs are chaotic in the last bit of a
    float, so two machines differing there give different curves from the same seed."""
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "jobs": jobs,
        "threads_per_run": max(1, (os.cpu_count() or 1) // jobs),
    }
