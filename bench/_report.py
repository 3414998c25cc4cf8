"""What every benchmark script shares: a description of the machine and writing its report."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from rwcore._io import atomic_write_bytes


def machine(**extra) -> dict:
    """CPU model, the vector ISA torch's CPU kernels dispatch to, core count, OS and Python, plus `extra`
    (library versions and the like)."""
    import torch

    from rwcore.trainer.machine import cpu_model

    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    model = cpu_model()
    if model is not None:
        info["cpu"] = model
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
