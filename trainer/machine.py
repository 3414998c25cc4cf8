"""What machine a result was measured on (the CPU's name; recorded with every committed result)."""

from __future__ import annotations

from pathlib import Path


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (None where there is none, e.g. macOS)."""
    try:
        return next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        return None
