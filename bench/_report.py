"""What every benchmark script shares: a description of the machine and writing its report."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from rwcore._io import atomic_write_bytes


def machine(**extra) -> dict:
    """CPU model, core count, OS and Python, plus `extra` (library versions and the like)."""
    info = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        info["cpu"] = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                           if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info.update(extra)
    return info


def publish(report: dict, text: str, out: Path | None) -> None:
    """Prints the Markdown table and, with `out`, writes the report as JSON there and the table beside it (.md)."""
    print()
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out, json.dumps(report, indent=2).encode())
        atomic_write_bytes(out.with_suffix(".md"), text.encode())
