"""Token log-probs straight from hidden states and the LM head, one chunk of logits at a time.

logp[u] = (h_u W^T + b)[y_u] / T - logsumexp((h_u W^T + b) / T). The forward
pass keeps only the per-row logsumexp; the backward pass recomputes each
chunk's logits, turns them into their gradient in place (the token_logprobs
backward kernel) and multiplies out the gradients of hidden, weight and bias.
So at most one [chunk, V] block of logits is alive, in hidden's dtype.

Order (no Triton kernel of its own: it launches token_logprobs's): autograd
Function, public function.
"""

from __future__ import annotations

import torch

from rwcore.kernels import _checks
from rwcore.kernels._backend import resolve_backend
from rwcore.kernels._fused_linear import GradAccumulator, LinearHead, check_linear_inputs, chunk_rows
from rwcore.kernels.token_logprobs import logprobs_backward, logprobs_forward


class FusedLinearLogProbsFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, inv_temperature, ignore_index, rows_per_chunk, backend, check_range):
        num_rows = hidden.shape[0]
        logp = torch.empty(num_rows, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(logp)
        head = LinearHead(hidden, weight, bias)
        for start in range(0, num_rows, rows_per_chunk):
            rows = slice(start, min(num_rows, start + rows_per_chunk))
            logp[rows], lse[rows], _ = logprobs_forward(
                head.logits(rows), labels[rows], inv_temperature, ignore_index, False, backend
            )
        # The logits never exist as a whole, so their range is judged by its effect: a row
        # logsumexp or log-prob that is not finite (also the ignored rows' lse, which backward uses).
        if check_range and not bool(torch.isfinite(lse).all() & torch.isfinite(logp).all()):
            raise _checks.scaled_range_error(inv_temperature)
        ctx.save_for_backward(hidden, weight, bias, labels, lse)
        ctx.config = (inv_temperature, ignore_index, rows_per_chunk, backend)
        return logp

    @staticmethod
    def backward(ctx, grad_logp):
        hidden, weight, bias, labels, lse = ctx.saved_tensors
        inv_temperature, ignore_index, rows_per_chunk, backend = ctx.config
        grad_logp = grad_logp.contiguous()
        grads = GradAccumulator(
            hidden, weight, bias, ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2]
        )
        head = LinearHead(hidden, weight, bias)
        for start in range(0, hidden.shape[0], rows_per_chunk):
            rows = slice(start, min(hidden.shape[0], start + rows_per_chunk))
            logits = head.logits(rows)
            grad_logits = logprobs_backward(
                logits,
                labels[rows],
                lse[rows],
                None,
                grad_logp[rows],
                None,
                inv_temperature,
                ignore_index,
                backend,
                out=head.gradient_buffer(logits),
            )
            grads.add(rows, grad_logits, *head.operands(rows))
        grad_hidden, grad_weight, grad_bias = grads.result()
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None


def fused_linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    ignore_index: int = -100,
    chunk_size: int | None = None,
    backend: str = "auto",
    validate: bool = True,
) -> torch.Tensor:
    """fp32 log-probs [N] of `labels` under softmax((hidden @ weight.T + bias) / temperature).

    Args:
        hidden: [N, H] final hidden states (float32 / bfloat16 / float16).
        weight: [V, H] LM head, same dtype; bias: [V] or None.
        labels: [N] int64; `ignore_index` rows give 0 and no gradient.
        chunk_size: rows per chunk of logits (default: about N * H logits per chunk).
        backend, validate: as in `token_logprobs`; with validate, logits (hidden @ weight.T + bias)
            whose scale over the temperature leaves float32 (infinite or NaN log-probs) are a
            ValueError naming temperature, hidden and weight.

    Gradients flow to hidden, weight and bias; weight and bias gradients are
    accumulated over chunks in fp32.
    """
    check_linear_inputs(hidden, weight, bias, labels, validate)
    if validate:
        _checks.check_labels(labels, weight.shape[0], "labels", ignore_index=ignore_index)
    inv_temperature = _checks.check_temperature(temperature)
    rows = chunk_rows(hidden.shape[0], weight.shape[0], hidden.shape[1], _checks.check_chunk_size(chunk_size))
    resolved = resolve_backend(backend, hidden)
    return FusedLinearLogProbsFunction.apply(
        hidden.contiguous(),
        weight.contiguous(),
        None if bias is None else bias.contiguous(),
        labels.contiguous(),
        inv_temperature,
        int(ignore_index),
        rows,
        resolved,
        bool(validate),
    )
