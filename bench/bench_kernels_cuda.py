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
Peers (each optional: one that is not installed, or needs CUDA in a --device cpu dry run, is recorded as
skipped with the reason): Liger-Kernel's chunked LigerFusedLinearGRPOLoss and torch.compile of the eager
code for the fused loss; on materialized bf16 logits, rwcore's token_logprobs + filtered_dual_clip_loss
against Liger's Triton `triton_grpo_loss`, flash-attn's Triton cross-entropy (the same streaming
softmax, without the policy loss) and torch.compile of the eager code, as achieved GB/s (6 bytes per
logit: read forward, read backward, write the gradient); and the row kernels at every launch
configuration `_launch` can pick on this GPU, so the per-architecture heuristic is checked.
Peaks: the vendor's dense bf16 FLOP rate and memory bandwidth where the device is in SPEC_PEAKS
(or bandwidth from the device properties), and always a measured reference in the same run (a large
cuBLAS bf16 GEMM and a device-to-device copy), so every fraction is also given against what this
device actually reaches. Times are medians of CUDA-synchronized repeats after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine, publish  # noqa: E402

from rwcore._io import atomic_write_bytes  # noqa: E402

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
LOGITS_SIZES = ((8192, 151_936),)  # (tokens N, vocab V) of the materialized-logits peers
LOGITS_QUICK = ((4096, 32_768),)
SEQ_LEN = 4096  # tokens per sequence where a peer wants [B, T, ...]
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
    gemm = timed(torch, device, lambda m=a: m @ m, 5)
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

    def eager_loss(hh, ww):
        logp = torch.log_softmax((hh @ ww.t()).float(), dim=-1).gather(1, labels.unsqueeze(1)).squeeze(1)
        ratio = torch.exp((logp - behavior).clamp(-20, 20))
        keep = mask & (ratio > 0.5) & (ratio < 5.0)
        term = torch.where(keep, torch.minimum(-ratio * advantages, 3.0 * advantages.abs()), 0.0)
        return term.sum() / mask.sum()

    def compile_peer():
        if device.type != "cuda":
            raise PeerSkipped("torch.compile is measured on CUDA only (compiling takes minutes on a CPU)")
        compiled = torch.compile(eager_loss)

        def step():
            h.grad = w.grad = None
            compiled(h, w).backward()

        return step

    def liger_peer():
        if device.type != "cuda":
            raise PeerSkipped("measured on CUDA only (bench_kernels.py runs it on the CPU)")
        try:
            from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
        except ImportError as error:
            raise PeerSkipped(f"liger-kernel is not installed ({error})") from None
        if tokens % SEQ_LEN:
            raise PeerSkipped(f"N must be a multiple of the sequence length {SEQ_LEN}")
        batch = tokens // SEQ_LEN
        loss_fn = LigerFusedLinearGRPOLoss(
            beta=0.0, use_ref_model=False, epsilon_low=0.5, epsilon_high=4.0, delta=3.0, loss_type="dapo", compiled=True
        )
        shaped = lambda t: t.view(batch, SEQ_LEN, *t.shape[1:])  # noqa: E731
        per_sequence = advantages.view(batch, SEQ_LEN)[:, 0].contiguous()

        def step():
            h.grad = w.grad = None
            loss = loss_fn(
                shaped(h), w, shaped(labels), shaped(mask).float(), per_sequence, old_per_token_logps=shaped(behavior)
            )[0]
            loss.backward()

        return step

    flops = 6.0 * tokens * hidden_size * vocab
    row = {
        "tokens": tokens,
        "hidden": hidden_size,
        "vocab": vocab,
        "dtype": str(dtype).removeprefix("torch."),
        "flops": flops,
    }
    peers = (
        ("rwcore", lambda: rwcore_step),
        ("eager", lambda: eager_step),
        ("liger_chunked", liger_peer),
        ("compile", compile_peer),
    )
    for name, build in peers:
        row[name] = measure(
            torch,
            device,
            build,
            repeats,
            lambda seconds: {"flop_rate": flops / seconds},
            reset=lambda: setattr(h, "grad", None) or setattr(w, "grad", None),
            label=name,
        )
    return row


class PeerSkipped(Exception):
    """A peer that cannot run here (not installed, or CUDA only in a CPU dry run); the reason is recorded."""


def measure(torch, device, build, repeats: int, rates, reset=lambda: None, label: str = "") -> dict:
    """{seconds, peak_mib, rates...} of the step `build()` returns, or {skipped | oom | error: reason}."""
    try:
        step = build()
        seconds = timed(torch, device, step, repeats)
        return {"seconds": seconds, **rates(seconds), "peak_mib": peak_memory(torch, device, step)}
    except PeerSkipped as reason:
        print(f"  {label}: skipped: {reason}", flush=True)
        return {"skipped": str(reason)}
    except torch.cuda.OutOfMemoryError:  # materialized logits at large N on a smaller device
        reset()
        torch.cuda.empty_cache()
        print(f"  {label}: out of memory", flush=True)
        return {"oom": True}
    except Exception as error:  # a peer's own failure is recorded; the table goes on
        reset()
        print(f"  {label}: error: {type(error).__name__}: {error}", flush=True)
        return {"error": f"{type(error).__name__}: {str(error)[:300]}"}


def bench_logits(torch, device, tokens: int, vocab: int, repeats: int) -> dict:
    """Forward + backward from materialized logits [N, V] to the policy loss (or, for flash-attn, the
    cross-entropy): the streaming-softmax kernels as a memory-bound workload, in achieved GB/s."""
    from rwcore.kernels import filtered_dual_clip_loss, token_logprobs

    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    # One extra row: Liger's triton_grpo_loss takes logits for L + 1 positions and drops the last.
    base = (torch.randn(tokens + 1, vocab, device=device, generator=gen) * 2).to(dtype)
    labels = torch.randint(0, vocab, (tokens,), device=device, generator=gen)
    mask = torch.rand(tokens, device=device, generator=gen) < 0.9
    behavior = -math.log(vocab) + 0.3 * torch.randn(tokens, device=device, generator=gen)
    advantages = torch.randn(1, device=device, generator=gen)
    logits = base[:tokens].clone().requires_grad_()
    element = torch.finfo(dtype).bits // 8
    moved = 3.0 * element * tokens * vocab  # read forward, read backward, write the gradient

    def rwcore_step():
        logits.grad = None
        logp = token_logprobs(logits, labels, validate=False)
        loss, _ = filtered_dual_clip_loss(
            logp.unsqueeze(0), behavior.unsqueeze(0), advantages, mask.unsqueeze(0), validate=False
        )
        loss.backward()

    def eager_loss(z):
        logp = torch.log_softmax(z.float(), dim=-1).gather(1, labels.unsqueeze(1)).squeeze(1)
        ratio = torch.exp((logp - behavior).clamp(-20, 20))
        keep = mask & (ratio > 0.5) & (ratio < 5.0)
        term = torch.where(keep, torch.minimum(-ratio * advantages, 3.0 * advantages.abs()), 0.0)
        return term.sum() / mask.sum()

    def eager_peer():
        def step():
            logits.grad = None
            eager_loss(logits).backward()

        return step

    def compile_peer():
        if not cuda:
            raise PeerSkipped("torch.compile is measured on CUDA only")
        compiled = torch.compile(eager_loss)

        def step():
            logits.grad = None
            compiled(logits).backward()

        return step

    def liger_triton_peer():
        if not cuda:
            raise PeerSkipped("Triton kernels need CUDA")
        try:
            from liger_kernel.transformers.grpo_loss import triton_grpo_loss
        except ImportError as error:
            raise PeerSkipped(f"liger-kernel is not installed ({error})") from None
        full = base.clone().unsqueeze(0).requires_grad_()

        def step():
            full.grad = None
            loss, _ = triton_grpo_loss(
                full,
                behavior.unsqueeze(0),
                None,
                labels.unsqueeze(0),
                advantages,
                mask.unsqueeze(0).float(),
                temperature=1.0,
                beta=0.0,
                eps_low=0.5,
                eps_high=4.0,
                inplace=False,
                loss_type="dapo",
                reduce=True,
                delta=3.0,
            )
            loss.backward()

        return step

    def flash_attn_peer():
        if not cuda:
            raise PeerSkipped("Triton kernels need CUDA")
        try:
            from flash_attn.ops.triton.cross_entropy import cross_entropy_loss
        except ImportError as error:
            raise PeerSkipped(f"flash-attn is not installed ({error})") from None

        def step():
            logits.grad = None
            losses, _ = cross_entropy_loss(logits, labels)
            losses.sum().backward()

        return step

    row = {"tokens": tokens, "vocab": vocab, "dtype": str(dtype).removeprefix("torch."), "bytes": moved}
    peers = (
        ("rwcore", lambda: rwcore_step),
        ("eager", eager_peer),
        ("liger_triton", liger_triton_peer),
        ("flash_attn_ce", flash_attn_peer),
        ("compile", compile_peer),
    )
    for name, build in peers:
        row[name] = measure(
            torch,
            device,
            build,
            repeats,
            lambda seconds: {"bandwidth": moved / seconds},
            reset=lambda: setattr(logits, "grad", None),
            label=name,
        )
    return row


def bench_launch_configs(torch, device, tokens: int, vocab: int, repeats: int) -> dict:
    """token_logprobs forward + backward at every configuration `_launch.row_configs` has for this GPU."""
    from rwcore.kernels import _launch, token_logprobs
    from rwcore.kernels import token_logprobs as module

    arch = _launch.device_arch(device)
    if arch is None:
        return {"skipped": "launch configurations are a GPU choice (the interpreter has one)"}
    chosen = _launch.row_config(arch, vocab)
    gen = torch.Generator(device=device).manual_seed(0)
    logits = (torch.randn(tokens, vocab, device=device, generator=gen) * 2).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), device=device, generator=gen)
    moved = 3.0 * 2 * tokens * vocab
    rows = []
    original = module.row_launch
    try:
        for config in _launch.row_configs(arch):
            module.row_launch = lambda device, vocab, config=config: config

            def step():
                logits.grad = None
                token_logprobs(logits, labels, validate=False).sum().backward()

            result = measure(
                torch,
                device,
                lambda: step,
                repeats,
                lambda seconds: {"bandwidth": moved / seconds},
                label=config.label(),
            )
            rows.append({"block": config.block, "num_warps": config.num_warps, "chosen": config == chosen, **result})
    finally:
        module.row_launch = original
    return {"arch": arch, "tokens": tokens, "vocab": vocab, "rows": rows}


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


def _failure(result: dict) -> str:
    if result.get("skipped"):
        return f"skipped: {result['skipped']}"
    if result.get("oom"):
        return "out of memory"
    return f"error: {result.get('error', 'not run')}"


def _peer_cells(result: dict, ours: dict, rate_key: str, unit: float, peak) -> str:
    if "seconds" not in result:
        return f"{_failure(result)} | | | | "
    mem = "n/a" if result.get("peak_mib") is None else f"{result['peak_mib']:.0f} MiB"
    ratio = f"{ours['seconds'] / result['seconds']:.2f}" if "seconds" in ours else ""
    return (
        f"{result['seconds'] * 1e3:.2f} ms | {result[rate_key] / unit:.0f} | {_fraction(result[rate_key], peak)} "
        f"| {mem} | {ratio}"
    )


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
        if "seconds" not in r:
            lines.append(
                f"| {row['tokens']} x {row['hidden']} x {row['vocab']} ({row['dtype']}) | {_failure(r)} "
                "| | | | | | | | |"
            )
            continue
        if "seconds" not in e:
            e_time, e_rate, e_mem, ratio = _failure(e), "", "", ""
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
        "fused_linear_policy_loss against the other fused peers (same inputs)",
        "",
        "| N x H x V | peer | time | TFLOP/s | of spec peak | peak mem | time rwcore/peer |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in report["fused"]:
        for peer in ("liger_chunked", "compile"):
            lines.append(
                f"| {row['tokens']} x {row['hidden']} x {row['vocab']} | {peer} | "
                + _peer_cells(row.get(peer, {}), row["rwcore"], "flop_rate", 1e12, spec_flops)
                + " |"
            )
    lines += [
        "",
        "From materialized logits to the loss, forward + backward (memory bound: 6 bytes per bf16 logit)",
        "",
        "| N x V | peer | time | GB/s | of spec peak | peak mem | time rwcore/peer |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in report.get("logits", []):
        for peer in ("rwcore", "eager", "liger_triton", "flash_attn_ce", "compile"):
            lines.append(
                f"| {row['tokens']} x {row['vocab']} ({row['dtype']}) | {peer} | "
                + _peer_cells(row.get(peer, {}), row["rwcore"], "bandwidth", 1e9, spec_bw)
                + " |"
            )
    sweep = report.get("launch_configs", {})
    if sweep.get("skipped"):
        lines += ["", f"token_logprobs launch configurations: skipped: {sweep['skipped']}"]
    if sweep.get("rows"):
        lines += [
            "",
            f"token_logprobs forward + backward at every launch configuration of sm_{sweep['arch']} "
            f"(N = {sweep['tokens']}, V = {sweep['vocab']}, bf16; * = the heuristic's choice)",
            "",
            "| BLOCK | warps | time | GB/s | of spec peak |",
            "|---:|---:|---:|---:|---:|",
        ]
        for r in sweep["rows"]:
            if "seconds" not in r:
                lines.append(f"| {r['block']} | {r['num_warps']} | {_failure(r)} | | |")
                continue
            lines.append(
                f"| {r['block']}{' *' if r['chosen'] else ''} | {r['num_warps']} | {r['seconds'] * 1e3:.2f} ms "
                f"| {r['bandwidth'] / 1e9:.0f} | {_fraction(r['bandwidth'], spec_bw)} |"
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
            f"| {row['tokens']} | {r['seconds'] * 1e3:.2f} ms | {e['seconds'] * 1e3:.2f} ms | "
            f"{r['bandwidth'] / 1e9:.0f} "
            f"| {_fraction(r['bandwidth'], spec_bw)} | {_fraction(r['bandwidth'], measured['copy_bandwidth'])} "
            f"| {e['bandwidth'] / 1e9:.0f} | {r['seconds'] / e['seconds']:.2f} |"
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
        help="fused loss: tokens, hidden size, vocabulary (repeatable)",
    )
    parser.add_argument(
        "--loss-tokens", action="append", type=int, metavar="T", help="dual-clip loss tokens (repeatable)"
    )
    parser.add_argument(
        "--logits",
        action="append",
        nargs=2,
        type=int,
        metavar=("N", "V"),
        help="materialized-logits peers: tokens, vocabulary (repeatable)",
    )
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
    versions = {"torch": torch.__version__}
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        pass
    fused, loss, logits = [], [], []
    report = {
        "machine": machine(**versions),
        "spec_peaks": peaks,
        "measured_peaks": measured,
        "fused": fused,
        "loss": loss,
        "logits": logits,
        "launch_configs": {},
        "partial": True,
    }

    def checkpoint():
        """The report so far, so a run cut short by a time limit (bench/gpu_check.sh) keeps what it measured."""
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(args.out, json.dumps(report, indent=2).encode())

    for size in sizes:
        print(f"fused_linear_policy_loss N={size[0]} H={size[1]} V={size[2]} ...", flush=True)
        fused.append(bench_fused(torch, device, *size, args.repeats))
        checkpoint()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for tokens in loss_tokens:
        print(f"filtered_dual_clip_loss tokens={tokens} ...", flush=True)
        loss.append(bench_loss(torch, device, tokens, args.repeats))
    checkpoint()
    logits_sizes = (
        [tuple(s) for s in args.logits] if args.logits else list(LOGITS_QUICK if args.quick else LOGITS_SIZES)
    )
    for tokens, vocab in logits_sizes:
        print(f"materialized logits N={tokens} V={vocab} ...", flush=True)
        logits.append(bench_logits(torch, device, tokens, vocab, args.repeats))
        checkpoint()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print("token_logprobs launch configurations ...", flush=True)
    report["launch_configs"] = bench_launch_configs(torch, device, *logits_sizes[0], args.repeats)
    del report["partial"]
    publish(report, render(report), args.out)
    return report


if __name__ == "__main__":
    main()
