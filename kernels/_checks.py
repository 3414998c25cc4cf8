"""Argument checks for the kernels' public functions (run when validate=True).

Shape, dtype and device checks are free; the finiteness and label-range
checks read values back to the host, which is why `validate=False` exists.
"""

from __future__ import annotations

import math

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


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


def check_labels(labels: torch.Tensor, vocab_size: int, name: str, *, ignore_index: int | None = None,
                 mask: torch.Tensor | None = None) -> None:
    """Every label that counts (not masked out, not ignore_index) must be in [0, vocab_size)."""
    counted = torch.ones_like(labels, dtype=torch.bool)
    if ignore_index is not None:
        counted &= labels != ignore_index
    if mask is not None:
        counted &= mask.bool()
    bad = counted & ((labels < 0) | (labels >= vocab_size))
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name}{list(index)} = {int(labels[index])} is outside [0, {vocab_size}) at an unmasked position")


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


def check_loss_bounds(ratio_low, ratio_high, clip_c) -> tuple[float, float, float]:
    low, high, c = _number(ratio_low, "ratio_low"), _number(ratio_high, "ratio_high"), _number(clip_c, "clip_c")
    if not (0.0 <= low < high and math.isfinite(high)):
        raise ValueError(f"ratio_low and ratio_high must satisfy 0 <= ratio_low < ratio_high < inf, got {ratio_low!r}, {ratio_high!r}")
    if not (c > 1.0 and math.isfinite(c)):
        raise ValueError(f"clip_c must be a finite number > 1 (dual clipping caps the loss at clip_c * |A|), got {clip_c!r}")
    return low, high, c


def check_chunk_size(value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"chunk_size must be a positive int or None, got {value!r}")
    return value
