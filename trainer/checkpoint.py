"""Checkpoint files that verify themselves and load without running code.

A checkpoint is a folder `checkpoints/step_NNNNNN/` written under a temporary name
(`checkpoints/.step_NNNNNN.tmp`) and renamed into place. Its last file, `manifest.json`, lists every
other file with its size and sha256, plus a checksum of that list; `--resume` and `rw eval` verify it
before anything is loaded (`verify`), and `--resume` falls back to the newest checkpoint that passes.
A checkpoint without a manifest (written by an older rwcore) is refused: its `state.pt` needs
unrestricted unpickling, which would let a run folder from elsewhere execute code.

Every `.pt` file loads with `torch.load(weights_only=True)`: state that is not a tensor or a plain
container (numpy arrays and scalars, the rollout records of `rollout.max_lag`) is turned into tagged
dicts of bytes, lists and tensors by `encode` and back by `decode`, for a fixed list of types only.

The manifest protects against corruption (bit flips, truncation, partial copies), not against a
forger: anyone who can write the folder can write a matching manifest. What stops a crafted folder
from running code is the restricted unpickler, not the checksum.

Writes: every file is fsynced before the manifest is written, the manifest and every folder of the
checkpoint before the rename, and the `checkpoints/` folder after it. A write that fails
(disk full, a file where a folder should be) raises `RunFolderError` naming the path, and the
temporary folder is removed; `clean_temporaries` removes what a killed run left behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rwcore.trainer.run_lock import LOCK_FILE
from rwcore.trainer.run_paths import ABLATE_FILES, RUN_FILES, RUN_OUTPUT_DIRS

MANIFEST = "manifest.json"
FORMAT = 1
_TAG = "__rwcore_type__"
_STEP = re.compile(r"^step_(\d+)$")
_STAGING = re.compile(r"^\.step_\d+\.tmp$")
_CHUNK = 1 << 20

CHECKPOINT_FILES = ("latest",)
_ATOMIC_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp$")


class CheckpointError(ValueError):
    """A checkpoint that is corrupted, incomplete, unverifiable or unsafe to load (names the file)."""


class RunFolderError(Exception):
    """Writing the run folder failed (disk full, no permission, a file where a folder should be)."""


# ---------------------------------------------------------------------------------------- encoding


def _dataclasses() -> dict[str, type]:
    """The record types a checkpoint may hold, by name (nothing else is rebuilt on load)."""
    from rwcore.trainer.envs.base import Outcome
    from rwcore.trainer.rollout import Rollout
    from rwcore.types import Trajectory, Turn

    return {cls.__name__: cls for cls in (Rollout, Trajectory, Turn, Outcome)}


_PLAIN = (str, int, float, bool, type(None), bytes)


def encode(value: Any, where: str = "state") -> Any:
    """`value` as something `torch.load(weights_only=True)` rebuilds: tensors, plain containers and
    scalars pass through; numpy arrays / scalars and the known record types become tagged dicts.
    Anything else raises TypeError naming where it sits, so that no checkpoint is written that could
    not be loaded."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "OVU" or value.dtype.hasobject:
            raise TypeError(f"{where}: a numpy array of dtype {value.dtype} cannot be saved in a checkpoint")
        return {
            _TAG: "ndarray",
            "dtype": value.dtype.str,
            "shape": list(value.shape),
            "data": np.ascontiguousarray(value).tobytes(),
        }
    if isinstance(value, np.generic):
        if value.dtype.kind in "OVUS":
            raise TypeError(f"{where}: a numpy scalar of dtype {value.dtype} cannot be saved in a checkpoint")
        return {_TAG: "npscalar", "dtype": value.dtype.str, "data": value.tobytes()}
    if type(value) in _PLAIN:
        return value
    if isinstance(value, dict) and type(value) is dict:
        out = {}
        for key, item in value.items():
            if type(key) not in _PLAIN and not (type(key) is tuple and all(type(k) in _PLAIN for k in key)):
                raise TypeError(f"{where}: a dict key of type {type(key).__name__} cannot be saved in a checkpoint")
            out[key] = encode(item, f"{where}[{key!r}]")
        return out
    if type(value) in (list, tuple, set, frozenset):
        items = [encode(item, f"{where}[{i}]") for i, item in enumerate(value)]
        return items if type(value) is list else type(value)(items)
    known = _dataclasses()
    if dataclasses.is_dataclass(value) and known.get(type(value).__name__) is type(value):
        return {
            _TAG: "record",
            "name": type(value).__name__,
            "fields": {f.name: encode(getattr(value, f.name), f"{where}.{f.name}") for f in dataclasses.fields(value)},
        }
    raise TypeError(
        f"{where}: a {type(value).__module__}.{type(value).__qualname__} cannot be saved in a "
        "checkpoint (only tensors, plain containers, numpy values and rollout records)"
    )


def decode(value: Any) -> Any:
    """The inverse of `encode`."""
    if isinstance(value, dict):
        tag = value.get(_TAG)
        if tag == "ndarray":
            dtype = np.dtype(value["dtype"])
            if dtype.hasobject:
                raise ValueError(f"a checkpoint array has dtype {dtype}")
            return np.frombuffer(value["data"], dtype=dtype).reshape(value["shape"]).copy()
        if tag == "npscalar":
            dtype = np.dtype(value["dtype"])
            if dtype.hasobject:
                raise ValueError(f"a checkpoint scalar has dtype {dtype}")
            return np.frombuffer(value["data"], dtype=dtype)[0]
        if tag == "record":
            cls = _dataclasses().get(value["name"])
            if cls is None:
                raise ValueError(f"a checkpoint record has unknown type {value['name']!r}")
            return cls(**{name: decode(item) for name, item in value["fields"].items()})
        decoded = {key: decode(item) for key, item in value.items()}
        if all(decoded[key] is item for key, item in value.items()):
            return value  # nothing tagged inside: the container itself (an OrderedDict keeps its _metadata)
        return decoded
    if type(value) in (list, tuple, set, frozenset):
        items = [decode(item) for item in value]
        if all(new is old for new, old in zip(items, value)):
            return value
        return items if type(value) is list else type(value)(items)
    return value


def save(value: Any, path: Path, encoded: bool = True) -> None:
    """torch.save of `encode(value)` (of `value` itself with encoded=False: a module's or optimizer's
    state dict, which already loads with weights_only=True) into `path` through a Python file, flushed
    and fsynced, so that a full disk raises OSError (ENOSPC) naming nothing half-written as done."""
    payload = encode(value, path.name) if encoded else value
    with open(path, "wb") as stream:
        try:
            torch.save(payload, stream)
        except RuntimeError as error:  # a failed write reaches us as torch's "[enforce fail at ...]"
            raise write_failure(error, path) from error
        stream.flush()
        os.fsync(stream.fileno())


def write_failure(error: BaseException, path: Path) -> BaseException:
    """What a failed `torch.save` into `path` really was, to raise in place of torch's RuntimeError.

    torch's zip writer turns whatever the stream's write raised into a RuntimeError ("[enforce fail at
    inline_container.cc:...] unexpected pos ...") whose context is the original: a KeyboardInterrupt or
    SystemExit (Ctrl-C landing in the write) is returned as it is, an OSError (ENOSPC, EFBIG, ...) as one
    naming `path`; without either, an OSError (EIO) carrying torch's first line, so that callers handle
    one kind of failure."""
    interrupt = _behind(error, lambda seen: isinstance(seen, (KeyboardInterrupt, SystemExit)))
    if interrupt is not None:
        return interrupt
    behind = _os_error_behind(error)
    if behind is not None:
        return OSError(behind.errno, behind.strerror or os.strerror(behind.errno), str(path))
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return OSError(errno.EIO, f"torch.save failed: {first[:300]}", str(path))


def load(path: Path, map_location=None, decoded: bool = True) -> Any:
    """A .pt file of a verified checkpoint, with the restricted unpickler (no code runs); decoded unless
    `decoded=False` (model and optimizer state dicts, saved with `encoded=False`). A file the unpickler refuses,
    a truncated archive or a missing file is a CheckpointError naming it: one line, no traceback."""
    try:
        value = torch.load(path, weights_only=True, map_location=map_location)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing") from None
    except Exception as error:  # the restricted unpickler's refusals, truncated zip archives
        reason = str(error).strip().splitlines()
        unsafe = [line.strip() for line in reason if "Unsupported" in line or "global" in line.lower()]
        detail = (unsafe or reason or [type(error).__name__])[0]
        raise CheckpointError(
            f"{path} cannot be loaded safely (torch.load weights_only=True): {detail[:300]}"
        ) from None
    if not decoded:
        return value
    try:
        return decode(value)
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{path} holds an invalid record: {error}") from None


# ---------------------------------------------------------------------------------------- manifest


def _files(folder: Path) -> list[Path]:
    """Every file under `folder` but the manifest, in a fixed order (refuses links and odd entries)."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = Path(root) / name
            if path.is_symlink() or not path.is_file():
                raise CheckpointError(f"{path} is not a regular file")
            if path.parent == folder and name == MANIFEST:
                continue
            found.append(path)
    return found


def _digest(path: Path, sync: bool = False) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as stream:
        while True:
            block = stream.read(_CHUNK)
            if not block:
                break
            digest.update(block)
            size += len(block)
        if sync:
            os.fsync(stream.fileno())
    return size, digest.hexdigest()


def _checksum(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def fsync_dir(folder: Path) -> None:
    """Makes the folder's entries (new files, renames) durable; a filesystem that cannot is let be."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError as error:
        if error.errno not in (22, 95):  # EINVAL / EOPNOTSUPP: this filesystem does not sync folders
            raise
    finally:
        os.close(handle)


def write_manifest(folder: Path, step: int) -> dict:
    """Hashes and fsyncs every file of a staging folder, writes manifest.json (fsynced) last, then fsyncs
    every folder in it, deepest first."""
    files = {}
    for path in _files(folder):
        size, sha = _digest(path, sync=True)
        files[path.relative_to(folder).as_posix()] = {"size": size, "sha256": sha}
    body = {"format": FORMAT, "step": int(step), "files": files}
    manifest = {**body, "checksum": _checksum(body)}
    with open(folder / MANIFEST, "wb") as stream:
        stream.write(json.dumps(manifest, indent=1, sort_keys=True).encode())
        stream.flush()
        os.fsync(stream.fileno())
    for root, _, _ in sorted(os.walk(folder), key=lambda entry: -len(Path(entry[0]).parts)):
        fsync_dir(Path(root))
    return manifest


def verify(folder: Path) -> dict:
    """The checkpoint's manifest, after checking it and every file it lists (size and sha256) and that no
    file is unlisted. Raises CheckpointError naming the file and what is wrong."""
    folder = Path(folder)
    if folder.is_symlink():
        raise CheckpointError(
            f"checkpoint {folder} is a symbolic link (to {os.readlink(folder)!r}): a checkpoint is read only from "
            "a folder rw wrote inside the run, never through a link"
        )
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint {folder} does not exist")
    path = folder / MANIFEST
    if not path.is_file():
        raise CheckpointError(
            f"{path} is missing: the checkpoint is incomplete or was written by an older "
            "rwcore (such checkpoints are not loaded: they need unrestricted unpickling)"
        )
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
        body = {"format": manifest["format"], "step": manifest["step"], "files": manifest["files"]}
        checksum = manifest["checksum"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{path} is unreadable ({type(error).__name__}): the manifest is corrupted") from None
    if _checksum(body) != checksum:
        raise CheckpointError(f"{path} does not match its own checksum: the manifest is corrupted")
    if body["format"] != FORMAT:
        raise CheckpointError(f"{path} has format {body['format']!r}; this rwcore reads format {FORMAT}")
    listed = body["files"]
    if not isinstance(listed, dict):
        raise CheckpointError(f"{path} is corrupted: 'files' is not a mapping")
    present = {p.relative_to(folder).as_posix() for p in _files(folder)}
    for name in sorted(present - set(listed)):
        raise CheckpointError(f"{folder / name} is not listed in {MANIFEST}: the checkpoint was altered")
    for name, entry in sorted(listed.items()):
        file = folder / name
        if name not in present:
            raise CheckpointError(f"{file} is missing (listed in {MANIFEST})")
        size, sha = _digest(file)
        if size != entry["size"]:
            raise CheckpointError(
                f"{file} has {size} bytes where {MANIFEST} says {entry['size']}: truncated or corrupted"
            )
        if sha != entry["sha256"]:
            raise CheckpointError(f"{file} does not match its sha256 in {MANIFEST}: corrupted")
    return manifest


# ---------------------------------------------------------------------------------------- run folders


def step_folders(checkpoints: Path) -> list[Path]:
    """The `step_N` entries under `checkpoints/` that are folders or symlinks, newest (highest step) first. A
    symlink is listed so that `verify` refuses it by name (a reader then says it skipped it), never followed."""
    if not checkpoints.is_dir():
        return []
    found = [
        (int(match.group(1)), path)
        for path in checkpoints.iterdir()
        if (match := _STEP.match(path.name)) and (path.is_symlink() or path.is_dir())
    ]
    return [path for _, path in sorted(found, reverse=True)]


# Files rw keeps in a run folder across a new start: rw ablate's bookkeeping, and the writer's lock
# (trainer/run_lock.py), which --overwrite holds while it removes the rest and must not remove.
KEPT_FILES = ABLATE_FILES + (LOCK_FILE,)


class RunFolderRefused(ValueError):
    """`--out` names a folder that a new run must not write into (names the folder and what to do)."""


def is_run_folder(path: Path) -> bool:
    """Whether `path` holds a run of `rw train` (its config.yaml beside checkpoints/ or metrics.jsonl)."""
    return (path / "config.yaml").is_file() and ((path / "checkpoints").is_dir() or (path / "metrics.jsonl").is_file())


def _ours(name: str, names: tuple[str, ...]) -> bool:
    match = _ATOMIC_TEMPORARY.match(name)
    return name in names or bool(match and match.group("name") in names)


def foreign_entries(run: Path) -> list[Path]:
    """Entries of a run folder that rw did not write (symlinks always count: nothing is followed)."""
    foreign = []
    for path in sorted(run.iterdir()):
        if path.is_symlink():
            foreign.append(path)
        elif path.name in RUN_OUTPUT_DIRS and path.is_dir():
            if path.name == "checkpoints":
                foreign += [
                    p
                    for p in sorted(path.iterdir())
                    if p.is_symlink()
                    or not (
                        (p.is_dir() and (_STEP.match(p.name) or _STAGING.match(p.name)))
                        or (p.is_file() and _ours(p.name, CHECKPOINT_FILES))
                    )
                ]
        elif not (path.is_file() and _ours(path.name, RUN_FILES + KEPT_FILES)):
            foreign.append(path)
    return foreign


def check_new_run_folder(path: Path, overwrite: bool = False) -> None:
    """Refuses `--out` on a folder a new run must not write into, before anything is written.

    Missing, empty, or holding only `rw ablate`'s bookkeeping and the run lock: fine. Holding anything else
    and not a run folder: refused (a new run would overwrite its files). A run folder: refused with the ways
    on (`--resume`, a new folder) unless `overwrite`, which removes the files rw wrote - only after checking
    that there is nothing else in it (then refused, naming what) - and keeps `rw ablate`'s bookkeeping and
    the lock file (`KEPT_FILES`). The caller holds the folder's lock (trainer/run_lock.py) before this runs.
    """
    if not path.exists():
        return
    entries = sorted(path.iterdir())
    if all(entry.name in KEPT_FILES and entry.is_file() and not entry.is_symlink() for entry in entries):
        return
    shown = ", ".join(entry.name for entry in entries[:5]) + (", ..." if len(entries) > 5 else "")
    if not is_run_folder(path):
        raise RunFolderRefused(
            f"--out {str(path)!r} is not empty and holds no run of rw ({shown}); a new run would "
            "write over its files: choose a new or empty folder"
        )
    if not overwrite:
        raise RunFolderRefused(
            f"--out {str(path)!r} already holds a run; continue it with: rw train --resume {path}"
            "; or choose a new folder; or add --overwrite to replace it (removes only the files "
            "rw wrote there)"
        )
    foreign = foreign_entries(path)
    if foreign:
        names = ", ".join(str(p.relative_to(path)) for p in foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise RunFolderRefused(
            f"--overwrite: {str(path)!r} also holds files rw did not write ({names}); nothing "
            "was removed: move them, or choose a new folder"
        )
    for entry in sorted(path.iterdir()):
        if entry.name in KEPT_FILES:
            continue
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def latest_checkpoint(run: Path) -> Path | None:
    """The checkpoint `checkpoints/latest` names, or None without that file. It must name a `step_N` folder
    right inside this run's checkpoints/ (not a symlink): a pointer edited to lead elsewhere - another run's
    checkpoint - is a CheckpointError naming it, never followed."""
    pointer = run / "checkpoints" / "latest"
    if not pointer.exists() and not pointer.is_symlink():
        return None
    if pointer.is_symlink() or not pointer.is_file():
        raise CheckpointError(f"{pointer} is not a plain file; refusing to follow it")
    try:
        name = pointer.read_text(encoding="utf-8", errors="strict")[:256].strip()
    except (OSError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{pointer} cannot be read ({error})") from None
    if not _STEP.fullmatch(name):
        raise CheckpointError(
            f"{pointer} names {name!r}, not a step_N folder of this run's checkpoints/; refusing to follow it"
        )
    folder = run / "checkpoints" / name
    if folder.is_symlink() or not folder.is_dir():
        raise CheckpointError(
            f"{pointer} names {name!r}, which is not a checkpoint folder inside {run / 'checkpoints'}"
        )
    return folder


def clean_temporaries(run: Path) -> list[Path]:
    """Removes what a killed run left behind: staging folders `checkpoints/.step_N.tmp` and the
    temporaries of atomic writes of the run's own files. Nothing else is touched. Returns the removed paths."""
    removed = []
    places = ((run, RUN_FILES), (run / "checkpoints", CHECKPOINT_FILES))
    for folder, names in places:
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            match = _ATOMIC_TEMPORARY.match(path.name)
            if match and match.group("name") in names and path.is_file() and not path.is_symlink():
                path.unlink()
                removed.append(path)
            elif (
                folder.name == "checkpoints"
                and folder.parent == run
                and _STAGING.match(path.name)
                and path.is_dir()
                and not path.is_symlink()
            ):
                shutil.rmtree(path)
                removed.append(path)
    return removed


# safetensors (Rust) words an I/O failure as text: `I/O error: No space left on device (os error 28)` (0.8) or
# `IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })` (earlier)
_RUST_OS_ERROR = re.compile(
    r'I/O error: (?P<a>[^()]+?) \(os error \d+\)|Os \{ code: \d+, kind: \w+, message: "(?P<b>[^"]*)" \}'
)


@contextlib.contextmanager
def writing(what: Path):
    """OSErrors raised inside become RunFolderError naming the path that could not be written."""
    try:
        yield
    except Exception as error:
        if type(error).__name__ == "SafetensorError":  # safetensors' writer reports the OSError as text only
            found = _RUST_OS_ERROR.search(str(error))
            if found is None:
                raise
            raise RunFolderError(f"cannot write {what}: {found.group('a') or found.group('b')}") from error
        if not isinstance(error, (OSError, RuntimeError)):
            raise
        if isinstance(error, RuntimeError):  # torch's and DeepSpeed's writers wrap the OSError of a failed write
            error = _os_error_behind(error)
            if error is None:
                raise
        path = error.filename if error.filename else what
        reason = error.strerror or str(error) or type(error).__name__
        raise RunFolderError(f"cannot write {path}: {reason}") from error


def _behind(error: BaseException, wanted: Callable[[BaseException], bool]) -> BaseException | None:
    """The first exception in `error`'s cause/context chain (itself included, 8 links at most) that is `wanted`."""
    seen, depth = error, 0
    while seen is not None and depth < 8:
        if wanted(seen):
            return seen
        seen, depth = seen.__cause__ or seen.__context__, depth + 1
    return None


def _os_error_behind(error: BaseException) -> OSError | None:
    """The OSError (with an errno) in the cause/context chain of `error`, if any."""
    return _behind(error, lambda seen: isinstance(seen, OSError) and seen.errno is not None)
