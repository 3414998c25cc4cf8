"""fused_linear_policy_loss forward + backward vs PyTorch eager and Liger-Kernel, on the CPU.

    .venv/bin/python bench/bench_kernels.py                       # default sizes, a few minutes
    .venv/bin/python bench/bench_kernels.py --quick               # one small size
    .venv/bin/python bench/bench_kernels.py --out bench/results/kernels-cpu.json

Peers, all computing Arise's policy loss from hidden states and an LM head:
- eager: logits = h @ W.T materialized, log_softmax, gather, ratio, filter, dual clip, backward;
- liger: Liger-Kernel's LigerFusedLinearGRPOLoss (torch.compile'd chunks) configured as close as it
  allows: no KL (beta=0, no reference model), token-level "dapo" normalization by the number of
  completion tokens, ratio clipped to [0.5, 5.0] (it clips where Arise filters) and two-sided
  clipping at delta=3 for negative advantages (INTELLECT-2's form of dual clipping);
- rwcore: rwcore.kernels.fused_linear_policy_loss with the PyTorch backend (the CPU path).

Each (peer, size) runs in a fresh subprocess: a warm-up (which also compiles Liger), then the peak
memory of one forward + backward (resident-set high-water mark above the inputs, with glibc's mmap
threshold pinned so freed tensors leave the resident set), then the median time of several runs.
Ratios are rwcore / peer, measured in the same run; float32, temperature 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _report import machine, publish  # noqa: E402

PEERS = ("rwcore", "eager", "liger")
OPTIONAL_PEERS = ("compile",)  # torch.compile of the eager code: add with --peers rwcore,eager,liger,compile
SEQ_LEN = 256
DEFAULT_SIZES = ((1024, 512, 16384), (2048, 1024, 32768))  # (tokens N, hidden H, vocab V)


def resident_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def worker(peer: str, tokens: int, hidden_size: int, vocab: int, repeats: int) -> dict:
    import torch

    torch.manual_seed(0)
    from rwcore.kernels import fused_linear_logprobs, fused_linear_policy_loss

    batch = max(1, tokens // SEQ_LEN)
    tokens = batch * SEQ_LEN
    hidden = torch.randn(tokens, hidden_size) / hidden_size**0.5
    weight = torch.randn(vocab, hidden_size)
    labels = torch.randint(0, vocab, (tokens,))
    mask = torch.rand(tokens) < 0.9
    with torch.no_grad():
        current = fused_linear_logprobs(hidden, weight, labels, backend="torch")
    behavior = current + 0.3 * torch.randn(tokens)  # most ratios inside (0.5, 5), some filtered
    advantages = torch.randn(batch)
    per_token_advantages = advantages.repeat_interleave(SEQ_LEN)

    if peer == "rwcore":

        def step(h, w):
            loss, _ = fused_linear_policy_loss(
                h, w, labels, behavior, per_token_advantages, mask, backend="torch", validate=False
            )
            loss.backward()
    elif peer in ("eager", "compile"):

        def eager_loss(h, w):
            logits = h @ w.t()
            logp = torch.log_softmax(logits.float(), dim=-1).gather(1, labels.unsqueeze(1)).squeeze(1)
            ratio = torch.exp((logp - behavior).clamp(-20, 20))
            keep = mask & (ratio > 0.5) & (ratio < 5.0)
            term = torch.where(
                keep, torch.minimum(-ratio * per_token_advantages, 3.0 * per_token_advantages.abs()), 0.0
            )
            return term.sum() / mask.sum()

        # "compile": the same eager code through torch.compile (Inductor), compiled in the warm-up.
        loss_of = torch.compile(eager_loss) if peer == "compile" else eager_loss

        def step(h, w):
            loss_of(h, w).backward()
    elif peer == "liger":
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        loss_fn = LigerFusedLinearGRPOLoss(
            beta=0.0, use_ref_model=False, epsilon_low=0.5, epsilon_high=4.0, delta=3.0, loss_type="dapo", compiled=True
        )
        shaped = lambda t: t.view(batch, SEQ_LEN, *t.shape[1:])  # noqa: E731

        def step(h, w):
            loss = loss_fn(
                shaped(h), w, shaped(labels), shaped(mask).float(), advantages, old_per_token_logps=shaped(behavior)
            )[0]
            loss.backward()
    else:
        raise ValueError(f"unknown peer {peer!r}")

    def fresh():
        return hidden.clone().requires_grad_(), weight.clone().requires_grad_()

    step(*fresh())  # warm-up (Liger compiles here)
    h, w = fresh()
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark
    before = resident_kib("VmRSS")
    step(h, w)
    peak = resident_kib("VmHWM") - before
    times = []
    for _ in range(repeats):
        h, w = fresh()
        start = time.perf_counter()
        step(h, w)
        times.append(time.perf_counter() - start)
    return {
        "peer": peer,
        "tokens": tokens,
        "hidden": hidden_size,
        "vocab": vocab,
        "seconds": statistics.median(times),
        "peak_mib": peak / 1024,
    }


def run_worker(peer: str, size: tuple, repeats: int) -> dict:
    env = dict(
        os.environ,
        MALLOC_MMAP_THRESHOLD_="65536",
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(os.cpu_count())),
    )
    command = [sys.executable, __file__, "--worker", peer, *map(str, size), str(repeats)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{peer} at {size} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def library_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in ("torch", "liger-kernel"):
        try:
            versions[name.replace("-", "_")] = version(name)
        except PackageNotFoundError:
            pass
    return versions


def render(report: dict) -> str:
    m = report["machine"]
    lines = [
        "# fused_linear_policy_loss (forward + backward) on the CPU",
        "",
        f"Machine: {m.get('cpu', '?')}, {m['cpus']} logical CPUs, {m['platform']}, Python {m['python']}, "
        f"torch {m['torch']}, liger-kernel {m.get('liger_kernel', '?')}. float32, sequences of {SEQ_LEN} tokens.",
        "Peak memory: resident-set high-water mark of one forward + backward above its inputs.",
        "",
        "| N x H x V | rwcore time | eager time | liger time | rwcore peak | eager peak | liger peak "
        "| time rwcore/eager | time rwcore/liger | peak rwcore/eager | peak rwcore/liger |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        r, e, g = row["rwcore"], row["eager"], row["liger"]
        lines.append(
            f"| {r['tokens']} x {r['hidden']} x {r['vocab']} | {r['seconds'] * 1e3:.0f} ms | {e['seconds'] * 1e3:.0f} "
            "ms "
            f"| {g['seconds'] * 1e3:.0f} ms | {r['peak_mib']:.0f} MiB | {e['peak_mib']:.0f} MiB | {g['peak_mib']:.0f} "
            "MiB "
            f"| {r['seconds'] / e['seconds']:.2f} | {r['seconds'] / g['seconds']:.2f} "
            f"| {r['peak_mib'] / e['peak_mib']:.2f} | {r['peak_mib'] / g['peak_mib']:.2f} |"
        )
    compiled = [row for row in report["rows"] if "compile" in row]
    if compiled:
        lines += [
            "",
            "| N x H x V | torch.compile time | torch.compile peak | time rwcore/compile | peak rwcore/compile |",
            "|---|---:|---:|---:|---:|",
        ]
        for row in compiled:
            r, c = row["rwcore"], row["compile"]
            lines.append(
                f"| {r['tokens']} x {r['hidden']} x {r['vocab']} | {c['seconds'] * 1e3:.0f} ms | "
                f"{c['peak_mib']:.0f} MiB | {r['seconds'] / c['seconds']:.2f} | {r['peak_mib'] / c['peak_mib']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--size",
        action="append",
        nargs=3,
        type=int,
        metavar=("N", "H", "V"),
        help="tokens, hidden size, vocabulary (repeatable; default: two sizes)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--peers", default=",".join(PEERS), help="comma-separated peers from rwcore,eager,liger (default) and compile"
    )
    parser.add_argument("--quick", action="store_true", help="one small size")
    parser.add_argument("--out", type=Path, help="write JSON here and Markdown beside it (.md)")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        peer, tokens, hidden_size, vocab, repeats = args.worker
        print(json.dumps(worker(peer, int(tokens), int(hidden_size), int(vocab), int(repeats))))
        return {}
    sizes = [tuple(s) for s in args.size] if args.size else ([(512, 128, 4096)] if args.quick else list(DEFAULT_SIZES))
    peers = [p for p in args.peers.split(",") if p]
    rows = []
    for size in sizes:
        row = {}
        for peer in peers:
            print(f"{peer:7s} N={size[0]} H={size[1]} V={size[2]} ...", flush=True)
            row[peer] = run_worker(peer, size, args.repeats)
        rows.append(row)
    report = {"machine": machine(**library_versions()), "rows": rows}
    if set(PEERS) <= set(peers):
        publish(report, render(report), args.out)
    else:
        print(json.dumps(rows, indent=2))
    return report


if __name__ == "__main__":
    main()
