"""The Triton kernels at production shapes against the float64 references (tests/kernel_reference.py).

    .venv/bin/python bench/gpu_kernel_check.py --out results/kernel-check.json          # CUDA, production shapes
    TRITON_INTERPRET=1 .venv/bin/python bench/gpu_kernel_check.py --device cpu --tiny   # the plumbing, on a CPU

Run by bench/gpu_check.sh. Production shapes: token_logprobs on bf16 logits [8,192 x 151,936] with
entropies and both gradients; filtered_dual_clip_loss on 4,096 x 4,096 tokens; fused_linear_policy_loss
on hidden [8,192 x 3,584] and head [151,936 x 3,584] in bf16 and fp32. Tolerances are the test suite's: fp32 math
from the same low-precision inputs must match float64 to 1e-5 relative (at the row's logit scale);
a bf16 output (the logits' gradient, the fused gradients) must be within 2x the error of eager PyTorch
in bf16 plus one bf16 rounding unit. The float64 references are evaluated in row chunks on the same
device. Exit code 1 when a check fails; every check runs and is recorded either way.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

PRODUCTION = {
    "rows": 8192,
    "vocab": 151_936,
    "hidden": 3584,
    "loss_batch": 4096,
    "loss_seq": 4096,
    "reference_rows": 1024,
}
TINY = {"rows": 96, "vocab": 1000, "hidden": 32, "loss_batch": 4, "loss_seq": 300, "reference_rows": 64}
# The float64 references run in chunks of shape["reference_rows"] rows (151,936 x 1,024 x 8 bytes = 1.2 GB);
# the tiny shapes use two chunks too, so the dry run covers the chunking.


def check_token_logprobs(torch, device, shape, dtype) -> dict:
    from kernel_reference import (
        assert_close64,
        assert_lowp_criterion,
        lowp_token_logprobs,
        ref_token_logprobs,
        ref_token_logprobs_grad,
        row_scale,
    )

    from rwcore.kernels import token_logprobs

    gen = torch.Generator(device=device).manual_seed(0)
    rows, vocab = shape["rows"], shape["vocab"]
    logits = (torch.randn(rows, vocab, device=device, generator=gen) * 2.0).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (rows,), device=device, generator=gen)
    grad_logp = torch.randn(rows, device=device, generator=gen)
    grad_entropy = torch.randn(rows, device=device, generator=gen)
    logp, entropy = token_logprobs(logits, labels, return_entropy=True, backend="triton")
    torch.autograd.backward([logp, entropy], [grad_logp, grad_entropy])
    for start in range(0, rows, shape["reference_rows"]):
        part = slice(start, min(rows, start + shape["reference_rows"]))
        z = logits.detach()[part]
        ref_logp, ref_entropy = ref_token_logprobs(z, labels[part])
        scale = row_scale(z, 1.0)
        assert_close64(
            logp[part], ref_logp, f"logp rows {part.start}:{part.stop}", rtol=1e-5, atol_rel=1e-5, scale=scale
        )
        assert_close64(
            entropy[part], ref_entropy, f"entropy rows {part.start}:{part.stop}", rtol=1e-5, atol_rel=1e-5, scale=scale
        )
        ref_grad = ref_token_logprobs_grad(z, labels[part], 1.0, grad_logp[part], grad_entropy[part])
        if dtype == torch.float32:
            assert_close64(logits.grad[part], ref_grad, "d logits", rtol=1e-4, atol_rel=1e-5)
        else:
            _, _, lowp_grad = lowp_token_logprobs(z, labels[part], 1.0, grad_logp[part], grad_entropy[part])
            assert_lowp_criterion(logits.grad[part], ref_grad, lowp_grad, f"d logits rows {part.start}:{part.stop}")
    return {"rows": rows, "vocab": vocab, "dtype": str(dtype)}


def check_dual_clip(torch, device, shape) -> dict:
    from kernel_reference import assert_close64, ref_dual_clip

    from rwcore.kernels import filtered_dual_clip_loss

    gen = torch.Generator(device=device).manual_seed(1)
    batch, seq = shape["loss_batch"], shape["loss_seq"]
    logp = (-torch.rand(batch, seq, device=device, generator=gen) * 5).requires_grad_()
    behavior = logp.detach() + 0.5 * torch.randn(batch, seq, device=device, generator=gen)
    advantages = torch.randn(batch, device=device, generator=gen)
    mask = torch.rand(batch, seq, device=device, generator=gen) < 0.9
    loss, stats = filtered_dual_clip_loss(logp, behavior, advantages, mask, backend="triton")
    loss.backward()
    ref = ref_dual_clip(logp.detach(), behavior, advantages.unsqueeze(1).expand(batch, seq), mask)
    assert_close64(loss, torch.tensor(ref["loss"], dtype=torch.float64), "loss", rtol=1e-4, atol_rel=1e-6)
    assert_close64(logp.grad, ref["grad"], "d logp", rtol=1e-5, atol_rel=1e-6)
    # the reference's statistics; the rollout_corr/* mismatch metrics (on by default) are not the kernel's
    for name, expected in ref["stats"].items():
        assert_close64(stats[name], torch.tensor(expected, dtype=torch.float64), name, rtol=1e-4, atol_rel=1e-6)
    return {"tokens": batch * seq}


def check_fused_linear(torch, device, shape, dtype) -> dict:
    from kernel_reference import (
        assert_close64,
        assert_lowp_criterion,
        lowp_fused_linear_policy_loss,
        ref_fused_linear_policy_loss,
    )

    from rwcore.kernels import fused_linear_policy_loss

    gen = torch.Generator(device=device).manual_seed(2)
    rows, hidden_size, vocab = shape["rows"], shape["hidden"], shape["vocab"]
    hidden = (torch.randn(rows, hidden_size, device=device, generator=gen) / math.sqrt(hidden_size)).to(dtype)
    weight = (torch.randn(vocab, hidden_size, device=device, generator=gen) * 0.5).to(dtype)
    labels = torch.randint(0, vocab, (rows,), device=device, generator=gen)
    mask = torch.rand(rows, device=device, generator=gen) < 0.9
    behavior = -math.log(vocab) + 0.3 * torch.randn(rows, device=device, generator=gen)
    advantages = torch.randn(rows, device=device, generator=gen)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss, stats = fused_linear_policy_loss(h, w, labels, behavior, advantages, mask, backend="triton")
    loss.backward()
    # The float64 reference in row chunks (the whole [N, V] in float64 with its temporaries would need ~60 GB):
    # the denominator is the whole batch's model-token count, the loss and d weight add up over chunks.
    total = int(mask.sum())
    weight64, ref_loss, ref_dh, ref_dw = weight.double(), 0.0, [], torch.zeros_like(weight, dtype=torch.float64)
    for start in range(0, rows, shape["reference_rows"]):
        part = slice(start, min(rows, start + shape["reference_rows"]))
        chunk, (dh, dw, _) = ref_fused_linear_policy_loss(
            hidden[part].double(),
            weight64,
            labels[part],
            behavior[part].double(),
            advantages[part].double(),
            mask[part],
            num_model_tokens=total,
        )
        ref_loss += chunk["loss"]
        ref_dh.append(dh)
        ref_dw += dw
    ref, ref_dh = {"loss": ref_loss}, torch.cat(ref_dh)
    if dtype == torch.float32:
        assert_close64(loss, torch.tensor(ref["loss"], dtype=torch.float64), "loss", rtol=1e-4, atol_rel=1e-6)
        assert_close64(h.grad, ref_dh, "d hidden", rtol=1e-3, atol_rel=1e-5)
        assert_close64(w.grad, ref_dw, "d weight", rtol=1e-3, atol_rel=1e-5)
    else:
        lowp_loss, _, (lowp_dh, lowp_dw, _) = lowp_fused_linear_policy_loss(
            hidden, weight, labels, behavior, advantages, mask
        )
        reference_loss = torch.tensor(ref["loss"], dtype=torch.float64)
        assert_lowp_criterion(loss, reference_loss, lowp_loss, "loss", in_dtype=dtype)
        assert_lowp_criterion(h.grad, ref_dh, lowp_dh, "d hidden")
        assert_lowp_criterion(w.grad, ref_dw, lowp_dw, "d weight")
    return {
        "rows": rows,
        "hidden": hidden_size,
        "vocab": vocab,
        "dtype": str(dtype),
        "kept_fraction": float(stats["kept_fraction"]),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="small shapes (the dry run)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_kernel_check: no CUDA device; run with --device cpu --tiny under TRITON_INTERPRET=1", flush=True)
        return 2
    device = torch.device(args.device)
    shape = TINY if args.tiny else PRODUCTION
    checks = [
        ("token_logprobs bf16", lambda: check_token_logprobs(torch, device, shape, torch.bfloat16)),
        ("token_logprobs fp32", lambda: check_token_logprobs(torch, device, shape, torch.float32)),
        ("filtered_dual_clip_loss fp32", lambda: check_dual_clip(torch, device, shape)),
        ("fused_linear_policy_loss bf16", lambda: check_fused_linear(torch, device, shape, torch.bfloat16)),
        ("fused_linear_policy_loss fp32", lambda: check_fused_linear(torch, device, shape, torch.float32)),
    ]
    results, failed = [], 0
    for name, run in checks:
        start = time.perf_counter()
        try:
            detail = run()
            status, message = "passed", ""
        except AssertionError as error:
            status, message, detail = "FAILED", str(error), {}
        except Exception:  # an error in a check is recorded, the others still run
            status, message, detail = "ERROR", traceback.format_exc(limit=6), {}
        failed += status != "passed"
        results.append(
            {"check": name, "status": status, "message": message, "seconds": time.perf_counter() - start, **detail}
        )
        print(
            f"  {name}: {status} ({results[-1]['seconds']:.1f} s){' ' + message[:500] if message else ''}", flush=True
        )
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)",
        "shapes": shape,
        "checks": results,
        "failed": failed,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
    print(f"gpu_kernel_check: {len(results) - failed}/{len(results)} passed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
