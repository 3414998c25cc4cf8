"""Arise's filtered dual-clip policy loss from token log-probs (eq. 18-19, appendix B.4).

    w    = exp(clamp(logp - logp_behavior, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    keep = model_mask & (ratio_low < w < ratio_high)          (constant under differentiation)
    loss = sum(keep * min(-w A, clip_c |A|)) / D

D counts model-generated tokens before filtering (`num_model_tokens` lets a
data-parallel caller pass the global count). The gradient w.r.t. logp is
keep * (-A w) / D where the surrogate is not capped, 0 where it is; it is
computed in the forward pass and scaled by the incoming gradient in backward.
The keep mask is applied with a select, never a multiply, and the ratio comes
from a clamped log-ratio, so an extreme token can neither overflow nor turn
into NaN through inf * 0; with D = 0 or nothing kept the loss and every
gradient are exactly 0.

Order: Triton kernel, launcher, PyTorch path, autograd Function, public function.
"""

from __future__ import annotations

import torch

from rwcore.kernels import _checks
from rwcore.kernels._backend import resolve_backend, tl, triton
from rwcore.kernels._launch import INTERPRETER_LOSS, loss_launch

LOG_RATIO_BOUND = 20.0  # e^20 ~ 5e8: far beyond any ratio_high, still finite in fp32
BLOCK_TOKENS = INTERPRETER_LOSS.block  # tokens per program; `_launch.loss_launch` picks it per device
STAT_NAMES = ("kept_fraction", "filtered_low_fraction", "filtered_high_fraction", "dual_clipped_fraction", "mean_ratio")
# Per-block partial sums the kernel writes: loss, model tokens, kept, low, high, dual-clipped, ratio.
_NUM_PARTIALS = 7


# --------------------------------------------------------------------------- Triton kernel


@triton.jit(do_not_specialize=["num_tokens", "seq_len", "adv_stride_row", "adv_stride_col"])
def _policy_loss_fwd_kernel(
    logp_ptr,
    behavior_ptr,
    advantages_ptr,
    mask_ptr,
    denominator_ptr,
    grad_ptr,
    partials_ptr,
    num_tokens,
    seq_len,
    adv_stride_row,
    adv_stride_col,
    ratio_low,
    ratio_high,
    clip_c,
    log_ratio_bound,
    BLOCK: tl.constexpr,
):
    block = tl.program_id(0)
    offsets = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < num_tokens
    logp = tl.load(logp_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    behavior = tl.load(behavior_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    adv_offsets = (offsets // seq_len) * adv_stride_row + (offsets % seq_len) * adv_stride_col
    advantage = tl.load(advantages_ptr + adv_offsets, mask=inside, other=0.0).to(tl.float32)
    model = (tl.load(mask_ptr + offsets, mask=inside, other=0) != 0) & inside

    log_ratio = tl.minimum(tl.maximum(logp - behavior, -log_ratio_bound), log_ratio_bound)
    ratio = tl.exp(log_ratio)
    low = model & (ratio <= ratio_low)
    high = model & (ratio >= ratio_high)
    keep = model & (ratio > ratio_low) & (ratio < ratio_high)
    surrogate = -ratio * advantage
    cap = clip_c * tl.abs(advantage)
    capped = surrogate > cap

    denominator = tl.load(denominator_ptr)
    safe_denominator = tl.where(denominator > 0, denominator, 1.0)
    term = tl.where(keep, tl.where(capped, cap, surrogate), 0.0)
    grad = tl.where(keep & (~capped), -advantage * ratio / safe_denominator, 0.0)
    grad = tl.where(denominator > 0, grad, 0.0)
    tl.store(grad_ptr + offsets, grad, mask=inside)

    out = partials_ptr + block.to(tl.int64) * 7
    tl.store(out + 0, tl.sum(term, axis=0))
    tl.store(out + 1, tl.sum(model.to(tl.float32), axis=0))
    tl.store(out + 2, tl.sum(keep.to(tl.float32), axis=0))
    tl.store(out + 3, tl.sum(low.to(tl.float32), axis=0))
    tl.store(out + 4, tl.sum(high.to(tl.float32), axis=0))
    tl.store(out + 5, tl.sum((keep & capped).to(tl.float32), axis=0))
    tl.store(out + 6, tl.sum(tl.where(model, ratio, 0.0), axis=0))


# --------------------------------------------------------------------------- launcher


def _launch(logp, behavior, advantages, mask, denominator, ratio_low, ratio_high, clip_c):
    """[B, T] inputs (advantages possibly a stride-0 broadcast) -> (grad [B, T], partial sums [7])."""
    batch, seq_len = logp.shape
    num_tokens = batch * seq_len
    grad = torch.empty(batch, seq_len, dtype=torch.float32, device=logp.device)
    config = loss_launch(logp.device)
    blocks = max(1, triton.cdiv(num_tokens, config.block))
    partials = torch.zeros(blocks, _NUM_PARTIALS, dtype=torch.float32, device=logp.device)
    if num_tokens:
        _policy_loss_fwd_kernel[(blocks,)](
            logp,
            behavior,
            advantages,
            mask,
            denominator,
            grad,
            partials,
            num_tokens,
            seq_len,
            advantages.stride(0),
            advantages.stride(1),
            ratio_low,
            ratio_high,
            clip_c,
            LOG_RATIO_BOUND,
            BLOCK=config.block,
            num_warps=config.num_warps,
        )
    return grad, partials.sum(0)


# --------------------------------------------------------------------------- PyTorch path


def _torch(logp, behavior, advantages, mask, denominator, ratio_low, ratio_high, clip_c):
    advantage = advantages.float()
    model = mask != 0
    ratio = torch.exp((logp.float() - behavior.float()).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    low = model & (ratio <= ratio_low)
    high = model & (ratio >= ratio_high)
    keep = model & (ratio > ratio_low) & (ratio < ratio_high)
    surrogate = -ratio * advantage
    cap = clip_c * advantage.abs()
    capped = surrogate > cap
    positive = denominator > 0
    safe_denominator = torch.where(positive, denominator, torch.ones_like(denominator))
    term = torch.where(keep, torch.where(capped, cap, surrogate), 0.0)
    grad = torch.where(keep & ~capped & positive, -advantage * ratio / safe_denominator, 0.0)
    partials = torch.stack(
        [
            term.sum(),
            model.sum(),
            keep.sum(),
            low.sum(),
            high.sum(),
            (keep & capped).sum(),
            torch.where(model, ratio, 0.0).sum(),
        ]
    ).float()
    return grad, partials


def policy_loss_partials(logp, behavior, advantages, mask, denominator, ratio_low, ratio_high, clip_c, backend):
    """[B, T] inputs -> (grad w.r.t. logp [B, T] fp32, partial sums [7] fp32). No host sync.

    The partial sums (loss numerator, model, kept, low, high and dual-clipped
    token counts, ratio sum) add up across chunks of a batch; `loss_and_stats`
    turns their total into the loss and the statistics.
    """
    run = _launch if backend == "triton" else _torch
    return run(logp, behavior, advantages, mask, denominator, ratio_low, ratio_high, clip_c)


def loss_and_stats(partials: torch.Tensor, denominator: torch.Tensor):
    """(loss, {stat name: detached 0-dim tensor}) from summed partials; zeros where a count is 0."""
    positive = denominator > 0
    loss = torch.where(positive, partials[0] / torch.where(positive, denominator, torch.ones_like(denominator)), 0.0)
    model_tokens = partials[1]
    any_model = model_tokens > 0
    per_model = torch.where(any_model, model_tokens, torch.ones_like(model_tokens))
    fractions = torch.where(any_model, partials[2:] / per_model, torch.zeros_like(partials[2:]))
    return loss, dict(zip(STAT_NAMES, fractions.detach().unbind(0)))


# --------------------------------------------------------------------------- autograd


class PolicyLossFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, behavior, advantages, mask, denominator, ratio_low, ratio_high, clip_c, backend):
        grad, partials = policy_loss_partials(
            logp, behavior, advantages, mask, denominator, ratio_low, ratio_high, clip_c, backend
        )
        loss, stats = loss_and_stats(partials, denominator)
        ctx.save_for_backward(grad)
        ctx.logp_dtype = logp.dtype
        ctx.mark_non_differentiable(*stats.values())
        return (loss, *stats.values())

    @staticmethod
    def backward(ctx, grad_loss, *unused):
        (grad,) = ctx.saved_tensors
        return (grad * grad_loss).to(ctx.logp_dtype), None, None, None, None, None, None, None, None


# --------------------------------------------------------------------------- public function


def denominator_tensor(num_model_tokens, model_mask: torch.Tensor, validate: bool = True) -> torch.Tensor:
    """D as a 0-dim fp32 tensor on the mask's device.

    Always checked: a Python number must be finite, >= 0 and within float32; a tensor
    must hold one real value. With `validate` (reads values back to the host): a
    tensor's value likewise, and D = 0 only when the mask has no model tokens (the
    documented loss-0 case) rather than silently zeroing a loss that has tokens.
    """
    if num_model_tokens is None:
        return (model_mask != 0).sum().to(torch.float32)
    if isinstance(num_model_tokens, torch.Tensor):
        _checks.check_num_model_tokens_tensor(num_model_tokens)
        denominator = num_model_tokens.detach().to(device=model_mask.device, dtype=torch.float32).reshape(())
    else:
        denominator = torch.tensor(
            _checks.check_num_model_tokens_number(num_model_tokens), dtype=torch.float32, device=model_mask.device
        )
    if validate:
        _checks.check_num_model_tokens_value(denominator, num_model_tokens, model_mask)
    return denominator


def check_policy_inputs(
    behavior_logprobs,
    advantages,
    model_mask,
    shape,
    shape_from: str,
    advantage_shapes,
    validate: bool = True,
    **others: torch.Tensor,
) -> None:
    """Dtype, shape and device checks of the per-token policy-loss arguments (free, always), then with
    `validate` the value checks (mask values, finiteness), which read values back to the host."""
    _checks.check_float(behavior_logprobs, "behavior_logprobs")
    _checks.check_float(advantages, "advantages")
    _checks.check_tensor(model_mask, "model_mask")
    _checks.check_shape(behavior_logprobs, shape, "behavior_logprobs", shape_from)
    _checks.check_shape(model_mask, shape, "model_mask", shape_from)
    if tuple(advantages.shape) not in advantage_shapes:
        expected = " or ".join(str(list(s)) for s in advantage_shapes)
        raise ValueError(f"advantages has shape {tuple(advantages.shape)}, expected {expected}")
    _checks.check_same_device(
        behavior_logprobs=behavior_logprobs, advantages=advantages, model_mask=model_mask, **others
    )
    if not validate:
        return
    _checks.check_mask(model_mask, "model_mask")
    for name, tensor in (("behavior_logprobs", behavior_logprobs), ("advantages", advantages), *others.items()):
        if tensor.dtype.is_floating_point:
            _checks.check_finite(tensor, name)


def filtered_dual_clip_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    model_mask: torch.Tensor,
    ratio_low: float = 0.5,
    ratio_high: float = 5.0,
    clip_c: float = 3.0,
    num_model_tokens=None,
    backend: str = "auto",
    validate: bool = True,
):
    """Arise's token-level policy loss with importance-ratio filtering and dual clipping.

    Args:
        logprobs: [B, T] current-policy log-probs (differentiable).
        behavior_logprobs: [B, T] log-probs recorded at rollout time.
        advantages: [B] per trajectory (broadcast over T) or [B, T] per token.
        model_mask: [B, T] bool (or 0/1 of any dtype): tokens the policy generated; tool
            output and prompt tokens stay in context but get no loss.
        ratio_low, ratio_high: tokens whose ratio is outside (ratio_low, ratio_high)
            are dropped, not clipped.
        clip_c: dual-clip cap; a negative-advantage token contributes at most clip_c * |A|.
        num_model_tokens: the denominator D; default sum(model_mask). Pass the
            global pre-filter count (a number or a one-element tensor) under data
            parallelism. NaN, infinite, negative or beyond-float32 values are a
            ValueError; with validate, so is D = 0 while model_mask has model tokens.
        validate: also run the value checks (finiteness, mask values, a tensor D's
            value), which read back to the host; shapes and numbers are always checked.

    Returns:
        (loss, stats): loss is a 0-dim fp32 tensor; stats maps kept_fraction,
        filtered_low_fraction, filtered_high_fraction, dual_clipped_fraction
        (fractions of this call's model tokens) and mean_ratio (over them) to
        detached 0-dim tensors.
    """
    low, high, clip = _checks.check_loss_bounds(ratio_low, ratio_high, clip_c)
    _checks.check_float(logprobs, "logprobs")
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
    check_policy_inputs(
        behavior_logprobs,
        advantages,
        model_mask,
        logprobs.shape,
        "logprobs",
        advantage_shapes=(tuple(logprobs.shape[:1]), tuple(logprobs.shape)),
        validate=validate,
        logprobs=logprobs,
    )
    resolved = resolve_backend(backend, logprobs)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1).expand(logprobs.shape)  # stride-0 view, no copy
    denominator = denominator_tensor(num_model_tokens, model_mask, validate)
    loss, *stats = PolicyLossFunction.apply(
        logprobs.contiguous(),
        behavior_logprobs.contiguous(),
        advantages,
        (model_mask != 0).to(torch.int8).contiguous(),
        denominator,
        low,
        high,
        clip,
        resolved,
    )
    return loss, dict(zip(STAT_NAMES, stats))
