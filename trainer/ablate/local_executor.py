"""Where the runs of a table run by default: each `rw train` a child process of `rw ablate` (`LocalExecutor`), and
the process handling the Ray executor (ray_executor.py) shares.

Runs are separate processes so a crash stays in its run; each gets `OMP_NUM_THREADS` (and the MKL /
OpenBLAS equivalents) set to its share of the cores, because two unpinned torch processes on a
2-core machine slow each other by an order of magnitude. Each run is started in a process group of its own with
a parent-death signal (SIGTERM), so no run outlives `rw ablate`, however it ends (`kill -9` included); when it
stops, it stops its runs and kills what is left of their groups.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from rwcore.trainer.ablate.plan import AblationPlan

__all__ = ["LocalExecutor", "STOP_SECONDS"]

STOP_SECONDS = 30.0
"""How long a stopped run may take to end after SIGTERM before its process group is killed."""


def _thread_env(threads: int) -> dict:
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(threads)
    return env


# Started before each `rw train` (exec'd in its place, same pid): PR_SET_PDEATHSIG(SIGTERM), so the kernel signals
# the run when rw ablate dies, however it dies; execve keeps the setting. Not a preexec_fn, which is unsafe
# with threads (tqdm's monitor). If rw ablate died before the call, getppid() no longer names it: stop at once.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0) != 0:\n"
    "    sys.exit('rw ablate: prctl(PR_SET_PDEATHSIG) failed: ' + os.strerror(ctypes.get_errno()))\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('rw ablate: rw ablate ended before this run started')\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def _dying_with_us(command: list[str]) -> list[str]:
    """`command` run through `_DIE_WITH_PARENT` (Linux; elsewhere as it is). -I: the trampoline imports
    nothing from the current folder or PYTHONPATH."""
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, "-I", "-c", _DIE_WITH_PARENT, str(os.getpid()), *command]


def _kill_group(process, sig: int) -> None:
    """Signals the process group a run was started in (its `rw train` is the leader; its own children are in
    it). A stand-in without a pid is left alone."""
    pid = getattr(process, "pid", None)
    if isinstance(pid, int) and pid > 0:
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _poll(process):
    """`process.poll()`; a run that has ended has what is left of its group killed first, while its pid is
    still unreaped (so it cannot have been reused by another process's group)."""
    pid = getattr(process, "pid", None)
    if isinstance(pid, int) and pid > 0 and getattr(process, "returncode", 0) is None:
        try:
            ended = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            ended = None
        if ended is not None:
            _kill_group(process, signal.SIGKILL)
    return process.poll()


def _stop_runs(running: dict) -> None:
    """SIGTERM to each running `rw train`, SIGKILL to its group if it has not ended after STOP_SECONDS, and to
    whatever is left of the group (its own processes: the rollout process of rollout.max_lag) once it ended."""
    for _, process, _, _ in running.values():
        process.terminate()
    deadline = time.monotonic() + STOP_SECONDS
    for _, process, _, log in running.values():
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(process, signal.SIGKILL)
            process.wait()
        _kill_group(process, signal.SIGKILL)
        log.close()


class LocalExecutor:
    """Where runs run by default: each a child process of this one (`plan.jobs` at a time, cores/jobs threads
    each), in a session of its own, getting SIGTERM if this process dies. `launch` is `subprocess.Popen` (tests
    may pass a stand-in). Another executor (ray_executor.py) has the same three methods; what `start`
    returns needs `poll()`, `terminate()` and `wait(timeout)` as a Popen has, and a `pid` only if it is a local
    process group to kill."""

    def __init__(self, launch: Callable[..., subprocess.Popen] = subprocess.Popen):
        self.launch = launch

    def threads(self, plan: AblationPlan) -> int:
        return max(1, (os.cpu_count() or 1) // plan.jobs)

    def start(self, command: list[str], log, threads: int):
        return self.launch(
            _dying_with_us(command),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_thread_env(threads),
            start_new_session=True,  # its own group: stopping it stops its children too; no terminal ^C
        )

    def machine(self, threads: int) -> dict:
        """What ablation.json's `machine` says of where the runs ran."""
        return {"threads_per_run": threads}
