"""`train.keep_checkpoints`: which checkpoints of a run folder stay after a new one is written (TRL's
`save_total_limit`, which also keeps the best model).

Kept: the newest N checkpoints up to the step just written (that one included, so a run always has the checkpoint
it would resume from) and the best held-out one - the checkpointed step with the highest `eval/success_rate` in
metrics.jsonl, the earliest of a tie. Never touched: checkpoints of later steps (left by a run that resumed from an
earlier intact checkpoint; they are replaced when the run gets there), symbolic links and anything that is not a
`step_N` folder (a staging folder `.step_N.tmp` being written is not one). The run folder's lock
(trainer/run_lock.py) makes the caller its only writer.

A checkpoint is deleted by renaming it to the staging name `.step_N.tmp` first, then removing that: a reader never
finds a half-deleted `step_N`, and what a kill leaves behind is removed by `checkpoint.clean_temporaries` at the
next start.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

from rwcore.trainer import checkpoint as ckpt

__all__ = ["best_checkpoint_step", "prune_checkpoints"]

_STEP = re.compile(r"^step_(\d+)$")


def best_checkpoint_step(metrics: Path, steps: set[int]) -> int | None:
    """Of `steps` (the checkpointed ones), the step whose held-out evaluation in `metrics` (metrics.jsonl) has the
    highest eval/success_rate; the earliest of a tie; None when none of them was evaluated. A torn last line
    (a killed writer's) is skipped."""
    best: tuple[float, int] | None = None
    try:
        lines = metrics.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict) or row.get("kind") != "eval" or row.get("step") not in steps:
            continue
        value = row.get("eval/success_rate")
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        if best is None or value > best[0] or (value == best[0] and row["step"] < best[1]):
            best = (float(value), int(row["step"]))
    return None if best is None else best[1]


def prune_checkpoints(run: Path, keep: int, current: int) -> list[Path]:
    """Deletes the checkpoints of `run` that `train.keep_checkpoints=keep` does not keep after the checkpoint of step
    `current` was written (see the module docstring); keep 0 deletes nothing. Returns the deleted folders."""
    if keep <= 0:
        return []
    folder = run / "checkpoints"
    found = {}
    for path in ckpt.step_folders(folder):
        match = _STEP.match(path.name)
        if match and not path.is_symlink() and path.is_dir() and int(match.group(1)) <= current:
            found[int(match.group(1))] = path
    if current not in found:  # the checkpoint just written must be there; otherwise delete nothing
        return []
    kept = set(sorted(found, reverse=True)[:keep])
    best = best_checkpoint_step(run / "metrics.jsonl", set(found))
    if best is not None:
        kept.add(best)
    removed = []
    for step in sorted(set(found) - kept):
        path = found[step]
        doomed = folder / f".{path.name}.tmp"
        shutil.rmtree(doomed, ignore_errors=True)
        os.replace(path, doomed)  # gone as a checkpoint at once; the files go next
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(path)
    if removed:
        ckpt.fsync_dir(folder)
    return removed
