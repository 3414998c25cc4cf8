"""Re-runs `rw train` for the default (rewardweaver) and outcome-only GRPO (rw_outcome_grpo), seeds 0-2, as
`rw ablate` ran them for the committed table (two runs at a time, one thread each), and compares every
metrics row with the committed runs' metrics.jsonl: held-out rows must be equal float for float, training rows
too apart from wall-clock timings. Usage (from the repository root):

    .venv/bin/python bench/results/refactor-check/reproduce.py REFERENCE_RUNS_DIR OUT_DIR
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

VARIANTS = ("rewardweaver", "rw_outcome_grpo")
SEEDS = (0, 1, 2)


def run(out: Path, variant: str, seed: int) -> Path:
    run_dir = out / f"{variant}-s{seed}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "rwcore.trainer", "train", "--quiet", "--out", str(run_dir), "--overwrite",
               f"train.method={variant}", f"train.seed={seed}"]
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    return run_dir


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def compare(reference: Path, fresh: Path) -> dict:
    ref, new = rows(reference / "metrics.jsonl"), rows(fresh / "metrics.jsonl")
    differences = []
    for a, b in zip(ref, new):
        keys = sorted(set(a) | set(b))
        for key in keys:
            if key.startswith("time/"):
                continue
            if a.get(key) != b.get(key):
                differences.append({"step": a.get("step"), "kind": a.get("kind"), "key": key, "committed": a.get(key),
                                    "now": b.get(key)})
    evals = [(r["step"], r["eval/success_rate"]) for r in new if r.get("kind") == "eval"]
    return {"rows": [len(ref), len(new)], "differences": differences[:20], "difference_count": len(differences),
            "final_eval": evals[-1] if evals else None}


def main() -> int:
    reference, out = Path(sys.argv[1]), Path(sys.argv[2])
    jobs = [(v, s) for v in VARIANTS for s in SEEDS]
    with ThreadPoolExecutor(max_workers=2) as pool:
        dirs = list(pool.map(lambda job: run(out, *job), jobs))
    report = {f"{v}-s{s}": compare(reference / f"{v}-s{s}", d) for (v, s), d in zip(jobs, dirs)}
    print(json.dumps(report, indent=1))
    return 0 if all(r["difference_count"] == 0 and r["rows"][0] == r["rows"][1] for r in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
