"""Simulated training run that shows where `CapabilitySampler` puts its sampling mass.

    python -m rwcore.sampling.demo                  # 60 steps, 600 tasks
    python -m rwcore.sampling.demo --steps 120 --tasks 5000 --seed 3

A simulated policy has a true pass rate per (task type, capability). Each step
the sampler picks a batch; every task is "rolled out" group_size times and
judged by rubrics of each capability (with explicit not-applicable verdicts and
occasional judge failures); pairs that get trained improve fastest at
intermediate pass rates, as policy-gradient learning does. Every report shows
the adaptive sampling probability of each pair next to its pass rate, and how
that probability splits over hopeless (< 0.1), learnable (0.1-0.8) and
mastered (> 0.8) pairs: the weight p (1 - p)^2 peaks at p = 1/3, so the mass
follows the pairs that still have something to learn.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from rwcore.arise.sampler import CapabilitySampler
from rwcore.tasks import DEFAULT_CAPABILITIES
from rwcore.verdict import Verdict

TASK_TYPES = ("price_lookup", "bundle_offer", "refund_claim", "order_edit", "account_merge", "bulk_import")
RUBRICS_PER_CAPABILITY = 3
BANDS = {"hopeless": (0.0, 0.1), "learnable": (0.1, 0.8), "mastered": (0.8, 1.01)}
LEARNING_RATE = 0.12


def initial_pass_rates(rng: np.random.Generator) -> np.ndarray:
    """[task types, capabilities] pass rates: some mastered, some hopeless, some in between."""
    levels = np.array([0.03, 0.15, 0.5, 0.85, 0.97])
    return rng.choice(levels, size=(len(TASK_TYPES), len(DEFAULT_CAPABILITIES)))


def make_tasks(num_tasks: int, rng: np.random.Generator) -> dict[str, list[str]]:
    tasks = {}
    for i in range(num_tasks):
        count = 1 + int(rng.random() < 0.3)
        tags = rng.choice(len(TASK_TYPES), size=count, replace=False)
        tasks[f"task-{i:05d}"] = [TASK_TYPES[t] for t in tags]
    return tasks


def judge_group(
    pass_rate: np.ndarray, tag_indices: list[int], rubrics: dict[str, str], group_size: int, rng: np.random.Generator
) -> dict[str, list]:
    """Verdicts of every rubric on `group_size` simulated trajectories of one task."""
    verdicts = {}
    for rubric_id, capability in rubrics.items():
        c = DEFAULT_CAPABILITIES.index(capability)
        p = float(np.mean(pass_rate[tag_indices, c]))
        row = []
        for _ in range(group_size):
            draw = rng.random()
            if draw < 0.02:
                row.append(Verdict.INVALID)
            elif draw < 0.15:
                row.append(Verdict.NA)
            else:
                row.append(bool(rng.random() < p))
        verdicts[rubric_id] = row
    return verdicts


def band_of(pass_rate: float) -> str:
    for name, (low, high) in BANDS.items():
        if low <= pass_rate < high:
            return name
    return "mastered"


def report(step: int, sampler: CapabilitySampler, pass_rate: np.ndarray, out) -> tuple[dict, dict]:
    """Prints the pass rate and adaptive pick probability of every pair.

    Returns (pick mass per band, share of pairs per band).
    """
    probabilities = sampler.pair_probabilities(step, num_draws=1000)
    print(f"\nstep {step:4d}   coverage {sampler.coverage():.2f}   (cells: pass rate / P(adaptive pick))", file=out)
    print("".ljust(16) + "".join(c[:12].rjust(14) for c in DEFAULT_CAPABILITIES), file=out)
    mass = dict.fromkeys(BANDS, 0.0)
    share = dict.fromkeys(BANDS, 0.0)
    for d, tag in enumerate(TASK_TYPES):
        cells = []
        for c, capability in enumerate(DEFAULT_CAPABILITIES):
            q = probabilities.get((tag, capability))
            band = band_of(pass_rate[d, c])
            share[band] += 1.0 / pass_rate.size
            mass[band] += q or 0.0
            cells.append(f"{pass_rate[d, c]:5.2f} / {q:4.2f}" if q is not None else f"{pass_rate[d, c]:5.2f} /   - ")
        print(tag[:16].ljust(16) + "".join(cell.rjust(14) for cell in cells), file=out)
    if probabilities:
        print(
            "adaptive pick mass by pass rate:  "
            + "   ".join(f"{name} {mass[name]:.2f} (share of pairs {share[name]:.2f})" for name in BANDS),
            file=out,
        )
    return mass, share


def run(
    steps: int, num_tasks: int, batch_size: int, group_size: int, report_every: int, seed: int, out=sys.stdout
) -> list[tuple[dict, dict]]:
    """Runs the simulation; returns (pick mass per band, share of pairs per band) at each report."""
    rng = np.random.default_rng(seed)
    pass_rate = initial_pass_rates(rng)
    tasks = make_tasks(num_tasks, rng)
    tag_indices = {task_id: [TASK_TYPES.index(t) for t in tags] for task_id, tags in tasks.items()}
    sampler = CapabilitySampler(tasks, batch_size=batch_size, group_size=group_size, seed=seed)
    rubrics = {
        f"{capability.lower()}-{k}": capability
        for capability in DEFAULT_CAPABILITIES
        for k in range(RUBRICS_PER_CAPABILITY)
    }
    sampler.set_rubrics(rubrics)
    print(
        f"simulating {steps} steps: {num_tasks} tasks, {len(TASK_TYPES)} task types, {len(rubrics)} rubrics, "
        f"batch {batch_size} x group {group_size}",
        file=out,
    )
    reports = []
    for step in range(steps):
        batch = sampler.sample(step)
        trained = np.zeros_like(pass_rate)
        for task_id in batch:
            indices = tag_indices[task_id]
            sampler.record_group(task_id, judge_group(pass_rate, indices, rubrics, group_size, rng), step)
            trained[indices, :] += 1.0
        # Learning is fastest where outcomes vary: a gradient proportional to
        # p (1 - p), scaled by the share of the batch that trained the task type.
        pass_rate = np.clip(pass_rate + LEARNING_RATE * trained / batch_size * pass_rate * (1.0 - pass_rate), 0.0, 1.0)
        if (step + 1) % report_every == 0 or step == steps - 1:
            reports.append(report(step + 1, sampler, pass_rate, out))
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rwcore.sampling.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=60, help="training steps to simulate (default: 60)")
    parser.add_argument("--tasks", type=int, default=600, help="number of tasks (default: 600)")
    parser.add_argument("--batch-size", type=int, default=32, help="tasks per batch (default: 32)")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per task (default: 8)")
    parser.add_argument("--report-every", type=int, default=15, help="steps between reports (default: 15)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    args = parser.parse_args(argv)
    for name in ("steps", "tasks", "batch_size", "group_size", "report_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.batch_size > args.tasks:
        parser.error("--batch-size must not exceed --tasks")
    run(args.steps, args.tasks, args.batch_size, args.group_size, args.report_every, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
