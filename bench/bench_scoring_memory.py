"""Peak memory of behavior scoring: the chunked fused-linear path vs materialized logits.

    .venv/bin/python bench/bench_scoring_memory.py                       # V = 32k and 152k, 4,096 tokens
    .venv/bin/python bench/bench_scoring_memory.py --quick               # V = 32k, 1,024 tokens
    .venv/bin/python bench/bench_scoring_memory.py --out bench/results/scoring-memory.json

What `rollout.behavior_logprobs=trainer` (and evaluation scoring) has to compute: the fp32 log-prob
of each token from the final hidden states [N, H] and the LM head [V, H]. The peer is what
`score_behavior` did before: the model's full logits [N, V], upcast to fp32, then
`token_logprobs`. rwcore's path is `fused_linear_logprobs` (one [chunk, V] block of logits at a
time). Each variant runs in a fresh subprocess; its peak is the growth of the process's peak
resident set (VmHWM, reset through /proc/self/clear_refs just before) over the inputs in memory, so allocator caching in
one variant
cannot hide the other's peak. The two outputs are compared (max abs difference) in the same run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine, publish  # noqa: E402

_CHILD = r"""
import ctypes, gc, json, sys, torch
from rwcore.kernels import fused_linear_logprobs, token_logprobs
N, H, V, variant = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.manual_seed(0)
hidden = torch.randn(N, H) / H ** 0.5
weight = torch.randn(V, H) * 0.02
labels = torch.randint(0, V, (N,))
def status_mib(key):
    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
    return int(line.split()[1]) / 1024
with torch.no_grad():
    small = weight[:16].clone()  # load the code paths without touching the measured peak
    fused_linear_logprobs(hidden[:64], small, labels[:64] % 16, validate=False)
    token_logprobs(hidden[:64] @ small.T, labels[:64] % 16, validate=False)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed pages go back to the OS
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak resident set (VmHWM) to the current one
    before = status_mib("VmRSS")
    if variant == "fused":
        logp = fused_linear_logprobs(hidden, weight, labels, validate=False)
    else:
        logits = (hidden @ weight.T).float()  # [N, V]: what model(...).logits.float() holds
        logp = token_logprobs(logits, labels, validate=False)
        del logits
    after = status_mib("VmHWM")
torch.save(logp, sys.argv[5])
print(json.dumps({"peak_extra_mib": after - before, "inputs_mib": before}))
"""


def measure(n: int, h: int, v: int, variant: str, tmp: Path) -> dict:
    out = tmp / f"{variant}-{v}.pt"
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(n), str(h), str(v), variant, str(out)],
        capture_output=True,
        text=True,
        check=False,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    if result.returncode != 0:
        raise RuntimeError(f"{variant} at V={v} failed: {result.stderr[-2000:]}")
    row = json.loads(result.stdout.strip().splitlines()[-1])
    row["output"] = str(out)
    return row


def main(argv=None) -> dict:
    import tempfile

    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4096, help="N: scored tokens (rollouts x length)")
    parser.add_argument("--hidden", type=int, default=512, help="H")
    parser.add_argument("--vocab", default="32000,151936", help="comma-separated V values")
    parser.add_argument("--quick", action="store_true", help="1,024 tokens, V = 32k")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.vocab = 1024, "32000"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for v in [int(x) for x in args.vocab.split(",")]:
            fused = measure(args.tokens, args.hidden, v, "fused", Path(tmp))
            materialized = measure(args.tokens, args.hidden, v, "materialized", Path(tmp))
            difference = float((torch.load(fused["output"]) - torch.load(materialized["output"])).abs().max())
            rows.append(
                {
                    "vocab": v,
                    "fused_peak_mib": fused["peak_extra_mib"],
                    "materialized_peak_mib": materialized["peak_extra_mib"],
                    "logits_mib": args.tokens * v * 4 / 2**20,
                    "ratio": fused["peak_extra_mib"] / max(materialized["peak_extra_mib"], 1e-9),
                    "max_abs_difference": difference,
                }
            )
    report = {
        "machine": machine(torch=torch.__version__),
        "config": {"tokens": args.tokens, "hidden": args.hidden},
        "rows": rows,
    }
    publish(report, render(report), args.out)
    return report


def render(report: dict) -> str:
    m, c = report["machine"], report["config"]
    lines = [
        "# Behavior scoring peak memory: fused-linear (chunked) vs materialized logits",
        "",
        f"Machine: {m.get('cpu', '?')}, {m['cpus']} logical CPUs, torch {m.get('torch', '?')}. "
        f"N = {c['tokens']} tokens, H = {c['hidden']}, fp32, one thread; peak = growth of the process's "
        "peak resident set (VmHWM) over the inputs, each variant in its own process.",
        "",
        "| V | full fp32 logits | materialized peak | fused peak | fused / materialized | max abs difference |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['vocab']:,} | {row['logits_mib']:.0f} MiB | {row['materialized_peak_mib']:.0f} MiB "
            f"| {row['fused_peak_mib']:.0f} MiB | **{row['ratio']:.3f}** | {row['max_abs_difference']:.1e} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
