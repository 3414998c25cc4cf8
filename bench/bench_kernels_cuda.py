"""The policy-loss kernels on CUDA: achieved FLOP rate and bandwidth as a fraction of the device's peak.

    .venv/bin/python bench/bench_kernels_cuda.py            # needs a CUDA GPU; says so and exits otherwise
    .venv/bin/python bench/bench_kernels_cuda.py --quick
    .venv/bin/python bench/bench_kernels_cuda.py --out bench/results/kernels-cuda.json

Each operation is measured against the resource that bounds it:
- fused_linear_policy_loss (forward + backward, bf16, Triton backend) is compute bound: it does the
  three GEMMs of an LM head (logits, d hidden, d weight), 6 N H V FLOPs, so its figure is the
  achieved FLOP rate; PyTorch eager (materialized logits) is the peer, with peak allocated memory.
- filtered_dual_clip_loss (forward + backward, fp32 log-probs) is memory bound: the least it can
  move is 13 bytes per token (read log-prob, behavior log-prob and the int8 mask, write d loss / d
  log-prob), so its figure is the achieved bandwidth; PyTorch eager is the peer.
Peaks: the vendor's dense bf16 FLOP rate and memory bandwidth where the device is in SPEC_PEAKS
(or bandwidth from the device properties), and always a measured reference in the same run (a large
cuBLAS bf16 GEMM and a device-to-device copy), so every fraction is also given against what this
device actually reaches. Times are medians of CUDA-synchronized repeats after a warm-up.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine, publish  # noqa: E402

NO_GPU = "GPU benchmarks need a GPU: torch.cuda.is_available() is False on this machine; skipped"
# (substring of torch.cuda.get_device_name(), dense bf16 FLOP/s, memory bytes/s), vendor datasheets.
SPEC_PEAKS = (
    ("H200", 989e12, 4.8e12),
    ("H100 PCIe", 756e12, 2.0e12),
    ("H100", 989e12, 3.35e12),
    ("A100-SXM4-80GB", 312e12, 2.039e12),
    ("A100", 312e12, None),
    ("L40S", 362e12, 0.864e12),
    ("L4", 121e12, 0.3e12),
)
FUSED_SIZES = ((8192, 3584, 151_936), (32_768, 3584, 151_936))  # (tokens N, hidden H, vocab V)
FUSED_QUICK = ((4096, 2048, 32_768),)
LOSS_TOKENS = (16_777_216,)  # B * T with T = 4096
LOSS_QUICK = (4_194_304,)


def spec_peaks(torch, device) -> dict:
    name = torch.cuda.get_device_name(device)
    flops = bandwidth = None
    for key, peak_flops, peak_bandwidth in SPEC_PEAKS:
        if key in name:
            flops, bandwidth = peak_flops, peak_bandwidth
            break
    props = torch.cuda.get_device_properties(device)
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    if bandwidth is None and clock_khz and bus_bits:
        bandwidth = 2 * clock_khz * 1e3 * bus_bits / 8  # double data rate
    return {"name": name, "flops": flops, "bandwidth": bandwidth, "memory_gib": props.total_memory / 2**30}


def timed(torch, device, function, repeats: int) -> float:
    """Median seconds of `repeats` synchronized calls, after one warm-up call (Triton compiles there)."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    function()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def peak_memory(torch, device, function) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    function()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def measured_peaks(torch, device, quick: bool) -> dict:
    cuda = device.type == "cuda"
    n = (4096 if quick else 8192) if cuda else 256
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    gemm = timed(torch, device, lambda: a @ a, 5)
    del a
    elements = ((1 << 26) if quick else (1 << 29)) if cuda else (1 << 22)  # 256 MiB / 2 GiB of fp32 on CUDA
    x = torch.empty(elements, device=device, dtype=torch.float32)
    y = torch.empty_like(x)
    copy = timed(torch, device, lambda: y.copy_(x), 5)
    return {"gemm_flops": 2 * n**3 / gemm, "copy_bandwidth": 2 * x.numel() * 4 / copy}


def bench_fused(torch, device, tokens: int, hidden_size: int, vocab: int, repeats: int) -> dict:
    from rwcore.kernels import fused_linear_policy_loss

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    hidden = (torch.randn(tokens, hidden_size, device=device, generator=gen) / hidden_size**0.5).to(dtype)
    weight = (torch.randn(vocab, hidden_size, device=device, generator=gen) * 0.02).to(dtype)
    labels = torch.randint(0, vocab, (tokens,), device=device, generator=gen)
    mask = torch.rand(tokens, device=device, generator=gen) < 0.9
    # The head starts near uniform, so log-probs are near -log V: most ratios land inside (0.5, 5).
    behavior = -math.log(vocab) + 0.3 * torch.randn(tokens, device=device, generator=gen)
    advantages = torch.randn(tokens, device=device, generator=gen)
    h, w = hidden.requires_grad_(), weight.requires_grad_()

    def rwcore_step():
        h.grad = w.grad = None
        loss, _ = fused_linear_policy_loss(h, w, labels, behavior, advantages, mask, backend="auto", validate=False)
        loss.backward()

    def eager_step():
        h.grad = w.grad = None
        logp = torch.log_softmax((h @ w.t()).float(), dim=-1).gather(1, labels.unsqueeze(1)).squeeze(1)
        ratio = torch.exp((logp - behavior).clamp(-20, 20))
        keep = mask & (ratio > 0.5) & (ratio < 5.0)
        term = torch.where(keep, torch.minimum(-ratio * advantages, 3.0 * advantages.abs()), 0.0)
        (term.sum() / mask.sum()).backward()

    flops = 6.0 * tokens * hidden_size * vocab
    row = {"tokens": tokens, "hidden": hidden_size, "vocab": vocab, "dtype": str(dtype).removeprefix("torch."),
           "flops": flops}
    for name, step in (("rwcore", rwcore_step), ("eager", eager_step)):
        try:
            seconds = timed(torch, device, step, repeats)
            row[name] = {"seconds": seconds, "flop_rate": flops / seconds, "peak_mib": peak_memory(torch, device, step)}
        except torch.cuda.OutOfMemoryError:  # eager's materialized logits at large N on a smaller device
            h.grad = w.grad = None
            torch.cuda.empty_cache()
            row[name] = {"oom": True}
            print(f"  {name}: out of memory", flush=True)
    return row


def bench_loss(torch, device, tokens: int, repeats: int) -> dict:
    from rwcore.kernels import filtered_dual_clip_loss

    seq = 4096 if tokens >= 4096 else tokens
    batch = tokens // seq
    gen = torch.Generator(device=device).manual_seed(0)
    logp = (-torch.rand(batch, seq, device=device, generator=gen) * 5).requires_grad_()
    behavior = logp.detach() + 0.3 * torch.randn(batch, seq, device=device, generator=gen)
    advantages = torch.randn(batch, device=device, generator=gen)
    mask = torch.rand(batch, seq, device=device, generator=gen) < 0.9
    mask_i8 = mask.to(torch.int8)

    def rwcore_step():
        logp.grad = None
        loss, _ = filtered_dual_clip_loss(logp, behavior, advantages, mask_i8, backend="auto", validate=False)
        loss.backward()

    def eager_step():
        logp.grad = None
        adv = advantages[:, None]
        ratio = torch.exp((logp - behavior).clamp(-20, 20))
        keep = mask & (ratio > 0.5) & (ratio < 5.0)
        term = torch.where(keep, torch.minimum(-ratio * adv, 3.0 * adv.abs()), 0.0)
        (term.sum() / mask.sum()).backward()

    moved = 13.0 * batch * seq
    row = {"tokens": batch * seq, "bytes": moved}
    for name, step in (("rwcore", rwcore_step), ("eager", eager_step)):
        seconds = timed(torch, device, step, repeats)
        row[name] = {"seconds": seconds, "bandwidth": moved / seconds}
    return row


def _fraction(value, peak) -> str:
    return f"{value / peak:.2f}" if peak else "n/a"


def render(report: dict) -> str:
    m, peaks, measured = report["machine"], report["spec_peaks"], report["measured_peaks"]
    spec_flops, spec_bw = peaks.get("flops"), peaks.get("bandwidth")
    lines = [
        f"# Policy-loss kernels on {peaks['name']}",
        "",
        f"Machine: {peaks['name']} ({peaks['memory_gib']:.0f} GiB), {m.get('cpu', '?')}, torch {m.get('torch', '?')}, "
        f"triton {m.get('triton', '?')}, Python {m['python']}.",
        f"Peaks: spec {spec_flops / 1e12 if spec_flops else float('nan'):.0f} TFLOP/s dense bf16, "
        f"{spec_bw / 1e12 if spec_bw else float('nan'):.2f} TB/s; measured in this run "
        f"{measured['gemm_flops'] / 1e12:.0f} TFLOP/s (cuBLAS bf16 GEMM), "
        f"{measured['copy_bandwidth'] / 1e12:.2f} TB/s (device copy).",
        "",
        "fused_linear_policy_loss, forward + backward (compute bound: 6 N H V FLOPs)",
        "",
        "| N x H x V | rwcore | eager | rwcore TFLOP/s | of spec peak | of measured GEMM | eager TFLOP/s "
        "| rwcore peak mem | eager peak mem | time rwcore/eager |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    mem = lambda v: "n/a" if v is None else f"{v:.0f} MiB"  # noqa: E731
    for row in report["fused"]:
        r, e = row["rwcore"], row["eager"]
        if r.get("oom"):
            lines.append(f"| {row['tokens']} x {row['hidden']} x {row['vocab']} ({row['dtype']}) | out of memory "
                         "| | | | | | | | |")
            continue
        if e.get("oom"):
            e_time, e_rate, e_mem, ratio = "out of memory", "", "", ""
        else:
            e_time, e_rate = f"{e['seconds'] * 1e3:.1f} ms", f"{e['flop_rate'] / 1e12:.0f}"
            e_mem, ratio = mem(e["peak_mib"]), f"{r['seconds'] / e['seconds']:.2f}"
        lines.append(
            f"| {row['tokens']} x {row['hidden']} x {row['vocab']} ({row['dtype']}) | {r['seconds'] * 1e3:.1f} ms "
            f"| {e_time} | {r['flop_rate'] / 1e12:.0f} | {_fraction(r['flop_rate'], spec_flops)} "
            f"| {_fraction(r['flop_rate'], measured['gemm_flops'])} | {e_rate} "
            f"| {mem(r['peak_mib'])} | {e_mem} | {ratio} |"
        )
    lines += [
        "",
        "filtered_dual_clip_loss, forward + backward (memory bound: 13 bytes per token at least)",
        "",
        "| tokens | rwcore | eager | rwcore GB/s | of spec peak | of measured copy | eager GB/s | time rwcore/eager |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["loss"]:
        r, e = row["rwcore"], row["eager"]
        lines.append(
            f"| {row['tokens']} | {r['seconds'] * 1e3:.2f} ms | {e['seconds'] * 1e3:.2f} ms | {r['bandwidth'] / 1e9:.0f} "
            f"| {_fraction(r['bandwidth'], spec_bw)} | {_fraction(r['bandwidth'], measured['copy_bandwidth'])} "
            f"| {e['bandwidth'] / 1e9:.0f} | {r['seconds'] / e['seconds']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", action="append", nargs=3, type=int, metavar=("N", "H", "V"),
                        help="fused loss: tokens, hidden size, vocabulary (repeatable)")
    parser.add_argument("--loss-tokens", action="append", type=int, metavar="T", help="dual-clip loss tokens (repeatable)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="one small size of each")
    parser.add_argument("--out", type=Path, help="write JSON here and Markdown beside it (.md)")
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # "cpu": a dry run of the arithmetic
    args = parser.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(NO_GPU, flush=True)
        return {"skipped": NO_GPU}
    device = torch.device(args.device)
    sizes = [tuple(s) for s in args.size] if args.size else list(FUSED_QUICK if args.quick else FUSED_SIZES)
    loss_tokens = args.loss_tokens or list(LOSS_QUICK if args.quick else LOSS_TOKENS)
    if device.type == "cuda":
        peaks = spec_peaks(torch, device)
    else:
        peaks = {"name": f"{device.type} (dry run)", "flops": None, "bandwidth": None, "memory_gib": 0.0}
    print(f"reference peaks on {peaks['name']} ...", flush=True)
    measured = measured_peaks(torch, device, args.quick)
    fused, loss = [], []
    for size in sizes:
        print(f"fused_linear_policy_loss N={size[0]} H={size[1]} V={size[2]} ...", flush=True)
        fused.append(bench_fused(torch, device, *size, args.repeats))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for tokens in loss_tokens:
        print(f"filtered_dual_clip_loss tokens={tokens} ...", flush=True)
        loss.append(bench_loss(torch, device, tokens, args.repeats))
    versions = {"torch": torch.__version__}
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        pass
    report = {"machine": machine(**versions), "spec_peaks": peaks, "measured_peaks": measured, "fused": fused,
              "loss": loss}
    publish(report, render(report), args.out)
    return report


if __name__ == "__main__":
    main()
