"""Shared pytest configuration for the rwcore test-suite."""

import os
import sys

# Helper modules (reference_sampler, stats_util) live beside the tests; make
# them importable whatever pytest import mode is configured.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

# The Triton kernels run on CPU tensors in Triton's interpreter. The flag is
# read when a kernel is defined, so it must be set before rwcore.kernels is
# imported; on a machine with a GPU the kernels compile for real instead.
try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# One real vLLM OpenAI-compatible server per session for every test that asks for `vllm_server`
# (tests/vllm_server.py); it starts only when a test uses it.
from vllm_server import vllm_server  # noqa: E402,F401
