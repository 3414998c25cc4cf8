"""`rw train` throughput, synchronous (rollout.max_lag=0) vs asynchronous (rollout.max_lag=1).

    .venv/bin/python bench/bench_async.py                          # 60 steps of the embedded default each
    .venv/bin/python bench/bench_async.py --quick                  # 10 steps each
    .venv/bin/python bench/bench_async.py --out bench/results/async.json

Runs the embedded default (`rw train`, default config, the same seed and overrides) per max_lag as
separate processes, each with the whole machine: the synchronous run's torch uses every core; the
asynchronous run splits them between the training process and the rollout process. The two settings
take turns, --repeats runs each (0, 1, 0, 1, ...), so that a slow spell of a shared machine does not
fall on one side only. Throughput is read from each run's metrics.jsonl: trajectories and generated
tokens over the summed `time/step` (the training loop's wall time without the held-out evaluations,
which are the same in both). Ratio = the median over repeats of max_lag 1 / the median of max_lag 0,
from this one run; the table shows each setting's median run (and every run's trajectories/s). The
two settings train on different rollouts after step 1 (lagged ones), so the held-out success of both
is printed for context, not compared.
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


def run(lag: int, steps: int, seed: int, folder: Path, extra: list[str]) -> dict:
    out = folder / f"lag{lag}"
    command = [
        sys.executable,
        "-m",
        "rwcore.trainer",
        "train",
        "--quiet",
        "--out",
        str(out),
        f"train.steps={steps}",
        f"train.seed={seed}",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        f"rollout.max_lag={lag}",
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # each run gets the whole machine
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"max_lag={lag} failed:\n{result.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    seconds = sum(r["time/step"] for r in train)
    trajectories = sum(r["rollout/trajectories"] for r in train)
    tokens = sum(r["generated_tokens_mean"] * r["rollout/trajectories"] for r in train)
    return {
        "max_lag": lag,
        "steps": len(train),
        "loop_s": seconds,
        "wall_s": wall,
        "trajectories_per_s": trajectories / seconds,
        "generated_tokens_per_s": tokens / seconds,
        "rollout_wait_share": sum(r["time/rollout_wait"] for r in train) / seconds,
        "mean_ratio_range": [min(r["mean_ratio"] for r in train), max(r["mean_ratio"] for r in train)],
        "kept_fraction_min": min(r["kept_fraction"] for r in train),
        "eval_first": evals[0]["eval/success_rate"],
        "eval_last": evals[-1]["eval/success_rate"],
    }


def main(argv=None) -> dict:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each max_lag, the two taking turns")
    parser.add_argument("--quick", action="store_true", help="10 steps, one run of each")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for both runs")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    steps, repeats = (10, 1) if args.quick else (args.steps, args.repeats)
    if repeats < 1:
        parser.error(f"--repeats must be at least 1; got {repeats}")
    every = {0: [], 1: []}
    with tempfile.TemporaryDirectory() as tmp:
        for turn in range(repeats):
            for lag in (0, 1):
                every[lag].append(run(lag, steps, args.seed, Path(tmp) / str(turn), args.set))
    # each setting's median run (by trajectories/s; the median of an odd count is one of the runs)
    runs = [sorted(every[lag], key=lambda r: r["trajectories_per_s"])[(repeats - 1) // 2] for lag in (0, 1)]
    median = {
        lag: {
            key: statistics.median(r[key] for r in every[lag])
            for key in ("trajectories_per_s", "generated_tokens_per_s")
        }
        for lag in (0, 1)
    }
    report = {
        "machine": machine(torch=torch.__version__, torch_threads=torch.get_num_threads()),
        "config": {"steps": steps, "seed": args.seed, "overrides": args.set, "repeats": repeats},
        "runs": runs,
        "every_run": {str(lag): every[lag] for lag in (0, 1)},
        "trajectories_ratio": median[1]["trajectories_per_s"] / median[0]["trajectories_per_s"],
        "tokens_ratio": median[1]["generated_tokens_per_s"] / median[0]["generated_tokens_per_s"],
    }
    publish(report, render(report), args.out)
    return report


def render(report: dict) -> str:
    m, c = report["machine"], report["config"]
    lines = [
        "# `rw train` throughput: asynchronous (max_lag 1) vs synchronous (max_lag 0)",
        "",
        f"Machine: {m.get('cpu', '?')}, {m['cpus']} logical CPUs, torch {m.get('torch', '?')}. The embedded default, "
        f"{c['steps']} steps, seed {c['seed']}{', ' + ' '.join(c['overrides']) if c['overrides'] else ''}; each run "
        f"alone on the machine, {c.get('repeats', 1)} runs of each max_lag taking turns; each row is that setting's "
        "median run.",
        "",
        "| max_lag | loop time | trajectories/s | generated tokens/s | waiting for rollouts | mean ratio (min-max) "
        "| min kept fraction | held-out success (start -> end) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r['max_lag']} | {r['loop_s']:.1f} s | {r['trajectories_per_s']:.1f} "
            f"| {r['generated_tokens_per_s']:.1f} | {100 * r['rollout_wait_share']:.0f} % "
            f"| {r['mean_ratio_range'][0]:.4f}-{r['mean_ratio_range'][1]:.4f} | {r['kept_fraction_min']:.3f} "
            f"| {r['eval_first']:.3f} -> {r['eval_last']:.3f} |"
        )
    lines += [
        "",
        f"Throughput max_lag 1 / max_lag 0 (medians over the runs): **{report['trajectories_ratio']:.2f}x** "
        f"trajectories/s, {report['tokens_ratio']:.2f}x generated tokens/s.",
    ]
    if "every_run" in report:
        lines += [
            "",
            "Every run's trajectories/s: "
            + "; ".join(
                f"max_lag {lag}: " + ", ".join(f"{r['trajectories_per_s']:.1f}" for r in runs)
                for lag, runs in report["every_run"].items()
            )
            + ".",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
