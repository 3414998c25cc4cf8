"""What a run's folder says about the run: its status file (OUT/runs/<variant>-s<seed>/ablation_status.json,
{"status": "finished"|"failed", ...}), how far its metrics have got, and whether a run that exited 0 counts
as finished.

A run is finished when its status file says so, which `rw ablate` writes only when the run exited 0 having
written each training step 1..N once, a held-out evaluation and the step-N checkpoint (`_unfinished`). A failed
run is a row marked failed with its error, never averaged in.
"""

from __future__ import annotations

import json
from pathlib import Path

from rwcore._io import atomic_write_bytes
from rwcore.trainer.ablate.statistics import eval_curve

STATUS_FILE = "ablation_status.json"


def _read_status(run_dir: Path) -> dict | None:
    try:
        status = json.loads((run_dir / STATUS_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return status if isinstance(status, dict) and status.get("status") in ("finished", "failed") else None


def _write_status(run_dir: Path, status: dict) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)  # a run that never started (its input failed) has no folder yet
    atomic_write_bytes(run_dir / STATUS_FILE, json.dumps(status, indent=1).encode())


def _steps_done(run_dir: Path) -> int:
    """The last training step in a run's metrics (0 when none yet)."""
    path = run_dir / "metrics.jsonl"
    try:
        with open(path, "rb") as stream:
            stream.seek(max(0, path.stat().st_size - 4096))
            tail = stream.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return 0
    for line in reversed(tail):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            return row["step"]
    return 0


def _failure(error: str, tail: str = "") -> dict:
    return {"status": "failed", "error": error, "log_tail": tail}


def _final_eval(run_dir: Path) -> tuple[int, float] | None:
    curve = eval_curve(run_dir)
    return (curve[-1][0], curve[-1][1]) if curve else None


def _unfinished(run_dir: Path, total: int) -> str | None:
    """Why a run that exited 0 does not count as finished, or None when it does: metrics.jsonl must hold each
    training step 1..total exactly once (a step twice means two writers) and a held-out evaluation, and
    checkpoints/latest must name the checkpoint of step `total`."""
    from collections import Counter

    from rwcore.trainer.checkpoint import MANIFEST, CheckpointError, latest_checkpoint

    if _final_eval(run_dir) is None:
        return "no final held-out evaluation in metrics.jsonl"
    steps = []
    try:
        lines = (run_dir / "metrics.jsonl").read_bytes().splitlines()
    except OSError as error:
        return f"metrics.jsonl cannot be read ({error.strerror or error})"
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            return "metrics.jsonl holds a line that is not JSON"
        if isinstance(row, dict) and row.get("kind") == "train" and isinstance(row.get("step"), int):
            steps.append(row["step"])
    counts = Counter(steps)
    repeated = sorted(step for step, n in counts.items() if n > 1)
    if repeated:
        return f"metrics.jsonl holds step {repeated[0]} {counts[repeated[0]]} times (two writers)"
    if sorted(steps) != list(range(1, total + 1)):
        last = max(steps, default=0)
        if last < total:
            return f"metrics.jsonl ends at step {last} of {total}"
        return f"metrics.jsonl holds steps {min(steps)}..{last}, not each of 1..{total} once"
    try:
        latest = latest_checkpoint(run_dir)
    except CheckpointError as error:
        return str(error)
    if latest is None or latest.name != f"step_{total:06d}" or not (latest / MANIFEST).is_file():
        return f"no checkpoint of step {total}, the last"
    return None
