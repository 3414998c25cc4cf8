"""Run from the checkout, its kernels/ and trainer/ folders must not hide installed packages of those names.

`python -m ...` (rw ablate's runs, torchrun, `python -m pytest`) and `python -c` put the working directory
first on sys.path. From the checkout's root that made its `kernels/` the top-level `kernels`, hiding
Hugging Face's `kernels` package, which transformers 5.2x imports at start: every `rw ablate` run failed with
"cannot import name 'CUDAProperties' from 'kernels' (<checkout>/kernels/__init__.py)" on a fresh set-up.
Stand-ins for the installed packages (a folder on PYTHONPATH) show which one an import finds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from _util import ROOT

import rwcore._checkout as checkout


def _installed(tmp_path: Path) -> dict:
    for name in ("kernels", "trainer"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"MARK = 'installed {name}'\n")
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def _python(code: str, env: dict) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:-1]


def test_the_working_directory_shadows_without_rwcore(tmp_path):
    """The set-up reproduces the bug: from the root, `-c` finds the checkout's folder first."""
    out = _python("import importlib.util; print(importlib.util.find_spec('kernels').origin)", _installed(tmp_path))
    assert out == [str(ROOT / "kernels" / "__init__.py")]


def test_importing_rwcore_lets_installed_packages_win(tmp_path):
    out = _python(
        "import rwcore, kernels, trainer, sys; print(kernels.MARK); print(trainer.MARK); "
        "import rwcore.kernels, rwcore.trainer.config; print(rwcore.kernels.__file__); "
        "print(sys.path[-1])",
        _installed(tmp_path),
    )
    assert out[:2] == ["installed kernels", "installed trainer"]
    assert out[2] == str(ROOT / "kernels" / "__init__.py")  # rwcore's own still come from the checkout
    assert out[3] in ("", str(ROOT))  # the root stays on the path, last


def test_no_change_when_the_root_is_not_in_front(monkeypatch):
    monkeypatch.setattr(sys, "path", ["/somewhere", "/else", str(ROOT)])
    assert checkout.move_root_last() is False
    assert sys.path == ["/somewhere", "/else", str(ROOT)]
    monkeypatch.setattr(sys, "path", [str(ROOT), "/somewhere", "", "/else"])
    monkeypatch.chdir(ROOT)
    assert checkout.move_root_last() is True
    assert sys.path == ["/somewhere", "/else", str(ROOT), ""]
    monkeypatch.setattr(sys, "path", ["/somewhere"])
    assert checkout.move_root_last() is False and sys.path == ["/somewhere"]
