"""Runs import-linter's contracts (pyproject.toml [tool.importlinter]) on rwcore as it is installed.

In the repository `rwcore.kernels` and `rwcore.trainer` live in kernels/ and trainer/ (setup.py maps them), which
import-linter cannot see from rwcore/. This copies the package's Python files into a temporary folder in the
installed layout and lints that copy. Exit status: import-linter's (0 = every contract kept).

    .venv/bin/python scripts/lint_imports.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = {"rwcore": "rwcore", "kernels": "rwcore/kernels", "trainer": "rwcore/trainer"}


def installed_layout(target: Path) -> None:
    for source, destination in LAYOUT.items():
        for path in (ROOT / source).rglob("*.py"):
            relative = path.relative_to(ROOT / source)
            if "__pycache__" in relative.parts:
                continue
            out = target / destination / relative
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out)


def main() -> int:
    import os
    import subprocess
    import sysconfig

    with tempfile.TemporaryDirectory(prefix="rwcore-lint-imports-") as folder:
        installed_layout(Path(folder))
        # -S: without site's .pth files, so the editable install's finder cannot point rwcore back at the checkout
        # (the copy is found first; import-linter comes from this environment's site-packages)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([folder, sysconfig.get_paths()["purelib"]])}
        code = (
            "import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, no_cache=True))"
        )
        return subprocess.run([sys.executable, "-S", "-c", code], env=env, cwd=folder).returncode


if __name__ == "__main__":
    sys.exit(main())
