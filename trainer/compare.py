"""`rw compare`: several runs' held-out success curves on one plot, and the runs grouped by config.

Runs whose config.yaml differs only in train.seed are one group (the seeds of one variant); per group the mean
final held-out success and normalized AUC, with enough seeds the IQM with its bootstrap interval, and against a
baseline group the probability of improvement and the IQM difference (the statistics of trainer/ablate/statistics.py,
the same `rw ablate` reports).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rwcore.trainer.ablate.statistics import (
    BOOTSTRAP_REPS,
    REACH_STEP,
    bootstrap_note,
    ceilings_used,
    eval_ceiling,
    eval_curve,
    mean_sd,
    metric_notes,
    normalized_auc,
    seed_statistics,
)

__all__ = ["plot_compare", "group_runs", "compare_groups", "SEED_KEY"]

SEED_KEY = "train.seed"


def plot_compare(run_dirs: Sequence[str | os.PathLike], path: str | os.PathLike) -> tuple[Path, list[dict]]:
    """Held-out success curves of several runs on one plot (with ±1 standard error bands where logged).
    Returns the PNG path and one summary per run; ValueError names a run without held-out evaluations, or a `path`
    that cannot be a file (a folder, or under a file). Missing folders of `path` are created; the PNG is written
    atomically."""
    from rwcore.trainer.report import _figure, _save

    path = Path(path)
    if path.is_dir():
        raise ValueError(f"--out {str(path)!r} is a folder; name the PNG file to write")
    blocking = next((parent for parent in path.parents if parent.exists() and not parent.is_dir()), None)
    if blocking is not None:
        raise ValueError(f"--out {str(path)!r} cannot be written: {str(blocking)!r} is a file, not a folder")
    curves = []
    for run_dir in run_dirs:
        run_dir = Path(run_dir)
        if not run_dir.is_dir():
            raise ValueError(f"RUN_DIR {str(run_dir)!r} is not a folder")
        curve = eval_curve(run_dir)
        if not curve:
            raise ValueError(f"RUN_DIR {str(run_dir)!r} has no held-out evaluation rows in metrics.jsonl")
        curves.append((run_dir, curve))
    fig = _figure(7.0, 4.3)
    ax = fig.add_subplot()
    summaries = []
    names = _short_names([d for d, _ in curves])
    for index, ((run_dir, curve), name) in enumerate(zip(curves, names)):
        steps = np.array([c[0] for c in curve])
        values = np.array([c[1] for c in curve])
        # ten colours, then the same ten dashed (and so on), so that no two of many runs look alike
        (line,) = ax.plot(
            steps,
            values,
            marker="o",
            markersize=3,
            linewidth=1.6,
            color=f"C{index % 10}",
            linestyle=("-", "--", ":", "-.")[index // 10 % 4],
            label=f"{name} ({values[0]:.2f} → {values[-1]:.2f})",
        )
        if all(c[2] is not None for c in curve):
            se = np.array([c[2] for c in curve])
            ax.fill_between(steps, values - se, values + se, color=line.get_color(), alpha=0.15, linewidth=0)
        summaries.append(
            {
                "run": str(run_dir),
                "name": name,
                "start": float(values[0]),
                "final": float(values[-1]),
                "best": float(values.max()),
                "final_step": int(steps[-1]),
            }
        )
    ax.set_xlabel("Training step")
    ax.set_ylabel("Held-out success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", frameon=False, fontsize=8)
    ax.set_title("Held-out success (±1 standard error)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return _save(fig, path), summaries
    except OSError as error:
        raise ValueError(f"--out {str(path)!r} cannot be written ({error.strerror or error})") from None


def _short_names(run_dirs: Sequence[Path]) -> list[str]:
    names = [d.name for d in run_dirs]
    if len(set(names)) == len(names):
        return names
    return [str(d) for d in run_dirs]


# --------------------------------------------------------------------------------------------
# Runs grouped by config
# --------------------------------------------------------------------------------------------


def _flatten(data: dict, prefix: str = "") -> dict:
    """{"train": {"seed": 0}} -> {"train.seed": 0}; an empty mapping stays a value ({})."""
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _run_config(run_dir: Path) -> tuple[dict | None, object]:
    """(a run's config.yaml flattened to section.key -> value without train.seed, its train.seed), or (None, None)
    without config.yaml. A pool.frozen_from naming the same seed's run (`<variant>-s<seed>`, as rw ablate writes
    it) is compared with the seed left out, so the seeds of arise_frozen_rubrics fall into one group."""
    from rwcore.trainer.config import read_yaml_file

    path = run_dir / "config.yaml"
    if not path.is_file():
        return None, None
    # read as rw reads a config file (bounded in size, depth and values, plain data only): RUN_DIR is any folder
    data = read_yaml_file(path, f"RUN_DIR {str(run_dir)!r}: config.yaml")
    if not isinstance(data, dict):
        raise ValueError(f"RUN_DIR {str(run_dir)!r}: config.yaml is not a mapping of sections")
    flat = _flatten(data)
    seed = flat.pop(SEED_KEY, None)
    frozen = flat.get("pool.frozen_from")
    if isinstance(frozen, str) and isinstance(seed, int):
        flat["pool.frozen_from"] = re.sub(rf"-s{seed}(/?)$", r"-s<seed>\1", frozen)
    return flat, seed


def _shown(value: object) -> str:
    """A config value in a group's name: strings bare ('' when empty), anything else as JSON."""
    if isinstance(value, str):
        return value or "''"
    return json.dumps(value, default=str)


def group_runs(run_dirs: Sequence[str | os.PathLike]) -> list[dict]:
    """Runs whose config.yaml differs only in train.seed, grouped, in the order they first appear.

    Returns [{"name", "config" (flat, without train.seed; None for a run without config.yaml, which is a group
    of its own), "runs": [Path], "seeds": [train.seed or None]}]. A group's name is the config keys that differ
    between groups (train.method first), e.g. "train.method=arise, optim.lr=0.001"; with one group, its
    train.method."""
    groups: dict[str, dict] = {}
    for run_dir in map(Path, run_dirs):
        config, seed = _run_config(run_dir)
        key = json.dumps(config, sort_keys=True, default=str) if config is not None else f"run:{run_dir}"
        group = groups.setdefault(key, {"config": config, "runs": [], "seeds": []})
        group["runs"].append(run_dir)
        group["seeds"].append(seed)
    listed = list(groups.values())
    configs = [g["config"] for g in listed if g["config"] is not None]
    keys = sorted({k for c in configs for k in c}, key=lambda k: (k != "train.method", k))
    differing = [k for k in keys if len({json.dumps(c.get(k, "(unset)"), default=str) for c in configs}) > 1]
    short = dict(zip([d for g in listed for d in g["runs"]], _short_names([d for g in listed for d in g["runs"]])))
    for group in listed:
        config = group["config"]
        if config is None:
            group["name"] = short[group["runs"][0]]
        elif differing:
            group["name"] = ", ".join(f"{k}={_shown(config.get(k, '(unset)'))}" for k in differing)
        else:
            group["name"] = f"train.method={config.get('train.method', '?')}"
    return listed


def _find_baseline(spec: str, groups: Sequence[dict]) -> dict:
    """The group --baseline names: a group's name, a train.method that one group has, or a RUN_DIR (path or
    glob pattern) whose runs all fall in one group; ValueError naming --baseline otherwise."""
    named = [g for g in groups if g["name"] == spec]
    if named:
        return named[0]
    by_method = [g for g in groups if g["config"] is not None and g["config"].get("train.method") == spec]
    if len(by_method) == 1:
        return by_method[0]
    if len(by_method) > 1:
        raise ValueError(
            f"--baseline {spec!r} is the train.method of {len(by_method)} groups "
            f"({'; '.join(g['name'] for g in by_method)}): name one of them"
        )

    def matches(run: Path) -> bool:
        if Path(spec).exists() and Path(spec).resolve() == run.resolve():
            return True
        pattern = spec.rstrip("/")
        return fnmatch.fnmatchcase(str(run).rstrip("/"), pattern) or fnmatch.fnmatchcase(run.name, pattern)

    matched = [g for g in groups if any(matches(run) for run in g["runs"])]
    if len(matched) == 1:
        return matched[0]
    if len(matched) > 1:
        raise ValueError(
            f"--baseline {spec!r} matches runs of {len(matched)} groups ({'; '.join(g['name'] for g in matched)}): "
            "match the runs of one config"
        )
    raise ValueError(
        f"--baseline {spec!r} names no group and matches no RUN_DIR; give a RUN_DIR (or a glob pattern of them), "
        f"a train.method, or a group: {'; '.join(g['name'] for g in groups)}"
    )


def compare_groups(
    run_dirs: Sequence[str | os.PathLike], baseline: str | None = None, reps: int = BOOTSTRAP_REPS
) -> dict:
    """`rw compare`'s numbers: the runs grouped by config (`group_runs`); per group the mean and sd of final held-out
    success and normalized AUC, and with MIN_SEEDS runs the IQM of each with its interval; with `baseline` (see
    `_find_baseline`) also every other group's probability of improvement and IQM difference against it.

    Returns {"groups": [{"name", "runs", "seeds", "final", "auc", "ceilings", "iqm", "vs_baseline", "baseline"}],
    "baseline": its name or None, "bootstrap", "notes"}; ValueError names a bad RUN_DIR or --baseline."""
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"--bootstrap-reps must be a positive integer, got {reps!r}")
    for run_dir in map(Path, run_dirs):
        if not run_dir.is_dir():
            raise ValueError(f"RUN_DIR {str(run_dir)!r} is not a folder")
    groups = group_runs(run_dirs)
    chosen = _find_baseline(baseline, groups) if baseline is not None else None
    entries = {id(g): [_compare_entry(run) for run in g["runs"]] for g in groups}
    listed = []
    for group in groups:
        finished = entries[id(group)]
        compared = entries[id(chosen)] if chosen is not None and group is not chosen else None
        listed.append(
            {
                "name": group["name"],
                "runs": [str(run) for run in group["runs"]],
                "seeds": group["seeds"],
                "final": mean_sd([e["final"] for e in finished]),
                "auc": mean_sd([e["auc"] for e in finished if e["auc"] is not None]),
                "ceilings": ceilings_used(finished),
                **seed_statistics(finished, compared, reps),
                "baseline": group is chosen,
            }
        )
    return {
        "groups": listed,
        "baseline": chosen["name"] if chosen is not None else None,
        "bootstrap": bootstrap_note(reps),
        "notes": metric_notes(chosen["name"] if chosen is not None else None, REACH_STEP, reps),
    }


def _compare_entry(run_dir: Path) -> dict:
    curve = eval_curve(run_dir)
    if not curve:
        raise ValueError(f"RUN_DIR {str(run_dir)!r} has no held-out evaluation rows in metrics.jsonl")
    ceiling, source = eval_ceiling(run_dir)
    return {"final": curve[-1][1], "auc": normalized_auc(curve, ceiling), "ceiling": ceiling, "ceiling_source": source}
