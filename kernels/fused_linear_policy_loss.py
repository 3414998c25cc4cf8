"""Hidden states to Arise's filtered dual-clip loss in one chunked pass, gradients written as it goes.

For each chunk of rows: fp32 logits = h W^T + b; the token_logprobs forward kernel
gives logp and the row logsumexp; the policy-loss kernel gives the loss terms,
the statistics' partial sums and d loss / d logp; the token_logprobs backward
kernel turns the logits into their gradient (in place for float32); two matmuls give the
chunk's share of the hidden, weight and bias gradients. Only one [chunk, V]
block of logits is ever alive, and nothing is recomputed in backward, which
just scales the stored gradients by the incoming one. The loss needs the
denominator D before the first chunk, which it has: D counts model tokens (or
is passed in), never kept ones.

Order (its kernels live with token_logprobs and policy_loss): autograd
Function, public function.
"""

from __future__ import annotations

import torch

from rwcore.kernels import _checks
from rwcore.kernels._backend import resolve_backend
from rwcore.kernels._fused_linear import GradAccumulator, LinearHead, check_linear_inputs, chunk_rows
from rwcore.kernels.policy_loss import (
    STAT_NAMES,
    check_policy_inputs,
    denominator_tensor,
    loss_and_stats,
    policy_loss_partials,
)
from rwcore.kernels.token_logprobs import logprobs_backward, logprobs_forward

_IGNORED = -100  # label given to masked rows, whose stored label may be anything


class FusedLinearPolicyLossFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        bias,
        labels,
        behavior,
        advantages,
        mask,
        denominator,
        inv_temperature,
        ratio_low,
        ratio_high,
        clip_c,
        rows_per_chunk,
        backend,
        check_range,
    ):
        num_rows = hidden.shape[0]
        in_range = torch.ones((), dtype=torch.bool, device=hidden.device)  # read once, after the last chunk
        grads = GradAccumulator(hidden, weight, bias, weight.requires_grad, bias is not None and bias.requires_grad)
        partials = torch.zeros(7, dtype=torch.float32, device=hidden.device)
        head = LinearHead(hidden, weight, bias)
        for start in range(0, num_rows, rows_per_chunk):
            rows = slice(start, min(num_rows, start + rows_per_chunk))
            logits = head.logits(rows)
            logp, lse, _ = logprobs_forward(logits, labels[rows], inv_temperature, _IGNORED, False, backend)
            if check_range:
                in_range &= torch.isfinite(lse).all() & torch.isfinite(logp).all()
            grad_logp, chunk_partials = policy_loss_partials(
                logp.unsqueeze(0),
                behavior[rows].unsqueeze(0),
                advantages[rows].unsqueeze(0),
                mask[rows].unsqueeze(0),
                denominator,
                ratio_low,
                ratio_high,
                clip_c,
                backend,
            )
            partials += chunk_partials
            grad_logits = logprobs_backward(
                logits,
                labels[rows],
                lse,
                None,
                grad_logp.squeeze(0),
                None,
                inv_temperature,
                _IGNORED,
                backend,
                out=head.gradient_buffer(logits),
            )
            grads.add(rows, grad_logits, *head.operands(rows))
        if check_range and not bool(in_range):
            raise _checks.scaled_range_error(inv_temperature)
        loss, stats = loss_and_stats(partials, denominator)
        ctx.save_for_backward(*(g for g in grads.result() if g is not None))
        ctx.has_grad = tuple(g is not None for g in grads.result())
        ctx.mark_non_differentiable(*stats.values())
        return (loss, *stats.values())

    @staticmethod
    def backward(ctx, grad_loss, *unused):
        saved = iter(ctx.saved_tensors)
        grad_hidden, grad_weight, grad_bias = (next(saved) * grad_loss if present else None for present in ctx.has_grad)
        return (grad_hidden, grad_weight, grad_bias) + (None,) * 12


def fused_linear_policy_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    model_mask: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    ratio_low: float = 0.5,
    ratio_high: float = 5.0,
    clip_c: float = 3.0,
    num_model_tokens=None,
    chunk_size: int | None = None,
    backend: str = "auto",
    validate: bool = True,
):
    """`filtered_dual_clip_loss(token_logprobs(hidden @ weight.T + bias, labels), ...)` without the logits.

    Args:
        hidden: [N, H] hidden states of every token position (float32 / bfloat16 / float16).
        weight: [V, H] LM head, same dtype; bias: [V] or None.
        labels: [N] int64 next tokens; rows outside `model_mask` may hold anything (e.g. -100).
        behavior_logprobs, advantages, model_mask: [N] each, aligned with the rows of `hidden`
            (advantages per token; broadcast per-trajectory ones before flattening).
        temperature, ratio_low, ratio_high, clip_c, num_model_tokens: as in
            `token_logprobs` and `filtered_dual_clip_loss`.
        chunk_size: rows per chunk of logits (default: about N * H logits per chunk).
        validate: as in `filtered_dual_clip_loss`; it also turns logits whose scale over the
            temperature leaves float32 into a ValueError naming temperature, hidden and weight.

    Returns:
        (loss, stats) as `filtered_dual_clip_loss`. Gradients flow to hidden, weight
        and bias (computed during the forward pass; weight and bias accumulated in fp32).
    """
    low, high, clip = _checks.check_loss_bounds(ratio_low, ratio_high, clip_c)
    check_linear_inputs(hidden, weight, bias, labels, validate)
    check_policy_inputs(
        behavior_logprobs,
        advantages,
        model_mask,
        hidden.shape[:1],
        "hidden rows",
        advantage_shapes=(tuple(hidden.shape[:1]),),
        validate=validate,
        hidden=hidden,
    )
    if validate:
        _checks.check_labels(labels, weight.shape[0], "labels", mask=model_mask)
    inv_temperature = _checks.check_temperature(temperature)
    denominator = denominator_tensor(num_model_tokens, model_mask, validate)
    rows = chunk_rows(hidden.shape[0], weight.shape[0], hidden.shape[1], _checks.check_chunk_size(chunk_size))
    resolved = resolve_backend(backend, hidden)
    mask = (model_mask != 0).to(torch.int8).contiguous()
    safe_labels = torch.where(mask != 0, labels, _IGNORED).contiguous()
    loss, *stats = FusedLinearPolicyLossFunction.apply(
        hidden.contiguous(),
        weight.contiguous(),
        None if bias is None else bias.contiguous(),
        safe_labels,
        behavior_logprobs.contiguous(),
        advantages.contiguous(),
        mask,
        denominator,
        inv_temperature,
        low,
        high,
        clip,
        rows,
        resolved,
        bool(validate),
    )
    return loss, dict(zip(STAT_NAMES, stats))
