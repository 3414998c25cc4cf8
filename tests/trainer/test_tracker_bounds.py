"""Trackers that cannot be trusted to answer or to keep what they get are named and dropped within a stated bound,
and training goes on (rwcore/trainer/trackers.py: `BOUNDS`, `REACH_SECONDS`; docs/trackers.md, "Failures").

The servers are real sockets on loopback: one with nothing listening, one that accepts and never answers. The
read-only store is a real read-only tmpfs, mounted in a user and mount namespace of the `rw train` child
(`unshare -rm`), so the kernel answers EROFS as on a read-only mount; nothing is mounted on the host."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _util import TINY_RUN, metrics_rows

from rwcore.trainer import tracker_guard, trackers
from rwcore.trainer.cli import main

TRACKER_ENV = ("WANDB_", "MLFLOW_", "TRACKIO_", "TENSORBOARD_")


@pytest.fixture
def clean_env():
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith(TRACKER_ENV):
            del os.environ[name]
    yield os.environ
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def silent_server():
    """A loopback server that accepts every connection and never answers (a hung proxy or server)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for connection in held:
        connection.close()
    server.close()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again on return: nothing listens there


@pytest.mark.parametrize("server", ["silent", "nothing listening"])
def test_an_mlflow_server_that_never_answers_is_named_and_dropped_and_the_run_trains(
    tmp_path, capsys, clean_env, silent_server, server
):
    """MLFLOW_TRACKING_URI at a listener that never answers (the run waited 540 s with nothing on screen) or at a
    closed port (297 s of retries): the run starts training within the reachability bound plus its own start,
    one line names MLflow and the address, and every step is trained and logged to metrics.jsonl."""
    url = silent_server if server == "silent" else f"http://127.0.0.1:{_closed_port()}"
    clean_env["MLFLOW_TRACKING_URI"] = url
    run = tmp_path / "run"
    started = time.monotonic()
    assert main(["train", "--out", str(run), "--quiet", *TINY_RUN, "train.loggers=[mlflow]"]) == 0
    took = time.monotonic() - started
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "tracker" in line and not line.startswith("rw: waiting for")]
    assert len(lines) == 1 and "rw: tracker mlflow failed at start" in lines[0] and url in lines[0], err
    assert ("did not answer within 5 s" if server == "silent" else "cannot be reached") in lines[0]
    assert "Traceback" not in err
    assert [row["step"] for row in metrics_rows(run, "train")] == [1, 2]
    # the bound: the reachability check's 5 s and a tiny run; MLflow's own retries took 297 s and more
    assert took < tracker_guard.REACH_SECONDS + 60, took


def test_a_tracker_call_that_hangs_is_dropped_at_its_bound_with_a_line_while_it_waits(monkeypatch, capsys):
    """Any tracker call that does not return (a server that stops answering mid-run) ends at its bound: a line
    after WAIT_NOTICE seconds says which tracker waits and for how long at most, then it is dropped; the process
    is not held by the hung call."""
    monkeypatch.setattr(tracker_guard, "WAIT_NOTICE", 0.2)
    monkeypatch.setitem(tracker_guard.BOUNDS, "log", 0.6)
    group = trackers.Trackers([], "rw")
    hung = threading.Event()

    class Hanging(trackers.Tracker):
        name = "hanging"

        def log(self, metrics, step):
            hung.wait()  # never set: the call does not return

        def close(self, complete=True):
            raise AssertionError("a hung tracker is not closed again")

    group.active = [Hanging("rw")]
    started = time.monotonic()
    group.log({"step": 1, "kind": "train", "loss": 1.0})
    took = time.monotonic() - started
    err = capsys.readouterr().err.splitlines()
    assert group.active == [] and 0.6 <= took < 5, took
    assert err[0] == "rw: waiting for tracker hanging (log); it is dropped if it does not answer within 1 s"
    assert err[1].startswith("rw: tracker hanging failed at log (TrackerTimeout: no answer within 1 s); dropped it")
    assert len(err) == 2
    group.log({"step": 2, "kind": "train", "loss": 1.0})  # dropped: gets nothing more
    group.close()
    hung.set()


def test_stores_on_a_read_only_mount_are_named_and_dropped_and_the_run_trains(tmp_path):
    """TRACKIO_DIR and MLFLOW_TRACKING_URI's sqlite file on a read-only mount: trackio was reported as working and
    stored nothing, MLflow retried for about 105 s. Each is one line naming its store and the read-only file
    system; the run trains every step."""
    store = tmp_path / "readonly"
    store.mkdir()
    out = tmp_path / "run"
    script = (
        "import os, subprocess, sys\n"
        f"subprocess.run(['mount', '-t', 'tmpfs', '-o', 'ro,size=1m', 'tmpfs', {str(store)!r}], check=True)\n"
        "from rwcore.trainer.cli import main\n"
        f"sys.exit(main(['train', '--out', {str(out)!r}, '--quiet', *{list(TINY_RUN)!r}, "
        "'train.loggers=[mlflow,trackio]']))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(TRACKER_ENV)}
    env.update(OMP_NUM_THREADS="1", TRACKIO_DIR=str(store), MLFLOW_TRACKING_URI=f"sqlite:///{store}/mlflow.db")
    started = time.monotonic()
    done = subprocess.run(
        ["unshare", "-rm", sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    took = time.monotonic() - started
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, done.stderr
    mlflow, trackio = sorted(lines)
    assert mlflow.startswith("rw: tracker mlflow failed at start") and str(store) in mlflow
    assert trackio.startswith("rw: tracker trackio failed at start") and str(store) in trackio
    assert "TRACKIO_DIR" in trackio and all("Read-only file system" in line for line in lines)
    assert [row["step"] for row in metrics_rows(Path(out), "train")] == [1, 2]
    assert took < 100, took  # MLflow alone retried for about 105 s


def test_a_full_disk_with_three_trackers_on_is_one_line_per_tracker_and_one_error_no_traceback(tmp_path):
    """A real ENOSPC (a 600 KiB tmpfs in the child's own namespaces) with TensorBoard, MLflow and trackio on: the
    clean `rw: error: cannot write ...` line used to come after 337 stderr lines holding 8 tracebacks (TensorBoard's
    writer thread, MLflow's SQLAlchemy, trackio's warnings). Now every stderr line is rw's: at most one per tracker
    (named), then the error."""
    disk = tmp_path / "disk"
    disk.mkdir()
    out = disk / "run"
    script = (
        "import subprocess, sys\n"
        f"subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=600k', 'tmpfs', {str(disk)!r}], check=True)\n"
        "from rwcore.trainer.cli import main\n"
        f"sys.exit(main(['train', '--out', {str(out)!r}, '--quiet', *{list(TINY_RUN)!r}, 'train.steps=6', "
        "'train.loggers=[tensorboard,mlflow,trackio]']))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(TRACKER_ENV)}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        ["unshare", "-rm", sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert all(line.startswith("rw: ") for line in lines), done.stderr[-3000:]
    assert lines[-1].startswith("rw: error: cannot write ") and "No space left on device" in lines[-1]
    warned = [line.split()[2] for line in lines[:-1] if " warns: " in line]
    failed = [line.split()[2].rstrip(":") for line in lines[:-1] if " warns: " not in line]
    for named in (warned, failed):  # one line per tracker for each: what it warned first, why it was dropped
        assert len(named) == len(set(named)) and set(named) <= {"tensorboard", "mlflow", "trackio"}, lines
