"""The run folder's step logs (`metrics.jsonl`, `sampling.jsonl`) cut back to a checkpoint on `--resume`.

A run killed with -9 (or a machine that lost power, or a disk that filled) mid-append leaves a torn last
line: that line is dropped with one note, since the checkpoint it follows is intact and the resumed run
writes its step again. Any other line that is not a JSON object with an integer `step` is damage rather
than a torn append; the resume is refused naming the file and the line, and nothing is changed."""

from __future__ import annotations

import json
from pathlib import Path

from rwcore._io import atomic_write_bytes


class RunLogError(ValueError):
    """A step log with a damaged line other than the last; the message names the file and the line."""


def _step_of(line: str) -> int | None:
    """The line's `step`, or None when the line is not a JSON object with an integer step."""
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):
        return None
    step = row.get("step", 0) if isinstance(row, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def truncate_after(paths: list[Path], step: int) -> list[str]:
    """Drops the lines of each log in `paths` written after `step` (a resumed run writes them again).

    Returns one note per torn or unreadable last line dropped. Raises RunLogError naming the file and the
    line number when an earlier line is unreadable; every log is read and checked before any is written,
    so a refusal changes none of them."""
    cuts = [(path, *_cut(path, step)) for path in paths if path.exists()]
    for path, data, _ in cuts:
        atomic_write_bytes(path, data)
    return [note for _, _, note in cuts if note]


def _cut(path: Path, step: int) -> tuple[bytes, str | None]:
    """The bytes `path` keeps up to `step`, and the note on a dropped last line (None when there was none)."""
    data = path.read_bytes()
    lines = data.decode("utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last complete line
    kept, note = [], None
    for number, line in enumerate(lines, start=1):
        if not line:
            continue
        found = _step_of(line)
        if found is None:
            if number == len(lines):
                why = "not a JSON object with a step" if data.endswith(b"\n") else "not ended by a newline"
                note = (
                    f"{path}: dropped its last line ({len(line.encode())} bytes, {why}), left by a run that "
                    f"stopped while writing it; the run resumes from step {step}"
                )
                continue
            raise RunLogError(
                f"{path}: line {number} is not a JSON object with an integer step ({line[:80]!r}); "
                "only a torn last line is dropped on --resume: remove or repair that line, or start a new run"
            )
        if found <= step:
            kept.append(line)
    return ("\n".join(kept) + "\n").encode() if kept else b"", note
