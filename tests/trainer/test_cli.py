"""`rw` command line: parsing, dispatch to the Trainer (faked here) and exit codes."""

import json
import shlex
from pathlib import Path

import pytest
from _util import ROOT

from rwcore.trainer.cli import main, training
from rwcore.trainer.config import Config, load_config


class FakeTrainer:
    """Records how the CLI drives the Trainer."""

    calls: list = []
    fail_in_train: BaseException | None = None

    def __init__(self, config, out_dir, quiet=False):
        if config.train.seed == 666:
            raise ValueError("environment 'nope' is not registered")
        self.config, self.out_dir, self.quiet = config, out_dir, quiet
        FakeTrainer.calls.append(("init", config, out_dir, quiet))

    @classmethod
    def resume(cls, run_dir, quiet=False, overrides=()):
        if not (Path(run_dir) / "checkpoints").is_dir():
            raise FileNotFoundError("no checkpoint found")
        trainer = cls.__new__(cls)
        trainer.config = load_config(None, list(overrides))
        trainer.resumed = {"checkpoint": str(Path(run_dir) / "checkpoints" / "step_000002"), "step": 2}
        trainer.resumed["steps_before"] = trainer.config.train.steps if not overrides else 4
        FakeTrainer.calls.append(("resume", run_dir, quiet) + ((tuple(overrides),) if overrides else ()))
        return trainer

    @classmethod
    def evaluate_checkpoint(
        cls,
        path,
        split="eval",
        max_tasks=None,
        with_skills=False,
        greedy=False,
        tasks_file=None,
        transcripts=None,
        loaded=None,
    ):
        extra = (("with_skills",) if with_skills else ()) + (("greedy",) if greedy else ())
        FakeTrainer.calls.append(("evaluate", path, split, max_tasks) + extra)
        return {"eval/success_rate": 0.5, "eval/outcome_mean": float("nan"), "tasks": 8}

    def setup(self):
        FakeTrainer.calls.append(("setup",))

    def train(self):
        FakeTrainer.calls.append(("train",))
        if FakeTrainer.fail_in_train is not None:
            raise FakeTrainer.fail_in_train

    def cleanup(self):
        FakeTrainer.calls.append(("cleanup",))


@pytest.fixture
def fake(monkeypatch):
    FakeTrainer.calls = []
    FakeTrainer.fail_in_train = None
    monkeypatch.setattr(training, "_trainer_class", lambda: FakeTrainer)
    return FakeTrainer


def names(calls):
    return [c[0] for c in calls]


def test_train_builds_config_and_runs(fake, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("train: {steps: 50, method: arise}\n")
    out = tmp_path / "run"
    code = main(
        ["train", "--config", str(path), "--out", str(out), "--quiet", "train.steps=3", "train.method=arise_no_skills"]
    )
    assert code == 0
    assert names(fake.calls) == ["init", "setup", "train", "cleanup"]
    _, config, out_dir, quiet = fake.calls[0]
    assert isinstance(config, Config)
    assert config.train.steps == 3 and config.train.method == "arise_no_skills"
    assert not hasattr(config.pool, "skills")  # train.method says whether skills are shown
    assert Path(out_dir) == out and quiet is True
    assert str(out) in capsys.readouterr().out


def test_train_default_out_is_timestamped(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train"]) == 0
    _, config, out_dir, quiet = fake.calls[0]
    assert config == load_config() and quiet is False
    assert Path(out_dir).parent == Path("runs") and Path(out_dir).name[:2] == "20"


def test_cleanup_runs_when_training_fails(fake, tmp_path):
    fake.fail_in_train = RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        main(["train", "--out", str(tmp_path / "r")])
    assert names(fake.calls)[-1] == "cleanup"


def test_interrupt_suggests_resume_once_a_checkpoint_exists(fake, tmp_path, capsys, monkeypatch):
    run = tmp_path / "r"

    def checkpoint_then_interrupt(self):
        (Path(self.out_dir) / "checkpoints").mkdir(parents=True)
        (Path(self.out_dir) / "checkpoints" / "latest").write_text("step_000010")
        raise KeyboardInterrupt

    monkeypatch.setattr(FakeTrainer, "train", checkpoint_then_interrupt)
    assert main(["train", "--out", str(run)]) == 130
    assert names(fake.calls)[-1] == "cleanup"
    assert capsys.readouterr().err.strip().endswith(f"continue with: rw train --resume {run}")


def test_interrupt_before_the_first_checkpoint_advises_a_command_that_works(fake, tmp_path, capsys):
    run = tmp_path / "my run"
    argv = ["train", "--out", str(run), "train.steps=7", "optim.lr=0.001"]
    fake.fail_in_train = KeyboardInterrupt()
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "--resume" not in err and "nothing to resume" in err
    advised = shlex.split(err.strip().split("start over with: ", 1)[1])
    assert advised[:2] == ["rw", "train"] and "--overwrite" in advised
    fake.fail_in_train, fake.calls = None, []
    assert main(advised[1:]) == 0  # the advice runs: the same config, into the same folder
    _, config, out_dir, _ = fake.calls[0]
    assert Path(out_dir) == run and config.train.steps == 7 and config.optim.lr == 0.001


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "train.stepz=3"], "unknown config key 'train.stepz'"),
        (["train", "train.steps=abc"], "'train.steps': expected int"),
        (["train", "train.method=grpo"], "combined, rewardweaver, rw_outcome_grpo"),
        (
            ["train", "train.method=arise", "sampler.kind=uniform"],
            "'sampler.kind': train.method=arise sets it to 'capability', got 'uniform'; "
            "train.method=arise_no_adaptive_sampling is that variant",
        ),
        (["train", "train.method=arise_frozen_rubrics"], "'pool.frozen_from'"),
        (["train", "--config", "/nonexistent/c.yaml"], "cannot read"),
        (["train", "train.seed=666"], "environment 'nope' is not registered"),
    ],
)
def test_config_errors_are_one_line_exit_2(fake, tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert err.startswith("rw: error:") and err.count("\n") == 1
    assert "train" not in names(fake.calls)


def test_bad_override_syntax_is_a_usage_error(fake, capsys):
    assert main(["train", "steps"]) == 2
    assert "section.key=value" in capsys.readouterr().err
    assert fake.calls == []


def test_resume(fake, tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    assert main(["train", "--resume", str(run)]) == 0
    assert names(fake.calls) == ["resume", "setup", "train", "cleanup"]
    assert fake.calls[0][1:] == (str(run), False)
    assert f"resuming {run} from checkpoint {run / 'checkpoints' / 'step_000002'} (step 2); training to step 500\n" in (
        capsys.readouterr().out
    )
    # overrides go to the trainer, which allows those that cannot change the steps already trained
    assert main(["train", "--resume", str(run), "train.steps=8"]) == 0
    assert fake.calls[4][1:] == (str(run), False, ("train.steps=8",))
    assert "training to step 8; train.steps extended from 4" in capsys.readouterr().out


@pytest.mark.parametrize("extra", [["--out", "x"], ["--config", "c.yaml"], ["--overwrite"]])
def test_resume_rejects_new_settings(fake, tmp_path, capsys, extra):
    assert main(["train", "--resume", str(tmp_path), *extra]) == 2
    assert "cannot be combined" in capsys.readouterr().err and fake.calls == []


def test_resume_errors(fake, tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert "no checkpoint found" in capsys.readouterr().err


def test_eval_prints_json(fake, tmp_path, capsys):
    ckpt = tmp_path / "step_10"
    ckpt.mkdir()
    assert main(["eval", str(ckpt), "--split", "train", "--tasks", "16"]) == 0
    assert fake.calls == [("evaluate", str(ckpt), "train", 16)]
    metrics = json.loads(capsys.readouterr().out)
    assert metrics == {"eval/success_rate": 0.5, "eval/outcome_mean": None, "tasks": 8}
    assert main(["eval", str(ckpt)]) == 0
    assert fake.calls[-1] == ("evaluate", str(ckpt), "eval", None)
    assert main(["eval", str(ckpt), "--with-skills"]) == 0
    assert fake.calls[-1] == ("evaluate", str(ckpt), "eval", None, "with_skills")


@pytest.mark.parametrize(
    "argv",
    [
        ["eval"],
        ["eval", "x", "--split", "test"],
        ["eval", "x", "--tasks", "0"],
        ["eval", "x", "--tasks", "many"],
    ],
)
def test_eval_usage_errors(fake, argv):
    assert main(argv) == 2 and fake.calls == []


def test_eval_missing_checkpoint(fake, tmp_path, capsys):
    assert main(["eval", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_help_and_missing_command(capsys):
    assert main([]) == 2
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("train", "eval", "report", "config"):
        assert command in out
    for command in ("train", "eval", "report", "config"):
        assert main([command, "--help"]) == 0
        assert "examples:" in capsys.readouterr().out
    assert main(["fly"]) == 2


def test_config_command(capsys, tmp_path):
    assert main(["config", "train.steps=7", "train.method=arise_no_skills"]) == 0
    out = capsys.readouterr().out
    assert "steps: 7" in out and "skills: 'off'" in out
    assert main(["config", "--describe"]) == 0
    assert "optim.lr = 0.0003" in capsys.readouterr().out
    assert main(["config", "optim.lr=x"]) == 2


def test_console_script_is_declared():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'rw = "rwcore.trainer.cli:main"' in text


def test_missing_trainer_is_a_one_line_error(monkeypatch, tmp_path, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "rwcore.trainer.trainer", None)  # import fails
    assert main(["train", "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert "cannot import the trainer" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["--local_rank=1", "train"], ["train", "--local-rank", "1"]])
def test_deepspeed_launchers_local_rank_goes_to_the_environment(fake, tmp_path, monkeypatch, argv):
    monkeypatch.setenv("LOCAL_RANK", "unset")  # so that monkeypatch removes what main() sets
    monkeypatch.delenv("LOCAL_RANK")
    assert main([*argv, "--out", str(tmp_path / "r"), "train.steps=3"]) == 0
    import os

    assert os.environ["LOCAL_RANK"] == "1"
    assert fake.calls[0][1].train.steps == 3


def test_bad_local_rank_is_a_one_line_error(fake, capsys):
    assert main(["--local_rank=x", "train"]) == 2
    assert "--local_rank" in capsys.readouterr().err and not fake.calls


def test_under_a_launcher_out_is_required_and_only_rank_0_prints(fake, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert main(["train"]) != 0
    assert "--out is required" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path / "r")]) == 0
    assert capsys.readouterr().out == ""  # rank 1 prints nothing of its own


def test_setup_errors_are_one_line_errors(fake, tmp_path, monkeypatch, capsys):
    def broken_setup(self):
        raise ValueError("optim.minibatches=9 is more than the 4 rollouts a process updates on")

    monkeypatch.setattr(fake, "setup", broken_setup)
    assert main(["train", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "optim.minibatches=9" in err and "Traceback" not in err
    assert names(fake.calls)[-1] == "cleanup"


def test_a_real_run_interrupted_before_its_first_checkpoint_starts_over_with_the_advised_command(tmp_path):
    """Ctrl-C (SIGINT) at step 1 of a real `rw train` that checkpoints only at its end: the advice is the same
    command with --overwrite (there is nothing --resume could continue), and that command runs to the end."""
    import signal
    import subprocess

    from _util import TINY_RUN, child_env, overrides_with, rw_command

    run = tmp_path / "run"
    overrides = overrides_with(TINY_RUN, "train.steps=3", "train.checkpoint_every=0")
    child = subprocess.Popen(
        rw_command("train", "--quiet", "--out", str(run), *overrides),
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in child.stdout:
        if line.startswith("step 1/"):
            child.send_signal(signal.SIGINT)
            break
    _, err = child.communicate(timeout=120)
    assert child.returncode == 130, err[-2000:]
    assert not (run / "checkpoints" / "latest").exists()
    assert "nothing to resume" in err and "Traceback" not in err
    advised = shlex.split(err.strip().splitlines()[-1].split("start over with: ", 1)[1])
    assert advised[:2] == ["rw", "train"] and "--overwrite" in advised
    done = subprocess.run(rw_command(*advised[1:]), env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000003"
