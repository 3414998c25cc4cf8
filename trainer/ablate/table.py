"""Rendering a table: ablation.md (the table, the statistics over seeds, a sentence per metric, the overrides a
variant could not apply, the failed runs), ablation.png (one point per seed) and ablation.json."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rwcore._io import atomic_write_bytes
from rwcore.trainer.ablate.plan import AblationPlan
from rwcore.trainer.ablate.statistics import MIN_SEEDS, NEEDS_SEEDS, REACH_STEP, format_estimate

__all__ = ["render_markdown", "plot_runs", "write_table"]


def _cpu_text(machine: dict) -> str:
    """' (AMD EPYC, torch kernels AVX512)'; empty for tables written before these were recorded."""
    parts = [
        part
        for part in (machine.get("cpu"), machine.get("cpu_capability") and f"torch kernels {machine['cpu_capability']}")
        if part
    ]
    return f" ({', '.join(parts)})" if parts else ""


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _reach_text(reach: dict | None, baseline: str) -> str:
    """Which of the baseline's evaluations 'steps to reach' measures against, in words."""
    if not reach:
        return f"{baseline} has no finished seed evaluated at or before step {REACH_STEP}: no target"
    if reach["exact"]:
        read = f"at step {reach['at_step']}"
    else:
        steps = sorted(set(reach["steps"]))
        why = "was not evaluated" if reach["at_step"] not in steps else "not every seed evaluated"
        read = (
            f"at step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))} (the last evaluation at or "
            f"before step {reach['at_step']}, which {why})"
        )
    level = _fmt(reach.get("baseline_value", reach["value"]))
    text = f"{baseline}'s mean held-out success {read}, {level} over {reach['seeds']} seed(s)"
    if reach.get("rule") == "half the ceiling":
        text += f" - no higher than its start, so half the ceiling instead: {_fmt(reach['value'])}"
    return text


def _ceiling_text(ceilings: Sequence[dict]) -> str:
    if not ceilings:
        return "no finished run"
    return "; ".join(
        f"{c['value']:g} for {c['runs']} run(s) ("
        + ("logged as eval/ceiling" if c["source"] == "eval/ceiling" else f"not logged: the {c['source']}")
        + ")"
        for c in ceilings
    )


def _reach_cell(reach: dict) -> str:
    return (
        f"{reach['mean']:.0f} ({reach['reached']}/{reach['of']})"
        if reach["mean"] is not None
        else f"never (0/{reach['of']})"
    )


def render_markdown(summary: dict) -> str:
    """ablation.md: the table (today's columns plus normalized AUC and steps to reach), the statistics over seeds,
    a sentence per metric, the overrides a variant could not apply and the failed runs. A summary written before
    the statistics existed renders its own columns only."""
    m = summary["machine"]
    baseline = summary["baseline"]
    has_stats = "notes" in summary
    grid = summary["paper"] == "grid"  # rw ablate --grid: rows are grid points, labelled by their settings
    row_kind, label_kind = ("grid point", "settings") if grid else ("variant", "paper row")
    lines = [
        f"# Grid: {', '.join(summary.get('grid') or {})}" if grid else f"# Ablation: {summary['paper']}",
        "",
        f"Held-out success (one sampled episode per held-out task, no skills) at the final step and the best "
        f"evaluated step, mean ± sd over seeds {', '.join(map(str, summary['seeds']))}; each seed's final "
        f"value in the last column. 'Steps to baseline' is the first evaluated step at which a seed reaches "
        f"{baseline}'s mean final success ({_fmt(summary['baseline_final_mean'])}"
        + (
            f"; it ended no higher than it started, so half the ceiling instead: "
            f"{_fmt(summary['baseline_target']['value'])}"
            if (summary.get("baseline_target") or {}).get("rule") == "half the ceiling"
            else ""
        )
        + f"), averaged over the seeds that reach it, with how many do (Arise fig. 3(b)). Wall time: "
        f"{_fmt(summary.get('wall_seconds'), 0)} s (every call into this folder together).",
        "",
        f"Machine: {m['processor']}{_cpu_text(m)}, {m['cpu_count']} cores, {m['platform']}, Python "
        f"{m['python']}, torch {m['torch']}; {m['jobs']} runs at a time, {m['threads_per_run']} thread(s) each.",
        "",
    ]
    if has_stats:
        lines += [
            f"'Steps to reach' measures against {_reach_text(summary.get('reach_target'), baseline)}. "
            f"Ceiling of the normalized AUC: {_ceiling_text(summary.get('ceilings', []))}.",
            "",
            f"| {row_kind} | {label_kind} | final | best | normalized AUC | steps to baseline | steps to reach "
            "| per-seed final |",
            "|---|---|---|---|---|---|---|---|",
        ]
    else:
        lines += [
            "| variant | paper row | final | best | steps to baseline | per-seed final |",
            "|---|---|---|---|---|---|",
        ]
    failures = []

    def stat(s):
        return f"{_fmt(s['mean'])} ± {_fmt(s['sd'])}" if s["n"] else "—"

    for row in summary["rows"]:
        per_seed = []
        for seed, entry in row["seeds"].items():
            if "final" in entry:
                per_seed.append(f"s{seed}: {entry['final']:.3f}")
            else:
                per_seed.append(f"s{seed}: {entry['status'].upper()}")
                if entry["status"] == "failed":
                    failures.append(f"- {row['variant']} seed {seed}: {entry.get('error', '')}")
        cells = [row["variant"], row["paper_row"], stat(row["final"]), stat(row["best"])]
        if has_stats:
            cells += [stat(row["auc"]), _reach_cell(row["steps_to_baseline"]), _reach_cell(row["steps_to_reach"])]
        else:
            cells.append(_reach_cell(row["steps_to_baseline"]))
        lines.append(f"| {' | '.join(cells)} | {', '.join(per_seed)} |")
    if has_stats:
        boot = summary["bootstrap"]
        lines += [
            "",
            f"## Over seeds: interquartile mean and comparison with {baseline}",
            "",
            f"Point estimate [{boot['confidence']:.0%} interval] over finished seeds; '{NEEDS_SEEDS}' where a variant "
            f"(or, for the comparison, {baseline}) has fewer than {boot['min_seeds']} finished seeds: the point "
            f"estimate alone. Intervals: {boot['method']}; {boot['reps']} resamples, seed {boot['seed']}.",
            "",
            f"| {row_kind} | seeds | IQM final | IQM normalized AUC | P(improvement) final | IQM difference final | "
            "P(improvement) AUC | IQM difference AUC |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in summary["rows"]:
            versus = row.get("vs_baseline")
            if versus:
                compare = [
                    format_estimate(versus["final"]["probability_of_improvement"]),
                    format_estimate(versus["final"]["iqm_difference"], signed=True),
                    format_estimate(versus["auc"]["probability_of_improvement"]),
                    format_estimate(versus["auc"]["iqm_difference"], signed=True),
                ]
            else:
                compare = ["(baseline)" if row["variant"] == baseline else "—"] * 4
            cells = [
                row["variant"],
                str(row["final"]["n"]),
                format_estimate(row["iqm"]["final"]),
                format_estimate(row["iqm"]["auc"]),
                *compare,
            ]
            lines.append(f"| {' | '.join(cells)} |")
        lines += ["", "## What each number is", ""]
        lines += [f"- {sentence}" for sentence in summary["notes"].values()]
        if summary.get("inapplicable"):
            lines += ["", "## Overrides a variant cannot apply", ""]
            lines += [f"- {cell['note']}." for cell in summary["inapplicable"]]
    if failures:
        lines += ["", "Failed runs (not averaged in):", *failures]
    return "\n".join(lines) + "\n"


def plot_runs(summary: dict, path: Path) -> Path:
    """One point per seed (final held-out success), the mean per variant, and the IQM with its interval where a
    variant has enough seeds for one."""
    from rwcore.trainer.report import _figure, _save

    rows = summary["rows"]
    fig = _figure(max(6.0, 1.0 * len(rows) + 2), 4.2)
    ax = fig.add_subplot()
    for x, row in enumerate(rows):
        finals = [e["final"] for e in row["seeds"].values() if "final" in e]
        if finals:
            offsets = np.linspace(-0.15, 0.15, len(finals)) if len(finals) > 1 else [0.0]
            ax.scatter([x + o for o in offsets], finals, color="#1f5f8b", s=22, zorder=3)
            ax.hlines(np.mean(finals), x - 0.3, x + 0.3, color="#d1495b", linewidth=2)
        estimate = (row.get("iqm") or {}).get("final") or {}
        if estimate.get("low") is not None:
            point = estimate["point"]
            ax.errorbar(
                x + 0.3,
                point,
                yerr=[[point - estimate["low"]], [estimate["high"] - point]],
                fmt="D",
                markersize=4,
                color="black",
                capsize=3,
                zorder=4,
            )
        failed = sum(e["status"] == "failed" for e in row["seeds"].values())
        if failed:
            ax.annotate(f"{failed} failed", (x, 0.02), ha="center", fontsize=8, color="#d1495b")
    ax.set_xticks(range(len(rows)), [row["variant"] for row in rows], rotation=30, ha="right")
    ax.set_ylabel("Final held-out success")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3, axis="y")
    ax.set_title(
        f"{summary['paper']} ablation: one point per seed, bar = mean, "
        f"diamond = IQM with 95% interval (>= {MIN_SEEDS} seeds)",
        fontsize=9,
    )
    return _save(fig, path)


def write_table(plan: AblationPlan, summary: dict) -> list[Path]:
    plan.out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(plan.out / "ablation.json", json.dumps(summary, indent=1).encode())
    atomic_write_bytes(plan.out / "ablation.md", render_markdown(summary).encode())
    return [plan.out / "ablation.md", plan.out / "ablation.json", plot_runs(summary, plan.out / "ablation.png")]
