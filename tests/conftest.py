"""Shared pytest configuration for the rwcore test-suite."""

import os
import sys
from collections import OrderedDict

# `python -m pytest` from the checkout puts its root first on sys.path, where kernels/ and trainer/ would
# hide installed packages of those names (Hugging Face's `kernels`, which transformers imports): importing
# rwcore (cheap, nothing heavy) moves the root last before any test imports transformers.
import rwcore  # noqa: F401

# Helper modules (reference_sampler, stats_util) live beside the tests; make
# them importable whatever pytest import mode is configured.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

# Under pytest-xdist (`-n auto`, how .ci/run runs the suite) every worker gets an equal share of the cores:
# two processes that each use torch's default thread count slow each other by an order of magnitude on a
# small machine. The share is set before torch is imported, so it holds for this process and the
# subprocesses the tests start (rw train, rw ablate, engine workers), unless a test sets its own.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
if _WORKERS > 1:
    _SHARE = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_name, _SHARE)

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

_SERVER_SCOPE = "vllm-server"
_uses_server: dict[str, bool] = {}


def _scope(nodeid: str) -> str:
    """A test's scheduling unit under `-n auto --dist loadfile`: its file, except that every file with a test
    asking for the real vLLM server (`vllm_server`) is one unit, so a single worker starts the session's one
    server. The files are read rather than the tests' fixtures: the controller process collects nothing."""
    path = nodeid.split("::", 1)[0]
    if path not in _uses_server:
        try:
            with open(os.path.join(os.path.dirname(_HERE), path), encoding="utf-8") as source:
                _uses_server[path] = "vllm_server" in source.read() and not path.endswith("conftest.py")
        except OSError:
            _uses_server[path] = False
    return _SERVER_SCOPE if _uses_server[path] else path


# The longest units of the suite (a few minutes each on 2 cores, measured with --durations): they are handed out
# first, since one started last sets the length of the whole run. A file missing here only loses its head start.
_LONG_UNITS = (
    _SERVER_SCOPE,
    "tests/trainer/test_engines.py",
    "tests/rwcore/evidence/test_sanitizers.py",
    "tests/trainer/test_async_rollout.py",
    "tests/trainer/ablate/test_ablate.py",
    "tests/trainer/test_vllm_real.py",
    "tests/rwcore/integrations/test_integration_versions.py",
    "tests/bench/test_gpu_check_dry_run.py",
)


class _LongUnitsFirst(OrderedDict):
    """xdist's work queue (scope -> tests), with the _LONG_UNITS in front of the others."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if key in _LONG_UNITS:
            self.move_to_end(key, last=False)


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` with the vLLM-server files as one unit (see _scope) and the long units first.
    pytest-xdist's own `--dist loadgroup` cannot carry groups on pytest 9, whose node ids are read-only."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class _FileScheduling(LoadScopeScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.workqueue = _LongUnitsFirst()

        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return _FileScheduling(config, log)
