"""Launch configurations (tile sizes and warp counts) of the Triton kernels, per GPU architecture.

One small heuristic, the same one the ahead-of-time compile check (`rwcore.kernels._aot`)
enumerates, so every configuration a launcher can pick on sm_80 or sm_90 is compiled (and its
registers and spills reported) in CI, on a machine without a GPU:

- Row kernels (token_logprobs forward and backward: one program streams one row of V logits).
  Each thread holds ELEMENTS_PER_THREAD = 16 elements of a tile (four 16-byte loads of fp32,
  two of bf16), so warps = tile / (32 * 16), at most MAX_ROW_WARPS = 8 (a larger tile gives
  each thread more elements). The cap is the compile check's finding: at 16 warps ptxas spills
  the fp16 forward kernel on sm_90 (40 registers, 8 bytes of spill stores), at 8 warps and the
  same 8192 tile it uses 57 registers and spills nothing, with the same occupancy. The tile is the next power of two >=
  V, between
  1024 and the architecture's largest tile: a small vocabulary does not leave most lanes idle,
  and a large one takes few loop iterations. Every tile ends in two or three block-wide
  reductions (max, sum, and the entropy's dot), each a shared-memory round trip with a
  barrier; Hopper (sm_90) streams a tile about 1.6x faster per SM than Ampere (3.35 vs 2.04
  TB/s over 132 vs 108 SMs), so its largest tile is twice Ampere's (8192 vs 4096 elements,
  both 8 warps) to keep the barriers' share of a row about the same. At most four tiles exist, so at
  most four compiles per kernel variant, whatever the shapes.
- The policy-loss kernel (elementwise over tokens, then a block sum) keeps 1024 tokens and 4
  warps on every architecture: 8 tokens per thread are two 16-byte loads of each fp32 stream,
  and nothing in it is architecture specific.

The Triton interpreter (CPU tensors, TRITON_INTERPRET=1) keeps the fixed configuration it
always had (INTERPRETER_ROW, INTERPRETER_LOSS), so CPU results do not depend on this module.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ELEMENTS_PER_THREAD = 16
MAX_ROW_WARPS = 8
MIN_ROW_TILE = 1024
# Largest row tile per compute-capability major version; an unknown newer GPU gets the newest entry.
MAX_ROW_TILE = {8: 4096, 9: 8192}
KNOWN_ARCHS = (80, 90)  # what the compile check targets: A100 (sm_80), H100 / H800 / H200 (sm_90)


@dataclass(frozen=True)
class LaunchConfig:
    block: int
    num_warps: int

    def label(self) -> str:
        return f"BLOCK={self.block}, num_warps={self.num_warps}"


INTERPRETER_ROW = LaunchConfig(block=4096, num_warps=8)
INTERPRETER_LOSS = LaunchConfig(block=1024, num_warps=4)
LOSS_CONFIG = LaunchConfig(block=1024, num_warps=4)


def _max_row_tile(arch: int) -> int:
    major = arch // 10
    known = [m for m in MAX_ROW_TILE if m <= major]
    return MAX_ROW_TILE[max(known)] if known else MAX_ROW_TILE[min(MAX_ROW_TILE)]


def row_config(arch: int, vocab_size: int) -> LaunchConfig:
    """Tile and warps of the token_logprobs kernels for compute capability `arch` (80, 90, ...) and V."""
    tile = MIN_ROW_TILE
    limit = _max_row_tile(arch)
    while tile < vocab_size and tile < limit:
        tile *= 2
    return LaunchConfig(block=tile, num_warps=min(MAX_ROW_WARPS, tile // (32 * ELEMENTS_PER_THREAD)))


def row_configs(arch: int) -> tuple[LaunchConfig, ...]:
    """Every configuration row_config can return on `arch`, smallest tile first."""
    configs, tile = [], MIN_ROW_TILE
    while tile <= _max_row_tile(arch):
        configs.append(row_config(arch, tile))
        tile *= 2
    return tuple(configs)


def loss_configs(arch: int) -> tuple[LaunchConfig, ...]:
    return (LOSS_CONFIG,)


def device_arch(device: torch.device) -> int | None:
    """Compute capability as 10 * major + minor for a CUDA device, None elsewhere (the interpreter)."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def row_launch(device: torch.device, vocab_size: int) -> LaunchConfig:
    arch = device_arch(device)
    return INTERPRETER_ROW if arch is None else row_config(arch, vocab_size)


def loss_launch(device: torch.device) -> LaunchConfig:
    return INTERPRETER_LOSS if device_arch(device) is None else LOSS_CONFIG
