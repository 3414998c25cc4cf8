"""`rw train --out` never writes over a user's files or an old run, and a checkpoint pointer never leads
out of its run folder. The refusals run through the real CLI (`main`); one case trains for real."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _util import TINY_RUN

from rwcore.trainer import checkpoint as ckpt
from rwcore.trainer.cli import main, training


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"<dir>") for p in sorted(folder.rglob("*"))
    }


def _fake_run(folder: Path, steps=(2,)) -> None:
    """The files a run of rw train leaves, with recognizable contents."""
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "config.yaml").write_text("train: {steps: 2}\n")
    (folder / "metrics.jsonl").write_text('{"step": 1, "kind": "train"}\n')
    (folder / "method.json").write_text("{}")
    for step in steps:
        (folder / "checkpoints" / f"step_{step:06d}").mkdir()
        (folder / "checkpoints" / f"step_{step:06d}" / "state.pt").write_bytes(b"old")
    (folder / "checkpoints" / "latest").write_text(f"step_{steps[-1]:06d}")


# ---- a folder that is not a run ------------------------------------------------------------------

USER_FOLDERS = {
    "notes": {"notes.txt": b"my notes"},
    "a config of theirs": {"config.yaml": b"my: config\n"},  # the name of a run file, but no run beside it
    "metrics of theirs": {"metrics.jsonl": b'{"mine": 1}\n', "data.csv": b"1,2\n"},
    "a staging-like folder": {"checkpoints/.step_000001.tmp/keep.bin": b"precious"},
    "hidden file": {".env": b"SECRET=1"},
}


@pytest.mark.parametrize("name", list(USER_FOLDERS))
@pytest.mark.parametrize("overwrite", [False, True])
def test_out_on_a_folder_of_other_files_is_refused_and_nothing_changes(no_trainer, tmp_path, capsys, name, overwrite):
    folder = tmp_path / "mine"
    for relative, content in USER_FOLDERS[name].items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(content)
    before = _tree(folder)
    argv = ["train", "--out", str(folder), "--quiet", *(["--overwrite"] if overwrite else [])]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "holds no run of rw" in err and str(folder) in err and err.count("\n") == 1
    assert _tree(folder) == before


def test_out_on_an_empty_or_missing_folder_is_fine(monkeypatch, tmp_path):
    built = []

    class Recorder:
        def __init__(self, config, out_dir, quiet=False):
            built.append(out_dir)

        def setup(self):
            pass

        def train(self):
            pass

        def cleanup(self):
            pass

    monkeypatch.setattr(training, "_trainer_class", lambda: Recorder)
    (tmp_path / "empty").mkdir()
    assert main(["train", "--out", str(tmp_path / "empty"), "--quiet"]) == 0
    assert main(["train", "--out", str(tmp_path / "new" / "deeper"), "--quiet"]) == 0
    # rw ablate's bookkeeping alone does not make a folder "used"
    (tmp_path / "ablate").mkdir()
    (tmp_path / "ablate" / "ablation.log").write_text("$ rw train ...\n")
    assert main(["train", "--out", str(tmp_path / "ablate"), "--quiet"]) == 0
    assert len(built) == 3


# ---- an existing run -----------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [(1,), (3, 7)])
def test_out_on_an_existing_run_is_refused_with_the_ways_on(no_trainer, tmp_path, capsys, steps):
    run = tmp_path / "run"
    _fake_run(run, steps)
    before = _tree(run)
    assert main(["train", "--out", str(run), "--quiet", "train.steps=5"]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and f"rw train --resume {run}" in err and "--overwrite" in err
    assert _tree(run) == before


def test_overwrite_refuses_a_run_folder_with_a_users_file_in_it_removing_nothing(no_trainer, tmp_path, capsys):
    for extra in ("analysis_by_hand.ipynb", "checkpoints/my_best.pt", "checkpoints/step_000002/../notes"):
        run = tmp_path / extra.replace("/", "_")
        _fake_run(run)
        (run / extra).parent.mkdir(parents=True, exist_ok=True)
        (run / extra).write_bytes(b"mine")
        before = _tree(run)
        assert main(["train", "--out", str(run), "--quiet", "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert "files rw did not write" in err and "nothing was removed" in err
        assert _tree(run) == before


def test_overwrite_refuses_a_symlink_in_the_run_folder_and_never_follows_it(no_trainer, tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    run = tmp_path / "run"
    _fake_run(run)
    (run / "report").symlink_to(outside)
    assert main(["train", "--out", str(run), "--quiet", "--overwrite"]) == 2
    assert "files rw did not write" in capsys.readouterr().err
    assert (outside / "keep.txt").read_text() == "keep" and (run / "report").is_symlink()


def test_overwrite_replaces_a_run_for_real_and_resume_then_works(tmp_path, capsys):
    """Two real runs into one folder: the second needs --overwrite, leaves no trace of the first, keeps
    rw ablate's bookkeeping, and --resume of the new run works."""
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), "--quiet", *TINY_RUN, "train.steps=3"]) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_")) == [
        "step_000001",
        "step_000002",
        "step_000003",
    ]
    (run / "ablation.log").write_text("bookkeeping\n")
    assert main(["train", "--out", str(run), "--quiet", *TINY_RUN, "train.steps=3"]) == 2  # refused without the flag
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--quiet", "--overwrite", *TINY_RUN, "train.steps=1"]) == 0
    steps = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert steps == ["step_000001"]  # the old steps 2 and 3 are gone: latest never sits beside them
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if row["kind"] == "train"] == [1]
    assert (run / "ablation.log").read_text() == "bookkeeping\n"
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000001"
    assert main(["train", "--resume", str(run), "--quiet"]) == 0  # steps 1 -> 1: nothing left, but it loads


def test_overwrite_needs_out_and_does_not_go_with_resume(no_trainer, tmp_path, capsys):
    assert main(["train", "--overwrite", "--quiet"]) == 2
    assert "--overwrite needs --out" in capsys.readouterr().err
    _fake_run(tmp_path / "run")
    assert main(["train", "--resume", str(tmp_path / "run"), "--overwrite"]) == 2
    assert "--overwrite" in capsys.readouterr().err


# ---- the checkpoint pointer ----------------------------------------------------------------------

POINTERS = [
    "../../other/checkpoints/step_000004",
    "/abs/elsewhere/step_000004",
    "step_000004/../../../other",
    "step_9/../step_000002x",
    "",
    "step_000002\x00",
    "..",
    "latest",
]


@pytest.mark.parametrize("pointer", POINTERS)
def test_a_pointer_that_leads_out_of_its_run_is_refused(tmp_path, pointer):
    run, other = tmp_path / "run", tmp_path / "other"
    _fake_run(run, (2,))
    _fake_run(other, (4,))
    (run / "checkpoints" / "latest").write_text(pointer)
    with pytest.raises(ckpt.CheckpointError, match="latest"):
        ckpt.latest_checkpoint(run)


def test_a_pointer_that_is_a_symlink_or_names_a_symlinked_step_is_refused(tmp_path):
    run, other = tmp_path / "run", tmp_path / "other"
    _fake_run(run, (2,))
    _fake_run(other, (4,))
    (run / "checkpoints" / "latest").unlink()
    (run / "checkpoints" / "latest").symlink_to(other / "checkpoints" / "latest")
    with pytest.raises(ckpt.CheckpointError, match="not a plain file"):
        ckpt.latest_checkpoint(run)
    (run / "checkpoints" / "latest").unlink()
    (run / "checkpoints" / "step_000009").symlink_to(other / "checkpoints" / "step_000004")
    (run / "checkpoints" / "latest").write_text("step_000009")
    with pytest.raises(ckpt.CheckpointError, match="not a checkpoint folder"):
        ckpt.latest_checkpoint(run)
    (run / "checkpoints" / "latest").write_text("step_000002\n")
    assert ckpt.latest_checkpoint(run) == run / "checkpoints" / "step_000002"


def test_rw_eval_refuses_a_run_whose_pointer_leads_into_another_run(tmp_path, capsys):
    """A real run and a second real run; the first's pointer edited to lead into the second: rw eval fails
    with one line naming the pointer instead of reporting the other run's policy as this run's."""
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(["train", "--out", str(first), "--quiet", *TINY_RUN]) == 0
    assert main(["train", "--out", str(second), "--quiet", *TINY_RUN, "train.seed=5"]) == 0
    capsys.readouterr()
    (first / "checkpoints" / "latest").write_text(
        os.path.relpath(second / "checkpoints" / "step_000002", first / "checkpoints")
    )
    assert main(["eval", str(first), "--tasks", "2"]) == 2
    err = capsys.readouterr().err
    assert "latest" in err and "refusing to follow it" in err and err.count("\n") == 1


# ---- what rw writes inside a run folder is never a link -------------------------------------------


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """A real 2-step run with TensorBoard and MLflow on (each writes its folder) and a report."""
    run = tmp_path_factory.mktemp("tracked") / "run"
    assert main(["train", "--out", str(run), "--quiet", *TINY_RUN, "train.loggers=[tensorboard,mlflow]"]) == 0
    return run


LINKED = ["tensorboard", "mlflow", "wandb", "trackio", "report", "analysis", "metrics.jsonl", "method.json"]


@pytest.mark.parametrize("name", LINKED)
def test_a_symlink_where_rw_writes_in_a_run_folder_is_refused_on_resume_naming_it(tracked_run, tmp_path, capsys, name):
    """A run folder someone sent, with RUN/<name> a symlink to a folder (or file) of theirs: `--resume` is one
    line naming it, exit 2, before anything is written; the link's target is unchanged, and so is the run."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tracked_run, run, symlinks=True)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("keep")
    entry = run / name
    if entry.is_dir():
        shutil.rmtree(entry)
    elif entry.exists():
        entry.unlink()
    entry.symlink_to(theirs if "." not in name else theirs / "keep.txt")
    before = _tree(run)
    assert main(["train", "--resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(entry) in err and "symbolic link" in err, err
    assert sorted(p.name for p in theirs.iterdir()) == ["keep.txt"] and (theirs / "keep.txt").read_text() == "keep"
    assert _tree(run) == before


def test_rw_report_and_a_tracker_refuse_a_linked_folder_and_the_rule_names_every_kind(tracked_run, tmp_path, capsys):
    """`rw report RUN` with RUN/report a symlink: one line naming it, nothing written through it. A tracker
    started on a run folder whose store is a link is refused naming it (not trackio's 'fixed when first
    imported'). `run_path` says what a path is: a FIFO, a file where a folder belongs, a folder where a file does."""
    import shutil

    from rwcore.trainer.run_paths import RunPathRefused, run_path
    from rwcore.trainer.trackers import MlflowTracker, TensorBoardTracker, TrackioTracker

    run = tmp_path / "run"
    shutil.copytree(tracked_run, run, symlinks=True)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    shutil.rmtree(run / "report", ignore_errors=True)
    (run / "report").symlink_to(theirs)
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(run / "report") in err and "symbolic link" in err, err
    assert list(theirs.iterdir()) == []
    for tracker, name in ((TensorBoardTracker, "tensorboard"), (MlflowTracker, "mlflow"), (TrackioTracker, "trackio")):
        shutil.rmtree(run / name, ignore_errors=True)
        (run / name).symlink_to(theirs)
        with pytest.raises(RunPathRefused, match="symbolic link"):
            tracker("rw").start({}, run)
        assert list(theirs.iterdir()) == []
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(RunPathRefused, match="is a FIFO, not a folder"):
        run_path(tmp_path / "fifo", "folder", create=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunPathRefused, match="is a file, not a folder"):
        run_path(tmp_path / "file", "folder")
    with pytest.raises(RunPathRefused, match="is a folder, not a file"):
        run_path(theirs, "file")
    assert run_path(tmp_path / "new", "folder", create=True).is_dir() and run_path(theirs, "folder") == theirs


def test_a_newest_checkpoint_that_is_a_symlink_is_skipped_with_a_line_everywhere(tracked_run, tmp_path, capsys):
    """checkpoints/step_000002 replaced by a symlink to a copy of itself: `--resume` and `rw export` each say
    they skipped it (a symbolic link) and use step 1; nothing is read through the link."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tracked_run, run, symlinks=True)
    newest = run / "checkpoints" / "step_000002"
    shutil.move(newest, tmp_path / "moved")
    newest.symlink_to(tmp_path / "moved")
    (run / "checkpoints" / "latest").write_text("step_000001")
    moved = _tree(tmp_path / "moved")
    assert main(["export", str(run), "--out", str(tmp_path / "export")]) == 0
    err = capsys.readouterr().err
    assert "step_000002 skipped" in err and "symbolic link" in err and "exporting step_000001" in err, err
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "step_000002 skipped" in err and "symbolic link" in err and "resuming from step_000001" in err, err
    # the resumed run wrote its own step 2 in place of the link; what the link pointed to is untouched
    assert not newest.is_symlink() and ckpt.verify(newest)["step"] == 2 and _tree(tmp_path / "moved") == moved
