"""One writer per run folder: `rw train` (new, `--resume`, `--overwrite`) and `rw ablate` hold an advisory lock
on the folder they write (`.rw.lock` inside it) for their whole life, so a second writer is refused with one
line naming the folder and the holder's pid, and changes nothing. A lock left by a dead process is taken over;
a lock file that is not a regular file is refused. `rw ablate` killed with SIGKILL leaves no `rw train` behind,
and a rerun counts a run finished only when it ran exactly once to its last step.

The first writer is a real `rw train` process (or a process holding the lock through
`rwcore.trainer.run_lock`); the second goes through the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _util import TINY_RUN, ablate_command, child_env, metrics_rows, overrides_with, train_steps

from rwcore.trainer.cli import main

LONG = "train.steps=3000"  # a run that is still training when the second writer comes
ENV = child_env(MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
# run_lock.py needs only the standard library: loaded from its file, the holder starts without importing torch
HOLD = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('run_lock', sys.argv[1])\n"
    "run_lock = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(run_lock)\n"
    "locks = [run_lock.acquire(folder) for folder in sys.argv[2:]]\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
)


def _busy(folder: Path, pid: int) -> str:
    return f"rw: error: {folder} is being written by another process (pid {pid}); wait for it or stop it\n"


def _start(tmp_path: Path, *args: str) -> subprocess.Popen:
    """A real `rw train` process; its output goes to files (a pipe nobody reads would stall it)."""
    log = tmp_path / f"train-{time.monotonic_ns()}"
    with open(f"{log}.out", "wb") as out, open(f"{log}.err", "wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "rwcore.trainer", "train", "--quiet", *map(str, args)],
            env=ENV,
            stdout=out,
            stderr=err,
        )
    process.err_path = Path(f"{log}.err")
    return process


def _hold(*folders: Path) -> subprocess.Popen:
    """A process that holds the lock of `folders` (through rwcore.trainer.run_lock) until its stdin closes."""
    from rwcore.trainer import run_lock

    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, run_lock.__file__, *map(str, folders)],
        env=ENV,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    if line.strip() != "held":
        process.kill()
        raise AssertionError(f"the holder did not take the lock: {line!r} {process.stderr.read()}")
    return process


def _let_go(process: subprocess.Popen) -> None:
    process.communicate(timeout=30)
    assert process.returncode == 0


def _wait_for(path: Path, process: subprocess.Popen | None = None, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the process ended ({process.returncode}) before {path} was written")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} was not written within {timeout} s")
        time.sleep(0.1)


def _one_run_of(run: Path, last: int | None = None) -> list[int]:
    """metrics.jsonl holds one run: train steps 1..n, each once, and one evaluation at step 0."""
    steps = train_steps(run)
    assert steps == list(range(1, len(steps) + 1)), steps
    assert [row["step"] for row in metrics_rows(run) if row.get("kind") == "eval"].count(0) == 1
    if last is not None:
        assert steps[-1] == last
    return steps


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() and not p.is_symlink() else b"<other>")
        for p in sorted(folder.rglob("*"))
    }


def _dead(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished two-step run to copy."""
    run = tmp_path_factory.mktemp("finished") / "run"
    assert main(["train", "--out", str(run), "--quiet", *TINY_RUN]) == 0
    return run


# ---- a live rw train against every second writer ---------------------------------------------------


def _refuses_every_second_writer(run: Path, holder: subprocess.Popen, capsys) -> None:
    """A new run, --resume and --overwrite on `run` while `holder` trains there: each refused with the holder's
    pid, removing and changing nothing of the run."""
    config = (run / "config.yaml").read_bytes()
    for argv in (
        ["--out", str(run), *TINY_RUN],
        ["--resume", str(run)],
        ["--out", str(run), "--overwrite", *TINY_RUN],
    ):
        assert main(["train", "--quiet", *argv]) == 2, argv
        assert capsys.readouterr().err == _busy(run, holder.pid), argv
        assert holder.poll() is None
        assert (run / "config.yaml").read_bytes() == config
        assert (run / "checkpoints" / "step_000001").is_dir() and (run / "metrics.jsonl").is_file()
    assert (run / ".rw.lock").read_text().split() == [str(holder.pid)]


def test_a_live_run_refuses_every_second_writer_and_keeps_one_history(tmp_path, capsys):
    """Two `rw train --out D` started together on one empty folder: one trains, the other is refused naming it
    (both were accepted before, and wrote 68 rows for 30 steps). The one that trains is the first writer, a
    real `rw train` in the middle of training; then the same run resumed after a kill -9 (its lock file left
    behind with a dead pid); then --overwrite of that run. Against each, a new run, --resume and --overwrite
    are refused naming its pid and remove nothing; once it is stopped the next writer takes the lock over;
    metrics.jsonl holds each step once throughout."""
    run = tmp_path / "run"
    run.mkdir()
    holders = []
    try:
        racers = [_start(tmp_path, "--out", run, *TINY_RUN, LONG) for _ in range(2)]
        holders += racers
        _wait_for(run / "checkpoints" / "step_000001")
        deadline = time.monotonic() + 30
        while all(racer.poll() is None for racer in racers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [racer.poll() is None for racer in racers].count(True) == 1, "both fresh starts are training"
        new, loser = racers if racers[1].poll() is not None else racers[::-1]
        assert loser.returncode == 2 and loser.err_path.read_text() == _busy(run, new.pid)
        _refuses_every_second_writer(run, new, capsys)
        new.kill()  # a killed run: its lock file stays behind with a dead pid
        new.wait(timeout=30)
        from rwcore.trainer.run_lock import holder as lock_holder

        assert (run / ".rw.lock").read_text().split() == [str(new.pid)] and lock_holder(run) is None
        at = _one_run_of(run)[-1]

        resumed = _start(tmp_path, "--resume", run)  # takes the stale lock over
        holders.append(resumed)
        _wait_for(run / "checkpoints" / f"step_{at + 2:06d}", resumed)
        _refuses_every_second_writer(run, resumed, capsys)
        resumed.send_signal(signal.SIGTERM)
        assert resumed.wait(timeout=60) == -signal.SIGTERM
        last = _one_run_of(run)[-1]
        assert last >= at + 2  # continued from the checkpoint, no step twice
        assert lock_holder(run) is None  # the kernel let go of it with the process

        replaced = _start(tmp_path, "--out", run, "--overwrite", *TINY_RUN, LONG)
        holders.append(replaced)
        _wait_for(run / "checkpoints" / f"step_{last + 1:06d}", replaced)  # past the old run's last step
        _refuses_every_second_writer(run, replaced, capsys)
        replaced.send_signal(signal.SIGTERM)
        replaced.wait(timeout=60)
    finally:
        for process in holders:
            _stop(process)
    assert len(_one_run_of(run)) >= last + 1


def test_a_process_holding_the_lock_refuses_every_writer_and_nothing_changes(tmp_path, capsys, finished_run):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    empty = tmp_path / "empty"
    empty.mkdir()
    holder = _hold(run, empty)
    try:
        before = {folder: _tree(folder) for folder in (run, empty)}
        assert set(before[empty]) == {".rw.lock"}
        for folder, argv in (
            (empty, ["--out", str(empty), *TINY_RUN]),
            (run, ["--out", str(run), *TINY_RUN]),
            (run, ["--resume", str(run)]),
            (run, ["--out", str(run), "--overwrite", *TINY_RUN]),
        ):
            assert main(["train", "--quiet", *argv]) == 2, argv
            assert capsys.readouterr().err == _busy(folder, holder.pid), argv
            assert {f: _tree(f) for f in (run, empty)} == before, argv
    finally:
        _let_go(holder)
    assert main(["train", "--out", str(empty), "--quiet", *TINY_RUN]) == 0  # free again once the holder let go
    _one_run_of(empty, last=2)


# ---- stale and bad lock files ----------------------------------------------------------------------


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


class _Recorder:
    """Stands in for the trainer (the lock is the CLI's business): records the lock file as setup() sees it."""

    seen: list = []

    def __init__(self, config, out_dir, quiet=False):
        self.out = Path(out_dir)

    @classmethod
    def resume(cls, run_dir, quiet=False, overrides=()):
        from rwcore.trainer.config import Config

        trainer = cls(None, run_dir, quiet)
        trainer.config = Config()  # what the resume line reads: the steps, and the checkpoint continued from
        trainer.resumed = {"checkpoint": str(Path(run_dir) / "checkpoints" / "step_000002"), "step": 2}
        return trainer

    def setup(self):
        _Recorder.seen.append((self.out / ".rw.lock").read_text())

    def train(self):
        pass

    def cleanup(self):
        pass


@pytest.mark.parametrize("command", ["new", "resume", "overwrite"])
def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, capsys, monkeypatch, finished_run, command):
    """A killed writer leaves `.rw.lock` with its pid; the kernel let go of the lock when it died, so the
    next writer takes it over without a word (and the lock file does not make the folder someone's files)."""
    from rwcore.trainer.cli import training

    run = tmp_path / "run"
    if command == "new":
        run.mkdir()
    else:
        shutil.copytree(finished_run, run)
    (run / ".rw.lock").write_text(f"{_dead_pid()}\n")
    monkeypatch.setattr(training, "_trainer_class", lambda: _Recorder)
    _Recorder.seen = []
    argv = {
        "new": ["--out", str(run), *TINY_RUN],
        "resume": ["--resume", str(run)],
        "overwrite": ["--out", str(run), "--overwrite", *TINY_RUN],
    }[command]
    assert main(["train", "--quiet", *argv]) == 0
    assert "error" not in capsys.readouterr().err
    assert _Recorder.seen == [f"{os.getpid()}\n"]  # taken over: it names this process while the run trains
    if command == "overwrite":
        assert not (run / "metrics.jsonl").exists()  # the old run was removed, the lock kept meanwhile
    assert not (run / ".rw.lock").exists()  # and removed when the run ended


def test_a_lock_held_by_a_killed_holder_is_free(tmp_path, capsys, monkeypatch):
    from rwcore.trainer.cli import training
    from rwcore.trainer.run_lock import holder as lock_holder

    run = tmp_path / "run"
    holder = _hold(run)
    assert lock_holder(run) == holder.pid
    holder.kill()
    holder.communicate(timeout=30)
    assert (run / ".rw.lock").read_text().split() == [str(holder.pid)]  # left behind, naming a dead process
    assert lock_holder(run) is None
    monkeypatch.setattr(training, "_trainer_class", lambda: _Recorder)
    _Recorder.seen = []
    assert main(["train", "--out", str(run), "--quiet", *TINY_RUN]) == 0
    assert _Recorder.seen == [f"{os.getpid()}\n"]


def _bad_lock(run: Path, kind: str, outside: Path) -> None:
    lock = run / ".rw.lock"
    if kind == "symlink":
        lock.symlink_to(outside)
    elif kind == "dangling symlink":
        lock.symlink_to(outside.parent / "nowhere")
    elif kind == "fifo":
        os.mkfifo(lock)
    elif kind == "folder":
        lock.mkdir()
    else:  # a hard link to a file of the user's: writing a pid into it would overwrite theirs
        os.link(outside, lock)


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "fifo", "folder", "hard link"])
@pytest.mark.parametrize("command", ["new", "resume"])
def test_a_lock_file_that_is_not_a_plain_file_is_refused(tmp_path, capsys, finished_run, kind, command):
    run = tmp_path / "run"
    if command == "new":
        run.mkdir()
    else:
        shutil.copytree(finished_run, run)
    outside = tmp_path / "users_file.txt"
    outside.write_text("precious\n")
    _bad_lock(run, kind, outside)
    before = _tree(run)
    argv = ["--out", str(run), *TINY_RUN] if command == "new" else ["--resume", str(run)]
    started = time.monotonic()
    assert main(["train", "--quiet", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rw: error: {run / '.rw.lock'} ") and err.count("\n") == 1, err
    assert "lock" in err.split(str(run / ".rw.lock"), 1)[1]
    assert time.monotonic() - started < 10
    assert _tree(run) == before and outside.read_text() == "precious\n"


# ---- rw ablate --------------------------------------------------------------------------------------

ABLATE_TINY = overrides_with(TINY_RUN, drop=["train.steps", "train.method"])


def _ablate_command(out: Path, steps: int) -> list[str]:
    return ablate_command(out, *ABLATE_TINY, variants="rw_outcome_grpo", seeds="0", steps=steps, jobs=1)


def test_rw_ablate_refuses_an_out_another_process_writes(tmp_path, capsys):
    out = tmp_path / "abl"
    out.mkdir()
    holder = _hold(out)
    try:
        before = _tree(out)
        assert main(_ablate_command(out, 1)[3:]) == 2
        assert _tree(out) == before == {".rw.lock": f"{holder.pid}\n".encode()}  # nothing written
    finally:
        _let_go(holder)
    assert capsys.readouterr().err == _busy(out, holder.pid)


def test_rw_ablate_waits_for_a_run_another_process_writes_then_refuses_it(tmp_path, monkeypatch, capsys):
    from rwcore.trainer import ablate

    out = tmp_path / "abl"
    cell = out / "runs" / "rw_outcome_grpo-s0"
    cell.mkdir(parents=True)
    plan = ablate.plan_ablation("rewardweaver", ["rw_outcome_grpo"], [0], 2, 1, out, ABLATE_TINY)
    started = []

    def launch(command, **kwargs):
        started.append(command)
        raise AssertionError("nothing may start while another process writes the run")

    monkeypatch.setattr(ablate.runner, "CELL_WAIT_SECONDS", 1.0)
    holder = _hold(cell)
    try:
        clock = time.monotonic()
        with pytest.raises(ValueError) as refused:
            ablate.run_ablation(plan, progress=False, launch=launch)
        waited = time.monotonic() - clock
    finally:
        _let_go(holder)
    assert str(refused.value) == _busy(cell, holder.pid).removeprefix("rw: error: ").rstrip("\n")
    assert started == [] and waited >= 1.0
    assert f"{cell} is being written by another process (pid {holder.pid}); waiting" in capsys.readouterr().err
    assert not (out / "ablation.md").exists() and not (cell / "ablation.log").exists()
    assert not (out / "ablation_settings.json").exists()


class _Done:
    """A stand-in for an `rw train` process that has already written what `files` writes and exited 0."""

    def __init__(self, write):
        self.write = write

    def poll(self):
        if self.write is not None:
            self.write()
            self.write = None
        return 0

    def wait(self, timeout=None):
        return 0

    def terminate(self):
        pass


def _write_run(run: Path, train_steps, eval_steps, checkpoint: int | None) -> None:
    rows = [{"step": s, "kind": "eval", "eval/success_rate": 0.5, "eval/success_se": 0.1} for s in eval_steps]
    rows += [{"step": s, "kind": "train"} for s in train_steps]
    rows.sort(key=lambda row: row["step"])
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    if checkpoint is not None:
        (run / "checkpoints" / f"step_{checkpoint:06d}").mkdir(parents=True)
        (run / "checkpoints" / f"step_{checkpoint:06d}" / "manifest.json").write_text("{}")
        (run / "checkpoints" / "latest").write_text(f"step_{checkpoint:06d}")


def test_rw_ablate_counts_a_run_finished_only_when_it_ran_once_to_its_last_step(tmp_path, monkeypatch):
    """Exit 0 and a held-out evaluation are not enough (that is how a second writer's run got counted):
    each training step of 1..N once in metrics.jsonl and the last step's checkpoint too."""
    from rwcore.trainer import ablate

    monkeypatch.setattr(ablate.runner.time, "sleep", lambda s: None)
    variants = ["rw_outcome_grpo", "rw_static_topk", "rw_random_active_set", "rewardweaver"]
    plan = ablate.plan_ablation("rewardweaver", variants, [0], 2, 4, tmp_path / "abl", ABLATE_TINY)
    shapes = {
        "rw_outcome_grpo": ([1, 2], [0, 2], 2),  # a whole run: finished
        "rw_static_topk": ([1], [0, 1], 1),  # stopped at step 1 of 2
        "rw_random_active_set": ([1, 2, 1, 2], [0, 2, 2], 2),  # two writers interleaved
        "rewardweaver": ([1, 2], [0, 2], 1),  # no checkpoint of the last step
    }

    def launch(command, **kwargs):
        variant = next(a.split("=", 1)[1] for a in command if a.startswith("train.method="))
        run = plan.runs_dir / f"{variant}-s0"
        return _Done(lambda: _write_run(run, *shapes[variant]))

    summary = ablate.run_ablation(plan, progress=False, launch=launch)
    status = {row["variant"]: row["seeds"]["0"] for row in summary["rows"]}
    assert status["rw_outcome_grpo"]["status"] == "finished"
    for variant in variants[1:]:
        assert status[variant]["status"] == "failed", variant
    assert "step 1 of 2" in status["rw_static_topk"]["error"]
    assert "step 1" in status["rw_random_active_set"]["error"] and "2 times" in status["rw_random_active_set"]["error"]
    assert "checkpoint" in status["rewardweaver"]["error"]


def test_rw_ablate_killed_with_sigkill_leaves_no_rw_train_and_a_rerun_finishes_each_run_once(tmp_path):
    """kill -9 of `rw ablate` mid-run: its `rw train` dies with it (parent-death signal) within seconds and
    lets go of the run's lock; the same command again at once resumes the run (it does not wait on an orphan or
    start a second writer), and the run the table calls finished ran each step once to its last."""
    out = tmp_path / "abl"
    steps = 10
    run = out / "runs" / "rw_outcome_grpo-s0"
    command = _ablate_command(out, steps)
    first = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children, again = [], None
    try:
        _wait_for(run / "checkpoints" / "step_000002", first)
        children = _children(first.pid)
        assert len(children) == 1
        killed = time.monotonic()
        first.kill()
        first.wait(timeout=30)
        again = subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while not _dead(children[0]) and time.monotonic() - killed < 10:
            time.sleep(0.05)
        died_after = time.monotonic() - killed
        assert _dead(children[0]), "rw train outlived the rw ablate that started it"
        stopped_at = train_steps(run)[-1]
        assert stopped_at < steps  # it was stopped, not left to train to the end
        _, err = again.communicate(timeout=300)
        assert again.returncode == 0, err
    finally:
        for process in (first, again):
            if process is not None:
                _stop(process)
        for pid in children:
            if not _dead(pid):
                os.kill(pid, signal.SIGKILL)
    print(f"rw train died {died_after:.2f} s after rw ablate was killed, at step {stopped_at} of {steps}")
    assert f"--resume {run}" in (run / "ablation.log").read_text()
    _one_run_of(run, last=steps)
    summary = json.loads((out / "ablation.json").read_text())
    entry = summary["rows"][0]["seeds"]["0"]
    assert entry["status"] == "finished" and entry["final_step"] == steps
    from rwcore.trainer.run_lock import holder as lock_holder

    assert lock_holder(run) is None and lock_holder(out) is None
