"""`rw ablate`: a paper's ablation table as parallel `rw train` runs (the work is trainer/ablate/)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rwcore.trainer.cli.command import Command, CommandError, _config_file, _lock_run_folder, _override, _positive_int

__all__ = ["AblateCommand"]


class AblateCommand(Command):
    name = "ablate"
    help = (
        "run a paper's ablation table (its variants x seeds), or a grid of settings x seeds, as parallel rw train runs"
    )
    description = (
        "Runs every variant of a table for every seed as separate `rw train` processes, at most --jobs at a time, "
        "each limited to its share of the CPU threads; writes OUT/ablation.md, ablation.json and ablation.png "
        "(one point per seed). The tables: each paper's (arise, rewardweaver) and claim (the rows the papers' "
        "main claim rests on). Per run: final and best held-out success, the normalized area under the held-out "
        "curve and the steps to reach the baseline's success; with at least 5 finished seeds per variant also "
        "the interquartile mean, the probability of improvement over the baseline and the IQM difference, each "
        "with a 95% bootstrap interval (fewer seeds: point estimates only, 'needs >= 5 seeds'). Run it again "
        "with the same --out to resume: finished runs are skipped, killed runs continue from their latest "
        "checkpoint, failed runs run again. A failed run is listed as failed with its error, never averaged in. "
        "arise_frozen_rubrics reads the same seed's arise run and starts after it. An override a variant cannot "
        "apply (advantage.process_gate for outcome_only) is dropped for that variant, and ablation.md says so. "
        "With --executor ray each run is a Ray task on the nodes of a Ray cluster (--address, else RAY_ADDRESS), "
        "which must all see --out at the same path (a shared filesystem); resuming works the same. "
        "--grid KEY=V1,V2 instead of --paper crosses settings of your own (every combination of the values of "
        "each --grid key) with the seeds the same way: rows are the grid's points, named by their settings "
        "(runs OUT/runs/lr=1e-4-s0, ...), compared with the first point; every point's config is checked before "
        "anything starts."
    )
    epilog = """examples:
  rw ablate --paper arise --out runs/ablate-arise
  rw ablate --paper arise --executor ray --address 10.0.0.1:6379 --out /shared/runs/ablate-arise
  rw ablate --paper rewardweaver --seeds 0,1,2 --jobs 2 --out runs/ablate-rw
  rw ablate --paper claim --seeds 0,1,2,3,4 --out runs/claim      # 5 seeds: intervals too
  rw ablate --paper arise --variants arise,outcome_only --steps 50 --out runs/quick
  rw ablate --paper arise --out runs/ablate-arise optim.lr=1e-3     # overrides apply to every run
  rw ablate --grid optim.lr=1e-4,3e-4 --seeds 0,1 --out runs/lr     # a grid of your own: runs lr=1e-4-s0, ...
  rw ablate --grid optim.lr=1e-4,3e-4 --grid train.method=arise,outcome_only --out runs/lr-method
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        from rwcore.trainer.ablate import PAPERS
        from rwcore.trainer.ablate.statistics import BOOTSTRAP_REPS

        parser.add_argument(
            "--paper", default=None, metavar="PAPER", help=f"the table to run: {', '.join(PAPERS)} (or --grid)"
        )
        parser.add_argument(
            "--grid",
            action="append",
            default=None,
            metavar="KEY=V1,V2,..",
            help="instead of --paper: cross these values of a config key (repeat --grid for more keys) with the "
            "seeds; each point's runs are named by its settings (lr=1e-4-s0) and the first point is the baseline",
        )
        parser.add_argument(
            "--variants",
            default=None,
            metavar="A,B,..",
            help="a subset of the table's rows (default: all; rw variants lists them)",
        )
        parser.add_argument("--seeds", default="0,1,2", metavar="S,S,..", help="seeds (default: 0,1,2)")
        parser.add_argument(
            "--steps",
            type=_positive_int,
            default=None,
            metavar="N",
            help="training steps per run (default: the config's train.steps)",
        )
        parser.add_argument(
            "--jobs",
            type=_positive_int,
            default=None,
            metavar="J",
            help="runs at a time (default: the number of cores; with --executor ray the cluster's CPUs, or its GPUs "
            "for GPU runs); each gets cores/J threads",
        )
        parser.add_argument(
            "--executor",
            choices=("local", "ray"),
            default="local",
            help="where runs run: child processes of this one (local, default) or Ray tasks on a Ray cluster",
        )
        parser.add_argument(
            "--address",
            default=None,
            metavar="ADDR",
            help="with --executor ray: the cluster's address (host:port or auto; default: RAY_ADDRESS, else what "
            "ray.init() finds or starts)",
        )
        parser.add_argument(
            "--config",
            default=None,
            metavar="FILE",
            help="base config for every run (a YAML file or a shipped config name)",
        )
        parser.add_argument("--out", required=True, metavar="DIR", help="output folder (reused to resume)")
        parser.add_argument(
            "--bootstrap-reps",
            type=_positive_int,
            default=BOOTSTRAP_REPS,
            metavar="N",
            help=f"bootstrap resamples per interval (default: {BOOTSTRAP_REPS}; rliable's own, 50000, takes ten "
            "times longer)",
        )
        parser.add_argument("--quiet", action="store_true", help="no progress bar")
        parser.add_argument(
            "overrides", nargs="*", type=_override, metavar="key=value", help="config overrides applied to every run"
        )

    def run(self, args: argparse.Namespace) -> int:
        from rwcore.trainer.ablate import check_resume, parse_seeds, plan_ablation, plan_grid

        executor = None
        try:
            if args.address is not None and args.executor != "ray":
                raise ValueError(f"--address {args.address}: only with --executor ray")
            if args.paper is None and args.grid is None:
                raise ValueError("one of --paper (a paper's table) or --grid (settings of your own) is required")
            if args.paper is not None and args.grid is not None:
                raise ValueError("--paper and --grid: give one (--grid train.method=a,b crosses variants too)")
            if args.grid is not None and args.variants is not None:
                raise ValueError("--variants selects rows of a --paper table; in a grid, --grid train.method=a,b")
            seeds = parse_seeds(args.seeds)
            variants = [v.strip() for v in args.variants.split(",")] if args.variants is not None else None
            config = _config_file(args.config)
            if args.grid is not None:
                plan = plan_grid(
                    args.grid,
                    seeds,
                    args.steps,
                    args.jobs,
                    args.out,
                    args.overrides,
                    config,
                    bootstrap_reps=args.bootstrap_reps,
                )  # loads every point's config: a bad key or value fails here, before anything starts
            else:
                plan = plan_ablation(
                    args.paper,
                    variants,
                    seeds,
                    args.steps,
                    args.jobs,
                    args.out,
                    args.overrides,
                    config,
                    bootstrap_reps=args.bootstrap_reps,
                )  # loads every variant's config: a bad key fails here, before anything starts
            check_resume(plan)
            if args.executor == "ray":  # before the lock: a bad address writes nothing
                from rwcore.trainer.ablate.ray_executor import connect

                executor = connect(args.address, plan, args.jobs)
                plan.jobs = executor.jobs
        except ValueError as error:
            raise CommandError(str(error)) from None
        try:
            with _lock_run_folder(plan.out):  # one rw ablate per OUT; run_ablation takes it again, as the same process
                if executor is not None:
                    try:
                        executor.check_folder(plan)  # every node sees --out, or nothing starts
                    except ValueError as error:
                        raise CommandError(str(error)) from None
                return self._ablate(args, plan, executor)
        finally:
            if executor is not None:
                executor.close()

    def _ablate(self, args: argparse.Namespace, plan: Any, executor: Any = None) -> int:
        from rwcore.trainer.ablate import prepare_prior, run_ablation
        from rwcore.trainer.run_lock import RunLockError

        runs = len(plan.variants) * len(plan.seeds)
        rows = "points" if plan.points else "variants"
        print(
            f"rw ablate: {plan.paper}, {len(plan.variants)} {rows} x {len(plan.seeds)} seeds = {runs} runs, "
            f"{plan.jobs} at a time, into {plan.out}",
            file=sys.stderr,
        )
        if executor is not None:
            print(f"rw ablate: {executor.describe()}", file=sys.stderr)
        for cells in plan.inapplicable.values():
            for cell in cells:
                print(f"rw ablate: {cell['note']}", file=sys.stderr)
        try:
            prior = prepare_prior(plan, progress=not args.quiet)
        except ValueError as error:
            raise CommandError(str(error)) from None
        if prior is not None:
            whose = "the first point's runs start" if plan.points else "every run starts"  # a grid may vary the prior
            print(f"rw ablate: {whose} from the reading prior {prior}", file=sys.stderr)
        try:
            summary = run_ablation(plan, progress=not args.quiet, **({"executor": executor} if executor else {}))
        except RunLockError as error:  # a run another process still writes
            raise CommandError(str(error)) from None
        for name in ("ablation.md", "ablation.json", "ablation.png"):
            print(plan.out / name)
        failed = sum(row["failed"] for row in summary["rows"])
        if failed:
            print(f"{failed} run(s) failed: see {plan.out / 'ablation.md'}", file=sys.stderr)
        return 1 if failed else 0
