"""What the two fused-linear ops share: argument checks, chunking, and one chunk's matmuls."""

from __future__ import annotations

import math

import torch

from rwcore.kernels import _checks


def check_linear_inputs(hidden, weight, bias, labels, validate: bool = True) -> None:
    """Dtypes, shapes (V > 0 included) and devices, always; finiteness (a host read) only with `validate`."""
    _checks.check_float(hidden, "hidden")
    _checks.check_float(weight, "weight")
    _checks.check_integer(labels, "labels")
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be [N, H], got shape {tuple(hidden.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[1]:
        raise ValueError(
            f"weight must be [V, H] with H = hidden.shape[1] = {hidden.shape[1]}, got shape {tuple(weight.shape)}"
        )
    if weight.dtype != hidden.dtype:
        raise ValueError(f"weight has dtype {weight.dtype}, expected hidden's dtype {hidden.dtype}")
    _checks.check_vocabulary(weight.shape[0], "weight")
    _checks.check_shape(labels, hidden.shape[:1], "labels", "hidden rows")
    if bias is not None:
        _checks.check_float(bias, "bias")
        _checks.check_shape(bias, weight.shape[:1], "bias", "weight rows")
        if bias.dtype != hidden.dtype:
            raise ValueError(f"bias has dtype {bias.dtype}, expected hidden's dtype {hidden.dtype}")
    _checks.check_same_device(hidden=hidden, weight=weight, bias=bias, labels=labels)
    if not validate:
        return
    for name, tensor in (("hidden", hidden), ("weight", weight), ("bias", bias)):
        if tensor is not None:
            _checks.check_finite(tensor, name)


MIN_CHUNK_ROWS = 64  # below this, per-chunk overhead and thin matmuls dominate


def chunk_rows(num_rows: int, vocab: int, hidden_size: int, chunk_size: int | None) -> int:
    """Rows per chunk. By default a chunk's logits hold about as many elements as `hidden`
    (N * H), so the extra memory is of the order of the input, with at least 64 rows, as a
    power of two; never more than N."""
    if chunk_size is not None:
        return max(1, min(chunk_size, max(num_rows, 1)))
    rows = max(MIN_CHUNK_ROWS, math.ceil(num_rows * hidden_size / max(vocab, 1)))
    return min(1 << (rows - 1).bit_length(), max(num_rows, 1))


_MM_OUT_DTYPE_WORKS: dict = {}


def _mm_out_dtype_works(device: torch.device) -> bool:
    """Whether torch.mm(..., out_dtype=torch.float32) takes bf16 inputs on this device (CUDA, recent torch)."""
    key = device.type
    if key not in _MM_OUT_DTYPE_WORKS:
        try:
            probe = torch.ones(1, 1, dtype=torch.bfloat16, device=device)
            _MM_OUT_DTYPE_WORKS[key] = torch.mm(probe, probe, out_dtype=torch.float32).dtype == torch.float32
        except (RuntimeError, TypeError, NotImplementedError):
            _MM_OUT_DTYPE_WORKS[key] = False
    return _MM_OUT_DTYPE_WORKS[key]


class LinearHead:
    """One call's view of the LM head: fp32 logits of a chunk, and the operands for its gradients.

    Logits are never rounded to a low precision before the softmax. With
    float32 inputs everything is float32 and a chunk's logits are turned into
    their gradient in place. With bf16/fp16 inputs on CUDA the matmul writes
    fp32 logits directly (torch.mm's out_dtype) and the gradient goes to a
    buffer in the input dtype for the tensor-core matmuls; elsewhere (the CPU,
    or a torch without out_dtype) the head is upcast to fp32 once per call.
    """

    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.hidden, self.bias = hidden, bias
        self.low_precision = hidden.dtype != torch.float32
        self.direct = self.low_precision and hidden.is_cuda and _mm_out_dtype_works(hidden.device)
        self.weight = weight.float() if self.low_precision and not self.direct else weight
        self.bias32 = None if bias is None else bias.float()

    def logits(self, rows: slice) -> torch.Tensor:
        """fp32 [rows, V]."""
        chunk = self.hidden[rows]
        if self.direct:
            logits = torch.mm(chunk, self.weight.t(), out_dtype=torch.float32)
        else:
            logits = chunk.float() @ self.weight.t() if self.low_precision else chunk @ self.weight.t()
        if self.bias32 is not None:
            logits += self.bias32
        return logits

    def gradient_buffer(self, logits: torch.Tensor) -> torch.Tensor:
        """Where the logits' gradient goes: the logits themselves, or an input-dtype buffer."""
        return torch.empty_like(logits, dtype=self.hidden.dtype) if self.direct else logits

    def operands(self, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden chunk, weight) in the gradient buffer's dtype."""
        chunk = self.hidden[rows]
        return (chunk.float() if self.low_precision and not self.direct else chunk), self.weight


class GradAccumulator:
    """The hidden gradient per chunk, and weight and bias gradients summed over chunks in fp32."""

    def __init__(self, hidden, weight, bias, need_weight: bool, need_bias: bool) -> None:
        self.grad_hidden = torch.empty_like(hidden)
        self.grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        self.grad_bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_bias else None
        self._dtype = weight.dtype

    def add(self, rows: slice, grad_logits, hidden_chunk, weight, into=None) -> None:
        """One chunk's share; `into` = (weight, bias) fp32 buffers to sum the head's gradients in instead
        (a sequence whose weight is not known yet: `fused_linear_policy_loss`'s bypass form)."""
        self.grad_hidden[rows] = grad_logits @ weight
        grad_weight, grad_bias = (self.grad_weight, self.grad_bias) if into is None else into
        if grad_weight is not None:
            if grad_logits.dtype == torch.float32 and hidden_chunk.dtype == torch.float32:
                grad_weight.addmm_(grad_logits.t(), hidden_chunk)  # in place: no [V, H] temporary
            else:
                grad_weight += (grad_logits.t() @ hidden_chunk).float()
        if grad_bias is not None:
            grad_bias += grad_logits.float().sum(0)

    def buffers(self):
        """Zeroed fp32 buffers shaped like the head's gradients (None where not needed), for `add(into=...)`."""
        return tuple(None if g is None else torch.zeros_like(g) for g in (self.grad_weight, self.grad_bias))

    def add_scaled(self, rows: list[slice], buffers, scale: torch.Tensor) -> None:
        """Adds `scale` (0-dim) times the buffers to the head's gradients and scales the rows' hidden gradient."""
        for target, buffer in zip((self.grad_weight, self.grad_bias), buffers):
            if target is not None:
                target.addcmul_(buffer, scale)
        for part in rows:
            self.grad_hidden[part] = (self.grad_hidden[part].float() * scale).to(self.grad_hidden.dtype)

    def result(self):
        cast = lambda g: None if g is None else g.to(self._dtype)  # noqa: E731
        return self.grad_hidden, cast(self.grad_weight), cast(self.grad_bias)
