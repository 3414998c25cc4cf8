"""The repository's habits, checked like everything else: ruff's lint and format (pyproject.toml [tool.ruff]),
import-linter's contracts (the layering trainer -> rwcore -> kernels, independent integrations, no import cycles;
pyproject.toml [tool.importlinter]), a valid pre-commit configuration, and no tracker issue numbers in the code."""

import re
import subprocess
import sys
from pathlib import Path

from _util import ROOT

BIN = Path(sys.executable).parent


def _run(*command):
    return subprocess.run([str(c) for c in command], cwd=ROOT, capture_output=True, text=True)


def test_ruff_lint_passes():
    result = _run(BIN / "ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_applied():
    result = _run(BIN / "ruff", "format", "--check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_contracts_are_kept():
    result = _run(sys.executable, "scripts/lint_imports.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 3 kept, 0 broken." in result.stdout


def test_the_pre_commit_configuration_is_valid():
    result = _run(BIN / "pre-commit", "validate-config", ".pre-commit-config.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_tracker_issue_numbers_in_code_tests_or_docs():
    pattern = re.compile(r"\bissue[s]?[ -]#?\d+|\bissue #\d+", re.IGNORECASE)
    found = []
    for folder in ("rwcore", "trainer", "kernels", "tests", "bench", "docs", "scripts", "examples", "csrc"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in (".py", ".md", ".cpp", ".h", ".sh", ".yaml") or "results" in path.parts:
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if pattern.search(line) and path.name != "test_code_style.py":
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    readme = (ROOT / "README.md").read_text()
    found += [f"README.md: {m.group(0)}" for m in pattern.finditer(readme)]
    assert not found, "\n".join(found)
