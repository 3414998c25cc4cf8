"""An environment of your own, without forking rwcore: examples/my_env_package, copied to a temporary folder and
installed there by real pip (`--target`, never into the shared venv), trains with `rw train env.name=coffee`
(its entry point, found through the installed dist-info) for rewardweaver, arise and outcome_only, and with
`env.name=my_env_package:make_env`; its run resumes after kill -9; a changed source makes `--resume` and `rw eval`
refuse naming the module; an unknown name lists the built-in environments and the installed one.

The run killed with SIGKILL is a real `rw train` process with the install folder on its PYTHONPATH; the other runs
go through the real CLI in this process with the folder on sys.path (the same lookup: importlib.metadata reads the
dist-info on the path), which spares a process start and a torch import per run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _util import ROOT, child_env, metrics_rows, rw_command, train_steps

from rwcore.trainer.cli import main
from rwcore.trainer.envs import builtin_names, check_outside, make
from rwcore.trainer.envs.provenance import environment_record

# two tasks of two rollouts a step, a checkpoint every step; the methods' schedules inside two steps
TINY = (
    "env.options.num_train=16",
    "env.options.num_eval=4",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "train.eval_every=0",
    "train.checkpoint_every=1",
    "pool.delta_pool=1",
    "rewardweaver.adaptation_interval=1",
    "rewardweaver.min_support=1",
    "rewardweaver.diagnosis_tasks=2",
    "rewardweaver.diagnostic_tasks=2",
)


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """The example package installed by pip into a folder of its own (its dist-info declares the entry point)."""
    base = tmp_path_factory.mktemp("own-env")
    source = shutil.copytree(ROOT / "examples" / "my_env_package", base / "source")
    folder = base / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["--target", str(folder), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert (folder / "my_env_package" / "environment.py").is_file()
    return folder


@pytest.fixture
def on_path(target, monkeypatch):
    """The install folder on this process's sys.path; the package is forgotten again afterwards."""
    monkeypatch.syspath_prepend(str(target))
    yield target
    for name in [m for m in sys.modules if m == "my_env_package" or m.startswith("my_env_package.")]:
        del sys.modules[name]


@pytest.mark.parametrize("method", ["rewardweaver", "arise", "outcome_only"])
def test_the_installed_package_trains_by_its_entry_point_name(on_path, tmp_path, capsys, method):
    run = tmp_path / "run"
    assert (
        main(
            ["train", "--quiet", "--out", str(run), "env.name=coffee", f"train.method={method}", "train.steps=2", *TINY]
        )
        == 0
    )
    assert train_steps(run) == [1, 2]
    rows = metrics_rows(run, "train")
    # the example's rules reach each method: RewardWeaver's active set once a stage picked them, Arise's pool after
    # its first update (pool.delta_pool=1), nothing for outcome-only GRPO
    process, advantage = [r["rubrics/process"] for r in rows], [r["rubrics/advantage"] for r in rows]
    assert {
        "rewardweaver": max(process) > 0 and max(advantage) == 0,
        "arise": advantage[-1] > 0 and max(process) == 0,
        "outcome_only": max(process) == max(advantage) == 0,
    }[method], rows
    record = json.loads((run / "environment.json").read_text())
    assert record["env.name"] == "coffee" and record["factory"] == "my_env_package.environment:make_env"
    module = record["modules"]["my_env_package"]
    assert (module["distribution"], module["version"], module["files"]) == ("my-env-package", "0.1.0", 3)
    assert Path(module["path"]) == on_path / "my_env_package"


def test_module_factory_names_it_without_an_entry_point(on_path, tmp_path):
    run = tmp_path / "run"
    name = "env.name=my_env_package.environment:make_env"
    assert main(["train", "--quiet", "--out", str(run), name, "train.method=rewardweaver", "train.steps=1", *TINY]) == 0
    assert train_steps(run) == [1]
    assert json.loads((run / "environment.json").read_text())["env.name"] == "my_env_package.environment:make_env"


def test_a_killed_run_resumes_and_a_changed_source_is_refused_naming_the_module(target, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    env = child_env(PYTHONPATH=f"{target}:{child_env().get('PYTHONPATH', '')}".rstrip(":"))
    args = ["train", "--quiet", "--out", str(run), "env.name=coffee", "train.method=rewardweaver", *TINY]
    process = subprocess.Popen(
        rw_command(*args, "train.steps=200"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 240
        while not (run / "checkpoints" / "step_000002").is_dir():
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        process.kill()  # SIGKILL: no handler runs
        process.wait(timeout=30)
    assert process.returncode == -9
    # the run continues from its last intact checkpoint with the settings it started with; to end it soon, the test
    # shortens it in its config.yaml (a --resume takes no overrides)
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("steps: 200", "steps: 4"))
    monkeypatch.syspath_prepend(str(target))
    try:
        assert main(["train", "--quiet", "--resume", str(run)]) == 0
        steps = train_steps(run)
        assert steps[-1] == 4 and sorted(set(steps)) == [1, 2, 3, 4] and steps.count(4) == 1

        # the installed source changes (one comment): resuming or evaluating the run is refused, naming the module
        (run / "checkpoints" / "latest").write_text("step_000003")
        with open(target / "my_env_package" / "rules.py", "a") as source:
            source.write("# changed\n")
        before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
        capsys.readouterr()
        assert main(["train", "--quiet", "--resume", str(run)]) == 2
        resume_err = capsys.readouterr().err.strip().splitlines()
        assert main(["eval", str(run)]) == 2
        eval_err = capsys.readouterr().err.strip().splitlines()
    finally:
        for name in [m for m in sys.modules if m == "my_env_package" or m.startswith("my_env_package.")]:
            del sys.modules[name]
    print(resume_err, eval_err)
    for err in (resume_err, eval_err):
        assert len(err) == 1 and err[0].startswith("rw: error:"), err
        assert "environment module 'my_env_package' changed since the run started" in err[0]
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_an_unknown_name_lists_every_environment_and_the_module_factory_form(on_path, tmp_path, capsys):
    assert main(["train", "--quiet", "--out", str(tmp_path / "run"), "env.name=cofee", *TINY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    print(err[0])
    for name in ("negotiation", "tools", "social", "textarena", "sotopia", "verifiers"):
        assert f" {name}" in err[0]
    assert "coffee (my-env-package 0.1.0)" in err[0] and "module:function" in err[0]
    assert not (tmp_path / "run").exists()


def test_built_in_names_are_listed_without_importing_them_and_record_no_code():
    assert builtin_names() == ["negotiation", "social", "sotopia", "tasks", "textarena", "tools", "verifiers"]
    record = environment_record("negotiation", make("negotiation", num_train=4, num_eval=2))
    assert record["modules"] == {} and record["provenance"] == {}


def test_a_module_inside_the_run_folder_is_refused_before_it_is_imported(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "sent_env.py").write_text("raise SystemExit('imported')\n")
    monkeypatch.syspath_prepend(str(run))  # e.g. `python -m rwcore.trainer` started inside the run folder
    with pytest.raises(ValueError, match="inside the run folder") as refused:
        check_outside("sent_env:make_env", run)
    assert "sent_env" not in sys.modules and "'sent_env'" in str(refused.value)


class _WithProvenance:
    """The smallest environment with a provenance() (the contract a task-file environment keeps)."""

    name, system_prompt, max_turns = "data", "", 1

    def __init__(self, digest: str) -> None:
        self.digest = digest

    def provenance(self) -> dict[str, str]:
        return {"train_file /data/train.jsonl": self.digest}


def test_a_changed_provenance_entry_is_refused_naming_it_and_rwcore_moving_its_own_factory_is_not(
    tmp_path, monkeypatch
):
    from rwcore.trainer.envs import registry
    from rwcore.trainer.envs.provenance import check_environment, write_environment

    # registered in this process only (register() without leaving it behind): this module's code, outside rwcore
    monkeypatch.setitem(registry._REGISTRY, "with_provenance", _WithProvenance)
    record = environment_record("with_provenance", _WithProvenance("a" * 64))
    assert record["provenance"] == {"train_file /data/train.jsonl": "a" * 64}
    assert record["factory"] == f"{__name__}:_WithProvenance"
    write_environment(tmp_path, record)
    check_environment(tmp_path, record)  # the same environment: accepted
    with pytest.raises(ValueError, match=r"provenance entry 'train_file /data/train\.jsonl' changed"):
        check_environment(tmp_path, environment_record("with_provenance", _WithProvenance("b" * 64)))

    built_in = environment_record("negotiation", make("negotiation", num_train=4, num_eval=2))
    write_environment(tmp_path, {**built_in, "factory": "rwcore.trainer.envs.negotiation.old:make_negotiation"})
    check_environment(tmp_path, built_in)  # rwcore's own code is never a reason to refuse
