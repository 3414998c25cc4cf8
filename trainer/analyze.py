"""`rw analyze`: RewardWeaver's appendix E and G tables from a run folder, as JSON, Markdown and PNG.

Inputs (written by `rw train` for variants with RewardWeaver stages):

- `reward_history.json`: one record per stage k. Its `diagnosis` holds the attributed deficit
  rates of the fresh on-policy batch that opened the stage: `failure_rates` (F_fail_{k,d}, the
  low-outcome cohort) and `success_rates` (F_succ_{k,d}, a sample of the successful
  trajectories, `rewardweaver.success_sample`); `active` is the stage's active set A_k.
- `diagnostics.json`: the fixed diagnostic set's mean score per capability at every stage
  boundary and at the end of training ({"step", "scores": {capability: S or null}}).

Appendix E (`bottleneck.*`): bottleneck importance I_{k,d} = F_fail - F_succ against the
next-stage failure reduction dF_{k,d} = F_fail_{k,d} - F_fail_{k+1,d} over every capability-stage
pair with all three defined: Spearman(I, dF), Spearman(F_fail, dF), the partial Spearman of I and
dF given F_fail, and the within-stage Spearman (`rwcore.rewardweaver.bottleneck_association`).

Appendix G (`retention.*`): S_{k,d} is the diagnostic score at the end of stage k (the boundary that
closes it; the last stage's is the end of training; a stage opened at the very end, never trained
under, is left out). For a capability active at stage k and not
at k+1, dS_{t,d} = S_{k+t,d} - S_{k,d} until it is active again (`capability_retention`).

Undefined correlations (too few pairs, constant inputs) are reported as null / "n/a".
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from rwcore._io import atomic_write_bytes
from rwcore.trainer.report import _figure, _save
from rwcore.trainer.run_paths import run_path

__all__ = ["analyze_run"]


def _load(path: Path, what: str):
    if not path.is_file():
        raise ValueError(f"{path.parent}: no {path.name} ({what})")
    try:
        return json.loads(path.read_text())
    except ValueError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None


def _finite(value) -> float | None:
    return (
        float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        else None
    )


def _fmt(value) -> str:
    value = _finite(value)
    return "n/a" if value is None else f"{value:.3f}"


def _capabilities(stages: list[dict]) -> list[str]:
    seen: dict[str, None] = {}
    for record in stages:
        for key in ("failure_rates", "success_rates"):
            seen.update(dict.fromkeys((record.get("diagnosis") or {}).get(key) or {}))
        seen.update(dict.fromkeys(record.get("active") or []))
    return list(seen)


def _matrix(stages: list[dict], key: str, ids: list[str]) -> np.ndarray:
    out = np.full((len(stages), len(ids)), np.nan)
    for k, record in enumerate(stages):
        table = (record.get("diagnosis") or {}).get(key) or {}
        for j, cid in enumerate(ids):
            value = _finite(table.get(cid))
            if value is not None:
                out[k, j] = value
    return out


def _write(out: Path, name: str, payload: dict, markdown: str) -> list[Path]:
    json_path, md_path = out / f"{name}.json", out / f"{name}.md"
    atomic_write_bytes(json_path, json.dumps(payload, indent=1, allow_nan=False).encode())
    atomic_write_bytes(md_path, markdown.encode())
    return [json_path, md_path]


def _bottleneck(stages: list[dict], ids: list[str], out: Path) -> list[Path]:
    from rwcore.rewardweaver import bottleneck_association

    fail, succ = _matrix(stages, "failure_rates", ids), _matrix(stages, "success_rates", ids)
    if len(stages) < 2:
        raise ValueError(f"appendix E needs at least 2 RewardWeaver stages; the run has {len(stages)}")
    result = bottleneck_association(fail, succ)
    pairs = []
    for k in range(len(stages) - 1):
        for j, cid in enumerate(ids):
            values = (fail[k, j], succ[k, j], fail[k + 1, j])
            pairs.append(
                {
                    "stage": k,
                    "capability": cid,
                    "F_fail": _finite(values[0]),
                    "F_succ": _finite(values[1]),
                    "importance": _finite(values[0] - values[1]),
                    "next_stage_reduction": _finite(values[0] - values[2]),
                }
            )
    summary = {
        "importance_rho": _finite(result.importance_rho),
        "failure_rate_rho": _finite(result.failure_rate_rho),
        "partial_rho": _finite(result.partial_rho),
        "within_stage_rho": _finite(result.within_stage_rho),
        "n_pairs": result.n_pairs,
        "stages": len(stages),
        "capabilities": len(ids),
    }
    lines = [
        "# Bottleneck attribution and next-stage failure reduction (RewardWeaver appendix E, table E1)",
        "",
        f"{summary['n_pairs']} capability-stage pairs ({len(ids)} capabilities, {len(stages) - 1} stage transitions).",
        "",
        "| Signal at stage k vs. reduction of attributed failures at k+1 | Spearman rho |",
        "|---|---|",
        f"| Bottleneck importance I = F_fail - F_succ | {_fmt(summary['importance_rho'])} |",
        f"| Current failure rate F_fail | {_fmt(summary['failure_rate_rho'])} |",
        f"| Importance, controlling for F_fail (partial) | {_fmt(summary['partial_rho'])} |",
        f"| Importance, within stage | {_fmt(summary['within_stage_rho'])} |",
        "",
        "| stage | capability | F_fail | F_succ | I | next-stage reduction |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {p['stage']} | {p['capability']} | {_fmt(p['F_fail'])} | {_fmt(p['F_succ'])} | "
        f"{_fmt(p['importance'])} | {_fmt(p['next_stage_reduction'])} |"
        for p in pairs
    ]
    written = _write(out, "bottleneck", {"summary": summary, "pairs": pairs}, "\n".join(lines) + "\n")
    fig = _figure(5.5, 4.0)
    ax = fig.add_subplot()
    usable = [p for p in pairs if p["importance"] is not None and p["next_stage_reduction"] is not None]
    if usable:
        ax.scatter(
            [p["importance"] for p in usable],
            [p["next_stage_reduction"] for p in usable],
            s=18,
            c=[p["stage"] for p in usable],
            cmap="viridis",
        )
    ax.axhline(0, color="0.7", lw=0.8)
    ax.axvline(0, color="0.7", lw=0.8)
    ax.set_xlabel("bottleneck importance I (stage k)")
    ax.set_ylabel("failure reduction (k -> k+1)")
    ax.set_title(f"Spearman rho = {_fmt(summary['importance_rho'])} over {summary['n_pairs']} pairs")
    written.append(_save(fig, out / "bottleneck.png"))
    return written


def _retention(stages: list[dict], ids: list[str], points: list[dict], out: Path) -> list[Path]:
    from rwcore.rewardweaver import capability_retention

    if not points:
        raise ValueError("appendix G needs diagnostics.json points (rewardweaver.diagnostic_tasks > 0)")
    by_step = {int(p["step"]): p for p in points}
    last_step = max(by_step)
    # a stage opened at the end of training was never trained under: it has no score of its own
    stages = [
        r for r in stages if (r.get("end_step") if r.get("end_step") is not None else last_step) > r["start_step"]
    ]
    scores = np.full((len(stages), len(ids)), np.nan)
    active = np.zeros((len(stages), len(ids)), dtype=bool)
    ends = []
    for k, record in enumerate(stages):
        end = record.get("end_step")
        end = last_step if end is None else int(end)
        ends.append(end)
        point = by_step.get(end, {})
        for j, cid in enumerate(ids):
            value = _finite((point.get("scores") or {}).get(cid))
            if value is not None:
                scores[k, j] = value
            active[k, j] = cid in (record.get("active") or [])
    result = capability_retention(scores, active, ids)
    events = [
        {
            "capability": e.capability_id,
            "last_active_stage": e.last_active_stage,
            "deltas": [{"after_stages": t, "change": _finite(d)} for t, d in e.deltas],
        }
        for e in result.events
    ]
    summary = {
        "observations": result.n,
        "mean": _finite(result.mean),
        "median": _finite(result.median),
        "min": _finite(result.min),
        "max": _finite(result.max),
        "deactivations": len(events),
    }
    table = {cid: [_finite(scores[k, j]) for k in range(len(stages))] for j, cid in enumerate(ids)}
    lines = [
        "# Capability retention after deactivation (RewardWeaver appendix G, table G1)",
        "",
        "Diagnostic score S (mean over applicable episodes of the fixed diagnostic set, no skills) at the end of "
        "each stage; `*` marks the stages where the capability was in the active set.",
        "",
        f"{summary['deactivations']} deactivation(s), {summary['observations']} post-deactivation observation(s): "
        f"mean change {_fmt(summary['mean'])}, median {_fmt(summary['median'])}, min {_fmt(summary['min'])}, "
        f"max {_fmt(summary['max'])}.",
        "",
        "| capability | " + " | ".join(f"stage {k} (step {ends[k]})" for k in range(len(stages))) + " |",
        "|---|" + "---|" * len(stages),
    ]
    for j, cid in enumerate(ids):
        cells = [_fmt(scores[k, j]) + ("*" if active[k, j] else "") for k in range(len(stages))]
        lines.append(f"| {cid} | " + " | ".join(cells) + " |")
    if events:
        lines += ["", "| capability | last active stage | change after 1, 2, ... stages |", "|---|---|---|"]
        lines += [
            f"| {e['capability']} | {e['last_active_stage']} | "
            + ", ".join(_fmt(d["change"]) for d in e["deltas"])
            + " |"
            for e in events
        ]
    written = _write(
        out,
        "retention",
        {
            "summary": summary,
            "events": events,
            "scores": table,
            "stage_end_steps": ends,
            "active": {cid: [bool(active[k, j]) for k in range(len(stages))] for j, cid in enumerate(ids)},
        },
        "\n".join(lines) + "\n",
    )
    fig = _figure(6.5, 4.0)
    ax = fig.add_subplot()
    for j, cid in enumerate(ids):
        if np.isfinite(scores[:, j]).any():
            (line,) = ax.plot(range(len(stages)), scores[:, j], marker="o", ms=3, lw=1, label=cid)
            on = np.flatnonzero(active[:, j] & np.isfinite(scores[:, j]))
            ax.scatter(on, scores[on, j], s=36, facecolors="none", edgecolors=line.get_color())
    ax.set_xlabel("stage (score at its end; circled: active)")
    ax.set_ylabel("diagnostic score S")
    ax.set_ylim(-0.05, 1.05)
    if len(ids) <= 14:
        ax.legend(fontsize=6, ncols=2, loc="lower right")
    written.append(_save(fig, out / "retention.png"))
    return written


def analyze_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Writes bottleneck.{json,md,png} and retention.{json,md,png} into `out_dir` (default
    RUN_DIR/analysis); returns the paths. ValueError (naming the file) when the run cannot give them."""
    run = Path(run_dir)
    if not run.is_dir():
        raise ValueError(f"RUN_DIR {str(run)!r} is not a folder")
    history = _load(
        run / "reward_history.json",
        "the RewardWeaver stages: run a variant with a process reward from "
        "the capability library, e.g. train.method=combined or rewardweaver",
    )
    stages = history.get("stages") if isinstance(history, dict) else None
    if not isinstance(stages, list):
        raise ValueError(f"{run / 'reward_history.json'}: no 'stages' list")
    points = _load(run / "diagnostics.json", "the fixed diagnostic set's scores")
    ids = _capabilities(stages)
    if out_dir is None:  # inside the run folder: never through a link someone left there
        out = run_path(run / "analysis", "folder", create=True)
    else:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
    return _bottleneck(stages, ids, out) + _retention(stages, ids, points, out)
