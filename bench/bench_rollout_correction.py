"""fused_linear_policy_loss with each rollout correction vs the plain fused loss: time and peak memory.

    .venv/bin/python bench/bench_rollout_correction.py --out bench/results/rollout-correction/rollout-correction.json
    .venv/bin/python bench/bench_rollout_correction.py --quick                     # small shape, about 10 s
    .venv/bin/python bench/bench_rollout_correction.py --presets off,decoupled_geo_rs --repeats 3
    .venv/bin/python bench/bench_rollout_correction.py --device cuda               # bf16, Triton backend (GPU)

One forward + backward of `rwcore.kernels.fused_linear_policy_loss` from hidden states and an LM head,
for every preset of `rwcore.kernels.rollout_correction.PRESETS` and for "off + metrics", against the
plain fused loss (rollout_correction=None, mismatch_metrics=False: exactly the computation before
rollout corrections existed) measured in the same process and run:

- a correction is called as the trainer calls it on a step's first epoch: the function's default
  mismatch_metrics=True, cu_seqlens (the sequences' offsets) always, proximal log-probs for the
  decoupled forms (none for the bypass forms); "off" is the preset without a correction and without
  metrics, i.e. the plain loss again: its ratio is the run's A/A control (how far apart two identical
  computations measure); "off + metrics" is no correction with the mismatch metrics;
- time: after a warm-up, `--repeats` rounds; in each round every correction is timed next to one
  plain step (plain first in even rounds, the correction first in odd ones), so a slow spell of a
  shared machine falls on both sides of a pair. The ratio is the median of the paired ratios
  correction / plain (each pair's min and max are reported too);
- peak memory: one step each of the plain loss and the correction, back to back, after the warm-up.
  On the CPU, the resident-set high-water mark of the step above what was resident before it
  (VmHWM after resetting it through /proc/self/clear_refs, glibc's mmap threshold pinned at 64 KiB
  so freed tensors leave the resident set; the measuring runs in a subprocess for that); on CUDA,
  torch.cuda.max_memory_allocated above the memory allocated before the step. The memory a
  correction adds is its peak minus the plain peak, reported against the [N, V] fp32 logits
  (N x V x 4 bytes): a [T, V]-sized buffer would be at least about 0.25 of it (one byte a logit);
- sanity: the loss and the gradients of hidden and weight of every correction are finite, the A/A
  control gives the plain loss and gradients bit for bit, and the metrics leave the loss unchanged.

Targets (the issue's): every correction adds at most 10 % to the fused loss time (ratio <= 1.10)
and no [T, V]-sized memory (added peak <= 0.10 of the fp32 logits here). Inputs: N = sequences x
sequence length tokens, 90 % of them model tokens, advantages per sequence, proximal log-probs = the
current ones + N(0, 0.02), behaviour log-probs = proximal + N(0, 0.05) (a train-inference mismatch
of the usual size, so some corrections reject or truncate part of the batch).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
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

TIME_TARGET = 1.10  # correction / plain
MEMORY_TARGET = 0.10  # added peak / fp32 [N, V] logits
SEQ_LEN = 512
# (tokens N, hidden H, vocab V): about 0.7 s per forward + backward on one core of an AVX512 CPU
DEFAULT_SIZE = {"cpu": (8 * SEQ_LEN, 256, 8192), "cuda": (16 * SEQ_LEN, 3584, 151936)}
QUICK_SIZE = {"cpu": (4 * 128, 64, 2048), "cuda": (4 * SEQ_LEN, 1024, 32768)}
QUICK_SEQ_LEN = {"cpu": 128, "cuda": SEQ_LEN}
DEFAULT_REPEATS = {"cpu": 5, "cuda": 5}
OFF_METRICS = "off + metrics"


def presets() -> list[str]:
    """Every configuration measured: PRESETS in their order (with "off" first), then "off + metrics"."""
    from rwcore.kernels.rollout_correction import PRESETS

    return ["off", *[name for name in PRESETS if name != "off"], OFF_METRICS]


def _form(name: str) -> str:
    if name == "off":
        return "none (A/A control)"
    if name == OFF_METRICS:
        return "none, metrics"
    return "bypass" if name.startswith("bypass_") else "decoupled"


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _lscpu() -> dict:
    """The lscpu fields that describe the CPU (empty where lscpu is missing)."""
    keep = ("Model name", "Vendor ID", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)")
    keep += ("L1d cache", "L2 cache", "L3 cache", "Hypervisor vendor", "CPU max MHz")
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return fields


# --------------------------------------------------------------------------- the measurement


def measure(config: dict) -> dict:
    """Runs the whole measurement in this process (on the CPU: the subprocess `run` starts)."""
    import torch

    from rwcore.kernels import fused_linear_logprobs, fused_linear_policy_loss

    device = torch.device(config["device"])
    dtype = getattr(torch, config["dtype"])
    backend = config["backend"]
    tokens, hidden_size, vocab = config["size"]
    seq_len = config["seq_len"]
    cuda = device.type == "cuda"

    gen = torch.Generator().manual_seed(0)
    sequences = max(1, tokens // seq_len)
    tokens = sequences * seq_len
    hidden = (torch.randn(tokens, hidden_size, generator=gen) / hidden_size**0.5).to(device, dtype)
    weight = torch.randn(vocab, hidden_size, generator=gen).to(device, dtype)  # logits of unit scale
    labels = torch.randint(0, vocab, (tokens,), generator=gen).to(device)
    mask = (torch.rand(tokens, generator=gen) < 0.9).to(device)
    with torch.no_grad():
        current = fused_linear_logprobs(hidden, weight, labels, backend=backend, validate=False)
    proximal = current + 0.02 * torch.randn(tokens, generator=gen).to(device)
    behavior = proximal + 0.05 * torch.randn(tokens, generator=gen).to(device)
    advantages = torch.randn(sequences, generator=gen).to(device).repeat_interleave(seq_len)
    cu_seqlens = torch.arange(sequences + 1, device=device) * seq_len

    def call(name):
        """The keyword arguments of one configuration (None: the plain fused loss)."""
        if name is None:
            return {"mismatch_metrics": False}
        if name == "off":
            return {"rollout_correction": "off", "mismatch_metrics": False}  # resolves to the plain loss again
        if name == OFF_METRICS:
            return {"cu_seqlens": cu_seqlens}
        extra = {} if name.startswith("bypass_") else {"proximal_logprobs": proximal}
        return {"rollout_correction": name, "cu_seqlens": cu_seqlens, **extra}

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def fresh():
        return hidden.clone().requires_grad_(), weight.clone().requires_grad_()

    def step(kwargs, h, w):
        loss, stats = fused_linear_policy_loss(
            h, w, labels, behavior, advantages, mask, backend=backend, validate=False, **kwargs
        )
        loss.backward()
        return loss.detach(), stats

    def timed(kwargs) -> float:
        h, w = fresh()
        sync()
        start = time.perf_counter()
        step(kwargs, h, w)
        sync()
        return time.perf_counter() - start

    def peak(kwargs):
        """(bytes above the memory in use before the step, loss, hidden grad, weight grad, stats)."""
        h, w = fresh()
        gc.collect()
        if cuda:
            sync()
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            loss, stats = step(kwargs, h, w)
            sync()
            grown = torch.cuda.max_memory_allocated(device) - before
        else:
            try:
                ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap pages go back to the OS
            except OSError:
                pass
            Path("/proc/self/clear_refs").write_text("5")  # resets the high-water mark to the resident set
            before = _status_kib("VmRSS")
            loss, stats = step(kwargs, h, w)
            grown = (_status_kib("VmHWM") - before) * 1024
        return grown, loss, h.grad, w.grad, stats

    def same(a, b) -> bool:
        """Bit for bit on the CPU; on a GPU within rounding (its reductions need not be deterministic)."""
        return torch.equal(a, b) if not cuda else bool(torch.allclose(a.float(), b.float(), rtol=1e-3, atol=1e-6))

    names = config["presets"]
    plain = call(None)
    for name in [None, *names]:  # warm-up: code paths, allocator, Triton compilation on a GPU
        step(call(name), *fresh())

    rows = {name: {"name": name, "form": _form(name)} for name in names}
    base_bytes, base_loss, base_gh, base_gw, _ = peak(plain)
    plain_peaks = []
    for name in names:
        plain_bytes, *_ = peak(plain)
        plain_peaks.append(plain_bytes)
        grown, loss, grad_h, grad_w, stats = peak(call(name))
        problems = []
        if not bool(torch.isfinite(loss)):
            problems.append("loss not finite")
        if not bool(torch.isfinite(grad_h).all()) or not bool(torch.isfinite(grad_w).all()):
            problems.append("gradients not finite")
        if name == "off" and not (same(loss, base_loss) and same(grad_h, base_gh) and same(grad_w, base_gw)):
            problems.append("differs from the plain loss")
        if name == OFF_METRICS and not same(loss, base_loss):
            problems.append("metrics changed the loss")
        figures = {k: float(v) for k, v in stats.items() if k.startswith("rollout_corr/")}
        rows[name].update(
            peak_bytes=grown,
            plain_peak_bytes=plain_bytes,
            added_bytes=grown - plain_bytes,
            loss=float(loss),
            sanity="ok" if not problems else "; ".join(problems),
            # how much of the batch the correction touched (verl's figures), for context
            masked_fraction=figures.get("rollout_corr/masked_fraction"),
            truncated_fraction=figures.get("rollout_corr/truncated_fraction"),
            metrics=len(figures),
            nonfinite_metrics=sorted(k for k, v in figures.items() if v != v or abs(v) == float("inf")),
        )
        del loss, grad_h, grad_w, stats

    pairs = {name: ([], []) for name in names}  # (correction times, plain times)
    for round_index in range(config["repeats"]):
        for name in names:
            kwargs = call(name)
            if round_index % 2 == 0:
                plain_s, corr_s = timed(plain), timed(kwargs)
            else:
                corr_s, plain_s = timed(kwargs), timed(plain)
            pairs[name][0].append(corr_s)
            pairs[name][1].append(plain_s)

    logits_bytes = tokens * vocab * 4
    for name in names:
        corr, base = pairs[name]
        ratios = [c / p for c, p in zip(corr, base)]
        row = rows[name]
        row.update(
            seconds=corr,
            plain_seconds=base,
            median_s=statistics.median(corr),
            plain_median_s=statistics.median(base),
            ratio=statistics.median(ratios),
            ratio_of_fastest=min(corr) / min(base),
            ratio_min=min(ratios),
            ratio_max=max(ratios),
            added_vs_logits=row["added_bytes"] / logits_bytes,
        )
        row["time_ok"] = row["ratio"] <= TIME_TARGET
        row["memory_ok"] = row["added_vs_logits"] <= MEMORY_TARGET
    all_plain = [s for name in names for s in pairs[name][1]]
    try:  # rows per chunk of logits without sequence alignment, for reading the memory column
        from rwcore.kernels._fused_linear import chunk_rows

        rows_per_chunk = chunk_rows(tokens, vocab, hidden_size, None)
    except ImportError:
        rows_per_chunk = None
    return {
        "tokens": tokens,
        "sequences": sequences,
        "seq_len": seq_len,
        "hidden": hidden_size,
        "vocab": vocab,
        "dtype": config["dtype"],
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if cuda else None,
        "backend": backend,
        "repeats": config["repeats"],
        "torch_threads": torch.get_num_threads(),
        "logits_bytes": logits_bytes,
        "plain_median_s": statistics.median(all_plain),
        "plain_peak_bytes": statistics.median(plain_peaks),
        "chunk_rows": rows_per_chunk,
        "rows": [rows[name] for name in names],
    }


def run(config: dict) -> dict:
    """The measurement: on the CPU in a subprocess with glibc's mmap threshold pinned, on CUDA here."""
    if config["device"] != "cpu":
        return measure(config)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    command = [sys.executable, __file__, "--worker", json.dumps(config)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the measuring subprocess failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- the report


def _mib(value: float) -> str:
    return f"{value / 2**20:+.2f} MiB"


def render(report: dict) -> str:
    m, r = report["machine"], report["result"]
    device = r["device_name"] or f"CPU ({m.get('cpu', '?')})"
    rows = [row for row in r["rows"] if row["name"] != "off"]
    control = next((row for row in r["rows"] if row["name"] == "off"), None)
    slow = [row["name"] for row in rows if not row["time_ok"]]
    big = [row["name"] for row in rows if not row["memory_ok"]]
    broken = [row["name"] for row in r["rows"] if row["sanity"] != "ok"]
    lines = [
        f"# fused_linear_policy_loss with rollout corrections vs the plain fused loss ({r['device']})",
        "",
        f"Device: {device}; {m['cpus']} logical CPUs, torch CPU capability {m['cpu_capability']}, "
        f"{m['platform']}, Python {m['python']}, torch {m['torch']}, {r['torch_threads']} torch thread(s) "
        f"(OMP_NUM_THREADS={report['omp_num_threads'] or 'unset'}).",
        f"Shape: N = {r['sequences']} x {r['seq_len']} = {r['tokens']:,} tokens, H = {r['hidden']:,}, "
        f"V = {r['vocab']:,}, {r['dtype']}, backend {r['backend']}; forward + backward. "
        f"Plain fused loss: {r['plain_median_s'] * 1e3:.0f} ms (median), peak {_mib(r['plain_peak_bytes'])[1:]} "
        f"above the inputs; [N, V] fp32 logits = {r['logits_bytes'] / 2**20:.0f} MiB"
        + (f"; {r['chunk_rows']} rows per chunk of logits." if r.get("chunk_rows") else "."),
        f"Time: median over {r['repeats']} interleaved pairs of correction / plain (min-max of the pairs; "
        "fastest correction step / fastest plain step beside it). "
        "Memory: the correction's peak minus the plain loss's, and that over the fp32 logits.",
        f"Targets: time ratio <= {TIME_TARGET:.2f}; memory added <= {MEMORY_TARGET:.2f} of the logits.",
        "",
        "| correction | form | time / plain | pairs min-max | fastest / fastest | time | memory added "
        "| added / logits | time target | memory target | sanity |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for row in r["rows"]:
        control_row = row["name"] == "off"
        lines.append(
            f"| {row['name']} | {row['form']} | {row['ratio']:.3f} | {row['ratio_min']:.2f}-{row['ratio_max']:.2f} "
            f"| {row['ratio_of_fastest']:.3f} | {row['median_s'] * 1e3:.0f} ms | {_mib(row['added_bytes'])} "
            f"| {row['added_vs_logits']:+.4f} "
            f"| {'-' if control_row else ('pass' if row['time_ok'] else 'FAIL')} "
            f"| {'-' if control_row else ('pass' if row['memory_ok'] else 'FAIL')} | {row['sanity']} |"
        )
    lines += [
        "",
        f"Time target met by {len(rows) - len(slow)} of {len(rows)}"
        + (f" (not: {', '.join(slow)})" if slow else "")
        + f"; memory target by {len(rows) - len(big)} of {len(rows)}"
        + (f" (not: {', '.join(big)})" if big else "")
        + (f". A/A control (the plain loss against itself): {control['ratio']:.3f}" if control else "")
        + f"; sanity {'ok for every row' if not broken else 'FAILED for ' + ', '.join(broken)}.",
        f"Largest time ratio {max(row['ratio'] for row in rows):.3f}; "
        f"largest memory added {max(row['added_vs_logits'] for row in rows):+.4f} of the logits.",
    ]
    return "\n".join(lines) + "\n"


def _library_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in ("torch", "triton"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            pass
    return versions


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", nargs=3, type=int, metavar=("N", "H", "V"), help="tokens, hidden size, vocabulary")
    parser.add_argument("--seq-len", type=int, help=f"tokens per sequence (default {SEQ_LEN}; N is rounded down)")
    parser.add_argument("--repeats", type=int, help="interleaved pairs per correction (default 5)")
    parser.add_argument("--presets", help="comma-separated subset (default: every preset and 'off + metrics')")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available, else cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: float32 on the CPU, bf16 on CUDA")
    parser.add_argument("--quick", action="store_true", help="a small shape and 3 pairs")
    parser.add_argument("--out", type=Path, help="write JSON here and Markdown beside it (.md)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(json.loads(args.worker))))
        return {}

    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is False")
    names = presets()
    chosen = names if not args.presets else [p.strip() for p in args.presets.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in names]
    if unknown:
        raise SystemExit(f"unknown presets {unknown}; choose from {names}")
    config = {
        "device": device,
        "dtype": args.dtype or ("float32" if device == "cpu" else "bfloat16"),
        "backend": "torch" if device == "cpu" else "auto",
        "size": list(args.size or (QUICK_SIZE if args.quick else DEFAULT_SIZE)[device]),
        "seq_len": args.seq_len or (QUICK_SEQ_LEN[device] if args.quick else SEQ_LEN),
        "repeats": args.repeats or (3 if args.quick else DEFAULT_REPEATS[device]),
        "presets": chosen,
    }
    print(
        f"rollout corrections: {len(chosen)} configurations x {config['repeats']} pairs on {device}, "
        f"N x H x V = {' x '.join(map(str, config['size']))}, sequences of {config['seq_len']} ...",
        flush=True,
    )
    started = time.perf_counter()
    result = run(config)
    report = {
        "machine": machine(**_library_versions()),
        "lscpu": _lscpu(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "config": config,
        "targets": {"time_ratio": TIME_TARGET, "memory_added_vs_logits": MEMORY_TARGET},
        "result": result,
        "seconds": time.perf_counter() - started,
    }
    publish(report, render(report), args.out)
    broken = [row["name"] for row in result["rows"] if row["sanity"] != "ok"]
    if broken:
        raise RuntimeError(f"sanity check failed for {broken}: see the report's sanity column")
    return report


if __name__ == "__main__":
    main()
