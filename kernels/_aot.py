"""Ahead-of-time compile check of every Triton kernel for sm_80 and sm_90, on a machine without a GPU.

The kernels' tests run them in Triton's interpreter, which accepts programs the real compiler
rejects and says nothing about registers or spills. This module compiles each `@triton.jit`
kernel of rwcore.kernels with the real compiler (`triton.compile(ASTSource(...),
target=GPUTarget("cuda", arch, 32))`: Triton -> TTGIR -> LLVM -> PTX -> ptxas -> cubin) at the
signatures (dtypes) and launch configurations (`_launch`) its launchers can pass, and reads
registers, spills and stack from `ptxas -v` (the ptxas Triton bundles; the system one is too old
for the PTX it emits) and shared memory from Triton's metadata.

    python -m rwcore.kernels._aot                 # the full grid for sm_80 and sm_90 (what .ci/run runs)
    python -m rwcore.kernels._aot --subset        # every kernel and dtype at the extreme configurations

Results are cached outside the source tree in ~/.cache/rwcore/triton-aot (RWCORE_AOT_CACHE),
one JSON (and the cubin) per variant, keyed by the kernel's source hash (Triton's cache_key,
which covers the functions it calls), the signature, the constexprs, the warps, the target and
the Triton version: an unchanged kernel is not recompiled, a changed one always is.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rwcore.kernels import _launch

ARCHS = _launch.KNOWN_ARCHS
FLOAT_TYPES = ("fp32", "bf16", "fp16")
DEFAULT_CACHE = Path.home() / ".cache" / "rwcore" / "triton-aot"


class AotCompileError(RuntimeError):
    """A kernel variant the real Triton compiler (or ptxas) rejects; the message names kernel, config and target."""


@dataclass(frozen=True)
class Variant:
    """One compile: a kernel at one signature, constexprs, warp count and target."""

    kernel: str  # "module.function"
    arch: int
    signature: dict = field(hash=False)
    constexprs: dict = field(hash=False)
    num_warps: int
    aligned: bool = True  # pointers 16-byte aligned (tt.divisibility=16), as torch allocations are
    is_default: bool = False  # the configuration the launcher picks at the production shapes

    def label(self) -> str:
        types = ",".join(f"{k}={v}" for k, v in self.signature.items() if v != "constexpr" and k.endswith("_ptr"))
        consts = ",".join(f"{k}={v}" for k, v in self.constexprs.items())
        return (
            f"{self.kernel.rsplit('.', 1)[1]} sm_{self.arch} num_warps={self.num_warps} {consts} [{types}]"
            f"{'' if self.aligned else ' unaligned'}"
        )


@dataclass
class Resources:
    """What one compiled variant uses, per thread and per program (block)."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    shared_bytes: int  # dynamic (Triton's metadata.shared) + static (ptxas "bytes smem")
    ptxas_log: str
    compile_seconds: float
    cached: bool = False


# --------------------------------------------------------------------------- what the launchers can pass


def _ptr(name_types: dict) -> dict:
    return {name: f"*{dtype}" for name, dtype in name_types.items()}


def _row_choices(arch: int, full: bool):
    """(with_entropy, launch config, production default) for the row kernels on `arch`: every tile in the full
    grid; in the subset both entropy variants at the production tile (V = 151,936) and the entropy one at the
    smallest tile."""
    configs = _launch.row_configs(arch)
    default = _launch.row_config(arch, 151_936)
    for with_entropy in (False, True):
        for config in configs:
            if not full and (config not in (configs[0], configs[-1]) or (config != default and not with_entropy)):
                continue
            yield with_entropy, config, default


def _token_fwd_variants(fn_name: str, arch: int, full: bool):
    """token_logprobs forward: logits in any float dtype (fp32 in the fused-linear path), labels int64 / int32."""
    for logits in FLOAT_TYPES:
        for labels in ("i64", "i32") if full else ("i64",):
            for with_entropy, config, default in _row_choices(arch, full):
                signature = {
                    **_ptr(
                        {
                            "logits_ptr": logits,
                            "labels_ptr": labels,
                            "logp_ptr": "fp32",
                            "lse_ptr": "fp32",
                            "entropy_ptr": "fp32",
                        }
                    ),
                    "stride_row": "i32",
                    "vocab_size": "i32",
                    "inv_temperature": "fp32",
                    "ignore_index": "i32",
                    "WITH_ENTROPY": "constexpr",
                    "BLOCK": "constexpr",
                }
                yield Variant(
                    fn_name,
                    arch,
                    signature,
                    {"WITH_ENTROPY": with_entropy, "BLOCK": config.block},
                    config.num_warps,
                    is_default=config == default and labels == "i64",
                )


def _token_bwd_variants(fn_name: str, arch: int, full: bool):
    """token_logprobs backward: gradient in the logits' dtype, or bf16 / fp16 from fp32 logits (fused-linear, CUDA)."""
    pairs = [(t, t) for t in FLOAT_TYPES] + [("fp32", "bf16"), ("fp32", "fp16")]
    for logits, grad in pairs:
        for labels in ("i64", "i32") if full else ("i64",):
            for with_entropy, config, default in _row_choices(arch, full):
                signature = {
                    **_ptr(
                        {
                            "logits_ptr": logits,
                            "labels_ptr": labels,
                            "lse_ptr": "fp32",
                            "entropy_ptr": "fp32",
                            "grad_logp_ptr": "fp32",
                            "grad_entropy_ptr": "fp32",
                            "grad_logits_ptr": grad,
                        }
                    ),
                    "stride_row": "i32",
                    "grad_stride_row": "i32",
                    "vocab_size": "i32",
                    "inv_temperature": "fp32",
                    "ignore_index": "i32",
                    "WITH_ENTROPY": "constexpr",
                    "BLOCK": "constexpr",
                }
                yield Variant(
                    fn_name,
                    arch,
                    signature,
                    {"WITH_ENTROPY": with_entropy, "BLOCK": config.block},
                    config.num_warps,
                    is_default=config == default and labels == "i64",
                )


def _loss_variants(fn_name: str, arch: int, full: bool):
    """Policy loss: log-probs, behavior log-probs and advantages in one float dtype, or fp32 log-probs with
    bf16 / fp16 behavior and advantages (the fused-linear path); int8 mask; fp32 outputs; without and with a
    rollout correction's fp32 per-token weight (HAS_WEIGHT)."""
    combos = [(t, t) for t in FLOAT_TYPES] + ([("fp32", "bf16"), ("fp32", "fp16")] if full else [])
    for config in _launch.loss_configs(arch):
        for logp, other in combos:
            for aligned in (True, False) if full and logp == other == "fp32" else (True,):
                for has_weight in (False, True):
                    signature = {
                        **_ptr(
                            {
                                "logp_ptr": logp,
                                "behavior_ptr": other,
                                "advantages_ptr": other,
                                "mask_ptr": "i8",
                                "weight_ptr": "fp32" if has_weight else "i8",
                                "denominator_ptr": "fp32",
                                "grad_ptr": "fp32",
                                "partials_ptr": "fp32",
                            }
                        ),
                        "num_tokens": "i32",
                        "seq_len": "i32",
                        "adv_stride_row": "i32",
                        "adv_stride_col": "i32",
                        "ratio_low": "fp32",
                        "ratio_high": "fp32",
                        "clip_c": "fp32",
                        "log_ratio_bound": "fp32",
                        "HAS_WEIGHT": "constexpr",
                        "BLOCK": "constexpr",
                    }
                    yield Variant(
                        fn_name,
                        arch,
                        signature,
                        {"HAS_WEIGHT": has_weight, "BLOCK": config.block},
                        config.num_warps,
                        aligned=aligned,
                        is_default=aligned,
                    )


# kernel ("module.function" inside rwcore.kernels) -> generator of its variants
VARIANTS = {
    "token_logprobs._token_logprobs_fwd_kernel": _token_fwd_variants,
    "token_logprobs._token_logprobs_bwd_kernel": _token_bwd_variants,
    "policy_loss._policy_loss_fwd_kernel": _loss_variants,
}


def discover_kernels() -> dict[str, object]:
    """Every `@triton.jit` object defined in a module of rwcore.kernels, by "module.function"."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    import rwcore.kernels as package

    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, (JITFunction, InterpretedFunction)) and value.fn.__module__ == module.__name__:
                found[f"{info.name}.{name}"] = value
    return found


def variants(archs=ARCHS, full: bool = True) -> list[Variant]:
    """The variants to compile. Raises AotCompileError when a kernel has no entry in VARIANTS."""
    kernels = discover_kernels()
    missing = sorted(set(kernels) - set(VARIANTS))
    if missing:
        raise AotCompileError(
            f"no compile configurations for the Triton kernels {missing}: add them to "
            f"rwcore.kernels._aot.VARIANTS with the signatures their launchers pass"
        )
    out = []
    for name, generate in VARIANTS.items():
        if name not in kernels:
            raise AotCompileError(f"rwcore.kernels._aot.VARIANTS names {name}, which is not a Triton kernel any more")
        for arch in archs:
            out.extend(generate(name, arch, full))
    return out


# --------------------------------------------------------------------------- compiling


def _jit_function(kernel):
    """The kernel as a JITFunction: one defined for the interpreter cannot go through the compiler."""
    from triton.runtime.jit import JITFunction

    if not isinstance(kernel, JITFunction):
        raise AotCompileError(
            f"{getattr(kernel, '__name__', kernel)!r} was defined under TRITON_INTERPRET=1; "
            "compile_kernels compiles such kernels in a child process without it"
        )
    return kernel


_PTXAS_PATTERNS = {
    "registers": r"Used (\d+) registers",
    "stack_frame": r"(\d+) bytes stack frame",
    "spill_stores": r"(\d+) bytes spill stores",
    "spill_loads": r"(\d+) bytes spill loads",
    "static_smem": r"(\d+) bytes smem",
}


def parse_ptxas_log(log: str) -> dict[str, int]:
    """Registers, stack, spills and static shared memory of the one entry function in a `ptxas -v` log."""
    if not re.search(_PTXAS_PATTERNS["registers"], log):
        raise AotCompileError(f"ptxas -v printed no register count:\n{log}")
    values = {}
    for key, pattern in _PTXAS_PATTERNS.items():
        match = re.search(pattern, log)
        values[key] = int(match.group(1)) if match else 0
    return values


def _ptxas_verbose(ptx: str, arch: int) -> str:
    """`ptxas -v` on the PTX Triton emitted, with the flags Triton's own ptxas call uses."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    ptxas = get_ptxas(arch).path
    with tempfile.TemporaryDirectory(prefix="rwcore-aot-") as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        command = [
            ptxas,
            "-lineinfo",
            "-v",
            "--regAllocOptLevel=2",
            f"--gpu-name={sm_arch_from_capability(arch)}",
            str(source),
            "-o",
            str(Path(folder) / "kernel.cubin"),
        ]
        done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise AotCompileError(f"ptxas failed ({done.returncode}): {done.stderr}")
    return done.stderr + done.stdout


def cache_dir() -> Path:
    return Path(os.environ.get("RWCORE_AOT_CACHE", DEFAULT_CACHE))


def _cache_key(variant: Variant, jit) -> str:
    import triton

    text = json.dumps(
        {
            "triton": triton.__version__,
            "source": jit.cache_key,
            "kernel": variant.kernel,
            "signature": variant.signature,
            "constexprs": variant.constexprs,
            "num_warps": variant.num_warps,
            "arch": variant.arch,
            "aligned": variant.aligned,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(handle, "wb") as out:
        out.write(data)
    os.replace(temporary, path)


def interpreting() -> bool:
    """Whether this process defines kernels for Triton's interpreter (TRITON_INTERPRET=1, as the CPU test suite
    does)."""
    import triton

    return bool(triton.knobs.runtime.interpret)


def compile_kernel(kernel, variant: Variant, use_cache: bool = True) -> Resources:
    """Compile `kernel` (a @triton.jit object) as `variant` describes; AotCompileError naming both on failure.

    Under TRITON_INTERPRET=1 Triton's own library functions (tl.max, tl.sum, ...) were defined for
    the interpreter and cannot be compiled, so the compile then runs in a child process without it.
    """
    return compile_kernels([(kernel, variant)], use_cache)[0]


def compile_kernels(pairs, use_cache: bool = True, raise_errors: bool = True) -> list:
    """compile_kernel for each (kernel, variant) in order (one child process for all of them when interpreting).

    With raise_errors=False a variant that fails to compile gives its AotCompileError in the list instead.
    """
    if interpreting():
        outcomes = _in_child({"jobs": [_job(kernel, variant) for kernel, variant in pairs], "use_cache": use_cache})
    else:
        outcomes = [
            _attempt(lambda: _compile_here(kernel, variant, use_cache))  # noqa: B023 - called in this iteration
            for kernel, variant in pairs
        ]
    if raise_errors:
        for outcome in outcomes:
            if isinstance(outcome, AotCompileError):
                raise outcome
    return outcomes


def _attempt(compile_one):
    try:
        return compile_one()
    except AotCompileError as error:
        return error


def _compile_here(kernel, variant: Variant, use_cache: bool) -> Resources:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    jit = _jit_function(kernel)
    key = _cache_key(variant, jit)
    record = cache_dir() / f"{key}.json"
    if use_cache and record.is_file():
        try:
            cached = Resources(**json.loads(record.read_text()))
            cached.cached = True
            return cached
        except (ValueError, TypeError):
            pass  # a damaged record is recompiled and rewritten
    pointers = [i for i, (name, kind) in enumerate(variant.signature.items()) if kind.startswith("*")]
    attrs = {(i,): [["tt.divisibility", 16]] for i in pointers} if variant.aligned else {}
    start = time.perf_counter()
    try:
        source = ASTSource(fn=jit, signature=variant.signature, constexprs=variant.constexprs, attrs=attrs)
        compiled = triton.compile(
            source, target=GPUTarget("cuda", variant.arch, 32), options={"num_warps": variant.num_warps}
        )
        log = _ptxas_verbose(compiled.asm["ptx"], variant.arch)
    except AotCompileError as error:
        raise AotCompileError(f"{variant.label()}: {error}") from error
    except Exception as error:  # the compiler's own errors (CompilationError, RuntimeError, MLIR failures)
        raise AotCompileError(f"{variant.label()} does not compile: {type(error).__name__}: {error}") from error
    parsed = parse_ptxas_log(log)
    resources = Resources(
        registers=parsed["registers"],
        spill_stores=parsed["spill_stores"],
        spill_loads=parsed["spill_loads"],
        stack_frame=parsed["stack_frame"],
        shared_bytes=int(compiled.metadata.shared) + parsed["static_smem"],
        ptxas_log=log.strip(),
        compile_seconds=time.perf_counter() - start,
    )
    if use_cache:
        _write_atomic(record.with_suffix(".cubin"), compiled.asm["cubin"])
        _write_atomic(record, json.dumps({k: v for k, v in asdict(resources).items() if k != "cached"}).encode())
    return resources


def compile_all(archs=ARCHS, full: bool = True, use_cache: bool = True, progress=None):
    """[(variant, resources)] for every variant; the first failure raises AotCompileError."""
    kernels = discover_kernels()
    todo = variants(archs, full)
    if interpreting():
        return list(zip(todo, compile_kernels([(kernels[v.kernel], v) for v in todo], use_cache)))
    results = []
    for variant in todo:
        resources = _compile_here(kernels[variant.kernel], variant, use_cache)
        if progress:
            progress(variant, resources)
        results.append((variant, resources))
    return results


def _job(kernel, variant: Variant) -> dict:
    import inspect

    function = kernel.fn
    return {
        "module": function.__module__,
        "file": inspect.getsourcefile(function),
        "function": function.__name__,
        "variant": asdict(variant),
    }


def _load_kernel(job: dict):
    """The kernel a job names: from its module when importable by name (rwcore.kernels), else from its file."""
    import importlib.util

    name = job["module"]
    if name.startswith("rwcore."):
        module = importlib.import_module(name)
    else:
        spec = importlib.util.spec_from_file_location(f"_rwcore_aot_{abs(hash(job['file']))}", job["file"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return getattr(module, job["function"])


def _in_child(request: dict) -> list[Resources]:
    """Run the jobs in `python -m rwcore.kernels._aot --worker` without TRITON_INTERPRET; its errors re-raised here."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "rwcore.kernels._aot", "--worker"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
    )
    try:
        reply = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise AotCompileError(f"the compile worker failed ({done.returncode}):\n{done.stderr[-4000:]}") from None
    return [AotCompileError(r["error"]) if "error" in r else Resources(**r) for r in reply["results"]]


def _worker() -> int:
    request = json.loads(sys.stdin.read())
    results = []
    for job in request["jobs"]:
        compile_job = lambda: _compile_here(_load_kernel(job), Variant(**job["variant"]), request["use_cache"])  # noqa: B023,E731 - called in this iteration
        outcome = _attempt(compile_job)
        results.append({"error": str(outcome)} if isinstance(outcome, AotCompileError) else asdict(outcome))
    print(json.dumps({"results": results}))
    return 0


# --------------------------------------------------------------------------- occupancy


@dataclass(frozen=True)
class SMLimits:
    """Per-SM limits of one architecture (CUDA C Programming Guide, compute capabilities 8.0 and 9.0)."""

    registers: int = 65536
    max_warps: int = 64
    max_blocks: int = 32
    register_unit: int = 256  # registers are allocated per warp in units of 256
    max_registers_per_thread: int = 255
    shared_bytes: int = 0  # usable per SM
    shared_reserved_per_block: int = 1024  # the runtime reserves 1 KB per block on sm_80+
    shared_unit: int = 128


SM_LIMITS = {80: SMLimits(shared_bytes=164 * 1024), 90: SMLimits(shared_bytes=228 * 1024)}


def occupancy(arch: int, registers: int, shared_bytes: int, num_warps: int) -> dict:
    """Resident blocks and warps per SM, and which limit binds, for one kernel on `arch`."""
    limits = SM_LIMITS[arch]
    warp_registers = -(-max(registers, 1) * 32 // limits.register_unit) * limits.register_unit
    by_registers = (limits.registers // warp_registers) // num_warps
    block_shared = -(-(shared_bytes + limits.shared_reserved_per_block) // limits.shared_unit) * limits.shared_unit
    by_shared = limits.shared_bytes // block_shared
    by_warps = limits.max_warps // num_warps
    bounds = {"registers": by_registers, "shared memory": by_shared, "warps": by_warps, "blocks": limits.max_blocks}
    blocks = min(bounds.values())
    limiter = min(bounds, key=lambda k: (bounds[k], k != "warps"))
    return {
        "blocks_per_sm": blocks,
        "warps_per_sm": blocks * num_warps,
        "occupancy": blocks * num_warps / limits.max_warps,
        "limited_by": limiter,
    }


# --------------------------------------------------------------------------- command line


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rwcore.kernels._aot", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--subset",
        action="store_true",
        help="every kernel and dtype at the smallest and the default configuration only",
    )
    parser.add_argument("--arch", type=int, nargs="+", choices=ARCHS, default=list(ARCHS))
    parser.add_argument("--no-cache", action="store_true", help="recompile everything")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # jobs as JSON on stdin
    args = parser.parse_args(argv)
    if args.worker:
        return _worker()
    start = time.perf_counter()
    try:
        results = compile_all(args.arch, full=not args.subset, use_cache=not args.no_cache)
    except AotCompileError as error:
        print(f"rwcore.kernels._aot: FAILED: {error}", file=sys.stderr)
        return 1
    spilled = [v.label() for v, r in results if v.is_default and (r.spill_stores or r.spill_loads)]
    fresh = sum(not r.cached for _, r in results)
    print(
        f"rwcore.kernels._aot: {len(results)} kernel variants compiled for "
        f"{', '.join(f'sm_{a}' for a in args.arch)} ({fresh} compiled, {len(results) - fresh} from the cache "
        f"{cache_dir()}) in {time.perf_counter() - start:.1f} s; "
        f"max registers {max(r.registers for _, r in results)}, "
        f"variants with spills {sum(bool(r.spill_stores or r.spill_loads) for _, r in results)}"
    )
    if spilled:
        print(
            "rwcore.kernels._aot: FAILED: spills at a default configuration:\n  " + "\n  ".join(spilled),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
