"""`rw bench`: the benchmark suite of a source checkout (bench/run_all.py, bench/gpu_static.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rwcore.trainer.cli.command import PROG, Command, CommandError

__all__ = ["BenchCommand"]


def _bench_candidates() -> list[Path]:
    """Where bench/run_all.py may be: beside the package in a source checkout (editable install), then the
    current folder. Tests replace this function."""
    return [Path(__file__).resolve().parents[2] / "bench", Path.cwd() / "bench"]


def _load_bench_runner(filename: str = "run_all.py") -> Any:
    """bench/run_all.py (or another script of bench/) of a source checkout, imported as a module."""
    import importlib.util

    candidates = _bench_candidates()
    for folder in candidates:
        script = folder / filename
        if script.is_file():
            spec = importlib.util.spec_from_file_location(f"rwcore_bench_{script.stem}", script)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    looked = ", ".join(str(folder) for folder in dict.fromkeys(candidates))
    raise CommandError(
        "the benchmarks are not installed with the package: rw bench runs bench/run_all.py from a source "
        f"checkout (looked in {looked}); run it from a source checkout of rwcore (pip install -e . there, "
        "then rw bench in that folder)"
    )


class BenchCommand(Command):
    name = "bench"
    help = "run the benchmark suite (from a source checkout) and write a JSON and Markdown report"
    description = (
        "Runs bench/run_all.py of a source checkout: evidence store and sampler vs pure Python, the "
        "fused policy loss vs PyTorch eager and Liger-Kernel, advantages vs a per-group loop, the "
        "adaptive share of a training step, asynchronous vs synchronous training, a GRPO step vs TRL's "
        "and behavior-scoring memory (plus, on a GPU, the kernels against the device's peak); "
        "prints each ratio table and writes report.json and report.md into --out."
    )
    epilog = """examples:
  rw bench --quick                              # small sizes, under two minutes on 2 cores
  rw bench --only advantages sampler --out /tmp/bench
  rw bench                                      # full sizes into bench/results/latest/
  rw bench --gpu-static                         # no GPU needed: registers, spills, occupancy, roofline
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
        parser.add_argument(
            "--out",
            metavar="DIR",
            default=None,
            help="folder for report.json and report.md (default: bench/results/latest)",
        )
        parser.add_argument(
            "--only",
            nargs="+",
            metavar="NAME",
            default=None,
            help="run only these benchmarks: sampler, kernels, advantages, training_step, kernels_cuda, "
            "async, trl_step, scoring_memory",
        )
        parser.add_argument(
            "--gpu-static",
            action="store_true",
            help="instead: compile every Triton kernel for sm_80 and sm_90 and write the resource "
            "table (registers, spills, shared memory, occupancy) and the roofline model to "
            "bench/results/gpu-static.md and roofline.md, or into --out (bench/gpu_static.py)",
        )

    def run(self, args: argparse.Namespace) -> int:
        if args.gpu_static:
            if args.quick or args.only:
                raise CommandError("--gpu-static takes no --quick or --only (it compiles every kernel variant)")
            out = [] if args.out is None else ["--out-dir", str(args.out)]
            if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
                raise CommandError(f"--out: {str(args.out)!r} exists and is not a folder")
            return _load_bench_runner("gpu_static.py").main(out)
        runner = _load_bench_runner()
        argv = ["--quick"] if args.quick else []
        if args.out is not None:
            out = Path(args.out)
            if out.exists() and not out.is_dir():
                raise CommandError(f"--out: {str(out)!r} exists and is not a folder")
            argv += ["--out", str(out)]
        if args.only:
            names = []
            for text in args.only:
                name = text.strip().lower().replace("-", "_")
                if name not in runner.NAMES:
                    raise CommandError(f"--only: unknown benchmark {text!r}; choose from {', '.join(runner.NAMES)}")
                names.append(name)
            argv += ["--only", *names]
        command = " ".join(
            [
                PROG,
                "bench",
                *(["--quick"] if args.quick else []),
                *(["--out", str(args.out)] if args.out is not None else []),
                *(["--only", *args.only] if args.only else []),
            ]
        )
        return runner.main(argv, command=command)
