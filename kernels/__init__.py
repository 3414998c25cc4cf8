"""Fused Triton kernels and their pure-PyTorch references (rwcore.kernels).

Filled in by the kernels work (token log-probs, the filtered dual-clip loss and
the fused-linear path); nothing here may import from rwcore above it.
"""
