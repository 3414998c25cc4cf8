"""What machine a result was measured on (the CPU's name; recorded with every committed result, every run folder's
run_info.json and every ablation table)."""

from __future__ import annotations

import os
import platform
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


def machine_record() -> dict:
    """The machine as run_info.json and ablation tables record it: OS, CPU model, `cpu_capability` (the vector ISA
    torch's CPU kernels dispatch to: it changes float rounding, so two machines differing there give different
    curves from one seed), cores (all, and usable by this process), torch's threads and the GPUs."""
    import torch

    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    gpus = []
    if torch.cuda.is_available():
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "torch_threads": torch.get_num_threads(),
        "gpus": gpus,
    }
