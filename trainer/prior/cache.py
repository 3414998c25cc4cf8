"""The per-machine cache of reading priors: where it lives, which entries it trusts, how one is read and written.

Layout: `<prior.cache_dir or $RWCORE_CACHE/priors or ~/.cache/rwcore/priors>/<env>-<key>/` holds `model.pt` (the
state dict), `prior.json` (the spec, the training curve, the probe, the machine) and `manifest.json` (size and
sha256 of both, in `rwcore.trainer.checkpoint`'s format); `.<env>-<key>.lock` beside it makes concurrent runs
wait for the one that builds it. The key is `rwcore.trainer.prior.pretrain.prior_spec`'s digest; this module's
code is not part of it (what it does decides where the weights are kept, not what they are), so changing it
rebuilds no prior. Order: a cache entry, else the prior shipped with the package for the key
(`rwcore.trainer.prior.shipped`, read in place under its own trust rule), else one built now.

Trust: the weights of an entry are what every run starts from, and its manifest only detects damage (anyone who
can write the entry can write a matching manifest). So, as ssh treats its keys, the cache root, an entry and
each of its files are used only when they are owned by the user (or root) and not writable by group or others;
an entry or root that is a symbolic link, a lock file that is not a regular file, or a file in an entry that is
not one, is refused. A refusal is a `PriorCacheError` (a ValueError: `rw` prints it as one `rw: error:` line,
exit 2) naming the path and the fix; the refused path is left as it is, never deleted or followed. The root and
every folder this module creates are 0700, its files 0600, whatever the umask. An entry that passes these
checks but fails its manifest or holds another key is ours and damaged: it is rebuilt, with one line naming it.

Reads go through file descriptors opened without following links (`O_NOFOLLOW`), checked with `fstat`: the
bytes verified against the manifest are the bytes loaded.

Disk space: before pretraining, the root's free space must cover the entry's estimated size twice plus a margin
(`needed_bytes`); otherwise one line names the folder, the free and needed bytes, and `RWCORE_CACHE` /
`prior.cache_dir` as the way to put the cache elsewhere. A write that fails anyway (disk full, torch's
"[enforce fail at inline_container.cc]" for one) removes its temporary folder; the trained prior is then used
from memory, uncached, with one line saying so (`rw pretrain`, whose job is the cache, stops with that line).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import hashlib
import io
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from rwcore.trainer import checkpoint as ckpt
from rwcore.trainer.prior import pretrain as training
from rwcore.trainer.prior import shipped

__all__ = [
    "Prior",
    "PriorCacheError",
    "cache_folder",
    "ensure_prior",
    "entry_bytes",
    "needed_bytes",
    "prior_record",
]

_ELSEWHERE = "point RWCORE_CACHE or prior.cache_dir at a folder of your own"
_MARGIN = 16 << 20  # bytes of free space asked beyond the entry's twice: other writers, filesystem metadata
_REPORT_ROOM = 1 << 20  # prior.json, manifest.json and torch.save's per-tensor records


class PriorCacheError(ValueError):
    """The prior cache cannot be used: one line naming the path and what to do about it."""


@dataclass
class Prior:
    """A pretrained prior: its `folder` (None when it could not be cached), `key`, the model's `state_dict`, the
    `report` (prior.json), `model_sha256`, the sha256 of its model.pt bytes, and its `source`: "shipped" (with
    the package, `rwcore.trainer.prior.shipped`), "cached" (read from the cache) or "built" (pretrained now)."""

    folder: Path | None
    key: str
    state_dict: dict
    report: dict
    model_sha256: str = ""
    source: str = "built"


def cache_folder(config) -> Path:
    """The folder that holds cached priors."""
    if config.prior.cache_dir:
        return Path(config.prior.cache_dir).expanduser()
    root = os.environ.get("RWCORE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "rwcore"
    )
    return Path(root) / "priors"


def entry_bytes(config, env) -> int:
    """An upper estimate of a cache entry's size for `config`'s model on `env`: float32 weights of the
    Llama-architecture model `rwcore.trainer.policy.build_model` builds (embedding and LM head counted apart
    even when tied), plus room for prior.json, the manifest and torch.save's records."""
    m = config.model
    vocabulary = len(env.vocabulary()) + 16  # the codec's special and role tokens
    width = m.num_heads * (m.head_dim or m.hidden_size // m.num_heads)
    layer = 4 * m.hidden_size * width + 3 * m.hidden_size * m.intermediate_size + 2 * m.hidden_size
    parameters = 2 * vocabulary * m.hidden_size + m.num_layers * layer + m.hidden_size
    return 4 * parameters + _REPORT_ROOM


def needed_bytes(config, env) -> int:
    """Free bytes the cache root must have before pretraining: the entry twice (the new one is written
    beside a damaged one it replaces) plus a margin."""
    return 2 * entry_bytes(config, env) + _MARGIN


# ---------------------------------------------------------------------------------------- trust


def _check(info: os.stat_result, path: Path, entry: Path | None = None) -> None:
    """Refuses `path` (its stat) unless the user or root owns it and neither group nor others can write it."""
    uid = os.geteuid()
    if info.st_uid not in (uid, 0):
        raise PriorCacheError(
            f"{path} is owned by uid {info.st_uid}, not by you (uid {uid}): whoever owns it chooses the weights "
            f"every run starts from, so it is refused and left as it is; {_ELSEWHERE}"
        )
    bits = stat.S_IMODE(info.st_mode)
    if bits & 0o022:
        fix = f"chmod go-w {path}"
        if entry is not None:
            fix += f" if you trust its contents, else remove {entry} to rebuild it"
        raise PriorCacheError(
            f"{path} is writable by group or others (mode {bits:04o}): anyone who can write it can plant the "
            f"weights every run starts from, so it is refused and left as it is; fix: {fix}"
        )


def _not_followed(path: Path, what: str, fix: str) -> PriorCacheError:
    return PriorCacheError(f"{path} ({what}) is a symbolic link, which the prior cache never follows: {fix}")


_UNLINK = "remove the link (the prior is then rebuilt), or point RWCORE_CACHE or prior.cache_dir elsewhere"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a device or special file" if not stat.S_ISREG(mode) else "a regular file"


def _make_private(root: Path) -> None:
    """Creates `root` and each missing folder above it, 0700 whatever the umask."""
    missing, path = [], root
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:  # another process made it first: checked like any existing root
            continue
        except OSError as error:
            raise PriorCacheError(
                f"cannot create the prior cache {root}: {folder}: {error.strerror or error}; {_ELSEWHERE}"
            ) from None
        try:
            handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # replaced at once by something else: the root's own checks say what
            continue
        try:
            os.fchmod(handle, 0o700)
        finally:
            os.close(handle)


def _open_root(root: Path) -> int:
    """A descriptor of the cache root (created private if missing), once it is a folder the user can trust."""
    _make_private(root)
    try:
        info = os.lstat(root)
        if stat.S_ISLNK(info.st_mode):
            raise _not_followed(
                root, "the prior cache", "point RWCORE_CACHE or prior.cache_dir at the folder it links to"
            )
        if not stat.S_ISDIR(info.st_mode):
            raise PriorCacheError(f"the prior cache {root} is {_kind(info.st_mode)}, not a folder; {_ELSEWHERE}")
        handle = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        raise PriorCacheError(f"cannot open the prior cache {root}: {error.strerror or error}; {_ELSEWHERE}") from None
    try:
        opened = os.fstat(handle)
        if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
            raise PriorCacheError(f"the prior cache {root} was replaced while it was checked; run again")
        _check(opened, root)
    except BaseException:
        os.close(handle)
        raise
    return handle


@contextlib.contextmanager
def _locked(root_fd: int, path: Path, log: Callable[[str], None]):
    """Holds the lock file `path` (in the root), a regular file opened without following a link and without
    blocking on a FIFO."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        handle = os.open(path.name, flags, 0o600, dir_fd=root_fd)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _not_followed(path, "the prior cache's lock file", "remove it") from None
        try:
            kind = _kind(os.stat(path.name, dir_fd=root_fd, follow_symlinks=False).st_mode)
        except OSError:
            kind = None
        if kind is not None and kind != "a regular file":
            raise PriorCacheError(
                f"{path} (the prior cache's lock file) is {kind}, not a regular file: remove it"
            ) from None
        raise PriorCacheError(
            f"cannot open the prior cache's lock file {path}: {error.strerror or error}; {_ELSEWHERE}"
        ) from None
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            raise PriorCacheError(
                f"{path} (the prior cache's lock file) is {_kind(info.st_mode)}, not a regular file: remove it"
            )
        if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) != 0o600:
            os.fchmod(handle, 0o600)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"rw: waiting for another process that is building the prior ({path.parent})")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    finally:
        os.close(handle)


def _entry(root_fd: int, folder: Path) -> bool:
    """Whether the entry `folder` exists; raises PriorCacheError when it, or a file in it, is not to be trusted
    (a link, not a folder or regular file, another's, or writable by group or others)."""
    try:
        info = os.stat(folder.name, dir_fd=root_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError as error:
        raise PriorCacheError(f"cannot read the cached prior {folder}: {error.strerror or error}") from None
    if stat.S_ISLNK(info.st_mode):
        raise _not_followed(folder, "a cached prior", _UNLINK)
    if not stat.S_ISDIR(info.st_mode):
        raise PriorCacheError(f"the cached prior {folder} is {_kind(info.st_mode)}, not a folder: remove it")
    _check(info, folder, entry=folder)
    with _opened_entry(root_fd, folder) as handle:
        for name in _names(handle, folder):
            _member(handle, folder, name)
    return True


@contextlib.contextmanager
def _opened_entry(root_fd: int, folder: Path, trust: Callable = _check):
    try:
        handle = os.open(folder.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _not_followed(folder, "a cached prior", _UNLINK) from None
        raise PriorCacheError(f"cannot read the cached prior {folder}: {error.strerror or error}") from None
    try:
        trust(os.fstat(handle), folder, entry=folder)
        yield handle
    finally:
        os.close(handle)


def _names(entry_fd: int, folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(entry_fd))
    except OSError as error:
        raise PriorCacheError(f"cannot read the cached prior {folder}: {error.strerror or error}") from None


def _member(entry_fd: int, folder: Path, name: str, trust: Callable = _check) -> os.stat_result:
    """The stat of file `name` of an entry, refusing what is not a trusted regular file."""
    path = folder / name
    try:
        info = os.stat(name, dir_fd=entry_fd, follow_symlinks=False)
    except OSError as error:
        raise PriorCacheError(f"cannot read {path}: {error.strerror or error}") from None
    if stat.S_ISLNK(info.st_mode):
        raise _not_followed(path, "in a cached prior", f"remove {folder} to rebuild it")
    if not stat.S_ISREG(info.st_mode):
        raise PriorCacheError(
            f"{path} is {_kind(info.st_mode)}, not a regular file: a cached prior holds none; remove {folder}"
        )
    trust(info, path, entry=folder)
    return info


# ---------------------------------------------------------------------------------------- reading


def _read_entry(root_fd: int, folder: Path, trust: Callable = _check) -> dict[str, bytes]:
    """name -> bytes of every file of the entry, each read through a descriptor checked to be the file that
    was checked."""
    files = {}
    with _opened_entry(root_fd, folder, trust) as handle:
        for name in _names(handle, folder):
            info = _member(handle, folder, name, trust)
            try:
                file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=handle)
            except OSError as error:
                raise PriorCacheError(f"cannot read {folder / name}: {error.strerror or error}") from None
            with os.fdopen(file, "rb") as stream:
                opened = os.fstat(stream.fileno())
                if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
                    raise PriorCacheError(f"{folder / name} was replaced while it was checked; run again")
                try:
                    files[name] = stream.read()
                except OSError as error:
                    raise PriorCacheError(f"cannot read {folder / name}: {error.strerror or error}") from None
    return files


def _verify(folder: Path, files: dict[str, bytes]) -> dict:
    """The manifest of an entry's files (read into memory), after checking it and every file it lists (size and
    sha256) and that no file is unlisted, as `rwcore.trainer.checkpoint.verify` does on disk."""
    path = folder / ckpt.MANIFEST
    if ckpt.MANIFEST not in files:
        raise ckpt.CheckpointError(f"{path} is missing: the cached prior is incomplete")
    try:
        manifest = json.loads(files[ckpt.MANIFEST].decode("utf-8"))
        body = {"format": manifest["format"], "step": manifest["step"], "files": manifest["files"]}
        checksum = manifest["checksum"]
        listed = {name: (int(item["size"]), str(item["sha256"])) for name, item in body["files"].items()}
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ckpt.CheckpointError(
            f"{path} is unreadable ({type(error).__name__}): the manifest is corrupted"
        ) from None
    if ckpt._checksum(body) != checksum:
        raise ckpt.CheckpointError(f"{path} does not match its own checksum: the manifest is corrupted")
    if body["format"] != ckpt.FORMAT:
        raise ckpt.CheckpointError(f"{path} has format {body['format']!r}; this rwcore reads format {ckpt.FORMAT}")
    for name in sorted(set(files) - set(listed) - {ckpt.MANIFEST}):
        raise ckpt.CheckpointError(f"{folder / name} is not listed in {ckpt.MANIFEST}: the entry was altered")
    for name, (size, sha) in sorted(listed.items()):
        if name not in files:
            raise ckpt.CheckpointError(f"{folder / name} is missing (listed in {ckpt.MANIFEST})")
        if len(files[name]) != size:
            raise ckpt.CheckpointError(
                f"{folder / name} has {len(files[name])} bytes where {ckpt.MANIFEST} says {size}: truncated or "
                "corrupted"
            )
        if hashlib.sha256(files[name]).hexdigest() != sha:
            raise ckpt.CheckpointError(f"{folder / name} does not match its sha256 in {ckpt.MANIFEST}: corrupted")
    return manifest


def _load(root_fd: int, folder: Path, key: str, source: str = "cached", trust: Callable = _check) -> Prior:
    """The cached (or shipped, `source`) prior in `folder` after verifying its manifest and key (CheckpointError
    naming what is wrong; PriorCacheError when it is not to be trusted)."""
    files = _read_entry(root_fd, folder, trust)
    manifest = _verify(folder, files)
    try:
        report = json.loads(files["prior.json"].decode("utf-8"))
    except (KeyError, UnicodeDecodeError, ValueError) as error:
        raise ckpt.CheckpointError(f"{folder / 'prior.json'} is unreadable ({type(error).__name__})") from None
    if not isinstance(report, dict) or report.get("key") != key:
        found = report.get("key") if isinstance(report, dict) else None
        raise ckpt.CheckpointError(f"{folder / 'prior.json'} is for key {found!r}, not {key!r}")
    if "model.pt" not in files:
        raise ckpt.CheckpointError(f"{folder / 'model.pt'} is missing")
    try:
        state = torch.load(io.BytesIO(files["model.pt"]), weights_only=True)
    except Exception as error:  # the restricted unpickler's refusals, damaged zip archives
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ckpt.CheckpointError(
            f"{folder / 'model.pt'} cannot be loaded safely (torch.load weights_only=True): {detail[:300]}"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ckpt.CheckpointError(f"{folder / 'model.pt'} is not a state dict")
    return Prior(folder, key, state, report, manifest["files"]["model.pt"]["sha256"], source)


# ---------------------------------------------------------------------------------------- writing


def _private(path: str, flags: int) -> int:
    """open()'s opener for a new file of the cache: never through a link, 0600 whatever the umask."""
    handle = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchmod(handle, 0o600)
    return handle


@contextlib.contextmanager
def _writing(path: Path):
    """A write failing inside names `path`: an OSError without a file name gets it, and torch.save's RuntimeError
    becomes the OSError behind it, or the interrupt it hid (`checkpoint.write_failure`)."""
    try:
        yield
    except RuntimeError as error:
        raise ckpt.write_failure(error, path) from error
    except OSError as error:
        if error.filename is None:
            raise OSError(error.errno, error.strerror or str(error), str(path)) from error
        raise


def _write_entry(staging: Path, state: dict, report: dict, steps: int) -> None:
    """model.pt, prior.json and manifest.json into the (new, private) staging folder, each fsynced."""
    model, record = staging / "model.pt", staging / "prior.json"
    with _writing(model), open(model, "xb", opener=_private) as stream:
        torch.save(state, stream)
        stream.flush()
        os.fsync(stream.fileno())
    with _writing(record), open(record, "xb", opener=_private) as stream:
        stream.write(json.dumps(report, indent=1, sort_keys=True).encode())
        stream.flush()
        os.fsync(stream.fileno())
    with _writing(staging / ckpt.MANIFEST):
        ckpt.write_manifest(staging, steps)
        os.chmod(staging / ckpt.MANIFEST, 0o600)  # written by the checkpoint module under the umask's mode


def _store(root: Path, folder: Path, state: dict, report: dict, steps: int, replace: bool) -> None:
    """Writes the entry under a temporary name and renames it into place (over `folder` when `replace`, an
    entry already checked to be ours). On any failure the temporary folder is removed and the error raised."""
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=root))
    try:
        os.chmod(staging, 0o700)
        _write_entry(staging, state, report, steps)
        if replace and os.path.lexists(folder):
            shutil.rmtree(folder)  # a real folder of ours (checked under the lock); rmtree refuses links
        os.replace(staging, folder)
        ckpt.fsync_dir(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _clean_stale(root: Path, name: str) -> None:
    """Removes the temporary folders a killed build of `name` left: only real folders of the user's, never
    a link or another's (those are left as they are)."""
    uid = os.geteuid()
    for path in glob.glob(os.path.join(glob.escape(str(root)), f".{glob.escape(name)}.*.tmp")):
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == uid:
            shutil.rmtree(path, ignore_errors=True)


def _sha256(state: dict) -> str:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def _check_space(root: Path, config, env) -> None:
    try:
        free = shutil.disk_usage(root).free
    except OSError:  # a filesystem that cannot say: the write reports a full disk if it is one
        return
    need = needed_bytes(config, env)
    if free < need:
        raise PriorCacheError(
            f"the prior cache {root} has {free} bytes free; building the prior needs {need} bytes there (its "
            f"entry, about {entry_bytes(config, env)} bytes, twice, plus a margin): free space there or point "
            f"RWCORE_CACHE or prior.cache_dir at another folder"
        )


# ---------------------------------------------------------------------------------------- the prior


def prior_record(prior: Prior) -> dict:
    """What a run folder's prior.json says about the prior the run started from: its key, cache folder (None
    when it could not be cached), the sha256 of its weights, how it was trained and the probe's summary."""
    probe = prior.report.get("probe", {})
    return {
        "key": prior.key,
        "source": prior.source,
        "folder": str(prior.folder) if prior.folder is not None else None,
        "model_sha256": prior.model_sha256,
        "spec": prior.report.get("spec"),
        "seconds": prior.report.get("seconds"),
        "threads": prior.report.get("threads"),
        "machine": prior.report.get("machine"),
        "curve_last": (prior.report.get("curve") or [None])[-1],
        "probe": {
            "chance": probe.get("chance"),
            "heldout": {k: v for k, v in probe.get("heldout", {}).items() if k != "pairs"},
            "skills_summary": probe.get("skills_summary"),
        },
    }


def _shipped(env_name: str, key: str, log: Callable[[str], None]) -> Prior | None:
    """The prior shipped with the package for this key, read in place and verified; None when none ships
    or the one that ships fails its checks (one line says which, and that rwcore should be reinstalled)."""
    folder = shipped.SHIPPED / f"{env_name}-{key}"
    if not os.path.lexists(folder):
        return None
    try:
        root_fd = os.open(shipped.SHIPPED, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        log(f"rw: the shipped prior {folder} is unreadable ({error.strerror or error}); building the prior")
        return None
    try:
        return _load(root_fd, folder, key, source="shipped", trust=shipped.check_like_code)
    except (shipped.ShippedPriorError, PriorCacheError, ckpt.CheckpointError) as error:
        log(f"rw: the shipped prior {folder} is not used ({error}); reinstall rwcore to restore it")
        return None
    finally:
        os.close(root_fd)


def _using(prior: Prior, log: Callable[[str], None]) -> Prior:
    log(f"rw: reading prior: {prior.source} ({prior.folder})")
    return prior


def ensure_prior(
    config,
    env,
    *,
    rebuild: bool = False,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    cache_required: bool = False,
) -> Prior:
    """The prior for `config` and `env`: from the cache when an intact, trusted entry is there, else the one
    shipped with the package for its key (`rwcore.trainer.prior.shipped`, read in place), else pretrained now
    and cached, after one line saying why (what changed the key relative to the nearest shipped or cached prior)
    and about how long it takes. A damaged or mismatched entry of the user's is rebuilt (or removed, when a
    shipped prior has the key), with one line naming it; `rebuild` forces a build. One line says which prior a
    run starts from. Raises PriorCacheError (one line) for a cache it does not trust or too little free space.
    When the entry cannot be written, the prior is returned uncached (`folder` None) with one line saying so,
    or, with `cache_required`, that line is raised as a PriorCacheError."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    spec = training.prior_spec(config, env)
    key = training._key(spec)
    root = cache_folder(config)
    folder = root / f"{env.name}-{key}"
    if not rebuild and not os.path.lexists(root):  # no cache yet: a shipped prior needs none created
        found = _shipped(env.name, key, log)
        if found is not None:
            return _using(found, log)
    root_fd = _open_root(root)
    try:
        with _locked(root_fd, root / f".{folder.name}.lock", log):
            present = _entry(root_fd, folder)
            if present and not rebuild:
                try:
                    return _using(_load(root_fd, folder, key), log)
                except ckpt.CheckpointError as error:
                    found = _shipped(env.name, key, log)
                    if found is not None:
                        log(f"rw: the cached prior {folder} is damaged ({error}); removed it")
                        shutil.rmtree(folder)  # a real folder of ours (checked under the lock)
                        return _using(found, log)
                    log(f"rw: the cached prior {folder} is damaged ({error}); rebuilding it")
            elif not rebuild:
                found = _shipped(env.name, key, log)
                if found is not None:
                    return _using(found, log)
            _clean_stale(root, folder.name)
            _check_space(root, config, env)
            if not present and not rebuild:  # why this prior must be built (after any refusal's one line)
                log(shipped.build_line(spec, root, folder.name))
            state, report = training.pretrain(config, env, progress=progress, log=log)
            report = {"key": key, "spec": spec, **report}
            try:
                _store(root, folder, state, report, int(config.prior.steps), replace=present)
            except OSError as error:
                where = error.filename or folder
                reason = f"writing {where} failed: {error.strerror or error}; nothing of it was left behind"
                if cache_required:
                    raise PriorCacheError(
                        f"the prior was trained but could not be cached in {folder} ({reason}): free space in "
                        f"{root} or point RWCORE_CACHE or prior.cache_dir at another folder"
                    ) from None
                log(
                    f"rw: could not cache the prior in {folder} ({reason}); this run continues with the prior in "
                    f"memory and the next one pretrains again unless {root} has room (or RWCORE_CACHE or "
                    "prior.cache_dir points elsewhere)"
                )
                return Prior(None, key, state, report, _sha256(state))
            return _using(_load(root_fd, folder, key, source="built"), log)
    finally:
        os.close(root_fd)
