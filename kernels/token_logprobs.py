"""Token log-probabilities (and entropies) from logits: logp = z_y / T - logsumexp(z / T).

Order: Triton kernels, their launchers, the chunked PyTorch path (the CPU
backend and the reference the Triton path is held to), the autograd Function,
the public function.

Both paths accumulate in fp32: a bf16/fp16 logits tile is upcast before the
exponential, never rounded first, and neither holds more than one chunk of
fp32 logits at a time. Rows whose label is `ignore_index` get logp 0 and no
gradient through logp (their entropy is still computed).
"""

from __future__ import annotations

import torch

from rwcore.kernels import _checks
from rwcore.kernels._backend import resolve_backend, tl, triton
from rwcore.kernels._launch import INTERPRETER_ROW, row_launch

# Vocabulary tile and warps under the interpreter; on a GPU `_launch.row_config` picks them per
# architecture from a bounded set (at most four compiles per variant, whatever the shapes).
BLOCK_V = INTERPRETER_ROW.block
NUM_WARPS = INTERPRETER_ROW.num_warps
TORCH_CHUNK_ELEMENTS = 1 << 22  # fp32 logits per chunk on the PyTorch path (16 MiB)


# --------------------------------------------------------------------------- Triton kernels


# Integer arguments are not specialized (Triton would otherwise compile a
# variant per value that is 1 or a multiple of 16): one compile serves every
# vocabulary size, stride and temperature.
@triton.jit(do_not_specialize=["stride_row", "vocab_size", "ignore_index"])
def _token_logprobs_fwd_kernel(
    logits_ptr,
    labels_ptr,
    logp_ptr,
    lse_ptr,
    entropy_ptr,
    stride_row,
    vocab_size,
    inv_temperature,
    ignore_index,
    WITH_ENTROPY: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One program per row; the row index is on grid axis 0 (no 65,535 limit)
    # and offsets are int64, so N * V may exceed 2**31.
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_row
    running_max = tl.full((), float("-inf"), tl.float32)
    running_sum = tl.full((), 0.0, tl.float32)
    # sum exp(s - max) * (s - max), for the entropy log(sum) - dot / sum: kept
    # relative to the running max so large logits do not cancel.
    running_dot = tl.full((), 0.0, tl.float32)
    for start in range(0, vocab_size, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < vocab_size
        s = tl.load(row_ptr + cols, mask=inside, other=0.0).to(tl.float32) * inv_temperature
        s_or_floor = tl.where(inside, s, float("-inf"))  # lanes past V weigh exp(-inf) = 0
        new_max = tl.maximum(running_max, tl.max(s_or_floor, axis=0))
        rescale = tl.exp(running_max - new_max)
        p = tl.exp(s_or_floor - new_max)
        if WITH_ENTROPY:
            shift = tl.where(running_sum > 0, running_max - new_max, 0.0)  # no -inf * 0 on the first tile
            running_dot = (running_dot + shift * running_sum) * rescale + tl.sum(p * (s - new_max), axis=0)
        running_sum = running_sum * rescale + tl.sum(p, axis=0)
        running_max = new_max
    lse = running_max + tl.log(running_sum)
    label = tl.load(labels_ptr + row).to(tl.int64)
    counted = label != ignore_index
    label_logit = tl.load(row_ptr + tl.where(counted, label, 0)).to(tl.float32) * inv_temperature
    tl.store(logp_ptr + row, tl.where(counted, label_logit - lse, 0.0))
    tl.store(lse_ptr + row, lse)
    if WITH_ENTROPY:
        tl.store(entropy_ptr + row, tl.log(running_sum) - running_dot / running_sum)


@triton.jit(do_not_specialize=["stride_row", "grad_stride_row", "vocab_size", "ignore_index"])
def _token_logprobs_bwd_kernel(
    logits_ptr,
    labels_ptr,
    lse_ptr,
    entropy_ptr,
    grad_logp_ptr,
    grad_entropy_ptr,
    grad_logits_ptr,
    stride_row,
    grad_stride_row,
    vocab_size,
    inv_temperature,
    ignore_index,
    WITH_ENTROPY: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # d logp / d s = onehot(y) - p and d H / d s = -p (log p + H), with
    # s = z / T. grad_logits may alias logits: each element is read before it
    # is overwritten, by the same program.
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_row
    grad_row_ptr = grad_logits_ptr + row * grad_stride_row
    label = tl.load(labels_ptr + row).to(tl.int64)
    g = tl.load(grad_logp_ptr + row).to(tl.float32)
    g = tl.where(label != ignore_index, g, 0.0)
    lse = tl.load(lse_ptr + row)
    if WITH_ENTROPY:
        g_entropy = tl.load(grad_entropy_ptr + row).to(tl.float32)
        entropy = tl.load(entropy_ptr + row)
    for start in range(0, vocab_size, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < vocab_size
        s = tl.load(row_ptr + cols, mask=inside, other=0.0).to(tl.float32) * inv_temperature
        log_p = s - lse
        p = tl.exp(log_p)
        grad_s = tl.where(cols == label, g, 0.0) - g * p
        if WITH_ENTROPY:
            grad_s -= g_entropy * p * (log_p + entropy)
        tl.store(grad_row_ptr + cols, (grad_s * inv_temperature).to(grad_logits_ptr.dtype.element_ty), mask=inside)


# --------------------------------------------------------------------------- launchers


def _launch_forward(logits, labels, inv_temperature, ignore_index, with_entropy):
    rows, vocab = logits.shape
    logp = torch.empty(rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty_like(logp)
    entropy = torch.empty_like(logp) if with_entropy else lse  # placeholder pointer when unused
    if rows:
        config = row_launch(logits.device, vocab)
        _token_logprobs_fwd_kernel[(rows,)](
            logits,
            labels,
            logp,
            lse,
            entropy,
            logits.stride(0),
            vocab,
            inv_temperature,
            ignore_index,
            WITH_ENTROPY=with_entropy,
            BLOCK=config.block,
            num_warps=config.num_warps,
        )
    return logp, lse, entropy if with_entropy else None


def _launch_backward(logits, labels, lse, entropy, grad_logp, grad_entropy, inv_temperature, ignore_index, out):
    rows, vocab = logits.shape
    with_entropy = grad_entropy is not None
    if rows:
        config = row_launch(logits.device, vocab)
        _token_logprobs_bwd_kernel[(rows,)](
            logits,
            labels,
            lse,
            entropy if with_entropy else lse,
            grad_logp,
            grad_entropy if with_entropy else grad_logp,
            out,
            logits.stride(0),
            out.stride(0),
            vocab,
            inv_temperature,
            ignore_index,
            WITH_ENTROPY=with_entropy,
            BLOCK=config.block,
            num_warps=config.num_warps,
        )
    return out


# --------------------------------------------------------------------------- chunked PyTorch path


def _torch_chunks(rows: int, vocab: int):
    step = max(1, TORCH_CHUNK_ELEMENTS // max(vocab, 1))
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))


def _torch_forward(logits, labels, inv_temperature, ignore_index, with_entropy):
    rows, vocab = logits.shape
    logp = torch.empty(rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty_like(logp)
    entropy = torch.empty_like(logp) if with_entropy else None
    for part in _torch_chunks(rows, vocab):
        s = logits[part].float()
        if inv_temperature != 1.0:
            s = s * inv_temperature
        part_lse = torch.logsumexp(s, dim=-1)
        label = labels[part]
        counted = label != ignore_index
        label_logit = s.gather(1, torch.where(counted, label, 0).long().unsqueeze(1)).squeeze(1)
        logp[part] = torch.where(counted, label_logit - part_lse, 0.0)
        lse[part] = part_lse
        if with_entropy:
            log_p = s - part_lse.unsqueeze(1)  # small numbers: no cancellation against lse
            entropy[part] = -(log_p.exp() * log_p).sum(-1)
    return logp, lse, entropy


def _torch_backward(logits, labels, lse, entropy, grad_logp, grad_entropy, inv_temperature, ignore_index, out):
    rows, vocab = logits.shape
    # Asked to overwrite fp32 logits with their gradient, the chunk is
    # transformed in place; otherwise one fp32 working copy per chunk.
    in_place = out.data_ptr() == logits.data_ptr() and out.dtype == torch.float32
    for part in _torch_chunks(rows, vocab):
        label = labels[part]
        counted = label != ignore_index
        g = torch.where(counted, grad_logp[part].float(), 0.0).unsqueeze(1)
        work = out[part] if in_place else logits[part].to(torch.float32, copy=True)
        if inv_temperature != 1.0:
            work.mul_(inv_temperature)
        work.sub_(lse[part].unsqueeze(1))  # log p
        if grad_entropy is not None:
            # d/ds of g logp + g_H H = g (onehot - p) - g_H p (log p + H)
            coefficient = (work + entropy[part].unsqueeze(1)).mul_(-grad_entropy[part].float().unsqueeze(1)).sub_(g)
            work.exp_().mul_(coefficient)
        else:
            work.exp_().mul_(-g)
        work.scatter_add_(1, torch.where(counted, label, 0).long().unsqueeze(1), g)
        if inv_temperature != 1.0:
            work.mul_(inv_temperature)
        if not in_place:
            out[part] = work
    return out


def logprobs_forward(logits, labels, inv_temperature, ignore_index, with_entropy, backend):
    """Rows of `logits` [N, V] (unit stride along V) -> fp32 (logp [N], lse [N], entropy [N] or None)."""
    run = _launch_forward if backend == "triton" else _torch_forward
    return run(logits, labels, inv_temperature, ignore_index, with_entropy)


def logprobs_backward(
    logits, labels, lse, entropy, grad_logp, grad_entropy, inv_temperature, ignore_index, backend, out=None
):
    """Gradient w.r.t. logits [N, V] in logits' dtype, written into `out` (may be `logits` itself)."""
    out = torch.empty_like(logits) if out is None else out
    run = _launch_backward if backend == "triton" else _torch_backward
    return run(logits, labels, lse, entropy, grad_logp, grad_entropy, inv_temperature, ignore_index, out)


# --------------------------------------------------------------------------- autograd


class TokenLogProbsFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, inv_temperature, ignore_index, with_entropy, backend):
        logp, lse, entropy = logprobs_forward(logits, labels, inv_temperature, ignore_index, with_entropy, backend)
        ctx.save_for_backward(logits, labels, lse, entropy if with_entropy else lse)
        ctx.config = (inv_temperature, ignore_index, with_entropy, backend)
        if with_entropy:
            return logp, entropy
        return logp

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy=None):
        logits, labels, lse, entropy = ctx.saved_tensors
        inv_temperature, ignore_index, with_entropy, backend = ctx.config
        if grad_logp is None:
            grad_logp = torch.zeros_like(lse)
        grad_logits = logprobs_backward(
            logits,
            labels,
            lse,
            entropy,
            grad_logp.contiguous(),
            grad_entropy.contiguous() if with_entropy and grad_entropy is not None else None,
            inv_temperature,
            ignore_index,
            backend,
        )
        return grad_logits, None, None, None, None, None


# --------------------------------------------------------------------------- public function


def token_logprobs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    return_entropy: bool = False,
    ignore_index: int = -100,
    backend: str = "auto",
    validate: bool = True,
):
    """Log-probability of each label under softmax(logits / temperature), in fp32.

    Args:
        logits: [..., V] float32 / bfloat16 / float16.
        labels: [...] int64 (or int32); a label equal to `ignore_index` gives logp 0
            and no gradient; every other label must be in [0, V).
        temperature: T > 0; logits are divided by it before the softmax. With validate, a T at
            which max |logits| / T exceeds 2**126 (the float32 softmax would give inf or NaN)
            is a ValueError; 1 / T beyond float32 always is.
        return_entropy: also return the entropy -sum_v p_v log p_v of each row.
        backend: "triton" (CUDA, or CPU under TRITON_INTERPRET=1), "torch" (chunked
            PyTorch) or "auto" (Triton on CUDA, PyTorch on CPU).
        validate: also check the values: finiteness and range of the scaled logits and the
            label range (they read values back to the host; pass False to skip them).
            Shapes, dtypes, devices, V > 0 and the temperature are always checked.

    Returns:
        logp fp32 [...], or (logp, entropy) with return_entropy. Differentiable
        w.r.t. `logits`; the gradient has logits' dtype.
    """
    # Free checks first, whatever `validate` says: a wrong shape or V = 0 would make a kernel read out of bounds.
    _checks.check_float(logits, "logits")
    _checks.check_integer(labels, "labels")
    if logits.dim() < 1 or tuple(labels.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"labels has shape {tuple(labels.shape)}, expected logits.shape[:-1] = {tuple(logits.shape[:-1])}"
        )
    _checks.check_vocabulary(logits.shape[-1], "logits")
    _checks.check_same_device(logits=logits, labels=labels)
    inv_temperature = _checks.check_temperature(temperature)
    if validate:
        _checks.check_scaled_logits(logits, inv_temperature, "logits")
        _checks.check_labels(labels, logits.shape[-1], "labels", ignore_index=ignore_index)
    resolved = resolve_backend(backend, logits)
    leading = logits.shape[:-1]
    flat_logits = logits.reshape(-1, logits.shape[-1])
    if flat_logits.stride(-1) != 1:
        flat_logits = flat_logits.contiguous()
    flat_labels = labels.reshape(-1).contiguous()
    out = TokenLogProbsFunction.apply(
        flat_logits, flat_labels, inv_temperature, int(ignore_index), bool(return_entropy), resolved
    )
    if return_entropy:
        return out[0].reshape(leading), out[1].reshape(leading)
    return out.reshape(leading)
