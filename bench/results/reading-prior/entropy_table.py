"""Policy entropy per training window against final held-out success, for every run folder given.

Usage: python bench/results/reading-prior/entropy_table.py RUNS_ROOT [RUNS_ROOT ...] > entropy.md

A run folder is any folder with a `metrics.jsonl` (as `rw train` and `rw ablate` write them). Train rows carry
`entropy` (the mean policy entropy over generated tokens, nats) and `process_term_mean` (the RewardWeaver
process term of the step's reward); eval rows carry `eval/success_rate`. This reads the logs only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

WINDOWS = ((1, 50), (50, 100), (100, 200), (200, 300), (300, 500))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(run: Path) -> dict | None:
    rows = [json.loads(line) for line in run.joinpath("metrics.jsonl").read_text().splitlines() if line.strip()]
    train = {r["step"]: r for r in rows if r.get("kind") != "eval" and "entropy" in r}
    evals = {r["step"]: r["eval/success_rate"] for r in rows if r.get("kind") == "eval"}
    if not train or not evals:
        return None
    entropy = [_mean([train[s]["entropy"] for s in range(a, b) if s in train]) for a, b in WINDOWS]
    process = _mean([train[s].get("process_term_mean") or 0.0 for s in range(1, 101) if s in train])
    return {"run": run.name, "entropy": entropy, "process_1_100": process, "final": evals[max(evals)]}


def main(roots: list[str]) -> None:
    runs = sorted({p.parent for root in roots for p in Path(root).rglob("metrics.jsonl")}, key=lambda p: p.name)
    head = " | ".join(f"H {a}-{b}" for a, b in WINDOWS)
    print(f"| run | {head} | process term 1-100 | final held-out |")
    print("|---|" + "---|" * (len(WINDOWS) + 2))
    for run in runs:
        s = summarize(run)
        if s is None:
            continue
        cells = " | ".join("" if h is None else f"{h:.2f}" for h in s["entropy"])
        print(f"| {s['run']} | {cells} | {s['process_1_100']:.2f} | {s['final']:.3f} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
