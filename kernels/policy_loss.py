"""Arise's filtered dual-clip policy loss from token log-probs (eq. 18-19, appendix B.4).

    w    = exp(clamp(logp - logp_anchor, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    keep = model_mask & (ratio_low < w < ratio_high)          (constant under differentiation)
    loss = sum(keep * rho * min(-w A, clip_c |A|)) / D

logp_anchor is the behaviour log-prob (Arise), or with a rollout correction the proximal one;
rho is the correction's per-token weight (`rollout_correction.py`; 1 without one, where the
kernel variant without a weight runs and the loss is Arise's bit for bit).

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
from rwcore.kernels import rollout_correction as correction_ops
from rwcore.kernels._backend import resolve_backend, tl, triton
from rwcore.kernels._launch import INTERPRETER_LOSS, loss_launch
from rwcore.kernels.loss_settings import LOSS_DEFAULTS, resolve_loss_settings

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
    weight_ptr,
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
    HAS_WEIGHT: tl.constexpr,
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
    if HAS_WEIGHT:
        weight = tl.load(weight_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
        term = term * weight
        grad = grad * weight
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


def _launch(logp, behavior, advantages, mask, denominator, ratio_low, ratio_high, clip_c, weight=None):
    """[B, T] inputs (advantages possibly a stride-0 broadcast; weight [B, T] fp32 or None) ->
    (grad [B, T], partial sums [7])."""
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
            mask if weight is None else weight,  # never read without HAS_WEIGHT
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
            HAS_WEIGHT=weight is not None,
            BLOCK=config.block,
            num_warps=config.num_warps,
        )
    return grad, partials.sum(0)


# --------------------------------------------------------------------------- PyTorch path


def _torch(logp, behavior, advantages, mask, denominator, ratio_low, ratio_high, clip_c, weight=None):
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
    if weight is not None:
        term, grad = term * weight, grad * weight
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


def policy_loss_partials(
    logp, behavior, advantages, mask, denominator, ratio_low, ratio_high, clip_c, backend, weight=None
):
    """[B, T] inputs -> (grad w.r.t. logp [B, T] fp32, partial sums [7] fp32). No host sync.

    `behavior` is the ratio's anchor; `weight` ([B, T] fp32, or None) multiplies each token's loss
    term and gradient (a rollout correction's weight).

    The partial sums (loss numerator, model, kept, low, high and dual-clipped
    token counts, ratio sum) add up across chunks of a batch; `loss_and_stats`
    turns their total into the loss and the statistics.
    """
    run = _launch if backend == "triton" else _torch
    return run(logp, behavior, advantages, mask, denominator, ratio_low, ratio_high, clip_c, weight)


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
    def forward(ctx, logp, behavior, advantages, mask, denominator, ratio_low, ratio_high, clip_c, backend, weight):
        grad, partials = policy_loss_partials(
            logp, behavior, advantages, mask, denominator, ratio_low, ratio_high, clip_c, backend, weight
        )
        loss, stats = loss_and_stats(partials, denominator)
        ctx.save_for_backward(grad)
        ctx.logp_dtype = logp.dtype
        ctx.mark_non_differentiable(*stats.values())
        return (loss, *stats.values())

    @staticmethod
    def backward(ctx, grad_loss, *unused):
        (grad,) = ctx.saved_tensors
        return (grad * grad_loss).to(ctx.logp_dtype), *(None,) * 9


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
    ratio_low: float = LOSS_DEFAULTS.ratio_low,
    ratio_high: float = LOSS_DEFAULTS.ratio_high,
    clip_c: float = LOSS_DEFAULTS.clip_c,
    num_model_tokens=None,
    backend: str = "auto",
    validate: bool = True,
    *,
    proximal_logprobs: torch.Tensor | None = None,
    rollout_correction=None,
    rollout_is_weights: torch.Tensor | None = None,
    mismatch_metrics: bool = True,
    **settings,
):
    """Arise's token-level policy loss with importance-ratio filtering and dual clipping, with an
    optional rollout correction.

    Args:
        logprobs: [B, T] current-policy log-probs (differentiable).
        behavior_logprobs: [B, T] log-probs recorded at rollout time (the engine's).
        advantages: [B] per trajectory (broadcast over T) or [B, T] per token.
        model_mask: [B, T] bool (or 0/1 of any dtype): tokens the policy generated; tool
            output and prompt tokens stay in context but get no loss.
        ratio_low, ratio_high: tokens whose ratio is outside (ratio_low, ratio_high)
            are dropped, not clipped.
        clip_c: dual-clip cap; a negative-advantage token contributes at most clip_c * |A|.
            Their defaults and ranges, and any further loss setting (a keyword in `settings`), are
            declared in `rwcore.kernels.loss_settings.LossSettings`; an undeclared keyword is a TypeError.
        num_model_tokens: the denominator D; default sum(model_mask). Pass the
            global pre-filter count (a number or a one-element tensor) under data
            parallelism. NaN, infinite, negative or beyond-float32 values are a
            ValueError; with validate, so is D = 0 while model_mask has model tokens.
        validate: also run the value checks (finiteness, mask values, a tensor D's
            value), which read back to the host; shapes and numbers are always checked.
        proximal_logprobs: [B, T] the training model's log-probs before this update (no grad). When
            given, the ratio is logprobs / proximal and the correction's weights use proximal / behavior
            (the decoupled form).
        rollout_correction: None (Arise's loss, unchanged), a `RolloutCorrection`, a preset name
            (`rollout_correction.PRESETS`, verl's names) or a mapping of verl's `rollout_correction` fields.
            Rows are the sequences of sequence-level criteria.
        rollout_is_weights: [B, T] precomputed non-negative weights (verl's / TRL's) multiplying each
            token's term, on top of the correction's.
        mismatch_metrics: add the `rollout_corr/*` metrics of (proximal or current) vs behavior log-probs.

    Returns:
        (loss, stats): loss is a 0-dim fp32 tensor; stats maps kept_fraction,
        filtered_low_fraction, filtered_high_fraction, dual_clipped_fraction
        (fractions of this call's model tokens), mean_ratio (over them) and the
        `rollout_corr/*` mismatch metrics to detached 0-dim tensors.
    """
    loss_settings = resolve_loss_settings(ratio_low=ratio_low, ratio_high=ratio_high, clip_c=clip_c, **settings)
    _checks.check_float(logprobs, "logprobs")
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
    extras = {
        name: tensor
        for name, tensor in (("proximal_logprobs", proximal_logprobs), ("rollout_is_weights", rollout_is_weights))
        if tensor is not None
    }
    for name, tensor in extras.items():
        _checks.check_float(tensor, name)
        _checks.check_shape(tensor, logprobs.shape, name, "logprobs")
    check_policy_inputs(
        behavior_logprobs,
        advantages,
        model_mask,
        logprobs.shape,
        "logprobs",
        advantage_shapes=(tuple(logprobs.shape[:1]), tuple(logprobs.shape)),
        validate=validate,
        logprobs=logprobs,
        **extras,
    )
    if validate and rollout_is_weights is not None and bool((rollout_is_weights < 0).any()):
        raise ValueError("rollout_is_weights must be non-negative")
    correction = correction_ops.resolve(rollout_correction)
    correction_ops.check_forms(correction, proximal_logprobs, has_sequences=True)
    low, high = correction_ops.ratio_bounds(correction, loss_settings.ratio_low, loss_settings.ratio_high)
    resolved = resolve_backend(backend, logprobs)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1).expand(logprobs.shape)  # stride-0 view, no copy
    denominator = denominator_tensor(num_model_tokens, model_mask, validate)
    model = model_mask != 0
    anchor, weight, metrics = correction_inputs(
        logprobs, behavior_logprobs, model, proximal_logprobs, correction, rollout_is_weights, mismatch_metrics
    )
    loss, *stats = PolicyLossFunction.apply(
        logprobs.contiguous(),
        anchor.contiguous(),
        advantages,
        model.to(torch.int8).contiguous(),
        denominator,
        low,
        high,
        loss_settings.clip_c,
        resolved,
        weight,
    )
    return loss, {**dict(zip(STAT_NAMES, stats)), **metrics}


def correction_inputs(logprobs, behavior, model, proximal, correction, rollout_is_weights, mismatch_metrics: bool):
    """[B, T] inputs -> (the ratio's anchor [B, T], the loss weight [B, T] fp32 or None, metrics dict).

    The anchor is the proximal log-probs when given, the current ones (detached) in the REINFORCE bypass
    form, else the behaviour log-probs. Rows are sequences."""
    rows, cols = logprobs.shape
    if proximal is not None:
        anchor, train = proximal, proximal
    else:
        anchor, train = behavior, logprobs.detach()
    if correction is not None and correction.bypass and correction.loss_type == "reinforce":
        anchor = logprobs.detach()
    flat_model = model.reshape(-1)
    seq = torch.arange(rows, device=logprobs.device).repeat_interleave(cols)
    weight = parts = None
    if correction is not None:
        log_ratio = (train.detach().float() - behavior.float()).reshape(-1)
        weight, parts = correction_ops.correction_weights(log_ratio, flat_model, correction, seq, rows)
    if rollout_is_weights is not None:
        extra = rollout_is_weights.detach().float().reshape(-1)
        weight = extra if weight is None else weight * extra
    metrics = {}
    if mismatch_metrics:
        tracker = correction_ops.MismatchMetrics(correction, rows, logprobs.device)
        tracker.add(train.reshape(-1), behavior.reshape(-1), flat_model, seq, parts)
        metrics = tracker.result()
    return anchor, None if weight is None else weight.reshape(rows, cols).contiguous(), metrics
