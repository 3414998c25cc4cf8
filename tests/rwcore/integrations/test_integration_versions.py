"""The integrations at both ends of their declared ranges (TRL and verl: both ends run), and the warning outside them.

The high end is the TRL in the environment (tests/rwcore/integrations/test_integration_trl.py runs there). The low end
is installed by scripts/setup.sh into ~/.cache/rwcore/trl-<version> (RWCORE_CACHE), and the TRL
integration tests run again in a subprocess with it first on PYTHONPATH. Likewise verl: 0.9.1 is in the
environment (extra `upstream`), 0.8.0 in ~/.cache/rwcore/verl-0.8.0, for the verl tests that 0.8 has.
"""

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from _util import ROOT

from rwcore.integrations import versions

SPECIFIER, LOW, HIGH = versions.TESTED["trl"]


def _low_dir(trainer: str = "trl") -> Path:
    cache = os.environ.get("RWCORE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rwcore"
    )
    return Path(cache) / f"{trainer}-{versions.TESTED[trainer][1]}"


def test_declared_range_is_the_tested_one():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^integrations = \["trl' + re.escape(SPECIFIER) + r'"\]$', pyproject, re.M), SPECIFIER
    import trl

    assert trl.__version__ == HIGH  # the environment holds the high end


def test_integration_tests_pass_on_the_lowest_declared_trl():
    target = _low_dir()
    assert (target / "trl" / "__init__.py").is_file(), (
        f"trl=={LOW} is not installed in {target}: run scripts/setup.sh with RWCORE_EXTRAS including test"
    )
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    )
    version = subprocess.run(
        [sys.executable, "-c", "import trl; print(trl.__version__)"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert version.stdout.strip() == LOW, version.stderr[-2000:]
    # every test of the TRL integration (pieces and the method driver) but the one that checks the import
    # without TRL (version-free)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/rwcore/integrations/test_integration_trl.py",
            "tests/rwcore/integrations/test_integration_trl_method.py",
            "-k",
            "not imported_lazily",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert re.search(r"\b13 passed\b", result.stdout), result.stdout[-2000:]
    assert "is tested with trl" not in result.stdout  # inside the range: no version warning


def test_outside_the_range_warns_once_naming_it(monkeypatch):
    monkeypatch.setattr(versions, "_warned", set())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert versions.check_version("trl", LOW) and versions.check_version("trl", HIGH)  # silent inside
    with pytest.warns(UserWarning, match=re.escape(f"trl{SPECIFIER}")) as record:
        assert not versions.check_version("trl", "0.29.1")
    assert f"releases {LOW} to {HIGH}" in str(record[0].message) and "0.29.1" in str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not versions.check_version("trl", "2.0.0")  # once per process
    monkeypatch.setattr(versions, "_warned", set())
    with pytest.warns(UserWarning, match="untested"):
        assert not versions.check_version("trl", "not-a-version")


def test_verl_outside_its_tested_range_warns_once(monkeypatch):
    import verl

    import rwcore.integrations.verl as rv

    monkeypatch.setattr(versions, "_warned", set())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rv.register(forward_non_tensor_batch=False)  # verl 0.9.1: inside the range, silent
    monkeypatch.setattr(verl, "__version__", "0.7.1")
    with pytest.warns(UserWarning, match=re.escape("verl>=0.8.0,<0.10")):
        rv.register(forward_non_tensor_batch=False)


# verl 0.8.0 has neither the V1 trainer (verl.trainer.ppo.v1, trainer mode rwcore_sync) nor plugin discovery:
# these tests of tests/rwcore/integrations/test_integration_verl.py need them (the rest -- the loss through ppo_loss,
# the estimator through the legacy compute_advantage, registration, the sampler, the legacy task runner, and
# tests/rwcore/integrations/test_integration_verl_method.py's AdaptiveMethodDriver through the legacy path -- run)
VERL_09_ONLY = ["v1", "plugin", "documented_configuration", "rwcore_sync_hands"]


def test_verl_integration_tests_pass_on_the_lowest_declared_verl():
    target = _low_dir("verl")
    low = versions.TESTED["verl"][1]
    assert (target / "verl" / "__init__.py").is_file(), (
        f"verl=={low} is not installed in {target}: run scripts/setup.sh with RWCORE_EXTRAS including upstream"
    )
    env = dict(
        os.environ,
        RWCORE_EXPECT_VERL=low,
        PYTHONPATH=os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    selection = " and ".join(f"not {name}" for name in VERL_09_ONLY)
    # the module asserts verl.__version__ == RWCORE_EXPECT_VERL, so the low end is what runs
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/rwcore/integrations/test_integration_verl.py",
            "tests/rwcore/integrations/test_integration_verl_method.py",
            "-k",
            selection,
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert re.search(r"\b47 passed, 6 deselected\b", result.stdout), result.stdout[-2000:]
    assert "is tested with verl" not in result.stdout  # inside the range: no version warning
