"""The C++ core under AddressSanitizer + UndefinedBehaviorSanitizer.

csrc/ is built with the project's CMakeLists.txt and
`-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined`
into a cache folder keyed by a hash of csrc/, CMakeLists.txt, the flags and the
toolchain (so a warm CI run only tests), then the tests that drive rwcore._evidence run
in a subprocess pytest whose every Python process loads that build in place of the
regular one (a meta-path finder installed by a sitecustomize on PYTHONPATH), with the
ASan runtime preloaded. Any sanitizer report aborts the process; the test requires exit
status 0 and no report in the output, and checks that the build is really instrumented
and really the one loaded.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from _util import ROOT

SANITIZE = "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
CXX_FLAGS = f"-O1 -g {SANITIZE}"
# The tests that exercise rwcore._evidence, the fuzz of its snapshot loaders included.
CPP_FACING_TESTS = [
    "tests/rwcore/evidence/test_evidence_store.py",
    "tests/rwcore/sampling/test_capability_sampler.py",
    "tests/rwcore/arise/test_pool_evidence.py",
    "tests/rwcore/evidence/test_store_invariants.py",
    "tests/rwcore/evidence/test_fuzz_snapshots.py",
]
FUZZ_SECONDS = "15"  # the fuzz's time box inside the sanitized run (it is slower there)
REPORT_MARKERS = (
    "ERROR: AddressSanitizer",
    "runtime error:",
    "ERROR: LeakSanitizer",
    "SUMMARY: AddressSanitizer",
    "SUMMARY: UndefinedBehaviorSanitizer",
)

SITECUSTOMIZE = '''\
"""Loads the sanitized build of rwcore._evidence in place of the regular one
(tests/rwcore/evidence/test_sanitizers.py)."""
import importlib.machinery
import importlib.util
import os
import sys

_PATH = os.environ["RWCORE_SANITIZED_EVIDENCE"]


class _SanitizedEvidence:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "rwcore._evidence":
            return None
        loader = importlib.machinery.ExtensionFileLoader(name, _PATH)
        return importlib.util.spec_from_file_location(name, _PATH, loader=loader)


sys.meta_path.insert(0, _SanitizedEvidence)
'''


def _cache_root() -> Path:
    base = os.environ.get("RWCORE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rwcore"
    )
    return Path(base)


def _toolchain() -> str:
    import pybind11

    compiler = subprocess.run(["g++", "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    return f"{compiler}|{sys.version}|pybind11 {pybind11.__version__}|{CXX_FLAGS}"


def _source_hash() -> str:
    digest = hashlib.sha256(_toolchain().encode())
    for path in sorted((ROOT / "csrc").iterdir()) + [ROOT / "CMakeLists.txt"]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build_sanitized() -> tuple[Path, float]:
    """(path of the sanitized extension, seconds spent building: 0 when it was cached)."""
    import pybind11

    cache = _cache_root() / f"asan-{_source_hash()}"
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    module = cache / "lib" / f"_evidence{suffix}"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; a waiting run then finds it built
        if module.exists():
            return module, 0.0
        start = time.monotonic()
        build = cache / "build"
        shutil.rmtree(build, ignore_errors=True)
        staging = cache / "lib.partial"
        shutil.rmtree(staging, ignore_errors=True)
        configure = [
            "cmake",
            "-S",
            str(ROOT),
            "-B",
            str(build),
            "-G",
            "Ninja",
            "-DCMAKE_BUILD_TYPE=Debug",
            f"-DCMAKE_CXX_FLAGS={CXX_FLAGS}",
            f"-DCMAKE_SHARED_LINKER_FLAGS={SANITIZE}",
            f"-DCMAKE_MODULE_LINKER_FLAGS={SANITIZE}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={staging}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
        ]
        for command in (configure, ["cmake", "--build", str(build), "--parallel", str(os.cpu_count() or 1)]):
            done = subprocess.run(command, capture_output=True, text=True)
            assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        built = staging / module.name
        assert built.exists(), f"the build produced no {built.name} in {staging}"
        staging.rename(cache / "lib")  # appears whole or not at all
        shutil.rmtree(build, ignore_errors=True)
        return module, time.monotonic() - start


def _runtime(name: str) -> str:
    path = subprocess.run(
        ["g++", f"-print-file-name={name}"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert os.path.isabs(path) and os.path.exists(path), f"g++ knows no {name} ({path!r})"
    return path


def sanitized_env(module: Path, overlay: Path, reports: Path) -> dict:
    """Reports go to files under `reports` as well: pytest's output capture of an aborted
    process, or of a worker subprocess, would otherwise swallow them."""
    overlay.mkdir(parents=True, exist_ok=True)
    reports.mkdir(parents=True, exist_ok=True)
    (overlay / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(overlay)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]),
        RWCORE_SANITIZED_EVIDENCE=str(module),
        LD_PRELOAD=" ".join([_runtime("libasan.so"), _runtime("libubsan.so")]),
        # Python itself is not instrumented and keeps memory until exit: leaks are not checked.
        ASAN_OPTIONS=f"detect_leaks=0:abort_on_error=1:halt_on_error=1:log_path={reports / 'asan'}",
        UBSAN_OPTIONS=f"halt_on_error=1:print_stacktrace=1:log_path={reports / 'ubsan'}",
        OMP_NUM_THREADS="1",
        RWCORE_FUZZ_SECONDS=FUZZ_SECONDS,
        RWCORE_FUZZ_MIN_CASES="1000",
    )
    return env


def test_cpp_facing_tests_pass_under_asan_and_ubsan(tmp_path):
    start = time.monotonic()
    module, build_seconds = build_sanitized()

    # The build is instrumented: it calls into both sanitizer runtimes.
    undefined = subprocess.run(
        ["nm", "-D", "--undefined-only", str(module)], capture_output=True, text=True, check=True
    ).stdout
    assert "__asan_report_load8" in undefined and "__asan_init" in undefined, "the build is not ASan-instrumented"
    assert "__ubsan_handle_" in undefined, "the build is not UBSan-instrumented"

    report_dir = tmp_path / "reports"
    env = sanitized_env(module, tmp_path / "overlay", report_dir)
    # ... and it is the build every Python process of the run loads, with the ASan runtime in place.
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import ctypes, rwcore._evidence as e; ctypes.CDLL(None).__asan_get_report_address; print(e.__file__)",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert probe.stdout.strip() == str(module), probe.stdout

    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *CPP_FACING_TESTS],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
    )
    output = run.stdout + run.stderr
    written = "".join(path.read_text(errors="replace") for path in sorted(report_dir.iterdir()))
    assert not written, "sanitizer report:\n" + written[-8000:]
    reports = [line for line in output.splitlines() if any(marker in line for marker in REPORT_MARKERS)]
    assert not reports, "sanitizer report:\n" + output[-6000:]
    assert run.returncode == 0, f"sanitized run failed (exit {run.returncode}):\n{output[-6000:]}"
    print(
        f"sanitized build {f'built in {build_seconds:.0f} s' if build_seconds else 'cached'}; "
        f"whole check {time.monotonic() - start:.0f} s; {run.stdout.strip().splitlines()[-1]}"
    )
