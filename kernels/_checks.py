"""Argument checks for the kernels' public functions.

Shape, dtype, device and Python-number checks are free and always run; the
value checks (finiteness, label range, mask values, the range of the scaled
logits, a tensor `num_model_tokens`) read values back to the host, which is
why `validate=False` exists: it skips only those.
"""

from __future__ import annotations

import math
import numbers

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
FP32_MAX = torch.finfo(torch.float32).max
# |logits| / temperature must stay below this: then the row logsumexp, logp =
# s_y - lse (at least -2 * bound - log V) and the entropy all stay finite in fp32.
SCALED_LOGIT_BOUND = 2.0**126


def check_tensor(value, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_float(value, name: str) -> None:
    check_tensor(value, name)
    if value.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be a floating-point tensor (float32, bfloat16, float16), got {value.dtype}")


def check_integer(value, name: str) -> None:
    check_tensor(value, name)
    if value.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name} must be an int64 or int32 tensor, got {value.dtype}")


def check_mask(value, name: str) -> None:
    """A bool tensor, or numbers that are all 0 or 1 (trainers often carry float response masks)."""
    check_tensor(value, name)
    if value.dtype.is_complex:
        raise ValueError(f"{name} must be a bool or 0/1 tensor, got {value.dtype}")
    if value.dtype != torch.bool and not bool(((value == 0) | (value == 1)).all()):
        raise ValueError(f"{name} must hold only 0 and 1 (or be a bool tensor)")


def check_shape(value: torch.Tensor, shape: tuple, name: str, expected_from: str) -> None:
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(value.shape)}, expected {tuple(shape)} (from {expected_from})")


def check_same_device(**tensors: torch.Tensor | None) -> None:
    present = {name: t for name, t in tensors.items() if t is not None}
    devices = {t.device for t in present.values()}
    if len(devices) > 1:
        listed = ", ".join(f"{name} on {t.device}" for name, t in present.items())
        raise ValueError(f"tensors must be on one device: {listed}")


def check_finite(value: torch.Tensor, name: str) -> None:
    if value.dtype.is_floating_point and not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} holds NaN or infinite values")


def check_labels(
    labels: torch.Tensor,
    vocab_size: int,
    name: str,
    *,
    ignore_index: int | None = None,
    mask: torch.Tensor | None = None,
) -> None:
    """Every label that counts (not masked out, not ignore_index) must be in [0, vocab_size)."""
    counted = torch.ones_like(labels, dtype=torch.bool)
    if ignore_index is not None:
        counted &= labels != ignore_index
    if mask is not None:
        counted &= mask.bool()
    bad = counted & ((labels < 0) | (labels >= vocab_size))
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"{name}{list(index)} = {int(labels[index])} is outside [0, {vocab_size}) at an unmasked position"
        )


def _number(value, name: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None


def check_positive(value, name: str) -> float:
    number = _number(value, name)
    if not (number > 0 and math.isfinite(number)):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return number


def check_temperature(value) -> float:
    """1 / temperature, once temperature is a positive finite number whose inverse float32 can hold."""
    temperature = check_positive(value, "temperature")
    inverse = 1.0 / temperature
    if not inverse <= FP32_MAX:
        raise ValueError(
            f"temperature={value!r} is too small: 1 / temperature = {inverse!r} is beyond the float32 "
            f"range the kernels compute in"
        )
    return inverse


def check_vocabulary(size: int, name: str) -> None:
    if size == 0:
        raise ValueError(f"{name} has an empty vocabulary dimension (V = 0): a softmax over no tokens is undefined")


def check_scaled_logits(logits: torch.Tensor, inv_temperature: float, name: str = "logits") -> None:
    """Finite logits whose magnitude divided by the temperature stays below SCALED_LOGIT_BOUND.

    One reduction (aminmax, which propagates NaN) and one host read serve both checks.
    """
    if logits.numel() == 0:
        return
    low, high = torch.aminmax(logits.detach())
    low, high = float(low), float(high)
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"{name} holds NaN or infinite values")
    peak = max(abs(low), abs(high))
    if peak * inv_temperature > SCALED_LOGIT_BOUND:
        raise ValueError(
            f"temperature={1.0 / inv_temperature!r} scales the {name} beyond the float32 range: max |{name}| / "
            f"temperature = {peak * inv_temperature:.3g} > 2**126 (the log-probabilities would be infinite or NaN)"
        )


def scaled_range_error(inv_temperature: float) -> ValueError:
    """The error of a fused op whose logits hidden @ weight.T + bias, over the temperature, left float32."""
    return ValueError(
        f"the logits hidden @ weight.T (+ bias) divided by temperature={1.0 / inv_temperature!r} leave the float32 "
        f"range (the log-probabilities would be infinite or NaN): raise the temperature or scale down hidden / weight"
    )


def check_num_model_tokens_number(value) -> float:
    """A Python `num_model_tokens`: a real number, finite, >= 0 and representable in float32."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"num_model_tokens must be a non-negative number or a one-element tensor, got {value!r}")
    number = float(value)
    _check_denominator_value(number, value)
    return number


def _check_denominator_value(number: float, shown) -> None:
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"num_model_tokens must be a finite non-negative number, got {shown!r}")
    as_fp32 = float(torch.tensor(number, dtype=torch.float32))
    if not math.isfinite(as_fp32) or (number > 0 and as_fp32 == 0):
        raise ValueError(f"num_model_tokens={shown!r} is outside the float32 range the loss is computed in")


def check_num_model_tokens_tensor(value: torch.Tensor) -> None:
    """Shape and dtype of a tensor `num_model_tokens` (free)."""
    if value.numel() != 1:
        raise ValueError(
            f"num_model_tokens must be a number or a one-element tensor, got a tensor of shape {tuple(value.shape)}"
        )
    if value.dtype == torch.bool or value.dtype.is_complex:
        raise ValueError(f"num_model_tokens must be a real-valued tensor, got dtype {value.dtype}")


def check_num_model_tokens_value(denominator: torch.Tensor, shown, model_mask: torch.Tensor) -> None:
    """The value of D (reads it back): finite, >= 0, and 0 only when the call has no model tokens."""
    number = float(denominator)
    _check_denominator_value(number, shown if not isinstance(shown, torch.Tensor) else number)
    if number == 0 and bool((model_mask != 0).any()):
        raise ValueError(
            "num_model_tokens is 0 but model_mask marks model-generated tokens: the loss would be "
            "silently 0; pass a positive denominator (e.g. the global count of model tokens)"
        )


def check_chunk_size(value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"chunk_size must be a positive int or None, got {value!r}")
    return value
