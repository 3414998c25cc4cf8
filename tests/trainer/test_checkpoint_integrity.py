"""Checkpoints that verify themselves.

Each checkpoint folder carries manifest.json (size and sha256 of every file, and a checksum of that
list); `rw eval` and `rw train --resume` verify it. `--resume` falls back to the newest intact
checkpoint and says so in one line; every .pt file loads with `torch.load(weights_only=True)`, so a
crafted run folder cannot run code; files and folders are fsynced before the rename (the parent after
it); leftover temporaries of a killed run are removed at start; a full disk or an output path that
cannot be a folder ends `rw train` with one line naming the path and no temporary folder left.

The manifest written by hand below follows the documented format (docs/reliability.md), independently
of the code that writes it.
"""

from __future__ import annotations

import ast
import errno
import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from _util import ROOT, SMALL_RUN, checkpoint_folder, metrics_rows, overrides_with, train_in_process, without_timing

from rwcore.trainer import cli
from rwcore.trainer.config import load_config
from rwcore.trainer.trainer import Trainer

REPO = ROOT
SMALL = overrides_with(
    SMALL_RUN, "env.options.num_eval=4", "train.checkpoint_every=1", "train.method=combined", "train.steps=2"
)
FILES = ("model.pt", "optimizer.pt", "state.pt", "manifest.json")


@pytest.fixture(scope="module")
def source_run(tmp_path_factory) -> Path:
    """A finished two-step run with checkpoints at steps 1 and 2 (never modified: tests copy it)."""
    folder = tmp_path_factory.mktemp("source") / "run"
    train_in_process(folder, SMALL)
    return folder


@pytest.fixture
def run(source_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(source_run, copy)
    return copy


def flip(path: Path, offset: int, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def one_error_line(err: str) -> str:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("rw: error:")
    return lines[0]


def no_temporaries(run: Path) -> bool:
    names = [p.name for p in run.rglob("*")]
    return not any(name.endswith(".tmp") for name in names)


def hand_written_manifest(folder: Path, step_number: int) -> None:
    """manifest.json in the documented format, computed here with hashlib (not by rwcore)."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "manifest.json"):
        data = path.read_bytes()
        files[path.relative_to(folder).as_posix()] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    body = {"format": 1, "step": step_number, "files": files}
    checksum = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps({**body, "checksum": checksum}, indent=1))


# ------------------------------------------------------------------------------------------ rw eval


@pytest.mark.parametrize("name", FILES)
def test_rw_eval_refuses_a_flipped_byte_naming_the_file(run, capsys, name):
    path = checkpoint_folder(run, 2) / name
    flip(path, path.stat().st_size // 2, 3)  # the middle of the file: tensor data for model.pt
    code = cli.main(["eval", str(checkpoint_folder(run, 2)), "--tasks", "1"])
    line = one_error_line(capsys.readouterr().err)
    assert code != 0
    assert str(path) in line


def test_rw_eval_refuses_a_checkpoint_without_manifest(run, capsys):
    (checkpoint_folder(run, 2) / "manifest.json").unlink(missing_ok=True)
    code = cli.main(["eval", str(run), "--tasks", "1"])  # the run folder: its latest checkpoint
    line = one_error_line(capsys.readouterr().err)
    assert code != 0
    assert "manifest.json" in line and "older rwcore" in line


def test_bit_flips_at_many_offsets_are_all_detected(run):
    from rwcore.trainer.checkpoint import CheckpointError, verify

    folder = checkpoint_folder(run, 2)
    verify(folder)  # the untouched checkpoint passes
    rng = random.Random(13)
    cases = 0
    for name in FILES:
        path = folder / name
        original = path.read_bytes()
        size = len(original)
        offsets = sorted(
            {0, 1, size // 7, size // 3, size // 2, 2 * size // 3, size - 2, size - 1, *rng.sample(range(size), 8)}
        )
        for offset in offsets:
            bit = rng.randrange(8)
            flip(path, offset, bit)
            with pytest.raises(CheckpointError) as caught:
                verify(folder)
            assert str(path) in str(caught.value), (name, offset, bit)
            path.write_bytes(original)
            cases += 1
        verify(folder)  # restored: passes again
    assert cases == 64


def test_truncation_and_extra_or_missing_files_are_detected(run):
    from rwcore.trainer.checkpoint import CheckpointError, verify

    folder = checkpoint_folder(run, 2)
    state = folder / "state.pt"
    original = state.read_bytes()
    state.write_bytes(original[: len(original) // 2])
    with pytest.raises(CheckpointError, match="state.pt has"):
        verify(folder)
    state.write_bytes(original)
    (folder / "rng_rank1.pt").write_bytes(b"unlisted")
    with pytest.raises(CheckpointError, match="rng_rank1.pt is not listed"):
        verify(folder)
    (folder / "rng_rank1.pt").unlink()
    (folder / "optimizer.pt").unlink()
    with pytest.raises(CheckpointError, match="optimizer.pt is missing"):
        verify(folder)


# ------------------------------------------------------------------------------------------ --resume


def test_resume_falls_back_to_the_newest_intact_checkpoint_and_says_so(run, source_run, capsys):
    state = checkpoint_folder(run, 2) / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])  # truncated, as by a crash of an unsafe copy
    code = cli.main(["train", "--resume", str(run), "--quiet"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert "step_000002" in lines[0] and "state.pt" in lines[0] and "step_000001" in lines[0]
    # resumed at step 1, step 2 trained again: the same metrics as the uninterrupted run
    assert without_timing(metrics_rows(run)) == without_timing(metrics_rows(source_run))


def test_resume_with_no_intact_checkpoint_names_the_run_folder(run, capsys):
    flip(checkpoint_folder(run, 2) / "model.pt", 5000, 0)
    state = checkpoint_folder(run, 1) / "state.pt"
    state.write_bytes(state.read_bytes()[:-10])
    metrics = (run / "metrics.jsonl").read_bytes()
    code = cli.main(["train", "--resume", str(run), "--quiet"])
    line = one_error_line(capsys.readouterr().err)
    assert code != 0
    assert str(run) in line and "no intact checkpoint" in line
    assert (run / "metrics.jsonl").read_bytes() == metrics  # nothing was changed


# ------------------------------------------------------------------------------------------ safe loading


class _Marker:
    """Unpickling this creates a file: the stand-in for code a crafted checkpoint would run."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("command", ["eval", "resume"])
def test_a_crafted_state_pt_is_refused_and_runs_no_code(run, tmp_path, capsys, command):
    marker = tmp_path / "marker"
    folder = checkpoint_folder(run, 2)
    torch.save({"step": 2, "payload": _Marker(marker)}, folder / "state.pt")
    hand_written_manifest(folder, 2)  # a forger can always write a matching manifest
    argv = ["eval", str(folder), "--tasks", "1"] if command == "eval" else ["train", "--resume", str(run), "--quiet"]
    try:
        code = cli.main(argv)
    except Exception:  # what matters below is that the marker is absent
        code = None
    assert not marker.exists()
    line = one_error_line(capsys.readouterr().err)
    assert code not in (0, None)
    assert str(folder / "state.pt") in line and "weights_only" in line


@pytest.mark.parametrize(
    "command,name",
    # every command that reads the file (rw eval and rw export read no optimizer state)
    [("resume", "model.pt"), ("resume", "optimizer.pt"), ("eval", "model.pt"), ("export", "model.pt")],
)
def test_a_crafted_model_or_optimizer_file_is_one_line_naming_it_on_every_command(run, tmp_path, capsys, command, name):
    marker = tmp_path / "marker"
    folder = checkpoint_folder(run, 2)
    torch.save({"payload": _Marker(marker)}, folder / name)
    hand_written_manifest(folder, 2)
    argv = {
        "eval": ["eval", str(folder), "--tasks", "1"],
        "resume": ["train", "--resume", str(run), "--quiet"],
        "export": ["export", str(run), "--step", "2", "--out", str(tmp_path / "exported")],
    }[command]
    code = cli.main(argv)
    assert not marker.exists()
    line = one_error_line(capsys.readouterr().err)
    assert code not in (0, None)
    assert str(folder / name) in line and "weights_only" in line


def test_every_checkpoint_file_loads_with_weights_only(source_run):
    files = sorted(checkpoint_folder(source_run, 2).glob("*.pt"))
    assert [p.name for p in files] == ["model.pt", "optimizer.pt", "state.pt"]
    for path in files:
        torch.load(path, weights_only=True)


def _torch_load_calls() -> list[tuple[str, int, object]]:
    found = []
    for folder in ("trainer", "rwcore", "kernels"):
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "load"
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "torch"
                ):
                    value = next((k.value for k in node.keywords if k.arg == "weights_only"), None)
                    found.append(
                        (
                            str(path.relative_to(REPO)),
                            node.lineno,
                            value.value if isinstance(value, ast.Constant) else value,
                        )
                    )
    return found


def test_every_torch_load_in_the_package_is_weights_only():
    calls = _torch_load_calls()
    # the two readers every .pt goes through: checkpoints (which the engines also use) and the prior cache
    assert {path for path, _, _ in calls} >= {"trainer/checkpoint.py", "trainer/prior/cache.py"}, calls
    assert [c for c in calls if c[2] is not True] == []


# ------------------------------------------------------------------------------------------ writing


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def test_files_and_folders_are_fsynced_around_the_rename(tmp_path, monkeypatch):
    trainer = Trainer(load_config(None, [*SMALL, "train.steps=1"]), tmp_path / "run", quiet=True)
    trainer.setup()
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", _fd_path(fd)))
        return real_fsync(fd)

    def replace(src, dst, *args, **kwargs):
        events.append(("replace", str(src), str(dst)))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    try:
        target = trainer.save_checkpoint()
    finally:
        trainer.cleanup()
    staging = str(target.parent / f".{target.name}.tmp")
    renames = [i for i, e in enumerate(events) if e[0] == "replace" and e[1] == staging and e[2] == str(target)]
    assert len(renames) == 1, events
    before = {e[1] for e in events[: renames[0]] if e[0] == "fsync"}
    after = {e[1] for e in events[renames[0] :] if e[0] == "fsync"}
    for name in ("model.pt", "optimizer.pt", "state.pt", "manifest.json"):
        assert f"{staging}/{name}" in before, name
    assert staging in before  # the staging folder's entries
    assert str(target.parent) in after  # the rename itself


@pytest.mark.parametrize("name", ["model.pt", "state.pt", "manifest.json"])
def test_disk_full_while_checkpointing_gives_one_line_and_leaves_no_temporaries(tmp_path, capsys, monkeypatch, name):
    out = tmp_path / "run"
    real_save, real_fsync = torch.save, os.fsync
    state = {"armed": False}

    def full(target):
        return state["armed"] and str(target).endswith("/" + name)

    def save(obj, f, *args, **kwargs):
        target = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", "")
        if full(target):
            if hasattr(f, "write"):
                f.write(b"PK\x03\x04 half")
            else:
                Path(target).write_bytes(b"PK\x03\x04 half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, f, *args, **kwargs)

    def fsync(fd):
        if full(_fd_path(fd)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    real_checkpoint = Trainer.save_checkpoint

    def save_checkpoint(self):
        state["armed"] = self.step == 2  # the checkpoint of step 1 is written; step 2's disk is full
        return real_checkpoint(self)

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Trainer, "save_checkpoint", save_checkpoint)
    code = None
    try:
        code = cli.main(["train", "--out", str(out), "--quiet", *SMALL])
    finally:
        err = capsys.readouterr().err
    line = one_error_line(err)
    assert code not in (0, None)
    assert "No space left on device" in line and str(out / "checkpoints") in line
    assert no_temporaries(out)
    assert (out / "checkpoints" / "latest").read_text() == "step_000001"
    assert not checkpoint_folder(out, 2).exists()


@pytest.mark.parametrize("case", ["under_a_file", "checkpoints_is_a_file", "metrics_is_a_folder"])
def test_an_output_path_that_cannot_be_written_gives_one_line(tmp_path, capsys, case):
    if case == "under_a_file":  # fails for root as well (tests may run as root, where chmod does not)
        (tmp_path / "file").write_text("x")
        out, culprit = tmp_path / "file" / "run", tmp_path / "file"
    elif case == "checkpoints_is_a_file":
        out = tmp_path / "run"
        out.mkdir()
        culprit = out / "checkpoints"
        culprit.write_text("x")
    else:
        out = tmp_path / "run"
        culprit = out / "metrics.jsonl"
        culprit.mkdir(parents=True)
    code = None
    try:
        code = cli.main(["train", "--out", str(out), "--quiet", *SMALL, "train.steps=1"])
    finally:
        err = capsys.readouterr().err
    line = one_error_line(err)
    assert code not in (0, None)
    if case == "under_a_file":
        assert str(culprit) in line
    else:  # a folder holding something that is not a run is refused before anything is written, naming it
        assert str(out) in line and culprit.name in line and "holds no run" in line
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))


def test_leftover_temporaries_are_removed_at_start_and_nothing_else(run, capsys):
    project = [
        run / "checkpoints" / ".step_000003.tmp",  # a staging folder of a killed run
        run / "checkpoints" / ".latest.ab12cd_3.tmp",
        run / ".metrics.jsonl.k2j4h6g8.tmp",
        run / ".pool_counts.json.zz99yy88.tmp",
    ]
    project[0].mkdir()
    (project[0] / "model.pt").write_bytes(b"half")
    for path in project[1:]:
        path.write_bytes(b"half")
    foreign = [
        run / "notes.tmp",
        run / ".mydata.abcd1234.tmp",
        run / "checkpoints" / ".other.tmp",
        run / "checkpoints" / "step_000002.tmp",
    ]
    for path in foreign:
        path.write_bytes(b"keep")
    assert cli.main(["train", "--resume", str(run), "--quiet"]) == 0  # a finished run: nothing to train
    assert [p for p in project if p.exists()] == []
    assert [p for p in foreign if not p.exists()] == []


def test_state_encoding_round_trips_exactly_and_refuses_other_objects(tmp_path):
    import numpy as np

    from rwcore.trainer.checkpoint import CheckpointError, load, save
    from rwcore.trainer.envs.base import Outcome
    from rwcore.trainer.rollout import Rollout
    from rwcore.types import Trajectory, Turn

    np.random.seed(5)
    np.random.random(3)
    rollout = Rollout(
        Trajectory(
            "t1",
            [Turn("user", "hi"), Turn("assistant", "yo", True)],
            0.5,
            ("a",),
            token_spans=((1, 3),),
            metadata={"env_state": {"offers": [1, 2]}},
        ),
        Outcome(0.5, False, "why"),
        [1, 2, 3],
        [False, True, True],
        torch.tensor([0.0, -0.5, -1.25]),
        7,
    )
    state = {
        "numpy": np.random.get_state(),
        "f32": np.float32(0.1),
        "i64": np.int64(-3),
        "array": np.arange(6, dtype=np.uint32).reshape(2, 3),
        "tensor": torch.tensor([1.5]),
        "tuple": (1, "a", None),
        "set": {1, 2},
        "bytes": b"\x00\xff",
        "rollouts": {4: [rollout]},
    }
    path = tmp_path / "state.pt"
    save(state, path)
    torch.load(path, weights_only=True)  # the restricted unpickler accepts the file as written
    back = load(path)
    kind, key, pos, has_gauss, cached = back["numpy"]
    assert kind == "MT19937" and key.dtype == np.uint32 and (key == state["numpy"][1]).all()
    assert (pos, has_gauss, cached) == state["numpy"][2:]
    assert type(back["f32"]) is np.float32 and back["f32"] == np.float32(0.1)
    assert type(back["i64"]) is np.int64 and back["i64"] == -3
    assert back["array"].dtype == np.uint32 and back["array"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert back["tensor"].tolist() == [1.5] and back["tuple"] == (1, "a", None) and back["set"] == {1, 2}
    assert back["bytes"] == b"\x00\xff"
    got = back["rollouts"][4][0]
    assert type(got) is Rollout and got.trajectory == rollout.trajectory and got.outcome == rollout.outcome
    assert type(got.trajectory.turns[1]) is Turn and got.trajectory.token_spans == ((1, 3),)
    assert (got.token_ids, got.generated, got.behavior_version) == ([1, 2, 3], [False, True, True], 7)
    assert got.behavior_logprobs.tolist() == [0.0, -0.5, -1.25]
    np.random.set_state(back["numpy"])
    assert np.random.random() == (np.random.seed(5), np.random.random(3), np.random.random())[2]
    refused = [{"x": object()}, {"f": lambda: 0}, {"a": np.array([None], dtype=object)}]
    for bad in refused:
        with pytest.raises(TypeError, match=f"state.pt\\[{next(iter(bad))!r}\\]"):
            save(bad, tmp_path / "state.pt")
    torch.save({"__rwcore_type__": "record", "name": "Popen", "fields": {}}, tmp_path / "forged.pt")
    with pytest.raises(CheckpointError, match="unknown type 'Popen'"):
        load(tmp_path / "forged.pt")
