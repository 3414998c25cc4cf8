"""`pytest bench/ --benchmark-only`: make the repository root, bench/ (the benchmark scripts and their
peers) and tests/ (the pure-Python reference sampler) importable whatever pytest's import mode."""

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
for _path in (_ROOT / "tests", _ROOT / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
# the root last: in front, its kernels/ and trainer/ folders would hide installed packages of those names
if str(_ROOT) not in sys.path:
    sys.path.append(str(_ROOT))
