"""`rw report`, `rw analyze` and `rw compare`: the commands that read finished run folders and write plots and
tables from them."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rwcore.trainer.cli.command import Command, CommandError, _positive_int

__all__ = ["ReportCommand", "AnalyzeCommand", "CompareCommand"]


class ReportCommand(Command):
    name = "report"
    help = "render PNG plots from a run folder"
    description = (
        "Renders active_rubric_emphasis.png, sampling_probabilities.png, pool_counts.png and "
        "success_curves.png from a run folder; a plot whose inputs are missing is skipped "
        "with a note."
    )
    epilog = """examples:
  rw report runs/demo                  # PNGs into runs/demo/report/
  rw report runs/demo --out figures/
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by rw train")
        parser.add_argument("--out", metavar="DIR", default=None, help="output folder (default: RUN_DIR/report)")

    def run(self, args: argparse.Namespace) -> int:
        run_dir = Path(args.run_dir)
        if not run_dir.is_dir():
            raise CommandError(f"RUN_DIR {str(run_dir)!r} is not a folder")
        from rwcore.trainer.report import render_report

        try:
            results = render_report(run_dir, args.out)
        except ValueError as error:
            raise CommandError(str(error)) from None
        written = 0
        for name, outcome in results.items():
            if isinstance(outcome, Path) or (
                isinstance(outcome, str) and outcome.endswith(".png") and os.path.exists(outcome)
            ):
                print(outcome)
                written += 1
            else:
                print(f"skipped {name}: {outcome.removeprefix('skipped: ')}", file=sys.stderr)
        if not written:
            print("no plots written (see the notes above)", file=sys.stderr)
        return 0


class AnalyzeCommand(Command):
    name = "analyze"
    help = "RewardWeaver's appendix E and G tables from a run folder (JSON, Markdown, PNG)"
    description = (
        "Writes bottleneck.{json,md,png} (appendix E: bottleneck importance vs next-stage failure reduction, "
        "Spearman, partial and within-stage) and retention.{json,md,png} (appendix G: capability scores on the "
        "fixed diagnostic set after deactivation) from reward_history.json and diagnostics.json."
    )
    epilog = """examples:
  rw analyze runs/demo                 # into runs/demo/analysis/
  rw analyze runs/demo --out tables/
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by rw train")
        parser.add_argument("--out", metavar="DIR", default=None, help="output folder (default: RUN_DIR/analysis)")

    def run(self, args: argparse.Namespace) -> int:
        from rwcore.trainer.analyze import analyze_run

        try:
            written = analyze_run(args.run_dir, args.out)
        except ValueError as error:
            raise CommandError(str(error)) from None
        for path in written:
            print(path)
        return 0


class CompareCommand(Command):
    name = "compare"
    help = "plot several runs' held-out success curves on one figure, and compare runs grouped by config"
    description = (
        "Reads each RUN_DIR's metrics.jsonl and draws its held-out success curve (with a ±1 standard "
        "error band where logged); prints each run's first, final and best held-out success. Then groups the "
        "runs whose config.yaml differs only in train.seed (the seeds of one setup) and prints per group the "
        "mean final held-out success and normalized AUC, and with at least 5 runs the interquartile mean of "
        "each with a 95% bootstrap interval; with --baseline also each other group's probability of "
        "improvement over the baseline group and the IQM difference, with intervals where both have 5 runs."
    )
    epilog = """examples:
  rw compare runs/a runs/b --out compare.png
  rw compare runs/ablate-arise/runs/arise-s0 runs/ablate-arise/runs/outcome_only-s0
  rw compare runs/claim/runs/* --baseline outcome_only              # a train.method one group has
  rw compare runs/lr3/s* runs/lr4/s* --baseline 'runs/lr4/*'        # the group of the runs a pattern matches
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        from rwcore.trainer.ablate.statistics import BOOTSTRAP_REPS

        parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folders written by rw train")
        parser.add_argument("--out", default="compare.png", metavar="FILE", help="PNG to write (default: compare.png)")
        parser.add_argument(
            "--baseline",
            default=None,
            metavar="RUN_DIR|PATTERN|GROUP",
            help="the group to compare the others with: the group of a RUN_DIR or of the runs a glob pattern "
            "matches, a train.method that one group has, or a group's printed name",
        )
        parser.add_argument(
            "--bootstrap-reps",
            type=_positive_int,
            default=BOOTSTRAP_REPS,
            metavar="N",
            help=f"bootstrap resamples per interval (default: {BOOTSTRAP_REPS})",
        )

    def run(self, args: argparse.Namespace) -> int:
        from rwcore.trainer.ablate.statistics import format_estimate
        from rwcore.trainer.compare import compare_groups, plot_compare

        if not str(args.out).endswith(".png"):
            raise CommandError(f"--out must name a .png file, got {args.out!r}")
        try:
            compared = compare_groups(args.run_dirs, args.baseline, args.bootstrap_reps)  # checks before drawing
            path, summaries = plot_compare(args.run_dirs, args.out)
        except ValueError as error:
            raise CommandError(str(error)) from None
        for entry in summaries:
            print(
                f"{entry['name']}: held-out success {entry['start']:.3f} -> {entry['final']:.3f} "
                f"(best {entry['best']:.3f}, step {entry['final_step']})"
            )
        print("groups (runs whose config.yaml differs only in train.seed):")
        for group in compared["groups"]:
            final, auc = group["final"], group["auc"]
            seeds = ",".join("?" if seed is None else str(seed) for seed in group["seeds"])
            ceilings = ", ".join(f"{float(c['value'])} ({c['source']})" for c in group["ceilings"])
            print(
                f"  {group['name']}{' [baseline]' if group['baseline'] else ''}: {final['n']} run(s), seeds {seeds}; "
                f"final {final['mean']:.3f} ± {final['sd']:.3f} sd; normalized AUC "
                + (f"{auc['mean']:.3f} ± {auc['sd']:.3f} sd" if auc["n"] else "— (one evaluation)")
                + f" (ceiling {ceilings}); IQM final {format_estimate(group['iqm']['final'])}, "
                f"IQM AUC {format_estimate(group['iqm']['auc'])}"
            )
            versus = group["vs_baseline"]
            if versus:
                print(
                    f"    vs {compared['baseline']}: P(improvement) final "
                    f"{format_estimate(versus['final']['probability_of_improvement'])}, AUC "
                    f"{format_estimate(versus['auc']['probability_of_improvement'])}; IQM difference final "
                    f"{format_estimate(versus['final']['iqm_difference'], signed=True)}, AUC "
                    f"{format_estimate(versus['auc']['iqm_difference'], signed=True)}"
                )
        boot = compared["bootstrap"]
        print(
            f"[low, high]: {boot['confidence']:.0%} stratified-bootstrap interval over the runs of a group "
            f"({boot['reps']} resamples, seed {boot['seed']}); fewer than {boot['min_seeds']} runs: no interval"
        )
        print(path)
        return 0
