"""A sandbox for agent tool calls: a Python snippet or a shell command in a limited subprocess.

What every call gets
--------------------
- A private working folder (a fresh temporary directory per `Sandbox`, i.e. per episode) as its
  current directory, HOME and TMPDIR; `Sandbox.close()` deletes it.
- A clean environment: PATH, HOME, TMPDIR, LANG and LC_ALL only. Nothing of the parent's environment
  (API keys, tokens, proxies) is inherited.
- Resource limits (`Limits`), set with setrlimit by the sandbox's init (or, in the weaker mode, the audit
  wrapper) just before the tool starts - never in a preexec_fn, so calls may run from several threads: CPU seconds
  (RLIMIT_CPU),
  address space (RLIMIT_AS), size of any one file (RLIMIT_FSIZE), open files (RLIMIT_NOFILE), processes
  of its user (RLIMIT_NPROC; effective only when the tool runs under its own unprivileged uid, see
  below), and a wall-clock limit enforced by the parent, which then kills the tool.
- Bounded output: the parent keeps at most `Limits.output_bytes` of stdout and of stderr (the rest is
  counted and dropped, so the parent's memory stays bounded) and kills a tool that writes more than
  `Limits.flood_bytes` in all.
- Killing: the tool runs in its own session (process group); on a timeout, a flood, or at the end of
  the call the whole group is killed with SIGKILL. With isolation (below) the tool is PID 1 of its own
  PID namespace, so descendants that left the process group (setsid) die with it too.
- A result, never an exception, for whatever the tool does: `ToolResult` says the exit code, the
  (truncated) output, and which limit stopped it (`error`: "timeout", "cpu_limit", "output_limit",
  "file_limit", "killed", "workspace_limit"). Only a sandbox that cannot start at all raises
  (`SandboxUnavailable`, at construction).

Isolation modes (`isolation=`)
------------------------------
"namespace" (what "auto" picks whenever it works): the tool runs under util-linux `unshare` in new
network, PID, mount, IPC and UTS namespaces (`unshare --net --pid --ipc --uts --fork --kill-child
--mount-proc`).

- IPC: System V shared memory, message queues and semaphores (and POSIX message queues) live in the
  call's own IPC namespace and die with it; nothing the tool makes is visible to the host, to another
  episode or to the next call.
- Unix sockets: abstract sockets belong to the network namespace (none reachable); path-based ones
  are files, so /tmp, /var/tmp, /run and /dev/shm are covered by empty, read-only tmpfs mounts (the
  working folder, usually under /tmp, is bound back in at its own path). A socket the host keeps
  elsewhere, in a folder the tool's uid may read, stays reachable.
- Keys: the tool joins a new, empty session keyring, so keys the trainer holds in its session
  keyring cannot be found or read.

- Network: the new network namespace has only a loopback interface, which is down: connecting to any
  address (the host's loopback servers included) and DNS fail. This is the one isolation the
  sandbox promises without exceptions.
- Files, in both cases below: inside the tool's mount namespace every mount point but /proc and /sys
  is remounted read-only, except the working folder (bind-mounted on itself). The tool's capability
  bounding set is emptied and no_new_privs set before it starts, so it has no capabilities (it cannot
  remount anything writable, even as root of a user namespace) and setuid programs do not raise it.
  So it can write ONLY its working folder: not /tmp, /dev/shm, the project, the run folder or the
  user's files. A set-up step that fails makes the call fail closed (exit 111, error "sandbox_setup"),
  and a failing probe makes "auto" refuse to start. The tool can READ whatever its uid may read (the
  system, world-readable files); its /proc shows only its own PID namespace, so it cannot read the
  parent's environment there.
- As root (the usual case in a container): the tool also runs under a fresh unprivileged uid/gid
  picked at random per sandbox (no supplementary groups), so it cannot read files of mode 0600/0700
  either. RLIMIT_NPROC counts that uid's processes, so a fork bomb stops at `Limits.processes`;
  leftover processes of that uid are killed after each call.
- Not root: an unprivileged user namespace maps the user to root inside (`--map-root-user`), with no
  capabilities (above); it reads what the user may read. RLIMIT_NPROC is not set (it would count all
  the user's processes): a fork bomb is bounded by the wall-clock limit and the system's per-user
  process limit, and dies with the PID namespace. If unprivileged user namespaces are disabled,
  "namespace" is unavailable.

"none" (never chosen automatically; the user must opt in with `isolation="none"`, i.e.
`env.options.isolation=none`): no namespaces, the user's own uid. Only the Python tool is offered; it
runs behind a Python audit hook that refuses sockets, subprocesses, exec, fork, os.system and ctypes.
That hook is a speed bump, not a boundary (code can get around audit hooks); the shell tool is refused.
Use it only for trusted policies on machines without namespaces.

"auto": "namespace" if a probe run succeeds, else SandboxUnavailable with an error that names
`isolation` and says how to opt in to "none". It never falls back silently.

Per call, not per process: memory. Besides RLIMIT_AS per process, the parent sums the resident memory
of the call's whole process tree every 0.1 s and kills the call past `memory_bytes` (error
"memory_limit"). This is a poll, not a cgroup: between two polls a call can briefly hold more (at most
what its processes allocate in 0.1 s, each under RLIMIT_AS), and memory that is in no process's
resident set (page cache) is not counted. No cgroup is used: where this was built (a container), the
cgroup v2 hierarchy has no memory controller (only hugetlb); a cgroup v1 memory group could be created
as root, but the sandbox does not use v1 groups, so the poll is the limit everywhere.

Disk: after each call, whatever else stopped it (a timeout included), the working folder is measured
without recursion and without following links: more than `workspace_files` entries (empty files and
folders count), a path too long to measure, or more than `workspace_bytes` bytes puts it over a limit
(`ToolResult.workspace`; the result also says "workspace_limit" when nothing else stopped the call) and
the environment ends the episode. During a call the folder can grow by at most what `file_bytes` per
file and the time limit allow.

Ending: every tool process is killed at the end of each call. The tool's `unshare` runs under util-linux
`setpriv --pdeathsig KILL`, so a trainer killed with -9 takes its tools with it; its working folders
(named `rw-sandbox-<pid>-...`) are removed by the next process that starts a sandbox (`reap_orphans`).
Folders are removed with `rm -rf` (no Python recursion, however deep the tree).

Not enforced: world-readable files on the host are readable; CPU time of the tool's descendants is
limited per process, not in sum (the wall limit bounds the sum).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

# The standard library only, and no import of rwcore: the tests load this file on its own, under an unprivileged
# uid with the system Python, to check the unprivileged-namespace mode.

__all__ = ["Limits", "Sandbox", "SandboxUnavailable", "ToolResult", "detect_isolation"]

ISOLATIONS = ("auto", "namespace", "none")
_UNSHARE = ("--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc")
_UID_RANGE = (1_000_000, 2_000_000_000)


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot be provided on this machine."""


@dataclass(frozen=True)
class Limits:
    """Per-call limits. wall_seconds: wall clock (the parent kills the tool); cpu_seconds: RLIMIT_CPU;
    memory_bytes: RLIMIT_AS; file_bytes: RLIMIT_FSIZE; processes: RLIMIT_NPROC (own-uid mode only);
    open_files: RLIMIT_NOFILE; output_bytes: kept per stream; flood_bytes: total output before the tool
    is killed; workspace_bytes / workspace_files: size and number of entries (files, folders, links) of
    the working folder, checked after each call. memory_bytes is also the episode's total: the parent
    sums the resident memory of every process of the call (its whole process tree) while it runs and
    kills the call past it (error "memory_limit")."""

    wall_seconds: float = 10.0
    cpu_seconds: int = 10
    memory_bytes: int = 1 << 30
    file_bytes: int = 8 << 20
    processes: int = 64
    open_files: int = 128
    output_bytes: int = 4096
    flood_bytes: int = 1 << 20
    workspace_bytes: int = 64 << 20
    workspace_files: int = 4096

    def __post_init__(self) -> None:
        for name in (
            "wall_seconds",
            "cpu_seconds",
            "memory_bytes",
            "file_bytes",
            "processes",
            "open_files",
            "output_bytes",
            "flood_bytes",
            "workspace_bytes",
            "workspace_files",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"limits.{name} must be a positive number, got {value!r}")
        if self.flood_bytes < self.output_bytes:
            raise ValueError(
                f"limits.flood_bytes ({self.flood_bytes}) must be >= limits.output_bytes ({self.output_bytes})"
            )


@dataclass(frozen=True)
class ToolResult:
    """What one call did. ok: exited 0 with no limit hit. exit_code: the tool's status (None when it was
    killed by us or could not start). error: None or which limit/fault stopped it. truncated: output was
    cut to Limits.output_bytes."""

    ok: bool
    exit_code: int | None
    stdout: str
    stderr: str
    error: str | None = None
    truncated: bool = False
    wall_seconds: float = 0.0
    output_bytes: int = 0
    changed: tuple[str, ...] = field(default=())
    workspace: str | None = None  # "bytes" / "files": the working folder is over that limit after the call

    def render(self, max_chars: int | None = None) -> str:
        """The transcript text of this result."""
        head = f"exit {self.exit_code}" if self.exit_code is not None else "no exit code"
        if self.error:
            head += f" error {self.error}"
        if self.workspace and self.error != "workspace_limit":
            head += f" and the folder is over its {self.workspace} limit"
        parts = [head]
        if self.stdout:
            parts.append("stdout:\n" + self.stdout)
        if self.stderr:
            parts.append("stderr:\n" + self.stderr)
        if self.truncated:
            parts.append(f"(output truncated; {self.output_bytes} bytes in all)")
        text = "\n".join(parts)
        return text if max_chars is None or len(text) <= max_chars else text[:max_chars] + "\n(cut)"


_PROBES: dict[str, str | None] = {}


# PID 1 of the tool's namespaces. With uid > 0 (root mode) it first bind-mounts the working folder on
# itself (its own mount, left writable), remounts every other mount point but /proc and /sys read-only,
# and takes the tool's uid/gid (no supplementary groups); it exits 111 when it cannot (fail closed). Then
# it runs the tool as its child, reaps every orphan, and exits with the tool's status (128 + signal when
# a signal killed it, which `unshare` alone would not pass on). When it exits the kernel kills whatever
# is left in the PID namespace.
_INIT = r"""
import ctypes, os, sys
import resource, signal  # imported as root: the tool's uid may not read this Python's library
uid, work, limits, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
if uid != 0:  # > 0: root mode; -1: an unprivileged user namespace (read-only mounts, no uid change)
    libc = ctypes.CDLL(None, use_errno=True)
    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
    LOCKED = (("nosuid", MS_NOSUID), ("nodev", MS_NODEV), ("noexec", MS_NOEXEC), ("noatime", 1024),
              ("nodiratime", 2048), ("relatime", 1 << 21), ("strictatime", 1 << 24))
    def mount(src, dst, flags, fstype=None, data=None):
        if libc.mount(src, dst, fstype, flags, data) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), dst)
    try:
        # A new, empty session keyring (keyctl KEYCTL_JOIN_SESSION_KEYRING): the parent's keys are not
        # reachable. ENOSYS / EACCES where keyrings are off: then there is nothing to reach either.
        keyctl = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
        if keyctl is not None and libc.syscall(keyctl, 1, None) < 0 and ctypes.get_errno() not in (38, 13):
            raise OSError(ctypes.get_errno(), "cannot join a new session keyring")
        # Empty tmpfs over the folders where host programs keep Unix sockets (path-based sockets are
        # not covered by the network namespace); the working folder, often under /tmp, is bound back
        # in at its own path through a descriptor opened before it was hidden.
        keep = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
        for hidden in (b"/tmp", b"/var/tmp", b"/run", b"/dev/shm"):
            if os.path.isdir(hidden) and not os.path.islink(hidden):
                mount(b"tmpfs", hidden, MS_NOSUID | MS_NODEV, b"tmpfs", b"size=64k,nr_inodes=64,mode=755")
        os.makedirs(work, exist_ok=True)
        mount(("/proc/self/fd/%d" % keep).encode(), work.encode(), MS_BIND)
        os.close(keep)
        points = []
        with open("/proc/self/mountinfo") as handle:
            for line in handle:
                fields = line.split()
                point = fields[4].encode().decode("unicode_escape").encode("latin-1")
                points.append((point, fields[5].split(",")))
        for point, opts in points:
            if point in (b"/proc", b"/sys", work.encode()) or point.startswith((b"/proc/", b"/sys/")):
                continue
            flags = MS_REMOUNT | MS_BIND | MS_RDONLY
            for name, bit in LOCKED:  # flags a user namespace may not drop are kept
                if name in opts:
                    flags |= bit
            try:
                mount(b"none", point, flags)
            except OSError as exc:
                if exc.errno != 2:  # only a mount point that vanished meanwhile is skipped
                    raise
        os.chdir(work)
        for cap in range(64):  # an empty capability bounding set: the tool's exec gets no capabilities,
            libc.prctl(24, cap, 0, 0, 0)  # not even as root of a user namespace (PR_CAPBSET_DROP)
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: no setuid binaries either
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
        if uid > 0:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        # unshare --kill-child armed PR_SET_PDEATHSIG in this process, but a change of uid clears it: armed
        # again, or a trainer killed with -9 would leave this init, and with it every tool, running
        if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_PDEATHSIG failed")
    except OSError as exc:
        sys.stderr.write("sandbox setup failed: %s\n" % exc)
        sys.exit(111)
try:
    for name, value in (pair.split("=") for pair in limits.split(",")):
        soft = int(value)
        resource.setrlimit(getattr(resource, name), (soft, soft + 1 if name == "RLIMIT_CPU" else soft))
    child = os.fork()
except (OSError, ValueError) as exc:
    sys.stderr.write("sandbox: cannot start the tool: %s\n" % exc)
    sys.exit(112)
if child == 0:
    try:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # Python ignores these; the tool gets the defaults
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        os.execve(argv[0], argv, os.environ)
    finally:
        os._exit(127)
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        sys.exit(112)
    if pid == child:
        sys.exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
"""


def _rlimits(limits: Limits | None, own_uid: bool) -> str:
    """The resource limits as "RLIMIT_X=n,..." (what the init and the audit wrapper set before the tool runs)."""
    if limits is None:
        return "RLIMIT_CORE=0"
    pairs = {
        "RLIMIT_CPU": int(max(1, limits.cpu_seconds)),
        "RLIMIT_AS": int(limits.memory_bytes),
        "RLIMIT_FSIZE": int(limits.file_bytes),
        "RLIMIT_NOFILE": int(limits.open_files),
        "RLIMIT_CORE": 0,
    }
    if own_uid:  # counts the sandbox uid's processes (root itself is exempt while it is still root)
        pairs["RLIMIT_NPROC"] = int(limits.processes)
    return ",".join(f"{k}={v}" for k, v in pairs.items())


def _unshare_prefix(isolation: str, uid: int | None, workdir: str = "/", limits: Limits | None = None) -> list[str]:
    if isolation != "namespace":
        return []
    unshare = shutil.which("unshare") or "/usr/bin/unshare"
    init = [sys.executable, "-I", "-S", "-c", _INIT]
    if os.geteuid() == 0:
        return [unshare, *_UNSHARE, "--", *init, str(uid), workdir, _rlimits(limits, True)]
    return [unshare, *_UNSHARE, "--map-root-user", "--", *init, "-1", workdir, _rlimits(limits, False)]


def detect_isolation() -> str | None:
    """ "namespace" when a namespace probe runs here, else None (cached per process)."""
    if "namespace" not in _PROBES:
        try:
            with tempfile.TemporaryDirectory(prefix="rw-sandbox-probe-") as folder:
                argv = _unshare_prefix("namespace", _UID_RANGE[0], folder) + ["/bin/sh", "-c", "exit 0"]
                done = subprocess.run(
                    argv,
                    env={"PATH": "/usr/bin:/bin"},
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    timeout=20,
                    cwd="/",
                )
            _PROBES["namespace"] = "namespace" if done.returncode == 0 else None
            _PROBES["namespace_error"] = f"exit {done.returncode}: {done.stderr.decode(errors='replace')[-300:]}"
        except (OSError, subprocess.SubprocessError) as exc:
            _PROBES["namespace"] = None
            _PROBES["namespace_error"] = str(exc)
    return _PROBES["namespace"]


_AUDIT_WRAPPER = r"""
import sys
_BLOCKED = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
            "os.forkpty", "ctypes.", "os.kill", "os.killpg", "pty.")
def _hook(event, args):
    if event.startswith(_BLOCKED):
        raise PermissionError("sandbox: " + event + " is not allowed")
import resource
for name, value in (pair.split("=") for pair in sys.argv[2].split(",")):
    resource.setrlimit(getattr(resource, name), (int(value), int(value) + 1 if name == "RLIMIT_CPU" else int(value)))
code = sys.argv[1]
sys.argv = ["<tool>"]
sys.addaudithook(_hook)
exec(compile(code, "<tool>", "exec"), {"__name__": "__main__"})
"""


# The tool's `unshare` gets SIGKILL when the thread that started it dies (the trainer killed with -9
# included); `--kill-child` passes that on to the namespace's init, whose death kills every process
# left in the PID namespace. Without util-linux setpriv the reaper below still removes the folders.
_SETPRIV = shutil.which("setpriv")
_PDEATHSIG = [_SETPRIV, "--pdeathsig", "KILL", "--"] if _SETPRIV else []


def _tree_rss(root: int) -> int:
    """Resident bytes of `root` and all its descendants (read from /proc; 0 when it is gone)."""
    total, stack, seen = 0, [root], set()
    page = os.sysconf("SC_PAGE_SIZE")
    while stack and len(seen) < 4096:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/statm") as handle:
                total += int(handle.read().split()[1]) * page
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as handle:
                    stack.extend(int(child) for child in handle.read().split())
        except (OSError, ValueError, IndexError):
            continue
    return total


def remove_tree(path: str) -> None:
    """Deletes `path` however deep it is (no recursion in Python; `rm -rf` walks with openat), never
    following symlinks out of it; an error leaves what could not be removed."""
    if not os.path.lexists(path):
        return
    rm = shutil.which("rm")
    if rm:
        subprocess.run(
            [rm, "-rf", "--one-file-system", "--", path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
    if os.path.lexists(path):  # no rm, or it failed: an iterative walk, deepest first
        stack, order = [path], []
        while stack:
            folder = stack.pop()
            order.append(folder)
            try:
                with os.scandir(folder) as listing:
                    for entry in listing:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        else:
                            with contextlib.suppress(OSError):
                                os.unlink(entry.path)
            except OSError:
                continue
        for folder in reversed(order):
            with contextlib.suppress(OSError):
                os.rmdir(folder)


_REAPED = False


def reap_orphans() -> list[str]:
    """Removes the working folders of sandboxes whose process is gone (a trainer killed with -9 cannot
    run close()); run once per process, when its first sandbox starts. Returns the removed paths."""
    global _REAPED
    if _REAPED:
        return []
    _REAPED = True
    removed = []
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        parts = name.split("-")
        if len(parts) < 4 or parts[:2] != ["rw", "sandbox"] or not parts[2].isdigit():
            continue
        pid = int(parts[2])
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            continue  # its owner still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        full = os.path.join(root, name)
        if os.path.isdir(full) and not os.path.islink(full):
            remove_tree(full)
            removed.append(full)
    return removed


class Sandbox:
    """One private working folder and the tools that run in it (see the module docstring).

    limits: `Limits`; isolation: "auto" | "namespace" | "none"; python: the interpreter for the Python
    tool (default: the first of this interpreter, /usr/bin/python3, /usr/local/bin/python3 that runs
    inside the sandbox; under its own uid a Python in a private folder such as /root may not).
    Use as a context manager, or call close()."""

    def __init__(self, limits: Limits | None = None, isolation: str = "auto", python: str | None = None) -> None:
        if limits is None:
            limits = Limits()
        if not isinstance(limits, Limits):
            raise ValueError(f"limits must be a sandbox.Limits, got {type(limits).__name__}")
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
        if isolation in ("auto", "namespace"):
            if detect_isolation() is None:
                raise SandboxUnavailable(
                    f"isolation={isolation!r}: no network namespace can be created here (the `unshare --net` probe "
                    "failed, "
                    f"{_PROBES.get('namespace_error', '').strip()!r}; it needs root or unprivileged user namespaces). "
                    "Tool calls would reach the network. To run "
                    "anyway with the weaker audit-hook guard (Python tool only, no shell; see "
                    "rwcore.trainer.envs.tools.sandbox), set isolation='none' (env.options.isolation=none)."
                )
            isolation = "namespace"
        self.isolation = isolation
        self.limits = limits
        self.own_uid = isolation == "namespace" and os.geteuid() == 0
        self.uid = random.SystemRandom().randrange(*_UID_RANGE) if self.own_uid else os.geteuid()
        reap_orphans()
        self.workdir = tempfile.mkdtemp(prefix=f"rw-sandbox-{os.getpid()}-")
        if self.own_uid:
            os.chown(self.workdir, self.uid, self.uid)
        os.chmod(self.workdir, 0o700)
        self._closed = False
        self.python = python or self._find_python()

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Kills anything left of the sandbox's uid and deletes the working folder."""
        if self._closed:
            return
        self._closed = True
        self._kill_uid()
        remove_tree(self.workdir)

    def __del__(self) -> None:  # best effort; close() is the contract
        try:
            self.close()
        except Exception:  # BLE001
            pass

    def _find_python(self) -> str:
        key = f"python/{self.isolation}/{self.own_uid}"
        if key in _PROBES:
            found = _PROBES[key]
        else:
            found = None
            for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
                if not candidate or not os.path.exists(candidate):
                    continue
                result = self._run([candidate, "-I", "-c", "import json, csv, statistics; print('ok')"])
                if result.ok and result.stdout.strip() == "ok":
                    found = candidate
                    break
            _PROBES[key] = found
        if found is None:
            self.close()
            raise SandboxUnavailable(
                "no Python interpreter runs inside the sandbox (tried this interpreter, "
                "/usr/bin/python3, /usr/local/bin/python3); pass python=<path>"
            )
        return found

    # -- files (written by the parent, owned by the sandbox's uid) ------------------------

    def path(self, relative: str) -> str:
        """The absolute path of `relative` inside the working folder (ValueError if it would leave it)."""
        full = os.path.realpath(os.path.join(self.workdir, relative))
        root = os.path.realpath(self.workdir)
        if full != root and not full.startswith(root + os.sep):
            raise ValueError(f"path {relative!r} leaves the sandbox folder")
        return full

    def write_file(self, relative: str, content: str) -> None:
        full = self.path(relative)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as handle:
            handle.write(content)
        if self.own_uid:
            for dirpath in {os.path.dirname(full), full}:
                os.chown(dirpath, self.uid, self.uid)

    def read_file(self, relative: str, max_bytes: int = 1 << 20) -> str | None:
        """The file's text (at most max_bytes, decoded leniently), or None when it is missing or not a
        regular file (a symlink the tool planted is not followed out of the folder)."""
        try:
            full = self.path(relative)
        except ValueError:
            return None
        if not os.path.isfile(full) or os.path.islink(os.path.join(self.workdir, relative)):
            return None
        with open(full, "rb") as handle:
            return handle.read(max_bytes).decode("utf-8", "replace")

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """relative path -> (size, mtime_ns) of every regular file in the working folder (symlinks not
        followed). Iterative (no recursion, whatever the depth) and bounded: it stops after
        Limits.workspace_files + 1 entries; `self._entries` holds how many it saw and
        `self._unmeasured` whether a path was too long to measure (both count as over the limits)."""
        out: dict[str, tuple[int, int]] = {}
        entries, unmeasured, cap = 0, False, self.limits.workspace_files + 1
        stack = [self.workdir]
        while stack and entries < cap:
            folder = stack.pop()
            try:
                with os.scandir(folder) as listing:
                    for entry in listing:
                        entries += 1
                        if entries >= cap:
                            break
                        try:
                            if entry.is_dir(follow_symlinks=False):
                                stack.append(entry.path)
                            elif entry.is_file(follow_symlinks=False):
                                st = entry.stat(follow_symlinks=False)
                                out[os.path.relpath(entry.path, self.workdir)] = (st.st_size, st.st_mtime_ns)
                        except OSError:
                            unmeasured = True
            except OSError as exc:
                if exc.errno == errno.ENAMETOOLONG or folder == self.workdir:
                    unmeasured = True
        self._entries, self._unmeasured = entries, unmeasured
        return out

    def over_limit(self, files: dict[str, tuple[int, int]]) -> str | None:
        """Which workspace limit the last snapshot (`files`) is over: "files", "bytes" or None."""
        if self._entries > self.limits.workspace_files or self._unmeasured:
            return "files"
        if sum(size for size, _ in files.values()) > self.limits.workspace_bytes:
            return "bytes"
        return None

    # -- tools ----------------------------------------------------------------------------

    def run_python(self, code: str) -> ToolResult:
        if not isinstance(code, str):
            return ToolResult(False, None, "", "", error="bad_call: code must be a string")
        if self.isolation == "none":
            return self._run([self.python, "-I", "-c", _AUDIT_WRAPPER, code, _rlimits(self.limits, False)])
        return self._run([self.python, "-I", "-c", code])

    def run_shell(self, cmd: str) -> ToolResult:
        if not isinstance(cmd, str):
            return ToolResult(False, None, "", "", error="bad_call: cmd must be a string")
        if self.isolation == "none":
            return ToolResult(False, None, "", "", error="unavailable: the shell tool needs isolation=namespace")
        return self._run(["/bin/sh", "-c", cmd])

    def _env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": self.workdir,
            "TMPDIR": self.workdir,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
        }

    def _run(self, argv: list[str]) -> ToolResult:
        if self._closed:
            return ToolResult(False, None, "", "", error="closed: the sandbox was closed")
        limits = self.limits
        before = self.snapshot()
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                _PDEATHSIG + _unshare_prefix(self.isolation, self.uid, self.workdir, self.limits) + argv,
                cwd=self.workdir,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            return ToolResult(False, None, "", "", error=f"start_failed: {exc.strerror or exc}")
        kept = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
        total = 0
        error = None
        selector = selectors.DefaultSelector()
        for stream in (proc.stdout, proc.stderr):
            os.set_blocking(stream.fileno(), False)
            selector.register(stream.fileno(), selectors.EVENT_READ)
        deadline = start + float(limits.wall_seconds)
        try:
            open_fds = set(kept)
            while open_fds:
                left = deadline - time.monotonic()
                if left <= 0:
                    error = "timeout"
                    break
                if _tree_rss(proc.pid) > limits.memory_bytes:
                    error = "memory_limit"
                    break
                for key, _ in selector.select(timeout=min(left, 0.1)):
                    fd = key.fd
                    try:
                        chunk = os.read(fd, 65536)
                    except OSError as exc:
                        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                            continue
                        chunk = b""
                    if not chunk:
                        selector.unregister(fd)
                        open_fds.discard(fd)
                        continue
                    total += len(chunk)
                    room = limits.output_bytes - len(kept[fd])
                    if room > 0:
                        kept[fd] += chunk[:room]
                    if total > limits.flood_bytes:
                        error = "output_limit"
                        break
                if error:
                    break
            if error is None:
                try:
                    proc.wait(timeout=max(0.01, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    error = "timeout"
        finally:
            self._kill_group(proc)
            selector.close()
            proc.stdout.close()
            proc.stderr.close()
            self._kill_uid()
        code = proc.returncode
        signum = -code if code is not None and code < 0 else (code - 128 if code is not None and code > 128 else None)
        if (
            error is None
            and self.isolation == "namespace"
            and code in (111, 112)
            and kept[list(kept)[1]].startswith(b"sandbox")
        ):
            error = "sandbox_setup"
        if error is None and signum is not None:
            error = {signal.SIGXCPU: "cpu_limit", signal.SIGXFSZ: "file_limit", signal.SIGKILL: "killed"}.get(
                signum, f"signal {signum}"
            )
        exit_code = None if error in ("timeout", "output_limit") else code
        after = self.snapshot()
        changed = tuple(sorted(p for p, meta in after.items() if before.get(p) != meta))
        workspace = self.over_limit(after)  # checked whatever else stopped the call (a timeout too)
        if error is None and workspace is not None:
            error = "workspace_limit"
        out_fd, err_fd = list(kept)
        stdout = kept[out_fd].decode("utf-8", "replace")
        stderr = kept[err_fd].decode("utf-8", "replace")
        truncated = total > len(kept[out_fd]) + len(kept[err_fd])
        return ToolResult(
            ok=error is None and code == 0,
            exit_code=exit_code,
            stdout=stdout,
            stderr=stderr,
            error=error,
            truncated=truncated,
            wall_seconds=time.monotonic() - start,
            output_bytes=total,
            changed=changed,
            workspace=workspace,
        )

    @staticmethod
    def _kill_group(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def _kill_uid(self) -> None:
        """Kills every process still running under the sandbox's own uid (root mode only)."""
        if not self.own_uid:
            return
        for _ in range(3):
            found = False
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    if os.stat(f"/proc/{entry}").st_uid == self.uid:
                        found = True
                        os.kill(int(entry), signal.SIGKILL)
                except (FileNotFoundError, ProcessLookupError, PermissionError):
                    continue
            if not found:
                return
            time.sleep(0.05)
