"""Policy entropies straight from hidden states and the LM head, one chunk of logits at a time.

H[u] = -sum_v p[u, v] log p[u, v] with p[u] = softmax((h_u W^T + b) / T). Each
chunk's logits are computed, reduced to its entropies (the token_logprobs
kernel's entropy output) and freed; the backward pass recomputes them chunk by
chunk (activation checkpointing), so at most one [chunk, V] block of logits is
alive in either pass. Used for the trainer's entropy bonus.

Order (no Triton kernel of its own: it launches token_logprobs's through its
differentiable functional): per-chunk function, public function.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from rwcore.kernels import _checks
from rwcore.kernels._fused_linear import check_linear_inputs, chunk_rows
from rwcore.kernels.token_logprobs import token_logprobs


def _chunk_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float, backend: str
) -> torch.Tensor:
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    placeholder = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    _, entropy = token_logprobs(
        logits, placeholder, temperature=temperature, return_entropy=True, backend=backend, validate=False
    )
    return entropy


def fused_linear_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    backend: str = "auto",
    validate: bool = True,
) -> torch.Tensor:
    """fp32 entropies [N] of softmax((hidden @ weight.T + bias) / temperature), differentiable.

    Args:
        hidden: [N, H] final hidden states (float32 / bfloat16 / float16).
        weight: [V, H] LM head, same dtype; bias: [V] or None.
        chunk_size: rows per chunk of logits (default: about N * H logits per chunk).
        backend, validate: as in `token_logprobs`; with validate, logits whose scale over the
            temperature leaves float32 (infinite or NaN entropies) are a ValueError naming
            temperature, hidden and weight.
    """
    _checks.check_tensor(hidden, "hidden")
    labels = torch.zeros(hidden.shape[0] if hidden.dim() else 0, dtype=torch.long, device=hidden.device)
    check_linear_inputs(hidden, weight, bias, labels, validate)  # the shared checks; entropies need no labels
    inv_temperature = _checks.check_temperature(temperature)
    rows = chunk_rows(hidden.shape[0], weight.shape[0], hidden.shape[1], _checks.check_chunk_size(chunk_size))
    if hidden.shape[0] == 0:
        return torch.zeros(0, dtype=torch.float32, device=hidden.device)
    parts = []
    for start in range(0, hidden.shape[0], rows):
        chunk = hidden[start : start + rows]
        if torch.is_grad_enabled() and (chunk.requires_grad or weight.requires_grad):
            parts.append(
                checkpoint(_chunk_entropy, chunk, weight, bias, float(temperature), backend, use_reentrant=False)
            )
        else:
            parts.append(_chunk_entropy(chunk, weight, bias, float(temperature), backend))
    entropy = torch.cat(parts)
    if validate and not bool(torch.isfinite(entropy).all()):
        raise _checks.scaled_range_error(inv_temperature)
    return entropy
