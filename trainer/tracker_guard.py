"""Bounds and checks around the experiment trackers of `rw train` (`rwcore.trainer.trackers`).

A tracker is someone else's code talking to someone else's store: it may wait forever on a server, keep nothing on
a read-only disk, or print tracebacks from its own threads. What keeps a run's promises anyway:

- `Worker` runs one tracker's calls on a daemon thread of its own, each with a bound (`BOUNDS`), and says after
  `WAIT_NOTICE` seconds that it is waiting; past the bound the call raises `TrackerTimeout` and the thread is
  left behind without holding the process's exit.
- `check_reachable` (a remote server answers within `REACH_SECONDS`) and `check_writable` (a local store takes a
  file) run at a tracker's start, so it fails there with a line naming the store, not minutes later or never.
- `ThreadFaults` turns what a tracker's own threads raise (TensorBoard's writer thread on a full disk) or warn
  (trackio's failed flushes) into one line per tracker, instead of tracebacks between rw's lines.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import tempfile
import threading
import traceback
import urllib.parse
import warnings
from pathlib import Path
from typing import Any

__all__ = [
    "BOUNDS",
    "REACH_SECONDS",
    "WAIT_NOTICE",
    "ThreadFaults",
    "TrackerTimeout",
    "Worker",
    "check_reachable",
    "check_writable",
    "one_line",
]

BOUNDS = {"start": 120.0, "log": 30.0, "close": 60.0}
"""Seconds a tracker's start, each log and its close may take before the tracker is dropped (the run goes on)."""
WAIT_NOTICE = 5.0
"""After this many seconds of waiting on a tracker call, one line says which tracker and for how long at most."""
REACH_SECONDS = 5.0
"""Bound of the reachability check of a tracker's remote server (TCP connect, then an HTTP answer)."""


class TrackerTimeout(RuntimeError):
    """A tracker call that did not return within its bound (`BOUNDS`)."""


class Worker:
    """One daemon thread per tracker, running its calls in order (wandb and trackio keep per-thread state): a call
    that never returns holds only this thread, which never holds the process's exit."""

    def __init__(self, name: str) -> None:
        self.calls: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._serve, name=f"rw-tracker-{name}", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            call = self.calls.get()
            if call is None:
                return
            method, args, box, done = call
            try:
                box["value"] = method(*args)
            except BaseException as error:  # handed to the caller, which decides
                box["error"] = error
            done.set()

    def call(self, method, args: tuple, bound: float, waiting) -> Any:
        """method(*args) on the worker; `waiting()` once after WAIT_NOTICE seconds; TrackerTimeout after `bound`."""
        box: dict[str, Any] = {}
        done = threading.Event()
        self.calls.put((method, args, box, done))
        if not done.wait(min(WAIT_NOTICE, bound)):
            if bound > WAIT_NOTICE:
                waiting()
            if not done.wait(max(bound - WAIT_NOTICE, 0.0)):
                raise TrackerTimeout(f"no answer within {bound:.0f} s")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def stop(self, wait: float = 5.0) -> None:
        """Ends the thread once its calls are done (waiting up to `wait` s: one that hangs is left, a daemon)."""
        self.calls.put(None)
        if self.thread is not threading.current_thread():
            self.thread.join(wait)


def check_reachable(url: str, what: str, seconds: float = REACH_SECONDS) -> None:
    """Raises ConnectionError naming `what` and `url` when an http(s) server there does not accept a connection or
    does not answer a request within `seconds` (any HTTP status counts as an answer). Other schemes pass."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=seconds) as connection:
            connection.settimeout(seconds)
            connection.sendall(f"HEAD / HTTP/1.0\r\nHost: {parts.hostname}\r\n\r\n".encode())
            if parts.scheme == "http" and not connection.recv(1):
                raise ConnectionError("it closed the connection without an answer")
    except TimeoutError:
        raise ConnectionError(f"{what} at {url} did not answer within {seconds:.0f} s") from None
    except OSError as error:
        raise ConnectionError(f"{what} at {url} cannot be reached ({one_line(error)})") from None


def check_writable(folder: Path, what: str) -> None:
    """Raises PermissionError naming `what` when a file cannot be made in `folder` (a read-only mount or folder:
    a store there would keep nothing, or retry for minutes)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".rw-write-check-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise PermissionError(f"{what} {folder} cannot be written ({one_line(error)})") from None


class ThreadFaults:
    """While installed, an exception raised in a thread whose frames run a tracker's package becomes one line naming
    that tracker and marks it in `failed`, so `Trackers` drops it at its next call; a warning issued from a tracker's
    package becomes one line (the first of each tracker) and the tracker is kept. Anything else goes to the hooks
    that were there."""

    def __init__(self, packages: dict[str, str]) -> None:
        self.packages = packages  # tracker name -> its package's import name
        self.failed: dict[str, str] = {}
        self.warned: set[str] = set()
        self._hook = self._show = None

    def _tracker(self, filenames: list[str]) -> str | None:
        for filename in reversed(filenames):
            for name, package in self.packages.items():
                if f"{os.sep}{package}{os.sep}" in filename:
                    return name
        return None

    def _report(self, name: str, what: str) -> None:
        if name not in self.failed:
            self.failed[name] = what
            print(
                f"rw: tracker {name}: {what}; dropped it: training and metrics.jsonl go on", file=sys.stderr, flush=True
            )

    def _excepthook(self, args) -> None:
        frames = [frame.filename for frame in traceback.extract_tb(args.exc_traceback)] if args.exc_traceback else []
        name = self._tracker(frames)
        if name is None or args.exc_value is None:
            self._hook(args)
        else:
            self._report(
                name, f"its thread {args.thread.name if args.thread else '?'} stopped ({one_line(args.exc_value)})"
            )

    def _showwarning(self, message, category, filename, lineno, file=None, line=None) -> None:
        name = self._tracker([filename])
        if name is None:
            self._show(message, category, filename, lineno, file, line)
        elif name not in self.warned:  # a warning is not a failure (trackio's failed flush is one of many kinds):
            self.warned.add(name)  # said once, in one line, and the tracker kept
            text = " ".join(str(message).split())[:300]
            print(f"rw: tracker {name} warns: {category.__name__}: {text}", file=sys.stderr, flush=True)

    def install(self) -> None:
        if self._hook is None:
            self._hook, threading.excepthook = threading.excepthook, self._excepthook
            self._show, warnings.showwarning = warnings.showwarning, self._showwarning

    def remove(self) -> None:
        if self._hook is not None:
            if threading.excepthook == self._excepthook:
                threading.excepthook = self._hook
            if warnings.showwarning == self._showwarning:
                warnings.showwarning = self._show
            self._hook = self._show = None


def one_line(error: BaseException, limit: int = 300) -> str:
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
