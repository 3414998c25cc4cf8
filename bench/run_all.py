"""Every benchmark in one command: ratio tables on stdout, one JSON and one Markdown report.

    .venv/bin/python bench/run_all.py                         # full sizes (several minutes on a laptop)
    .venv/bin/python bench/run_all.py --quick                 # small sizes, under two minutes on 2 cores
    .venv/bin/python bench/run_all.py --only advantages sampler --out /tmp/bench
    .venv/bin/rw bench --quick                                # the same through the CLI

Benchmarks, in order (each is also a script of its own in bench/):
- sampler:       evidence store and capability sampler vs pure Python (bench_sampler.py)
- kernels:       fused_linear_policy_loss vs PyTorch eager and Liger-Kernel on the CPU (bench_kernels.py;
                 Liger is left out, with a note, when liger-kernel is not installed)
- advantages:    compute_advantages / length_regularize vs a per-group loop (bench_advantages.py)
- training_step: the adaptive machinery's share of a `rw train` step (bench_training_step.py)
- kernels_cuda:  the kernels on CUDA against the device's peak FLOP rate and bandwidth
                 (bench_kernels_cuda.py); skipped with a note when torch.cuda.is_available() is False
- async:         `rw train` throughput with rollout.max_lag 1 vs 0 (bench_async.py)
- trl_step:      one GRPO step, rwcore's trainer vs TRL's GRPOTrainer at equal work (bench_trl_step.py)
- scoring_memory: behavior-scoring peak memory, fused-linear vs materialized logits (bench_scoring_memory.py)
- shared_prefix: `rw train` step time with model.shared_prefix on vs off, with and without Arise's skills
                 (bench_shared_prefix.py)
- rollout_correction: fused_linear_policy_loss with each rollout-correction preset vs the plain fused loss,
                 time and added peak memory (bench_rollout_correction.py)

The report goes to OUT/report.json (every benchmark's full report and the machine) and
OUT/report.md (a summary of the headline ratios, then every benchmark's table); OUT defaults to
bench/results/latest/. A benchmark that fails is recorded with its error and the others still run;
the exit code is then 1.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import importlib.util
import json
import sys
import time
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from _report import machine  # noqa: E402

# name -> (module in bench/, what it measures)
BENCHMARKS = {
    "sampler": ("bench_sampler", "evidence store and capability sampler vs pure Python"),
    "kernels": ("bench_kernels", "fused_linear_policy_loss vs PyTorch eager and Liger-Kernel (CPU)"),
    "advantages": ("bench_advantages", "compute_advantages and length_regularize vs a per-group loop"),
    "training_step": ("bench_training_step", "the adaptive machinery's share of a training step"),
    "kernels_cuda": ("bench_kernels_cuda", "policy-loss kernels on CUDA against the device's peak"),
    "async": ("bench_async", "rw train throughput, rollout.max_lag 1 vs 0"),
    "trl_step": ("bench_trl_step", "one GRPO step, rwcore vs TRL GRPOTrainer at equal work"),
    "scoring_memory": ("bench_scoring_memory", "behavior-scoring peak memory, fused vs materialized"),
    "shared_prefix": ("bench_shared_prefix", "rw train step time, model.shared_prefix on vs off"),
    "rollout_correction": ("bench_rollout_correction", "fused loss with each rollout correction vs without"),
}
NAMES = tuple(BENCHMARKS)
DEFAULT_OUT = BENCH / "results" / "latest"


def normalize_name(text: str) -> str:
    name = text.strip().lower().replace("-", "_")
    if name not in BENCHMARKS:
        raise argparse.ArgumentTypeError(f"unknown benchmark {text!r}; choose from {', '.join(NAMES)}")
    return name


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _kernels_cpu_markdown(module, report: dict) -> str:
    """bench_kernels' own table needs all three peers; without Liger, a rwcore / eager table."""
    try:
        return module.render(report)
    except KeyError:
        pass
    lines = [
        "# fused_linear_policy_loss (forward + backward) on the CPU, rwcore vs eager",
        "",
        "liger-kernel is not installed, so its column is left out.",
        "",
        "| N x H x V | rwcore time | eager time | rwcore peak | eager peak | time rwcore/eager | peak rwcore/eager |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        r, e = row["rwcore"], row["eager"]
        lines.append(
            f"| {r['tokens']} x {r['hidden']} x {r['vocab']} | {r['seconds'] * 1e3:.0f} ms "
            f"| {e['seconds'] * 1e3:.0f} ms | {r['peak_mib']:.0f} MiB | {e['peak_mib']:.0f} MiB "
            f"| {r['seconds'] / e['seconds']:.2f} | {r['peak_mib'] / max(e['peak_mib'], 1e-9):.2f} |"
        )
    return "\n".join(lines) + "\n"


def run_one(name: str, quick: bool) -> dict:
    """Runs one benchmark in this process: {"report", "markdown", "seconds"} or {"skipped"} or {"error"}."""
    module_name, _ = BENCHMARKS[name]
    argv = ["--quick"] if quick else []
    if name == "kernels_cuda" and not _cuda_available():
        from bench_kernels_cuda import NO_GPU

        print(NO_GPU, flush=True)
        return {"skipped": NO_GPU}
    note = None
    if name == "kernels" and not _installed("liger_kernel"):
        argv += ["--peers", "rwcore,eager"]
        note = "liger-kernel is not installed: its peer was left out"
        print(note, flush=True)
    started = time.perf_counter()
    try:
        module = importlib.import_module(module_name)
        report = module.main(argv)
        markdown = _kernels_cpu_markdown(module, report) if name == "kernels" else module.render(report)
    except Exception as error:  # one failing benchmark must not stop the others
        traceback.print_exc()
        return {"error": f"{type(error).__name__}: {error}", "seconds": time.perf_counter() - started}
    if name == "kernels" and note:
        print(markdown)  # bench_kernels prints only JSON without all three peers
    result = {"report": report, "markdown": markdown, "seconds": time.perf_counter() - started}
    if note:
        result["note"] = note
    return result


# --------------------------------------------------------------------------- the summary


def headlines(name: str, report: dict) -> list[tuple[str, str]]:
    """(measurement, figure) pairs: the claims each benchmark exists for."""
    rows: list[tuple[str, str]] = []
    if name == "sampler":
        rows.append(("observe_many throughput, rwcore / pure Python", f"{report['observe_many']['speedup']:.0f}x"))
        for regime, row in report["sample"].items():
            rows.append((f"sample() latency, {regime} phase, pure Python / rwcore", f"{row['speedup']:.0f}x"))
    elif name == "kernels":
        for row in report["rows"]:
            r, e = row["rwcore"], row["eager"]
            size = f"{r['tokens']}x{r['hidden']}x{r['vocab']}"
            rows.append((f"peak memory rwcore / eager, {size}", f"{r['peak_mib'] / max(e['peak_mib'], 1e-9):.2f}"))
            rows.append((f"time rwcore / eager, {size}", f"{r['seconds'] / e['seconds']:.2f}"))
            if "liger" in row:
                rows.append((f"time rwcore / liger, {size}", f"{r['seconds'] / row['liger']['seconds']:.2f}"))
    elif name == "advantages":
        for row in report["rows"]:
            for function in ("compute_advantages", "length_regularize"):
                shape = f"{row['trajectories']:,}" + (
                    f" x {row['rubrics']}" if function == "compute_advantages" else ""
                )
                rows.append((f"{function}, {shape}, per-group loop / rwcore", f"{row[function]['speedup']:.0f}x"))
    elif name == "training_step":
        for row in report["methods"]:
            rows.append(
                (
                    f"adaptive share of step time, {row['method']} (mean over steps)",
                    f"{100 * row['adaptive_fraction_mean']:.2f} %",
                )
            )
        if report.get("step_ratio") is not None:
            rows.append(("median step time, combined / outcome_only", f"{report['step_ratio']:.2f}"))
    elif name == "kernels_cuda":
        spec = report["spec_peaks"]
        measured = report["measured_peaks"]
        for row in report["fused"]:
            if "flop_rate" not in row["rwcore"]:  # out of memory, or an error recorded in the report
                continue
            rate = row["rwcore"]["flop_rate"]
            spec_part = f"{rate / spec['flops']:.2f} of spec" if spec.get("flops") else "spec n/a"
            rows.append(
                (
                    f"fused_linear_policy_loss FLOP rate, {row['tokens']}x{row['hidden']}x{row['vocab']}",
                    f"{rate / 1e12:.0f} TFLOP/s ({spec_part}, {rate / measured['gemm_flops']:.2f} of GEMM)",
                )
            )
        for row in report["loss"]:
            bw = row["rwcore"]["bandwidth"]
            spec_part = f"{bw / spec['bandwidth']:.2f} of spec" if spec.get("bandwidth") else "spec n/a"
            rows.append(
                (
                    f"filtered_dual_clip_loss bandwidth, {row['tokens']} tokens",
                    f"{bw / 1e9:.0f} GB/s ({spec_part}, {bw / measured['copy_bandwidth']:.2f} of copy)",
                )
            )
    elif name == "async":
        rows.append(("rw train trajectories/s, max_lag 1 / max_lag 0", f"{report['trajectories_ratio']:.2f}x"))
    elif name == "trl_step":
        rows.append(("GRPO step time, TRL GRPOTrainer / rwcore", f"{report['speedup']:.2f}x"))
    elif name == "scoring_memory":
        for row in report["rows"]:
            rows.append((f"behavior-scoring peak, fused / materialized, V={row['vocab']:,}", f"{row['ratio']:.3f}"))
    elif name == "shared_prefix":
        for row in report["rows"]:
            rows.append((f"rw train step time, {row['method']}, shared_prefix off / on", f"{row['speedup']:.2f}x"))
    elif name == "rollout_correction":
        result = report["result"]
        corrections = [row for row in result["rows"] if row["name"] != "off"]  # "off" is the A/A control
        if corrections:
            slowest = max(corrections, key=lambda row: row["ratio"])
            largest = max(corrections, key=lambda row: row["added_vs_logits"])
            met = sum(row["time_ok"] for row in corrections)
            rows.append(
                (
                    f"fused loss time with a rollout correction / without, worst of {len(corrections)} "
                    f"({slowest['name']}; {met} within {report['targets']['time_ratio']:.2f})",
                    f"{slowest['ratio']:.2f}",
                )
            )
            rows.append(
                (
                    f"peak memory a rollout correction adds / [N, V] fp32 logits, worst ({largest['name']})",
                    f"{largest['added_vs_logits']:.3f}",
                )
            )
    return rows


def render(report: dict) -> str:
    m = report["machine"]
    lines = [
        "# rwcore benchmarks",
        "",
        f"Run {report['started']} with `{report['command']}` ({'quick sizes' if report['quick'] else 'full sizes'}).",
        f"Machine: {m.get('cpu', '?')}, {m['cpus']} logical CPUs, {m['platform']}, Python {m['python']}, "
        + ", ".join(f"{k} {v}" for k, v in m.items() if k not in ("cpu", "cpus", "platform", "python"))
        + ".",
        "Every figure is a ratio against a peer measured in the same process and run (see each section).",
        "",
        "| benchmark | measurement | figure |",
        "|---|---|---:|",
    ]
    for name, result in report["benchmarks"].items():
        if "skipped" in result:
            lines.append(f"| {name} | skipped | {result['skipped']} |")
        elif "error" in result:
            lines.append(f"| {name} | FAILED | {result['error'].splitlines()[0][:200]} |")
        else:
            for measurement, figure in headlines(name, result["report"]):
                lines.append(f"| {name} | {measurement} | {figure} |")
    for name, result in report["benchmarks"].items():
        if "markdown" in result:
            body = result["markdown"].strip().splitlines()
            if body and body[0].startswith("# "):
                body[0] = "#" + body[0]  # each benchmark's title one level down
            lines += [
                "",
                *body,
                "",
                f"_{name}: {result['seconds']:.0f} s" + (f"; {result['note']}_" if result.get("note") else "_"),
            ]
    return "\n".join(lines) + "\n"


def _library_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for package in ("rwcore", "numpy", "torch", "triton", "liger-kernel"):
        try:
            versions[package.replace("-", "_")] = version(package)
        except PackageNotFoundError:
            pass
    try:
        import torch

        versions["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    if _cuda_available():
        import torch

        versions["gpu"] = torch.cuda.get_device_name(0)
    return versions


def run(names, quick: bool, out: Path | None, command: str = "bench/run_all.py") -> dict:
    """Runs `names` in order, writes OUT/report.json and OUT/report.md when `out` is set; returns the report."""
    from rwcore._io import atomic_write_bytes

    report = {
        "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command,
        "quick": quick,
        "machine": machine(**_library_versions()),
        "benchmarks": {},
    }
    for name in names:
        print(f"\n=== {name}: {BENCHMARKS[name][1]} ===", flush=True)
        report["benchmarks"][name] = run_one(name, quick)
    text = render(report)
    print("\n" + "\n\n".join(text.split("\n\n", 3)[:3]))  # title, run line and the summary table
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out / "report.json", json.dumps(report, indent=2, default=str).encode())
        atomic_write_bytes(out / "report.md", text.encode())
        print(f"\nreport: {out / 'report.md'} and {out / 'report.json'}", flush=True)
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run_all.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (under two minutes on 2 cores)")
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        metavar="DIR",
        help=f"folder for report.json and report.md (default: {DEFAULT_OUT.relative_to(ROOT)})",
    )
    parser.add_argument(
        "--only", nargs="+", type=normalize_name, metavar="NAME", help=f"run only these benchmarks ({', '.join(NAMES)})"
    )
    return parser


def main(argv=None, command: str | None = None) -> int:
    """Entry point of `bench/run_all.py` and `rw bench`; 0 when every selected benchmark ran (or was skipped)."""
    args = build_parser().parse_args(argv)
    names = [n for n in NAMES if n in set(args.only)] if args.only else list(NAMES)
    if command is None:
        command = " ".join(["bench/run_all.py", *(sys.argv[1:] if argv is None else argv)])
    report = run(names, args.quick, args.out, command=command)
    failed = [name for name, result in report["benchmarks"].items() if "error" in result]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
