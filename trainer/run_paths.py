"""One rule for every path rw writes inside a run folder: it is what rw made there, or missing - never a link.

A run folder can come from someone else (a colleague's run to `--resume`, a folder to `rw report`). A symlink
inside it - `RUN/tensorboard` pointing at another folder - would make rw write where the sender chose, so every
writer asks `run_path` before it writes: a path that exists must be a plain folder or a plain file, as the
writer expects, checked with `lstat` (nothing is followed); otherwise `RunPathRefused` (a ValueError: `rw`
prints it as one `rw: error:` line, exit 2) names the path, what it is and the fix, and nothing is written.
`check_run_folder` applies the rule to every entry rw writes in a run folder at once, before a `--resume`
writes anything. Files rw replaces whole are written through a temporary and a rename (`rwcore._io`), which
replaces a link rather than following it; the rule refuses them anyway, so a run folder never mixes the two.

`rw export --out` is checked with `kind_of` too (a link or anything but a folder is refused, naming what it is),
and `--overwrite` counts every link in a run folder as not rw's (`checkpoint.foreign_entries`). The run-folder lock
(`run_lock`: opened with `O_NOFOLLOW` and checked with `fstat`, so there is no gap between check and open) and the
checkpoint pointer (`checkpoint.latest_checkpoint`) keep their own checks, which say the same.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Literal

__all__ = ["ABLATE_FILES", "RUN_FILES", "RUN_OUTPUT_DIRS", "RunPathRefused", "check_run_folder", "kind_of", "run_path"]

# Files of a run folder written with rwcore._io.atomic_write_bytes, whose temporaries are
# ".<name>.<8 random characters>.tmp" (tempfile.mkstemp) in the same folder.
RUN_FILES = (
    "config.yaml",
    "method.json",
    "metrics.jsonl",
    "sampling.jsonl",
    "reward_stages.json",
    "reward_history.json",
    "diagnostics.json",
    "pool_counts.json",
    "pool_events.json",
    "pool_rubrics.json",
    "prior.json",
    "run_info.json",
    "environment.json",
)
# What `rw ablate` keeps inside each run folder it launches, and the folders other commands write into one.
ABLATE_FILES = ("ablation.log", "ablation_status.json")
# The experiment trackers (train.loggers) each keep their store in a folder named after them (trainer/trackers.py).
RUN_OUTPUT_DIRS = ("checkpoints", "report", "analysis", "tensorboard", "wandb", "mlflow", "trackio")


class RunPathRefused(ValueError):
    """A path inside a run folder that rw would write through but is not what rw made there (names it)."""


def kind_of(path: str | os.PathLike) -> str | None:
    """What `path` is, without following a link: None (missing), 'folder', 'file', 'symbolic link', 'FIFO',
    'socket', 'device' or 'special file'."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "special file"


def run_path(path: str | os.PathLike, want: Literal["folder", "file"], create: bool = False) -> Path:
    """`path` (inside a run folder) when it is missing or a plain `want`; a missing folder is made when `create`.
    Raises RunPathRefused naming the path and what it is otherwise (a symlink is never followed)."""
    path = Path(path)
    found = kind_of(path)
    if found is not None and found != want:
        target = f" to {os.readlink(path)!r}" if found == "symbolic link" else ""
        raise RunPathRefused(
            f"{str(path)!r} is a {found}{target}, not a {want}: rw writes only into what it made inside a run "
            f"folder and never through a link; move it away (rw then makes a new {want} there)"
        )
    if found is None and create and want == "folder":
        path.mkdir(exist_ok=True)
        if kind_of(path) != "folder":  # made by someone else in between
            raise RunPathRefused(f"{str(path)!r} changed while rw made it; move it away and run again")
    return path


def check_run_folder(run: str | os.PathLike) -> None:
    """Applies `run_path` to every folder and file rw writes directly inside `run` (`RUN_OUTPUT_DIRS`,
    `RUN_FILES`, the ones `rw ablate` keeps): raises RunPathRefused for the first that is not plain."""
    run = Path(run)
    for name in RUN_OUTPUT_DIRS:
        run_path(run / name, "folder")
    for name in RUN_FILES + ABLATE_FILES:
        run_path(run / name, "file")
