"""`rw report`: paper-style PNG plots from a run folder written by `rw train`.

`render_report(run_dir, out_dir=None) -> dict[str, Path | str]` renders the plots below into
`out_dir` (default `RUN_DIR/report`) and returns, per plot name, the written file's `Path`, or a
`str` saying why the plot was skipped (missing or empty input, unreadable data). It never raises
for bad run-folder contents; only a `run_dir` that is not a folder raises `ValueError`. PNGs are
written atomically, with matplotlib's object API (no pyplot, no global backend switch).

Plots:
- `active_rubric_emphasis.png`: which capabilities are in the active reward set in each
  RewardWeaver stage, as their reward weight `1/|A|` (heatmap capability x stage, capabilities
  grouped by family; the RewardWeaver paper, figure 4).
- `sampling_probabilities.png`: adaptive pick probability per (task type, capability), averaged
  over the early / middle / late third of training (three heatmaps, blank where a pair was never
  eligible in that third; the Arise paper, figure 5).
- `pool_counts.png`: active rubrics, cumulative added and cumulative retired over steps (arise
  figure 4a).
- `success_curves.png`: training `success_rate` (raw and smoothed) and held-out
  `eval/success_rate` vs step.
- `llm_cost.png`: cumulative requests, tokens and (with judge.price_in / price_out) money of the LLM judge
  and the reflection model over steps (`judge/*`, `reflector/*`; skipped for a run without them).
- `credit_diagnosis.png`: groups whose outcome / reward / process term vary, entropy, and each judged
  rubric's within-group variation over steps (`rwcore.trainer.report_credit`).

Run-folder contract (what the trainer writes; everything optional, each plot needs its files):

- `metrics.jsonl`: one JSON object per line.
  Training rows: {"kind": "train", "step": int, "success_rate", "outcome_mean", "reward_mean",
  "kept_fraction", "active_rubrics", "invalid_rate", "loss", "time/step",
  "time/adaptive_fraction", ...}. Evaluation rows: {"kind": "eval", "step": int,
  "eval/success_rate", "eval/outcome_mean", ...}, one of them at step 0 before training.
  Rows without "kind" count as eval rows when they have "eval/success_rate", else as train rows.
  Unparsable lines (e.g. a torn last line of a killed run) are skipped and counted.
- `sampling.jsonl`: one JSON object per line,
  {"step": int, "pairs": [{"tag": str, "capability": str, "probability": float}, ...]}: the
  probability that an adaptive pick targets each eligible (task type, capability) pair at that
  step (discovery picks excluded). A pair absent from a row was not eligible (probability 0).
- `reward_stages.json`: a JSON list, one entry per RewardWeaver stage:
  {"stage": int, "start_step": int, "end_step": int | null (null = still running),
   "active": [capability id, ...], "families": {capability id: family},
   "strategy": str, "reason": str}.
- `pool_counts.json`: a JSON list, one entry per pool update:
  {"step": int, "active": int, "added": int, "retired": int}, where "active" is the number of
  active (non-retired) rubrics after the update and "added" / "retired" are the numbers added /
  retired AT that update (not cumulative; the plot accumulates them).
- `pool_events.json`: a JSON list of {"kind": "created" | "activated" | "hidden" | "refined" |
  "retired" | "retained", "rubric_id": str, "step": int, "pass_rate": float | null, ...}.
  Used for the pool plot only when `pool_counts.json` is missing (active = created - retired).
"""

from __future__ import annotations

import io
import json
import math
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable
from importlib import import_module
from pathlib import Path
from typing import Any

import numpy as np

from rwcore.trainer.run_paths import run_path

__all__ = ["render_report", "PLOTS", "load_jsonl"]


# Arise table 3 order; other capabilities follow alphabetically.
_CAPABILITY_ORDER = ("Understanding", "Execution", "Verification", "Debugging", "Efficiency")

_STYLE = {
    "font.size": 11,
    "axes.titlesize": 13,
    "axes.labelsize": 12,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "figure.titlesize": 14,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "savefig.dpi": 150,
}


class _Skip(Exception):
    """A plot cannot be drawn; the message is the reason."""


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def load_jsonl(path: str | os.PathLike) -> tuple[list[dict], int]:
    """JSON objects of a .jsonl file and the number of unparsable or non-object lines skipped."""
    rows: list[dict] = []
    bad = 0
    with open(path, encoding="utf-8", errors="replace") as stream:
        for line in stream:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(row, dict):
                rows.append(row)
            else:
                bad += 1
    return rows, bad


def _load_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as stream:
        return json.load(stream)


def _need(run_dir: Path, name: str) -> Path:
    path = run_dir / name
    if not path.is_file():
        raise _Skip(f"{name} not found")
    if path.stat().st_size == 0:
        raise _Skip(f"{name} is empty")
    return path


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _step(row: dict) -> int | None:
    step = row.get("step")
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step):
        return None
    return int(step)


def _order_capabilities(names: Iterable[str]) -> list[str]:
    names = set(names)
    known = [c for c in _CAPABILITY_ORDER if c in names]
    return known + sorted(names - set(known))


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _save(fig, path: Path) -> Path:
    from rwcore._io import atomic_write_bytes

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", facecolor="white")
    atomic_write_bytes(path, buffer.getvalue())
    return path


def _plot_active_rubric_emphasis(run_dir: Path, out: Path) -> Path:
    stages = _load_json(_need(run_dir, "reward_stages.json"))
    if not isinstance(stages, list):
        raise _Skip("reward_stages.json is not a list of stages")
    stages = [s for s in stages if isinstance(s, dict)]
    if not stages:
        raise _Skip("reward_stages.json has no stages")
    stages.sort(key=lambda s: (_number(s.get("stage")) or 0, _number(s.get("start_step")) or 0))
    families: dict[str, str] = {}
    first_active: dict[str, int] = {}
    for index, stage in enumerate(stages):
        fam = stage.get("families") or {}
        if isinstance(fam, dict):
            for cap, family in fam.items():
                if family:  # "" / null = unknown: grouped under "other"
                    families.setdefault(str(cap), str(family))
        for cap in stage.get("active") or []:
            first_active.setdefault(str(cap), index)
    if not first_active:
        raise _Skip("no capability was active in any stage")
    capabilities = sorted(
        first_active,
        key=lambda c: (families.get(c, "~other"), first_active[c], c),
    )
    weights = np.zeros((len(capabilities), len(stages)))
    row_of = {c: i for i, c in enumerate(capabilities)}
    for j, stage in enumerate(stages):
        active = [str(c) for c in stage.get("active") or []]
        for cap in active:
            weights[row_of[cap], j] = 1.0 / len(set(active))

    n_caps, n_stages = weights.shape
    cap_width = max(len(c) for c in capabilities)
    fam_width = max((len(families.get(c, "other")) for c in capabilities), default=5)
    width = min(22.0, max(8.0, 2.5 + 0.075 * (cap_width + fam_width) + 0.55 * n_stages))
    height = min(20.0, max(4.0, 2.3 + 0.33 * n_caps))
    fig = _figure(width, height)
    ax = fig.add_subplot()
    masked = np.ma.masked_where(weights == 0, weights)
    from matplotlib import colormaps

    cmap = colormaps["Blues"].with_extremes(bad="#f4f4f4")
    image = ax.imshow(
        masked, aspect="auto", cmap=cmap, vmin=0.0, vmax=max(float(weights.max()), 1e-9), interpolation="nearest"
    )
    ax.set_yticks(range(n_caps), labels=capabilities)
    labels = []
    for stage in stages:
        start = stage.get("start_step")
        end = stage.get("end_step")
        span = f"{start if start is not None else '?'}–{end if end is not None else ''}"
        labels.append(f"{stage.get('stage', '?')}\n{span}")
    ax.set_xticks(range(n_stages), labels=labels, fontsize=9 if n_stages > 8 else None)
    ax.set_xlabel("Stage (training steps)")
    ax.set_ylabel("Capability")
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    # Cell grid, then family groups separated by lines and labelled on the right.
    ax.set_xticks(np.arange(-0.5, n_stages, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, n_caps, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    groups: OrderedDict[str, list[int]] = OrderedDict()
    for i, cap in enumerate(capabilities):
        groups.setdefault(families.get(cap, "other"), []).append(i)
    for rows in list(groups.values())[1:]:
        ax.axhline(rows[0] - 0.5, color="#333333", linewidth=1.2)
    secondary = ax.secondary_yaxis("right")
    secondary.set_yticks([float(np.mean(rows)) for rows in groups.values()], labels=list(groups))
    secondary.tick_params(length=0)
    for label in secondary.get_yticklabels():
        label.set_fontweight("bold")
    colorbar = fig.colorbar(image, ax=ax, pad=0.02, shrink=0.9 if n_caps > 4 else 1.0)
    colorbar.set_label("Reward weight 1/|A|")
    strategies = sorted({str(s.get("strategy")) for s in stages if s.get("strategy")})
    title = "Active-rubric emphasis across RewardWeaver stages\n"
    if strategies:
        title += f"selection: {', '.join(strategies)}; "
    title += "grey = inactive"
    ax.set_title(title)
    return _save(fig, out / "active_rubric_emphasis.png")


def _plot_sampling_probabilities(run_dir: Path, out: Path) -> tuple[Path, str]:
    rows, bad = load_jsonl(_need(run_dir, "sampling.jsonl"))
    snapshots: list[tuple[int, dict[tuple[str, str], float]]] = []
    for row in rows:
        step = _step(row)
        pairs = row.get("pairs")
        if step is None or not isinstance(pairs, list):
            bad += 1
            continue
        probs: dict[tuple[str, str], float] = {}
        for pair in pairs:
            if not isinstance(pair, dict):
                continue
            p = _number(pair.get("probability"))
            if p is None or pair.get("tag") is None or pair.get("capability") is None:
                continue
            key = (str(pair["tag"]), str(pair["capability"]))
            probs[key] = probs.get(key, 0.0) + p
        snapshots.append((step, probs))
    if not snapshots:
        raise _Skip("sampling.jsonl has no rows with a step and pairs")
    snapshots.sort(key=lambda s: s[0])
    tags = sorted({k[0] for _, probs in snapshots for k in probs})
    capabilities = _order_capabilities({k[1] for _, probs in snapshots for k in probs})
    if not tags:
        raise _Skip("sampling.jsonl never lists an eligible (task type, capability) pair")

    n = len(snapshots)
    cuts = [0, max(1, round(n / 3)), max(2, round(2 * n / 3)), n] if n >= 3 else None
    windows = (
        [snapshots[cuts[i] : cuts[i + 1]] for i in range(3)]
        if cuts
        else [[snapshots[min(i, n - 1)]] for i in (0, n // 2, n - 1)]
    )
    names = ("Early", "Middle", "Late")
    grids = []
    for window in windows:
        grid = np.full((len(tags), len(capabilities)), np.nan)
        seen = np.zeros_like(grid, dtype=bool)
        total = np.zeros_like(grid)
        for _, probs in window:
            for (tag, cap), p in probs.items():
                i, j = tags.index(tag), capabilities.index(cap)
                seen[i, j] = True
                total[i, j] += p
        grid[seen] = total[seen] / len(window)  # absent from a row = not eligible = 0
        grids.append(grid)
    vmax = max(float(np.nanmax(g)) if np.isfinite(g).any() else 0.0 for g in grids) or 1.0

    from matplotlib import colormaps

    cmap = colormaps["viridis"].with_extremes(bad="white")
    tag_width = max(len(t) for t in tags)
    panel_w = 0.75 * len(capabilities) + 0.6
    width = min(24.0, 1.5 + 0.08 * tag_width + 3 * panel_w + 1.2)
    height = min(18.0, 2.6 + 0.42 * len(tags) + 0.06 * max(len(c) for c in capabilities))
    fig = _figure(width, height)
    axes = fig.subplots(1, 3, sharey=True)
    annotate = len(tags) * len(capabilities) <= 60
    image = None
    for k, (ax, grid, window, name) in enumerate(zip(axes, grids, windows, names)):
        image = ax.imshow(
            np.ma.masked_invalid(grid), cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest"
        )
        first, last = window[0][0], window[-1][0]
        span = f"step {first}" if first == last else f"steps {first}–{last}"
        ax.set_title(f"{name} ({span})")
        ax.set_xticks(range(len(capabilities)), labels=capabilities, rotation=40, ha="right", rotation_mode="anchor")
        ax.set_yticks(range(len(tags)), labels=tags)
        ax.set_xticks(np.arange(-0.5, len(capabilities), 1), minor=True)
        ax.set_yticks(np.arange(-0.5, len(tags), 1), minor=True)
        ax.grid(which="minor", color="#dddddd", linewidth=0.8)
        ax.tick_params(which="both", length=0)
        for spine in ax.spines.values():
            spine.set_visible(True)
            spine.set_color("#999999")
        if k == 0:
            ax.set_ylabel("Task type")
        ax.set_xlabel("Capability")
        if annotate:
            for i in range(len(tags)):
                for j in range(len(capabilities)):
                    if np.isfinite(grid[i, j]):
                        value = grid[i, j]
                        ax.text(
                            j,
                            i,
                            f"{value:.2f}",
                            ha="center",
                            va="center",
                            fontsize=8,
                            color="white" if value < 0.6 * vmax else "black",
                        )
    colorbar = fig.colorbar(image, ax=list(axes), pad=0.02, shrink=0.95)
    colorbar.set_label("Adaptive pick probability")
    fig.suptitle(
        "Adaptive sampling probability per (task type, capability)\n"
        "mean over each third of training; blank = pair not eligible, discovery excluded"
    )
    note = f"skipped {bad} malformed sampling.jsonl rows" if bad else ""
    return _save(fig, out / "sampling_probabilities.png"), note


def _pool_series_from_events(run_dir: Path) -> list[dict]:
    events = _load_json(_need(run_dir, "pool_events.json"))
    if not isinstance(events, list):
        raise _Skip("pool_events.json is not a list")
    per_step: dict[int, dict[str, int]] = {}
    for event in events:
        if not isinstance(event, dict):
            continue
        step = _step(event)
        kind = event.get("kind")
        if step is None or kind not in ("created", "retired"):
            continue
        counts = per_step.setdefault(step, {"added": 0, "retired": 0})
        counts["added" if kind == "created" else "retired"] += 1
    active = 0
    series = []
    for step in sorted(per_step):
        active += per_step[step]["added"] - per_step[step]["retired"]
        series.append({"step": step, "active": active, **per_step[step]})
    return series


def _plot_pool_counts(run_dir: Path, out: Path) -> tuple[Path, str]:
    note = ""
    try:
        series = _load_json(_need(run_dir, "pool_counts.json"))
        if not isinstance(series, list):
            raise _Skip("pool_counts.json is not a list")
    except _Skip as reason:
        try:
            series = _pool_series_from_events(run_dir)
        except _Skip as second:
            raise _Skip(f"{reason}; {second}") from None
        note = f"{reason}; counts derived from pool_events.json"
    points = []
    for row in series:
        if not isinstance(row, dict) or _step(row) is None:
            continue
        values = [_number(row.get(k)) for k in ("active", "added", "retired")]
        points.append((_step(row), *[v if v is not None else 0.0 for v in values]))
    if not points:
        raise _Skip("no pool updates recorded")
    points.sort()
    steps = np.array([p[0] for p in points])
    active = np.array([p[1] for p in points])
    added = np.cumsum([p[2] for p in points])
    retired = np.cumsum([p[3] for p in points])

    fig = _figure(7.0, 4.3)
    ax = fig.add_subplot()
    style = dict(drawstyle="steps-post", linewidth=2.0)
    marker = "o" if len(steps) <= 40 else None
    ax.plot(
        steps, added, label="Added (cumulative)", color="#2a9d8f", linestyle="--", marker=marker, markersize=4, **style
    )
    ax.plot(
        steps,
        retired,
        label="Retired (cumulative)",
        color="#e76f51",
        linestyle=":",
        marker=marker,
        markersize=4,
        **style,
    )
    ax.plot(steps, active, label="Active", color="#264653", marker=marker, markersize=4, **style)
    ax.set_xlabel("Training step")
    ax.set_ylabel("Number of rubrics")
    ax.set_title("Rubric pool: active, added and retired rubrics")
    ax.set_ylim(bottom=0)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", frameon=False)
    ax.text(
        0.99,
        0.02,
        f"final: {int(active[-1])} active, {int(added[-1])} added, {int(retired[-1])} retired",
        transform=ax.transAxes,
        ha="right",
        va="bottom",
        fontsize=9,
        color="#555555",
    )
    return _save(fig, out / "pool_counts.png"), note


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average (partial windows at the start)."""
    if window <= 1:
        return values
    cumulative = np.cumsum(np.insert(values, 0, 0.0))
    out = np.empty_like(values)
    for i in range(len(values)):
        lo = max(0, i + 1 - window)
        out[i] = (cumulative[i + 1] - cumulative[lo]) / (i + 1 - lo)
    return out


def _plot_success_curves(run_dir: Path, out: Path) -> tuple[Path, str]:
    rows, bad = load_jsonl(_need(run_dir, "metrics.jsonl"))
    train: dict[int, float] = {}
    evals: dict[int, float] = {}
    for row in rows:
        step = _step(row)
        if step is None:
            continue
        kind = row.get("kind")
        if kind == "eval" or (kind is None and "eval/success_rate" in row):
            value = _number(row.get("eval/success_rate"))
            if value is not None:
                evals[step] = value
        elif kind in (None, "train"):
            value = _number(row.get("success_rate"))
            if value is not None:
                train[step] = value  # a resumed run may repeat steps: the last row wins
    if not train and not evals:
        raise _Skip("metrics.jsonl has no success_rate or eval/success_rate values")

    fig = _figure(7.0, 4.3)
    ax = fig.add_subplot()
    if train:
        steps = np.array(sorted(train))
        values = np.array([train[s] for s in steps])
        window = max(1, len(values) // 20)
        ax.plot(steps, values, color="#8ab6d6", linewidth=0.8, alpha=0.6, label="Training (per step)")
        if window > 1:
            ax.plot(
                steps,
                _smooth(values, window),
                color="#1f5f8b",
                linewidth=2.2,
                label=f"Training ({window}-step moving average)",
            )
    if evals:
        steps = np.array(sorted(evals))
        values = np.array([evals[s] for s in steps])
        label = "Held-out evaluation"
        if len(values) >= 2:
            label += f" ({values[0]:.2f} → {values[-1]:.2f})"
        ax.plot(steps, values, color="#d1495b", linewidth=2.0, marker="o", markersize=5, label=label)
    ax.set_xlabel("Training step")
    ax.set_ylabel("Success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title("Task success during training")
    ax.legend(loc="upper left", frameon=False)
    notes = []
    if bad:
        notes.append(f"skipped {bad} unparsable metrics.jsonl lines")
    if not evals:
        notes.append("no eval rows")
    if not train:
        notes.append("no training rows")
    return _save(fig, out / "success_curves.png"), "; ".join(notes)


def _plot_llm_cost(run_dir: Path, out: Path) -> tuple[Path, str]:
    """Cumulative requests, tokens and (when priced) money of each LLM role over steps (judge/*, reflector/*)."""
    rows, bad = load_jsonl(_need(run_dir, "metrics.jsonl"))
    roles = [role for role in ("judge", "reflector") if any(f"{role}/requests" in row for row in rows)]
    if not roles:
        raise _Skip("metrics.jsonl has no judge/* or reflector/* figures (a run without an LLM judge)")
    priced = any(f"{role}/cost" in row for row in rows for role in roles)
    fig = _figure(11.0 if priced else 7.5, 4.0)
    axes = fig.subplots(1, 3 if priced else 2)
    colors = {"judge": "#1f5f8b", "reflector": "#d1495b"}
    for role in roles:
        steps, requests, tokens, money = [], [], [], []
        total = [0.0, 0.0, 0.0]
        for row in rows:
            step = _step(row)
            if step is None or f"{role}/requests" not in row:
                continue
            total[0] += _number(row.get(f"{role}/requests")) or 0.0
            total[1] += (_number(row.get(f"{role}/prompt_tokens")) or 0.0) + (
                _number(row.get(f"{role}/completion_tokens")) or 0.0
            )
            total[2] += _number(row.get(f"{role}/cost")) or 0.0
            steps.append(step)
            requests.append(total[0])
            tokens.append(total[1])
            money.append(total[2])
        axes[0].plot(steps, requests, color=colors[role], linewidth=2.0, label=role)
        axes[1].plot(steps, tokens, color=colors[role], linewidth=2.0, label=role)
        if priced:
            axes[2].plot(steps, money, color=colors[role], linewidth=2.0, label=role)
    for ax, label in zip(axes, ("Requests (cumulative)", "Tokens (cumulative)", "Cost (cumulative)")):
        ax.set_xlabel("Training step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", frameon=False)
    fig.suptitle("What the LLM roles cost")
    return _save(fig, out / "llm_cost.png"), f"skipped {bad} unparsable metrics.jsonl lines" if bad else ""


_RENDERERS: dict[str, Callable[[Path, Path], Any]] = {
    "active_rubric_emphasis": _plot_active_rubric_emphasis,
    "sampling_probabilities": _plot_sampling_probabilities,
    "pool_counts": _plot_pool_counts,
    "success_curves": _plot_success_curves,
    "llm_cost": _plot_llm_cost,
    # imported when drawn: report_credit reads this module's helpers
    "credit_diagnosis": lambda run, out: import_module("rwcore.trainer.report_credit").plot_credit_diagnosis(run, out),
}
PLOTS = tuple(_RENDERERS)


def render_report(
    run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None, notes: dict[str, str] | None = None
) -> dict[str, Path | str]:
    """Renders every plot; returns {plot name: written PNG Path, or the skip reason (str)}.

    `out_dir` defaults to RUN_DIR/report and is created. Pass a dict as `notes` to receive
    non-fatal remarks per plot (e.g. malformed lines skipped, counts derived from events).
    """
    run = Path(run_dir)
    if not run.is_dir():
        raise ValueError(f"run_dir {str(run)!r} is not a folder")
    out = Path(out_dir) if out_dir is not None else run_path(run / "report", "folder")  # never through a link
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"out_dir {str(out)!r}: cannot create ({error})") from None
    from matplotlib import rc_context

    results: dict[str, Path | str] = {}
    for name, renderer in _RENDERERS.items():
        try:
            with rc_context(_STYLE):
                outcome = renderer(run, out)
        except _Skip as reason:
            results[name] = f"skipped: {reason}"
            continue
        except Exception as error:  # bad data must not stop the other plots
            results[name] = f"skipped: could not read the inputs ({type(error).__name__}: {error})"
            continue
        if isinstance(outcome, tuple):
            outcome, note = outcome
            if note and notes is not None:
                notes[name] = note
        results[name] = outcome
    return results
