"""One writer per run folder: an advisory lock on `FOLDER/.rw.lock`, held for the life of the writer.

`rw train` (a new run, `--resume`, `--overwrite`) and `rw ablate` (its output folder) take the lock of the folder
they write before they change anything in it, and keep it until they end. A second writer is refused with
`RunFolderBusy`, whose message names the folder and the holder's pid.

The lock is `flock(LOCK_EX | LOCK_NB)` on the file: the kernel lets go of it when the holder dies however it
dies (`kill -9` included), so a lock file left behind by a dead process is simply taken over. The file holds the
holder's pid, for the message only; nothing is decided from it. It is opened with `O_NOFOLLOW | O_NONBLOCK`
and must be a plain file with one link: a symlink, FIFO, folder or hard link there is refused with
`LockFileRefused` naming the path (a pid written through a link would overwrite someone's file).

A process may take a folder's lock again while it holds it (`rw ablate` takes its output folder in the
command and in `run_ablation`): the lock is let go when the last taker releases it. The file is removed
while still locked when the lock is let go, so a finished run leaves none behind.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from pathlib import Path

__all__ = ["LOCK_FILE", "RunLockError", "RunFolderBusy", "LockFileRefused", "RunLock", "acquire", "holder"]

LOCK_FILE = ".rw.lock"

# Tries before giving up on a lock file that keeps being replaced under us (each try loses to a holder that
# removed it while letting go; more than a few in a row means something else is at work there).
_TRIES = 50


class RunLockError(ValueError):
    """The lock of a run folder cannot be taken (names the folder or the lock file)."""


class RunFolderBusy(RunLockError):
    """Another live process holds the folder's lock."""

    def __init__(self, folder: Path, pid: int | None):
        self.folder, self.pid = Path(folder), pid
        who = f"pid {pid}" if pid is not None else "pid unknown"
        super().__init__(f"{folder} is being written by another process ({who}); wait for it or stop it")


class LockFileRefused(RunLockError):
    """The lock file is not a plain file (a symlink, FIFO, folder, device or hard link)."""


class RunLock:
    """A held lock; `release()` (or leaving a `with` block) lets go of it."""

    def __init__(self, folder: Path, path: Path, fd: int, created: list[Path]):
        self.folder, self.path, self._fd, self._created = folder, path, fd, created
        self._count = 1

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Lets go (once every taker in this process has). Folders `acquire` created that are still empty
        (the writer was refused or failed before writing anything) are removed too."""
        if self._fd is None:
            return
        self._count -= 1
        if self._count > 0:
            return
        _HELD.pop(self._key, None)
        try:
            # removed while still locked: a process that opened this file and waits to lock it finds, once it
            # has the lock, that the path no longer names its file, and opens the new one (see `acquire`)
            if _same_file(self.path, self._fd):
                self.path.unlink()
        except OSError:
            pass
        finally:
            os.close(self._fd)
            self._fd = None
        for folder in reversed(self._created):
            try:
                folder.rmdir()
            except OSError:  # not empty: the writer wrote into it
                break

    @property
    def _key(self) -> str:
        return os.path.realpath(self.folder)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


_HELD: dict[str, RunLock] = {}


def _same_file(path: Path, fd: int) -> bool:
    try:
        named = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _open(path: Path, create: bool) -> int | None:
    """The lock file, opened without following a link or blocking on a FIFO and checked to be a plain file
    with one link; None when it does not exist and `create` is off."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o644)
    except FileNotFoundError:
        if create:
            raise
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise LockFileRefused(f"{path} is a symbolic link, not rw's lock file; remove it") from None
        if error.errno in (errno.EISDIR, errno.ENXIO, errno.EOPNOTSUPP, errno.ENODEV):
            raise LockFileRefused(f"{path} is not a regular file, not rw's lock file; remove it") from None
        raise
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "is not a regular file"
    elif info.st_nlink > 1:
        problem = f"has {info.st_nlink} hard links"
    if problem:
        os.close(fd)
        raise LockFileRefused(f"{path} {problem}, not rw's lock file; remove it")
    return fd


def _pid_in(fd: int) -> int | None:
    """The pid a holder wrote; it writes it just after taking the lock, so an empty file is read again."""
    for _ in range(10):
        text = os.pread(fd, 64, 0).decode("ascii", "replace").split("\n", 1)[0].strip()
        if text.isdigit():
            return int(text)
        time.sleep(0.02)
    return None


def _mkdirs(folder: Path) -> list[Path]:
    """Makes `folder` and its missing parents; returns the ones it made, outermost first."""
    missing = []
    for candidate in (folder, *folder.parents):
        if candidate.exists() or candidate.is_symlink():
            break
        missing.append(candidate)
    folder.mkdir(parents=True, exist_ok=True)
    return list(reversed(missing))


def acquire(folder: str | os.PathLike, create: bool = True) -> RunLock:
    """Takes the lock of `folder` (made first, with its parents, when missing) without waiting.

    Raises RunFolderBusy when another process holds it, LockFileRefused when `.rw.lock` there is not a plain
    file, OSError when the folder or the file cannot be made."""
    folder = Path(folder)
    created = _mkdirs(folder) if create else []
    held = _HELD.get(os.path.realpath(folder))
    if held is not None and held.held:
        held._count += 1
        return held
    path = folder / LOCK_FILE
    try:
        for _ in range(_TRIES):
            fd = _open(path, create=True)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = _pid_in(fd)
                os.close(fd)
                raise RunFolderBusy(folder, pid) from None
            except BaseException:
                os.close(fd)
                raise
            if not _same_file(path, fd):  # its holder removed it while we waited to open it: open the new one
                os.close(fd)
                continue
            # pid first, then the length: a reader sees the old pid or the new one, never an empty file
            data = f"{os.getpid()}\n".encode()
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
            lock = RunLock(folder, path, fd, created)
            _HELD[lock._key] = lock
            return lock
        raise RunLockError(f"{path} keeps being replaced by another process; cannot lock {folder}")
    except BaseException:
        for made in reversed(created):
            try:
                made.rmdir()
            except OSError:
                break
        raise


def holder(folder: str | os.PathLike) -> int | None:
    """The pid of the live process holding `folder`'s lock (-1 where it wrote none), or None when nobody does
    (this process, when it holds it, gives its own pid).

    Creates nothing and leaves a stale lock file where it is; to look it takes a free lock for an instant, so
    a writer starting in that instant would be refused (naming this process)."""
    path = Path(folder) / LOCK_FILE
    held = _HELD.get(os.path.realpath(folder))
    if held is not None and held.held:
        return os.getpid()
    try:
        fd = _open(path, create=False)
    except FileNotFoundError:  # the folder itself is missing
        return None
    if fd is None:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _pid_in(fd)
            return -1 if pid is None else pid
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
