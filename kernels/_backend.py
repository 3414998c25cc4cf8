"""Backend choice and the Triton import, shared by every kernel module.

Triton is optional: without it the kernel modules still import (their
`@triton.jit` functions become stubs) and the "torch" backend works; asking
for backend="triton" then fails with a message saying what to install.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is absent
    HAS_TRITON = False

    class _MissingKernel:
        def __init__(self, function):
            self.__name__ = function.__name__

        def __getitem__(self, grid):
            raise ModuleNotFoundError(f"{self.__name__} needs Triton: pip install triton")

    class _TritonStub:
        """Just enough of `triton` for the kernel modules to import."""

        @staticmethod
        def jit(function=None, **options):
            return _MissingKernel(function) if function is not None else _MissingKernel

    class _LanguageStub:
        """`tl.constexpr` and friends in kernel signatures evaluate to None."""

        def __getattr__(self, name):
            return None

    triton = _TritonStub()
    tl = _LanguageStub()

BACKENDS = ("auto", "torch", "triton")


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_backend(backend: str, *tensors: torch.Tensor) -> str:
    """'torch' or 'triton' for tensors on one device; ValueError naming `backend` when impossible.

    "auto" picks Triton for CUDA tensors when Triton is installed, PyTorch otherwise.
    "triton" needs CUDA tensors, or CPU tensors with TRITON_INTERPRET=1 (the
    interpreter, for tests at small shapes).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    on_cuda = tensors[0].is_cuda
    if backend == "auto":
        return "triton" if on_cuda and HAS_TRITON else "torch"
    if backend == "triton":
        if not HAS_TRITON:
            raise ValueError("backend='triton' needs the triton package: pip install triton")
        if not on_cuda and not interpreter_enabled():
            raise ValueError(
                "backend='triton' needs CUDA tensors, or CPU tensors with TRITON_INTERPRET=1 set before "
                "rwcore.kernels is imported (the Triton interpreter); use backend='torch' on a CPU"
            )
    return backend
