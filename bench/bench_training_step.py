"""The adaptive machinery's share of a training step, and combined vs outcome-only step time.

    .venv/bin/python bench/bench_training_step.py               # 6 steps x 8 tasks x 4 rollouts per method
    .venv/bin/python bench/bench_training_step.py --quick       # 3 steps x 4 tasks x 4 rollouts
    .venv/bin/python bench/bench_training_step.py --out bench/results/training-step.json

Runs short `rw train` runs of the embedded default (built-in negotiation environment, the small
built-in transformer, rule judge) in-process with `rwcore.trainer.trainer.Trainer`, once per
method, and reads each run's metrics.jsonl. Every training row holds `time/step` (the whole step:
sampling, rollouts, judging, rewards, advantages, policy update, evidence and adaptation) and
`time/adaptive` (the part spent in the sampler, evidence, advantages, pool and selection), so
`time/adaptive_fraction` is the adaptive machinery's overhead measured inside the real loop.

The pool update and RewardWeaver's re-selection run every `--adapt-every` steps (default 3, a few
times more often than the default config's 10 and 30) so that a short run includes them; the
measured share is therefore an upper bound for the default schedule. The step-time ratio
combined / outcome_only compares whole steps: the combined method also judges its active rubrics
and rolls out with skills in the prompt, so its rollouts differ; it is context, not a kernel claim.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine, publish  # noqa: E402

METHODS = ("combined", "outcome_only")


def run_method(method: str, args, folder: Path) -> dict:
    """One short training run; per-step timings from its metrics.jsonl."""
    from rwcore.trainer.config import load_config
    from rwcore.trainer.trainer import Trainer

    overrides = [
        f"train.method={method}",
        f"train.steps={args.steps}",
        f"train.seed={args.seed}",
        f"rollout.tasks_per_step={args.tasks_per_step}",
        f"rollout.group_size={args.group_size}",
        f"env.options.num_eval={args.eval_tasks}",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        f"pool.delta_pool={args.adapt_every}",
        f"rewardweaver.adaptation_interval={args.adapt_every}",
        *args.set,
    ]
    config = load_config(None, overrides)
    run_dir = folder / method
    started = time.perf_counter()
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # the trainer's per-step log lines
        trainer = Trainer(config, str(run_dir), quiet=True)
        try:
            trainer.setup()
            trainer.train()
        finally:
            trainer.cleanup()
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    train = [r for r in rows if r.get("kind") == "train"]
    if not train:
        raise RuntimeError(f"{method}: the run wrote no training rows")
    steps = [r["time/step"] for r in train]
    adaptive = [r["time/adaptive"] for r in train]
    fractions = [r["time/adaptive_fraction"] for r in train]
    return {
        "method": method,
        "device": str(trainer.device) if hasattr(trainer, "device") else None,
        "steps": len(train),
        "step_s": steps,
        "adaptive_s": adaptive,
        "step_median_s": statistics.median(steps),
        "step_mean_s": statistics.fmean(steps),
        "adaptive_median_ms": statistics.median(adaptive) * 1e3,
        "adaptive_max_ms": max(adaptive) * 1e3,
        "adaptive_fraction_mean": statistics.fmean(fractions),
        "adaptive_fraction_max": max(fractions),
        "adaptive_share_total": sum(adaptive) / sum(steps) if sum(steps) > 0 else 0.0,
        "generated_tokens_mean": statistics.fmean(r["generated_tokens_mean"] for r in train),
        "judgments_per_step": statistics.fmean(r["judgments"] for r in train),
        "active_rubrics_last": train[-1]["active_rubrics"],
        "wall_s": wall,
    }


def render(report: dict) -> str:
    m = report["machine"]
    c = report["config"]
    lines = [
        "# Adaptive machinery in a training step (embedded default, `rw train`)",
        "",
        f"Machine: {m.get('cpu', '?')}, {m['cpus']} logical CPUs, {m['platform']}, Python {m['python']}, "
        f"torch {m.get('torch', '?')} (one run of `bench/bench_training_step.py`, rwcore {m.get('rwcore', '?')}).",
        f"Runs: {c['steps']} steps x {c['tasks_per_step']} tasks x {c['group_size']} rollouts, pool update and "
        f"RewardWeaver re-selection every {c['adapt_every']} steps, device {report['methods'][0].get('device')}. "
        "Adaptive = sampler + evidence + advantages + pool + selection, timed inside the trainer "
        "(`time/adaptive` in metrics.jsonl).",
        "",
        "| method | steps | median step | mean step | adaptive per step (median / max) "
        "| adaptive share (mean / max / total) | generated tokens | judgments per step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["methods"]:
        lines.append(
            f"| {row['method']} | {row['steps']} | {row['step_median_s']:.2f} s | {row['step_mean_s']:.2f} s "
            f"| {row['adaptive_median_ms']:.1f} / {row['adaptive_max_ms']:.1f} ms "
            f"| {100 * row['adaptive_fraction_mean']:.2f} % / {100 * row['adaptive_fraction_max']:.2f} % "
            f"/ {100 * row['adaptive_share_total']:.2f} % | {row['generated_tokens_mean']:.1f} "
            f"| {row['judgments_per_step']:.0f} |"
        )
    ratio = report.get("step_ratio")
    if ratio is not None:
        lines += [
            "",
            f"Median step time combined / outcome_only: **{ratio:.2f}** (whole steps; the methods' rollouts "
            "differ, so this includes judging and rollout-length differences, not only the adaptive part).",
        ]
    return "\n".join(lines) + "\n"


def library_versions() -> dict:
    import numpy
    import torch

    import rwcore

    return {"rwcore": rwcore.__version__, "torch": torch.__version__, "numpy": numpy.__version__}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--tasks-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--eval-tasks", type=int, default=8, help="held-out tasks (evaluated before and after)")
    parser.add_argument(
        "--adapt-every", type=int, default=3, help="pool.delta_pool and rewardweaver.adaptation_interval"
    )
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated train.method values")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra config override")
    parser.add_argument(
        "--keep", type=Path, metavar="DIR", help="keep the run folders here (default: a temporary folder)"
    )
    parser.add_argument("--quick", action="store_true", help="3 steps x 4 tasks x 4 rollouts")
    parser.add_argument("--out", type=Path, help="write the report as JSON here and as Markdown beside it (.md)")
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--quick" in argv:  # smaller defaults; explicit options still win
        parser.set_defaults(steps=3, tasks_per_step=4, eval_tasks=4)
    args = parser.parse_args(argv)
    for name in ("steps", "tasks_per_step", "group_size", "eval_tasks", "adapt_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    methods = [m for m in args.methods.split(",") if m]

    with contextlib.ExitStack() as stack:
        folder = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rw-bench-train-")))
        rows = []
        for method in methods:
            print(
                f"  {method}: {args.steps} steps x {args.tasks_per_step} tasks x {args.group_size} rollouts ...",
                flush=True,
            )
            rows.append(run_method(method, args, folder))
    by_method = {row["method"]: row for row in rows}
    ratio = None
    if {"combined", "outcome_only"} <= set(by_method):
        ratio = by_method["combined"]["step_median_s"] / by_method["outcome_only"]["step_median_s"]
    report = {
        "machine": machine(**library_versions()),
        "config": {
            k: getattr(args, k)
            for k in ("steps", "tasks_per_step", "group_size", "eval_tasks", "adapt_every", "seed", "set")
        },
        "methods": rows,
        "step_ratio": ratio,
    }
    publish(report, render(report), args.out)
    return report


if __name__ == "__main__":
    main()
