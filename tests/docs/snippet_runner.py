"""Runs the docs' python blocks for tests/docs/test_doc_snippets.py, each as a script of its own.

    python snippet_runner.py JOBS.json WORKDIR TIMEOUT_S

JOBS.json is a list of {"id", "source"} (and optionally "timeout", seconds); WORKDIR/results.json gets
{id: {"rc", "timed_out", "output"}}.

Each block runs in a fresh, empty working directory (WORKDIR/<n>/), as `__main__` with an empty namespace,
its output captured. Importing torch costs seconds per process, so where the OS can fork, this runner imports
the heavy modules once and forks a child per block (a block's names still start empty: a missing import
fails as it would for a user); elsewhere each block is a new `python snippet.py` process. A block that runs
past TIMEOUT_S is killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback

WARM = ("numpy", "torch", "rwcore", "rwcore.kernels", "rwcore.method", "rwcore.arise.sampler")


def _child(script: str, log: str) -> None:
    """In the forked child: run `script` as __main__ with stdout/stderr into `log`; never returns."""
    code = 1
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdin = open(os.devnull)
        sys.argv = [script]
        sys.path[0] = os.getcwd()  # as `python snippet.py` run in its own folder
        with open(script, encoding="utf-8") as handle:
            compiled = compile(handle.read(), script, "exec")
        exec(compiled, {"__name__": "__main__", "__file__": script, "__builtins__": __builtins__})
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), False
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -signal.SIGKILL, True
        time.sleep(0.02)


def main(jobs_file: str, workdir: str, timeout: float) -> None:
    with open(jobs_file, encoding="utf-8") as handle:
        jobs = json.load(handle)
    fork = hasattr(os, "fork")
    if fork:
        for name in WARM:
            try:
                __import__(name)
            except ImportError:
                pass
    results = {}
    for n, job in enumerate(jobs):
        folder = os.path.join(workdir, str(n))
        os.makedirs(folder)
        script = os.path.join(workdir, f"snippet_{n}.py")  # beside the working directory, not in it
        with open(script, "w", encoding="utf-8") as handle:
            handle.write(job["source"])
        log = os.path.join(workdir, f"snippet_{n}.log")
        if fork:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                os.chdir(folder)
                _child(script, log)
            rc, timed_out = _wait(pid, job.get("timeout", timeout))
        else:
            with open(log, "w") as out:
                try:
                    rc = subprocess.run(
                        [sys.executable, script],
                        cwd=folder,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        timeout=job.get("timeout", timeout),
                    ).returncode
                    timed_out = False
                except subprocess.TimeoutExpired:
                    rc, timed_out = -signal.SIGKILL, True
        with open(log, encoding="utf-8", errors="replace") as handle:
            output = handle.read()
        results[job["id"]] = {"rc": rc, "timed_out": timed_out, "output": output[-6000:]}
    with open(os.path.join(workdir, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
