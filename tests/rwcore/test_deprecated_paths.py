"""The modules that moved (Arise into rwcore.arise, samplers into rwcore.sampling) keep their old import
paths for one release: same module objects, and a DeprecationWarning naming the new path."""

import subprocess
import sys

import pytest

OLD_TO_NEW = [  # written out here, not read from rwcore._deprecated, so a dropped alias fails
    ("rwcore.advantages", "rwcore.arise.advantages"),
    ("rwcore.evidence", "rwcore.arise.evidence"),
    ("rwcore.pool", "rwcore.arise.pool"),
    ("rwcore.pool.pool", "rwcore.arise.pool.pool"),
    ("rwcore.pool.lifecycle", "rwcore.arise.pool.lifecycle"),
    ("rwcore.pool.prompt", "rwcore.arise.pool.prompt"),
    ("rwcore.pool.records", "rwcore.arise.pool.records"),
    ("rwcore.pool.window", "rwcore.arise.pool.window"),
    ("rwcore.baselines", "rwcore.sampling.baselines"),
    ("rwcore.data", "rwcore.sampling.batch"),
    ("rwcore.demo_sampler", "rwcore.sampling.demo"),
]


@pytest.mark.parametrize("old,new", OLD_TO_NEW)
def test_an_old_path_warns_and_is_the_new_module(old, new):
    code = f"""
import importlib, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    old = importlib.import_module({old!r})
new = importlib.import_module({new!r})
messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
assert any({new!r} in m for m in messages), messages
assert any('will be removed in rwcore 0.2.0' in m for m in messages), messages
if {old!r} == "rwcore.pool":   # the package re-exports the new package's names
    assert old.RubricSkillPool is new.RubricSkillPool
else:
    assert old is new, (old, new)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_old_capability_sampler_name_still_resolves():
    code = """
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from rwcore.sampling import CapabilitySampler
from rwcore.arise.sampler import CapabilitySampler as new
assert CapabilitySampler is new
assert any("rwcore.arise.sampler" in str(w.message) for w in caught)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_old_demo_command_still_runs():
    result = subprocess.run(
        [
            sys.executable,
            "-W",
            "always",
            "-m",
            "rwcore.demo_sampler",
            "--steps",
            "2",
            "--tasks",
            "40",
            "--batch-size",
            "4",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "rwcore.sampling.demo" in result.stderr


def test_the_new_layout_imports_without_deprecation_warnings():
    code = """
import warnings
warnings.simplefilter("error", DeprecationWarning)
import rwcore.arise.pool, rwcore.arise.sampler, rwcore.arise.advantages, rwcore.arise.evidence
import rwcore.sampling.baselines, rwcore.sampling.batch, rwcore.tasks, rwcore.sampling.demo
import rwcore.method, rwcore.rewardweaver
from rwcore import CapabilitySampler, UniformSampler, RubricSkillPool, AdaptiveMethod
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_removal_release_is_a_later_one_than_this():
    from importlib.metadata import version

    from rwcore._deprecated import REMOVED_IN

    def parse(text):
        return tuple(int(part) for part in text.split(".")[:3])

    assert REMOVED_IN == "0.2.0"  # the release named in the warnings and in docs/method.md
    assert parse(REMOVED_IN) > parse(version("rwcore")), (REMOVED_IN, version("rwcore"))
