"""Every Triton kernel compiles with the real compiler for sm_80 and sm_90 (no GPU needed).

The kernel tests run in Triton's interpreter, which accepts programs the compiler rejects
(test_a_kernel_the_interpreter_runs_but_the_compiler_rejects_fails_the_check shows one). Here
each kernel goes through triton.compile for a CUDA target and the bundled ptxas, at every
kernel, every float dtype and both ends of the launch configurations (`_launch`); the full grid
(label dtypes, every tile, the mixed-dtype fused-linear signatures, unaligned pointers) runs in
`python -m rwcore.kernels._aot` and `rw bench --gpu-static`. Results are cached outside the
clone (~/.cache/rwcore/triton-aot), keyed by the kernels' source, so only a changed kernel
recompiles.
"""

import json
import os
import re
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")  # the triton extra is part of `test`; without it there is nothing to compile
import triton.language as tl  # noqa: E402

from rwcore.kernels import _aot, _launch  # noqa: E402

# The kernels of rwcore.kernels, listed by hand from the source (the discovery must find exactly these).
KERNELS = {
    "token_logprobs._token_logprobs_fwd_kernel",
    "token_logprobs._token_logprobs_bwd_kernel",
    "policy_loss._policy_loss_fwd_kernel",
}


def test_every_triton_kernel_of_the_package_has_compile_configurations():
    assert set(_aot.discover_kernels()) == KERNELS
    assert set(_aot.VARIANTS) == KERNELS


@pytest.fixture(scope="module")
def subset():
    return _aot.compile_all(full=False)


def test_the_subset_covers_every_kernel_arch_dtype_and_both_extreme_configurations(subset):
    seen = {(v.kernel, v.arch, v.signature[next(iter(v.signature))], v.constexprs.get("BLOCK")) for v, _ in subset}
    for arch in (80, 90):
        tiles = {c.block for c in _launch.row_configs(arch)}
        for kernel in ("token_logprobs._token_logprobs_fwd_kernel", "token_logprobs._token_logprobs_bwd_kernel"):
            for dtype in ("*fp32", "*bf16", "*fp16"):
                for tile in (min(tiles), max(tiles)):
                    assert (kernel, arch, dtype, tile) in seen
        for dtype in ("*fp32", "*bf16", "*fp16"):
            assert ("policy_loss._policy_loss_fwd_kernel", arch, dtype, 1024) in seen


def test_every_compiled_variant_fits_the_hardware_and_defaults_do_not_spill(subset):
    for variant, resources in subset:
        assert 0 < resources.registers <= 255, variant.label()
        limits = _aot.SM_LIMITS[variant.arch]
        assert resources.shared_bytes + limits.shared_reserved_per_block <= limits.shared_bytes, variant.label()
        assert (
            _aot.occupancy(variant.arch, resources.registers, resources.shared_bytes, variant.num_warps)[
                "blocks_per_sm"
            ]
            >= 1
        ), variant.label()
        if variant.is_default:
            assert resources.spill_stores == resources.spill_loads == 0, (
                f"{variant.label()} spills:\n{resources.ptxas_log}"
            )
        assert f"for 'sm_{variant.arch}" in resources.ptxas_log, variant.label()


def test_compiled_cubins_are_cached_outside_the_clone(subset):
    repository = Path(__file__).resolve().parents[2]  # this file is also loaded outside pytest, without tests/
    assert repository not in _aot.cache_dir().resolve().parents
    records = list(_aot.cache_dir().glob("*.json"))
    assert len(records) >= len(subset)
    cubin = next(iter(_aot.cache_dir().glob("*.cubin"))).read_bytes()
    assert cubin[:4] == b"\x7fELF"  # a real device binary


def test_launch_heuristic_picks_only_configurations_the_check_compiles():
    # Hand-worked: the production vocabulary (151,936) takes the largest tile of each architecture,
    # 8 warps; a 50-token vocabulary takes the smallest tile, 1024 elements = 2 warps x 32 x 16.
    assert _launch.row_config(80, 151_936) == _launch.LaunchConfig(4096, 8)
    assert _launch.row_config(90, 151_936) == _launch.LaunchConfig(8192, 8)
    assert _launch.row_config(90, 50) == _launch.LaunchConfig(1024, 2)
    assert _launch.row_config(80, 3000) == _launch.LaunchConfig(4096, 8)
    assert _launch.row_config(120, 151_936) == _launch.row_config(90, 151_936)  # newer GPUs: the newest entry
    compiled = {(v.kernel, v.arch, v.constexprs["BLOCK"], v.num_warps) for v in _aot.variants(full=True)}
    for arch in _launch.KNOWN_ARCHS:
        for vocab in (1, 50, 1025, 4096, 32_000, 151_936, 10**6):
            config = _launch.row_config(arch, vocab)
            for kernel in ("token_logprobs._token_logprobs_fwd_kernel", "token_logprobs._token_logprobs_bwd_kernel"):
                assert (kernel, arch, config.block, config.num_warps) in compiled
        assert (
            "policy_loss._policy_loss_fwd_kernel",
            arch,
            _launch.LOSS_CONFIG.block,
            _launch.LOSS_CONFIG.num_warps,
        ) in compiled


def test_interpreter_keeps_the_fixed_configuration():
    cpu = torch.device("cpu")
    assert _launch.row_launch(cpu, 151_936) == _launch.LaunchConfig(4096, 8)
    assert _launch.row_launch(cpu, 50) == _launch.LaunchConfig(4096, 8)
    assert _launch.loss_launch(cpu) == _launch.LaunchConfig(1024, 4)


def test_occupancy_hand_worked():
    # 32 registers x 32 threads = 1024 per warp -> 64 warps by registers; 8-warp blocks -> 8 blocks, full.
    assert _aot.occupancy(80, 32, 32, 8) == {
        "blocks_per_sm": 8,
        "warps_per_sm": 64,
        "occupancy": 1.0,
        "limited_by": "warps",
    }
    # 128 registers -> 4096 per warp -> 16 warps -> four 4-warp blocks: a quarter.
    assert _aot.occupancy(90, 128, 0, 4) == {
        "blocks_per_sm": 4,
        "warps_per_sm": 16,
        "occupancy": 0.25,
        "limited_by": "registers",
    }
    # 57 registers round up to 64 per thread (2048 per warp, allocated in units of 256) -> 32 warps.
    assert _aot.occupancy(90, 57, 64, 8)["warps_per_sm"] == 32
    # 100 KB of shared memory (+1 KB reserved): one block on sm_80 (164 KB), two on sm_90 (228 KB).
    assert _aot.occupancy(80, 32, 100 * 1024, 4)["blocks_per_sm"] == 1
    assert _aot.occupancy(90, 32, 100 * 1024, 4)["blocks_per_sm"] == 2


def test_ptxas_log_parsing():
    log = (
        "ptxas info    : Compiling entry function 'k' for 'sm_90a'\nptxas info    : Function properties for k\n"
        "    24 bytes stack frame, 16 bytes spill stores, 20 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]\n"
    )
    assert _aot.parse_ptxas_log(log) == {
        "registers": 255,
        "stack_frame": 24,
        "spill_stores": 16,
        "spill_loads": 20,
        "static_smem": 1024,
    }
    with pytest.raises(_aot.AotCompileError, match="no register count"):
        _aot.parse_ptxas_log("ptxas fatal   : something else")


# Runs in the interpreter (a Python loop may `break`), but Triton's compiler has no `break`.
@triton.jit
def _first_negative_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    found = -1
    for i in range(0, n):
        if tl.load(x_ptr + i) < 0:
            found = i
            break
    tl.store(out_ptr, found)


_BROKEN = _aot.Variant(
    "test._first_negative_kernel",
    90,
    {"x_ptr": "*fp32", "out_ptr": "*i32", "n": "i32", "BLOCK": "constexpr"},
    {"BLOCK": 16},
    1,
)


@triton.jit
def _scale_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) * 2.0, mask=offsets < n)


@triton.jit
def _scale_kernel_changed(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) * 3.0, mask=offsets < n)


_SCALE = _aot.Variant("test._scale_kernel", 80, {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 128}, 1)


@pytest.fixture(scope="module")
def own_kernels(tmp_path_factory):
    """The test's kernels compiled in one call (one child process under the interpreter), into a fresh cache:
    the broken kernel, then the scale kernel twice, then its changed copy."""
    cache = tmp_path_factory.mktemp("aot-cache")
    saved = os.environ.get("RWCORE_AOT_CACHE")
    os.environ["RWCORE_AOT_CACHE"] = str(cache)
    try:
        outcomes = _aot.compile_kernels(
            [
                (_first_negative_kernel, _BROKEN),
                (_scale_kernel, _SCALE),
                (_scale_kernel, _SCALE),
                (_scale_kernel_changed, _SCALE),
            ],
            raise_errors=False,
        )
    finally:
        if saved is None:
            del os.environ["RWCORE_AOT_CACHE"]
        else:
            os.environ["RWCORE_AOT_CACHE"] = saved
    return cache, outcomes


def test_a_kernel_the_interpreter_runs_but_the_compiler_rejects_fails_the_check(own_kernels):
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        out = torch.zeros(1, dtype=torch.int32)
        _first_negative_kernel[(1,)](torch.tensor([1.0, 2.0, -3.0, -4.0]), out, 4, BLOCK=16)
        assert int(out) == 2  # the interpreter accepts it and gets the right answer
    cache, outcomes = own_kernels
    broken = outcomes[0]
    assert isinstance(broken, _aot.AotCompileError)
    assert re.search(
        r"(?s)_first_negative_kernel sm_90 .*does not compile.*unsupported AST node type: Break", str(broken)
    )


def test_compile_kernels_raises_the_first_failure_by_default(monkeypatch):
    failure = _aot.AotCompileError("k sm_90 does not compile: ...")
    monkeypatch.setattr(_aot, "interpreting", lambda: True)
    monkeypatch.setattr(_aot, "_in_child", lambda request: [failure] * len(request["jobs"]))
    with pytest.raises(_aot.AotCompileError) as raised:
        _aot.compile_kernels([(_first_negative_kernel, _BROKEN)])
    assert raised.value is failure


def test_cache_hits_an_unchanged_kernel_and_misses_a_changed_one(own_kernels):
    cache, (_, first, again, changed) = own_kernels
    assert (first.cached, again.cached, changed.cached) == (False, True, False)
    assert again.registers == first.registers
    records = list(cache.glob("*.json"))
    assert len(records) == 2  # the scale kernel and its changed copy; nothing for the broken kernel
    assert all("Used" in json.loads(r.read_text())["ptxas_log"] for r in records)
