"""GPU readiness without a GPU: resource report of every Triton kernel variant, and a roofline model.

    .venv/bin/rw bench --gpu-static                      # both reports into bench/results/
    .venv/bin/python bench/gpu_static.py --out-dir /tmp/static
    .venv/bin/python bench/gpu_static.py --roofline-only # the arithmetic only, no compiling

1. Resources (`gpu-static.md` / `.json`): every kernel variant `rwcore.kernels._aot` enumerates (the
   dtypes and launch configurations the launchers can pass, for sm_80 and sm_90) compiled by Triton
   for a CUDA target on this machine; registers per thread, spills and stack from the bundled
   `ptxas -v`, shared memory from Triton's metadata, and the occupancy those allow per SM
   (`_aot.occupancy`: 65,536 registers allocated per warp in units of 256, 64 warps and 32 blocks,
   164 KB / 228 KB of shared memory, 1 KB reserved per block). Spills at a default configuration
   are reported as bugs (exit code 1).
2. Roofline (`roofline.md` / `.json`): for the GPU table's shapes (N = 8k and 32k tokens, V = 151,936,
   H = 3,584, bf16) the bytes each step of a design moves and the FLOPs it does, per device (H800,
   H100 SXM, H200), as lower bounds on time, for rwcore's fused-linear path as the code runs it and
   for Liger-Kernel's chunked GRPO loss (`LigerFusedLinearGRPOLoss`, modelled from its source:
   `liger_kernel/chunked_loss/fused_linear_ppo.py`), with the standalone kernels on materialized
   logits beside Liger's Triton `triton_grpo_loss`.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from _report import machine  # noqa: E402

from rwcore._io import atomic_write_bytes  # noqa: E402

DEFAULT_OUT = BENCH / "results"
# Datasheet figures (dense, no sparsity). FP32 is the CUDA-core rate PyTorch gets for float32 matmuls
# by default (torch.backends.cuda.matmul.allow_tf32 is False); TF32 the tensor-core rate when allowed.
DEVICES = {
    "H800": {"bandwidth": 3.35e12, "bf16": 989e12, "fp32": 67e12, "tf32": 495e12},
    "H100 SXM": {"bandwidth": 3.35e12, "bf16": 989e12, "fp32": 67e12, "tf32": 495e12},
    "H200": {"bandwidth": 4.8e12, "bf16": 989e12, "fp32": 67e12, "tf32": 495e12},
}
TOKENS = (8192, 32_768)
HIDDEN, VOCAB = 3584, 151_936
SEQUENCE = 4096  # tokens per sequence for Liger, which chunks by sequence (chunk_size=1)


# --------------------------------------------------------------------------- resources


def resource_report(full: bool = True, use_cache: bool = True) -> dict:
    from rwcore.kernels import _aot

    start = time.perf_counter()
    done = []

    def progress(variant, resources):
        done.append(1)
        if len(done) % 25 == 0:
            print(f"  {len(done)} variants compiled ...", flush=True)

    results = _aot.compile_all(full=full, use_cache=use_cache, progress=progress)
    rows, fresh = [], []
    for variant, resources in results:
        occupancy = _aot.occupancy(variant.arch, resources.registers, resources.shared_bytes, variant.num_warps)
        pointers = {k: v.lstrip("*") for k, v in variant.signature.items() if v.startswith("*")}
        rows.append(
            {
                "kernel": variant.kernel.rsplit(".", 1)[1],
                "arch": variant.arch,
                "num_warps": variant.num_warps,
                "constexprs": variant.constexprs,
                "pointer_types": pointers,
                "aligned": variant.aligned,
                "default": variant.is_default,
                "registers": resources.registers,
                "spill_stores": resources.spill_stores,
                "spill_loads": resources.spill_loads,
                "stack_frame": resources.stack_frame,
                "shared_bytes": resources.shared_bytes,
                **occupancy,
            }
        )
        fresh.append(not resources.cached)
    import triton

    return {
        "machine": machine(triton=triton.__version__),
        "full_grid": full,
        "variants": len(rows),
        "compiled_now": sum(fresh),
        "seconds": time.perf_counter() - start,
        "default_spills": [r for r in rows if r["default"] and (r["spill_stores"] or r["spill_loads"])],
        "rows": rows,
    }


def _types(row: dict) -> str:
    types = row["pointer_types"]
    first = next(iter(types.values()))
    if row["kernel"].startswith("_token_logprobs_bwd"):
        text = f"{types['logits_ptr']} -> {types['grad_logits_ptr']}"
    elif row["kernel"].startswith("_policy_loss"):
        text = first if types["behavior_ptr"] == first else f"{first} / {types['behavior_ptr']}"
    else:
        text = first
    if "labels_ptr" in types:
        text += f", labels {types['labels_ptr']}"
    return text + ("" if row["aligned"] else ", unaligned")


def render_resources(report: dict) -> str:
    rows = report["rows"]
    lines = [
        "# Triton kernels: registers, spills, shared memory and occupancy (sm_80, sm_90)",
        "",
        f"Compiled ahead of time on a machine without a GPU (Triton {report['machine'].get('triton')}, "
        f"`triton.compile` for `GPUTarget('cuda', arch, 32)`, the bundled `ptxas -v`), "
        f"{report['variants']} variants ({'the full grid' if report['full_grid'] else 'the subset'}). "
        "Written by `rw bench --gpu-static` (bench/gpu_static.py). Occupancy is the per-SM limit those "
        "resources allow (registers in units of 256 per warp, 64 warps, 32 blocks, 164 KB / 228 KB of "
        "shared memory, 1 KB reserved per block); it is a ceiling, not a measurement.",
        "",
        f"Spills: {sum(bool(r['spill_stores'] or r['spill_loads']) for r in rows)} variants spill; "
        f"{len(report['default_spills'])} at a default configuration. Maximum registers per thread: "
        f"{max(r['registers'] for r in rows)}.",
        "",
        "## At the production configuration (V = 151,936: the launcher's choice on each architecture)",
        "",
        "| kernel | arch | dtypes | BLOCK | warps | regs | spill st/ld (B) | shared (B) | blocks/SM | occupancy | "
        "limited by |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def line(r):
        extra = ""
        if "WITH_ENTROPY" in r["constexprs"]:
            extra = " +entropy" if r["constexprs"]["WITH_ENTROPY"] else ""
        if r["constexprs"].get("HAS_WEIGHT"):
            extra = " +correction weight"
        return (
            f"| {r['kernel']}{extra} | sm_{r['arch']} | {_types(r)} | {r['constexprs']['BLOCK']} | {r['num_warps']} "
            f"| {r['registers']} | {r['spill_stores']}/{r['spill_loads']} | {r['shared_bytes']} "
            f"| {r['blocks_per_sm']} | {r['occupancy']:.2f} | {r['limited_by']} |"
        )

    lines += [line(r) for r in rows if r["default"]]
    lines += [
        "",
        "## Every variant",
        "",
        "| kernel | arch | dtypes | BLOCK | warps | regs | spill st/ld (B) | shared (B) | blocks/SM | occupancy | "
        "limited by |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [line(r) for r in rows]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- roofline


def _phase(name, bytes_moved, flops=0.0, precision="bf16", count=1):
    return {"name": name, "bytes": float(bytes_moved) * count, "flops": float(flops) * count, "precision": precision}


def rwcore_fused_phases(tokens: int, hidden: int = HIDDEN, vocab: int = VOCAB) -> tuple[list, dict]:
    """fused_linear_policy_loss as `FusedLinearPolicyLossFunction` runs it on CUDA with bf16 inputs
    (`LinearHead` direct path: fp32 logits from torch.mm(out_dtype=float32), a bf16 gradient buffer)."""
    from rwcore.kernels._fused_linear import chunk_rows

    c = chunk_rows(tokens, vocab, hidden, None)
    chunks = math.ceil(tokens / c)
    n, h, v = tokens, hidden, vocab
    phases = [
        _phase("logits GEMM h W^T, bf16 in, fp32 out", 2 * n * h + chunks * 2 * v * h + 4 * n * v, 2 * n * h * v),
        _phase("token_logprobs forward kernel (reads fp32 logits)", 4 * n * v + 16 * n),
        _phase("policy-loss kernel", 17 * n),
        _phase("token_logprobs backward kernel (fp32 logits -> bf16 gradient)", 6 * n * v + 16 * n),
        _phase("d hidden GEMM (bf16)", 2 * n * v + chunks * 2 * v * h + 2 * n * h, 2 * n * h * v),
        _phase("d weight GEMM per chunk (bf16 out)", 2 * n * v + 2 * n * h + chunks * 2 * v * h, 2 * n * h * v),
        _phase("d weight: .float() of the chunk's product (temporary)", chunks * 6 * v * h),
        _phase("d weight: fp32 accumulator += temporary", chunks * 12 * v * h),
        _phase("d weight fp32 -> bf16, once", 6 * v * h),
        _phase("backward: stored gradients x d loss", 4 * v * h + 4 * n * h),
    ]
    return phases, {"rows_per_chunk": c, "chunks": chunks}


def rwcore_accumulating_phases(tokens: int, hidden: int = HIDDEN, vocab: int = VOCAB) -> tuple[list, dict]:
    """The same with the weight gradient accumulated inside the GEMM (fp32 C, beta = 1: cuBLAS reads and
    writes the fp32 accumulator once per chunk) instead of a bf16 product, .float() and +=. Not what the code
    does today; the bound it would have."""
    phases, info = rwcore_fused_phases(tokens, hidden, vocab)
    chunks, n, h, v = info["chunks"], tokens, hidden, vocab
    kept = [p for p in phases if not p["name"].startswith("d weight")]
    kept.insert(
        5,
        _phase(
            "d weight GEMM accumulating into fp32 (beta = 1)",
            2 * n * v + 2 * n * h + chunks * (2 + 8) * v * h,
            2 * n * h * v,
        ),
    )
    kept.insert(6, _phase("d weight fp32 -> bf16, once", 6 * v * h))
    return kept, info


def liger_chunked_phases(
    tokens: int, hidden: int = HIDDEN, vocab: int = VOCAB, matmul: str = "fp32", sequence: int = SEQUENCE
) -> tuple[list, dict]:
    """LigerFusedLinearGRPOLoss (liger_kernel/chunked_loss/fused_linear_ppo.py) with bf16 inputs: one sequence
    per outer chunk; inside it `_selective_logprob_forward/backward` stream 2,048-row x 4,096-column tiles:
    the forward GEMM, then in backward the logits recomputed, and d hidden / d weight as float32 matmuls
    (grad_logits @ weight_chunk.float(), grad_logits.t() @ hidden_chunk.float()). Per tile element the
    elementwise passes move (bytes): forward .float() 6, * 1/T 8, amax 4, (x - max) 8, exp 8, sum 4;
    backward .float() 6, * 1/T 8, (x - log z) 8, exp 8, * grad 8."""
    from liger_kernel.chunked_loss import fused_linear_ppo as source

    s_rows = min(source._SELECTIVE_LOGPROB_SEQ_CHUNK_SIZE, sequence)
    v_cols = source._SELECTIVE_LOGPROB_VOCAB_CHUNK_SIZE
    n, h, v = tokens, hidden, vocab
    sequences = math.ceil(n / sequence)
    seq_chunks = sequences * math.ceil(sequence / s_rows)  # row tiles over the whole batch
    vocab_tiles = math.ceil(v / v_cols)
    phases = [
        _phase(
            "forward logits GEMM per tile (bf16)",
            seq_chunks * (vocab_tiles * 2 * s_rows * h + 2 * v * h) + 2 * n * v,
            2 * n * h * v,
        ),
        _phase("forward elementwise (.float, scale, max, exp, sum)", 38 * n * v),
        _phase(
            "backward logits recomputed (bf16 GEMM)",
            seq_chunks * (vocab_tiles * 2 * s_rows * h + 2 * v * h) + 2 * n * v,
            2 * n * h * v,
        ),
        _phase("backward elementwise (.float, scale, log p, exp, x grad)", 38 * n * v),
        _phase(
            "weight chunk / hidden chunk .float() per tile", seq_chunks * (6 * v * h + vocab_tiles * 6 * s_rows * h)
        ),
        _phase(
            f"d hidden GEMM per tile ({matmul})",
            4 * n * v + seq_chunks * (4 * v * h + vocab_tiles * 4 * s_rows * h),
            2 * n * h * v,
            matmul,
        ),
        _phase("d hidden += per tile (fp32)", seq_chunks * vocab_tiles * 12 * s_rows * h),
        _phase(
            f"d weight GEMM per tile ({matmul})",
            4 * n * v + seq_chunks * (vocab_tiles * 4 * s_rows * h + 4 * v * h),
            2 * n * h * v,
            matmul,
        ),
        _phase("d weight += per tile (fp32)", seq_chunks * 12 * v * h),
        _phase("per sequence: fp32 d weight zeroed, -> bf16, added to the bf16 total", sequences * 16 * v * h),
    ]
    return phases, {"sequence": sequence, "rows_per_tile": s_rows, "vocab_per_tile": v_cols, "row_tiles": seq_chunks}


LOSS_TOKENS = 16_777_216  # the GPU table's filtered_dual_clip_loss size (B x T with T = 4096)


def standalone_kernels(tokens: int, vocab: int = VOCAB, logits_bytes: int = 2) -> list[tuple[str, int, float]]:
    """(kernel, N, bytes) of the kernels on materialized [N, V] bf16 logits (token_logprobs, or Liger's
    triton_grpo_loss, which also reads the logits once forward and once backward and writes their gradient),
    and of the policy-loss kernel at the GPU table's size. Each is bytes / bandwidth bound: a few FLOPs per
    element against a ridge point of hundreds."""
    n, v = tokens, vocab
    return [
        ("token_logprobs forward (read logits)", n, logits_bytes * n * v + 16 * n),
        ("token_logprobs backward (read logits, write gradient)", n, 2 * logits_bytes * n * v + 16 * n),
        ("Liger triton_grpo_loss forward + backward", n, 3 * logits_bytes * n * v + 24 * n),
    ]


def bounds(phases: list, device: dict, useful_flops: float) -> dict:
    """Lower bounds on time: every phase at its own roofline, run one after another (as separate kernels run),
    and everything overlapped perfectly; the best fraction of the bf16 compute roofline that implies."""
    in_sequence = 0.0
    detail = []
    for p in phases:
        compute = p["flops"] / device[p["precision"]] if p["flops"] else 0.0
        memory = p["bytes"] / device["bandwidth"]
        in_sequence += max(compute, memory)
        detail.append(
            {
                "name": p["name"],
                "compute_s": compute,
                "memory_s": memory,
                "bound": "compute" if compute > memory else "memory",
                "intensity": p["flops"] / p["bytes"] if p["bytes"] else float("inf"),
            }
        )
    overlapped = max(
        sum(p["flops"] / device[p["precision"]] for p in phases if p["flops"]),
        sum(p["bytes"] for p in phases) / device["bandwidth"],
    )
    ideal = useful_flops / device["bf16"]
    return {
        "in_sequence_s": in_sequence,
        "overlapped_s": overlapped,
        "compute_roofline_s": ideal,
        "best_fraction": ideal / in_sequence,
        "best_fraction_overlapped": ideal / overlapped,
        "phases": detail,
    }


def roofline_report() -> dict:
    designs = {}
    for tokens in TOKENS:
        useful = 6.0 * tokens * HIDDEN * VOCAB
        for name, build in (
            ("rwcore fused_linear_policy_loss (as written)", rwcore_fused_phases),
            ("rwcore, d weight accumulated in the GEMM (estimate)", rwcore_accumulating_phases),
            ("Liger chunked GRPO, fp32 matmuls (PyTorch default)", lambda n: liger_chunked_phases(n, matmul="fp32")),
            ("Liger chunked GRPO, TF32 allowed", lambda n: liger_chunked_phases(n, matmul="tf32")),
        ):
            phases, info = build(tokens)
            designs.setdefault(name, {})[tokens] = {
                "info": info,
                "flops": sum(p["flops"] for p in phases),
                "bytes": sum(p["bytes"] for p in phases),
                "phases": phases,
                "devices": {d: bounds(phases, spec, useful) for d, spec in DEVICES.items()},
            }
    standalone = [entry for tokens in TOKENS for entry in standalone_kernels(tokens)]
    standalone.append(("filtered_dual_clip_loss forward + backward (17 B per token)", LOSS_TOKENS, 17 * LOSS_TOKENS))
    standalone = [
        {
            "kernel": name,
            "tokens": tokens,
            "bytes": moved,
            "devices": {d: moved / spec["bandwidth"] for d, spec in DEVICES.items()},
        }
        for name, tokens, moved in standalone
    ]
    return {
        "shapes": {"tokens": TOKENS, "hidden": HIDDEN, "vocab": VOCAB, "dtype": "bf16", "sequence": SEQUENCE},
        "devices": DEVICES,
        "designs": designs,
        "standalone": standalone,
    }


def render_roofline(report: dict) -> str:
    ms = lambda s: f"{s * 1e3:.1f}"  # noqa: E731
    names = list(DEVICES)
    lines = [
        "# Roofline model: the policy loss from hidden states at the GPU table's shapes",
        "",
        f"V = {VOCAB:,}, H = {HIDDEN:,}, bf16 inputs, N = {', '.join(f'{t:,}' for t in TOKENS)} tokens. Useful work: "
        "the three LM-head GEMMs, 6 N H V FLOPs (logits, d hidden, d weight). Devices (datasheet, dense): "
        + "; ".join(
            f"{d} {s['bandwidth'] / 1e12:.2f} TB/s, {s['bf16'] / 1e12:.0f} TFLOP/s bf16, "
            f"{s['fp32'] / 1e12:.0f} fp32, {s['tf32'] / 1e12:.0f} tf32"
            for d, s in DEVICES.items()
        )
        + ".",
        "Bytes are what each step must move through HBM as the code is written (every temporary a full "
        "round trip; L2 reuse ignored, so tiles that fit in L2 make Liger's elementwise figures upper "
        "estimates). *In sequence*: each step at its own roofline, one after another (separate kernels "
        "do not overlap); *overlapped*: all FLOPs and all bytes at once. Best fraction = the 6 N H V "
        "compute roofline over the in-sequence bound: the most of the bf16 peak the design can reach. "
        "Written by `rw bench --gpu-static` (bench/gpu_static.py); arithmetic, not a measurement.",
        "",
        "| design | N | chunks | TFLOP done | GB moved | "
        + " | ".join(f"{d}: bound ms (seq / overlap), best fraction" for d in names)
        + " |",
        "|---|---:|---|---:|---:|" + "---:|" * len(names),
    ]
    for name, by_tokens in report["designs"].items():
        for tokens, entry in by_tokens.items():
            info = entry["info"]
            chunks = (
                f"{info['chunks']} x {info['rows_per_chunk']} rows"
                if "chunks" in info
                else f"{info['row_tiles']} x {info['rows_per_tile']} rows x {info['vocab_per_tile']} cols"
            )
            cells = [
                f"{ms(b['in_sequence_s'])} / {ms(b['overlapped_s'])}, {b['best_fraction']:.2f}"
                for b in entry["devices"].values()
            ]
            lines.append(
                f"| {name} | {tokens:,} | {chunks} | {entry['flops'] / 1e12:.0f} | {entry['bytes'] / 1e9:.0f} | "
                + " | ".join(cells)
                + " |"
            )
    big, small = max(TOKENS), min(TOKENS)
    designs = report["designs"]
    fraction = lambda design, n, d: designs[design][n]["devices"][d]["best_fraction"]  # noqa: E731
    ours, fixed = "rwcore fused_linear_policy_loss (as written)", "rwcore, d weight accumulated in the GEMM (estimate)"
    liger32, liger_tf = "Liger chunked GRPO, fp32 matmuls (PyTorch default)", "Liger chunked GRPO, TF32 allowed"
    info = designs[ours][big]["info"]
    h100 = DEVICES["H100 SXM"]
    lines += [
        "",
        "## What the model says",
        "",
        "- Compute bound: only the three bf16 LM-head GEMMs (hundreds of FLOP per byte, above the ridge "
        f"point of {h100['bf16'] / h100['bandwidth']:.0f} FLOP/B). Memory bound: every Triton kernel "
        "(token_logprobs forward and backward, the policy loss: a few FLOPs per element moved), every "
        "elementwise pass and every gradient accumulation.",
        f"- rwcore as written reaches at most {fraction(ours, big, 'H100 SXM'):.2f} of the bf16 peak at N = {big:,} "
        f"on an H100 / H800 ({fraction(ours, big, 'H200'):.2f} on an H200) and {fraction(ours, small, 'H100 SXM'):.2f} "
        f"at N = {small:,}. The default chunk has about N H / V rows, so there are always about "
        f"{info['chunks']} chunks, and each chunk moves 24 bytes per weight element (reading W twice, then the "
        "d weight product written in bf16, copied to fp32 and added to the fp32 accumulator): a fixed ~420 GB "
        "at this V x H whatever N is. That, not the Triton kernels (under 10 % of the bound), is the first thing to "
        "fix on a GPU.",
        f"- Accumulating d weight inside the GEMM (fp32 C, beta = 1) would lift the bound to "
        f"{fraction(fixed, big, 'H100 SXM'):.2f} ({fraction(fixed, big, 'H200'):.2f} on H200) at N = {big:,}; the GEMM "
        "then reads and writes the fp32 accumulator once per chunk (8 V H bytes against 2 c H V FLOPs), so it "
        f"is compute bound only with chunks of at least 4 x ridge = {4 * h100['bf16'] / h100['bandwidth']:.0f} "
        f"rows on H100 ({4 * DEVICES['H200']['bf16'] / DEVICES['H200']['bandwidth']:.0f} on H200): larger chunks "
        "than today's default, paid for in logits memory (fp32 c x V).",
        f"- Liger's chunked GRPO loss executes 8 N H V FLOPs for 6 of useful work (the logits are recomputed in "
        "backward), two of its four GEMMs in float32 (grad_logits and .float() copies of weight / hidden chunks), "
        f"and about 38 bytes per logit element in each direction in unfused elementwise passes: at most "
        f"{fraction(liger32, big, 'H100 SXM'):.2f} of the bf16 peak with PyTorch's default float32 matmuls and "
        f"{fraction(liger_tf, big, 'H100 SXM'):.2f} with TF32 allowed (H100, N = {big:,}).",
        "- The standalone kernels on materialized logits are bandwidth bound; the table below is their floor. "
        "`bench/gpu_check.sh` measures the achieved fraction of it on a real GPU.",
    ]
    lines += [
        "",
        f"## Step by step at N = {big:,} on the H100 / H800 (ridge point "
        f"{DEVICES['H100 SXM']['bf16'] / DEVICES['H100 SXM']['bandwidth']:.0f} FLOP/B bf16, "
        f"{DEVICES['H100 SXM']['fp32'] / DEVICES['H100 SXM']['bandwidth']:.0f} fp32)",
        "",
    ]
    for name, by_tokens in report["designs"].items():
        entry = by_tokens[big]
        device = entry["devices"]["H100 SXM"]
        lines += [f"**{name}**", "", "| step | GB | TFLOP | FLOP/B | bound | ms |", "|---|---:|---:|---:|---|---:|"]
        for phase, detail in zip(entry["phases"], device["phases"]):
            intensity = "-" if not phase["flops"] else f"{detail['intensity']:.0f}"
            lines.append(
                f"| {phase['name']} | {phase['bytes'] / 1e9:.1f} | {phase['flops'] / 1e12:.1f} | {intensity} "
                f"| {detail['bound']} | {ms(max(detail['compute_s'], detail['memory_s']))} |"
            )
        lines.append("")
    lines += [
        "## Kernels on materialized logits (memory bound: bytes / bandwidth)",
        "",
        "| kernel | N | GB | " + " | ".join(f"{d} ms" for d in names) + " |",
        "|---|---:|---:|" + "---:|" * len(names),
    ]
    for entry in report["standalone"]:
        lines.append(
            f"| {entry['kernel']} | {entry['tokens']:,} | {entry['bytes'] / 1e9:.2f} | "
            + " | ".join(f"{t * 1e3:.2f}" for t in entry["devices"].values())
            + " |"
        )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- command line


def _write(out_dir: Path, stem: str, report: dict, text: str) -> None:
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out_dir / f"{stem}.json", json.dumps(report, indent=2, default=str).encode())
    atomic_write_bytes(out_dir / f"{stem}.md", text.encode())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpu_static.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=DEFAULT_OUT,
        metavar="DIR",
        help="folder for gpu-static.{md,json} and roofline.{md,json} (default: bench/results)",
    )
    parser.add_argument("--subset", action="store_true", help="compile the test's subset, not the full grid")
    parser.add_argument("--no-cache", action="store_true", help="recompile every variant")
    parser.add_argument("--roofline-only", action="store_true", help="skip compiling; write the roofline model only")
    args = parser.parse_args(argv)
    code = 0
    if not args.roofline_only:
        print("compiling every kernel variant for sm_80 and sm_90 ...", flush=True)
        report = resource_report(full=not args.subset, use_cache=not args.no_cache)
        _write(args.out_dir, "gpu-static", report, render_resources(report))
        print(
            f"{report['variants']} variants ({report['compiled_now']} compiled now) in {report['seconds']:.1f} s; "
            f"max registers {max(r['registers'] for r in report['rows'])}; "
            f"{len(report['default_spills'])} spilling at a default configuration",
            flush=True,
        )
        if report["default_spills"]:
            code = 1
    roofline = roofline_report()
    text = render_roofline(roofline)
    _write(args.out_dir, "roofline", roofline, text)
    print(text)
    print(f"wrote {args.out_dir}/gpu-static.md and {args.out_dir}/roofline.md", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
