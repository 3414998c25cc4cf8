"""`rw train` step time with model.shared_prefix on (default) vs off, with and without Arise's skills.

    .venv/bin/python bench/bench_shared_prefix.py                   # 30 steps per run, about 2 minutes
    .venv/bin/python bench/bench_shared_prefix.py --quick           # 16 steps per run
    .venv/bin/python bench/bench_shared_prefix.py --out bench/results/shared-prefix.json

Every rollout of a step starts with the same system prompt; under Arise its active skills follow,
which makes that shared prefix about 5x longer than the base prompt. With model.shared_prefix on,
the update, behaviour scoring and HF generation encode it once per batch instead of once per row.
Each configuration runs as separate `rw train` processes, each with the whole machine, on the same
seed: `outcome_only` (the base prompt only) and `arise` (skills enter the prompt at the second pool
evolution; the bench sets pool.delta_pool=5 so that comes early). On and off take turns, --repeats
times each (on, off, on, off, ...), so that a slow spell of a shared machine does not fall on one side
only. A run's figure is its mean `time/step` from the step after the first one with skills (for
outcome_only, over the same steps); the ratio is the median over repeats off / the median on, from
this one run. The two settings compute the same function to float rounding; the report gives the
largest difference between their per-step losses over the first steps, before sampling from nearly
equal probabilities could ever pick a different token.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine, publish  # noqa: E402

METHODS = ("outcome_only", "arise")
DELTA_POOL = 5  # pool.delta_pool here (the default is 10): skills are in the prompt from the step after it


def run(method: str, shared: bool, steps: int, seed: int, folder: Path) -> dict:
    out = folder / f"{method}-{'on' if shared else 'off'}"
    command = [
        sys.executable,
        "-m",
        "rwcore.trainer",
        "train",
        "--quiet",
        "--out",
        str(out),
        f"train.method={method}",
        f"train.steps={steps}",
        f"train.seed={seed}",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        f"pool.delta_pool={DELTA_POOL}",
        f"model.shared_prefix={str(shared).lower()}",
    ]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # each run gets the whole machine
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{method} shared_prefix={shared} failed:\n{result.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    train = [r for r in rows if r["kind"] == "train"]
    return {
        "method": method,
        "shared_prefix": shared,
        "steps": len(train),
        "wall_s": time.perf_counter() - started,
        "step_times": [r["time/step"] for r in train],
        "active_skills": [r.get("pool/active_skills", 0) for r in train],
        "losses": [r["loss"] for r in train],
    }


def _timed(run: dict, first: int) -> dict:
    """The run with its mean step time over steps >= first (1-based)."""
    times = run["step_times"][first - 1 :]
    return {**run, "timed_from_step": first, "step_s": sum(times) / len(times)}


def main(argv=None) -> dict:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting, on and off taking turns")
    parser.add_argument("--quick", action="store_true", help="16 steps per run, one run of each")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    steps, repeats = (16, 1) if args.quick else (args.steps, args.repeats)
    if steps < 3 * DELTA_POOL:
        parser.error(
            f"--steps must be at least {3 * DELTA_POOL}: skills enter Arise's prompt at the second pool evolution"
        )
    if repeats < 1:
        parser.error(f"--repeats must be at least 1; got {repeats}")
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in METHODS:
            for turn in range(repeats):
                for shared in (True, False):
                    runs.setdefault((method, shared), []).append(
                        run(method, shared, steps, args.seed, Path(tmp) / str(turn))
                    )
    # time the steps from the first one with skills in the (shared) Arise prompt, for every run alike
    with_skills = [i + 1 for i, n in enumerate(runs["arise", True][0]["active_skills"]) if n > 0]
    if not with_skills:
        raise RuntimeError("no Arise step had active skills; raise --steps")
    first = with_skills[0] + 1
    rows = []
    for method in METHODS:
        on = [_timed(r, first) for r in runs[method, True]]
        off = [_timed(r, first) for r in runs[method, False]]
        on_s, off_s = (statistics.median(r["step_s"] for r in side) for side in (on, off))
        compared = min(5, steps)
        rows.append(
            {
                "method": method,
                "on": on,
                "off": off,
                "on_s": on_s,
                "off_s": off_s,
                "speedup": off_s / on_s,
                "active_skills_max": max(on[0]["active_skills"]),
                "loss_max_diff_first_steps": max(
                    abs(a - b) for a, b in zip(on[0]["losses"][:compared], off[0]["losses"][:compared])
                ),
                "compared_steps": compared,
            }
        )
    report = {
        "machine": machine(torch=torch.__version__, torch_threads=torch.get_num_threads()),
        "config": {
            "steps": steps,
            "seed": args.seed,
            "delta_pool": DELTA_POOL,
            "timed_from_step": first,
            "repeats": repeats,
        },
        "rows": rows,
    }
    publish(report, render(report), args.out)
    return report


def render(report: dict) -> str:
    m, c = report["machine"], report["config"]
    lines = [
        "# `rw train` step time, model.shared_prefix on vs off",
        "",
        f"Machine: {m.get('cpu', '?')}, {m['cpus']} logical CPUs, torch {m.get('torch', '?')}. The embedded default, "
        f"{c['steps']} steps, seed {c['seed']}, pool.delta_pool={c['delta_pool']}, each run alone on the machine, "
        f"{c.get('repeats', 1)} runs of each setting, on and off taking turns; a run's step time is its mean "
        f"`time/step` from step {c['timed_from_step']} on (Arise's skills are in its training prompt from there), and "
        "the table gives the median over runs (each run's in brackets).",
        "",
        "| train.method | active skills (max) | step time, off | step time, on | off / on | largest loss difference, "
        "first steps |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        each = {side: ", ".join(f"{r['step_s']:.3f}" for r in row[side]) for side in ("off", "on")}
        lines.append(
            f"| {row['method']} | {row['active_skills_max']} | {row['off_s']:.3f} s ({each['off']}) "
            f"| {row['on_s']:.3f} s ({each['on']}) | **{row['speedup']:.2f}x** "
            f"| {row['loss_max_diff_first_steps']:.1e} (steps 1-{row['compared_steps']}) |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
