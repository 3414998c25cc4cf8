"""Nothing in a run folder runs: a `config.yaml` naming environment code (env.options.taskset, env_id) is
imported only from the installed packages or PYTHONPATH, never from the run folder or the folder the
command runs in, whichever command reads it. Every case runs the real CLI as a user would
(`python -m rwcore.trainer`, the spelling that puts the current folder on sys.path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _util import ROOT

EXAMPLES = ROOT / "examples" / "verifiers"

SMALL = [
    "env.name=verifiers",
    "env.options.taskset=word_echo",
    "env.options.num_train=8",
    "env.options.num_eval=4",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "train.steps=1",
    "train.eval_every=0",
    "train.checkpoint_every=1",
    "train.method=outcome_only",
]

# The planted module leaves a file behind when it is imported: proof that it ran.
PLANTED = "import pathlib, os\npathlib.Path(os.environ['RW_PLANTED_MARK']).write_text('ran')\n"


def _rw(args, cwd, mark, pythonpath=None, timeout=240):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env.update(OMP_NUM_THREADS="1", RW_PLANTED_MARK=str(mark))
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    return subprocess.run(
        [sys.executable, "-m", "rwcore.trainer", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real one-step run of the word_echo taskset (imported from PYTHONPATH, as a user installs one)."""
    folder = tmp_path_factory.mktemp("trained") / "run"
    done = _rw(["train", "--out", str(folder), "--quiet", *SMALL], ROOT, folder / "unused", pythonpath=[EXAMPLES])
    assert done.returncode == 0, done.stderr[-2000:]
    return folder


def _plant(run: Path, key: str, layout: str) -> None:
    """Puts `evilmod` in the run folder (a module or a package) and names it in config.yaml under `key`."""
    if layout == "module":
        (run / "evilmod.py").write_text(PLANTED)
    else:
        (run / "evilmod").mkdir()
        (run / "evilmod" / "__init__.py").write_text(PLANTED)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["env"]["options"][key] = "evilmod"
    (run / "config.yaml").write_text(yaml.safe_dump(config))


def _copy(trained: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(trained, to)
    return to


COMMANDS = {
    "eval": lambda run: ["eval", "."],
    "resume": lambda run: ["train", "--resume", "."],
    "config-of-the-run": lambda run: ["train", "--config", "config.yaml", "--out", str(run.parent / "new")],
}


@pytest.mark.parametrize(
    "command, key, layout",
    [
        *[(command, "taskset", "module") for command in sorted(COMMANDS)],
        ("eval", "taskset", "package"),
        ("resume", "env_id", "module"),
    ],
)
def test_code_in_a_run_folder_never_runs(trained, tmp_path, command, key, layout):
    run = _copy(trained, tmp_path / "run")
    _plant(run, key, layout)
    mark = tmp_path / "ran"
    done = _rw(COMMANDS[command](run), run, mark, pythonpath=[EXAMPLES])
    assert not mark.exists(), f"the run folder's evilmod ran ({command})"
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert lines[0].startswith("rw: error:") and "evilmod" in lines[0] and key in lines[0]  # names the key


def test_code_in_the_current_folder_never_runs(trained, tmp_path):
    """The same module in the folder the command runs in, the run folder elsewhere."""
    run = _copy(trained, tmp_path / "run")
    _plant(run, "taskset", "module")
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    (run / "evilmod.py").rename(elsewhere / "evilmod.py")
    mark = tmp_path / "ran"
    done = _rw(["eval", str(run)], elsewhere, mark, pythonpath=[EXAMPLES])
    assert not mark.exists()
    assert done.returncode == 2 and "evilmod" in done.stderr


def test_a_folder_the_user_names_on_pythonpath_is_imported(trained, tmp_path):
    """The control: the same planted module IS imported when the user puts its folder on PYTHONPATH, so
    the refusals above are the path rule at work, not a module that could never load."""
    run = _copy(trained, tmp_path / "run")
    _plant(run, "taskset", "module")
    mark = tmp_path / "ran"
    _rw(["eval", "."], run, mark, pythonpath=[EXAMPLES, run])
    assert mark.read_text() == "ran"
