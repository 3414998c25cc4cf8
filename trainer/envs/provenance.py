"""What a run's environment was built from, recorded in the run folder's `environment.json` and checked again
when the run is resumed or evaluated.

`environment_record(name, env)` -> a JSON-ready dict:

    env.name      the configured name
    factory       "module:qualname" of the callable that built it
    modules       {top-level module: {"sha256", "files", "distribution", "version", "path"}} for every top-level
                  package (or single-file module) outside rwcore that holds the factory or the environment's
                  class: sha256 over its .py files (relative path and content, sorted; __pycache__ left out),
                  the installed distribution and version that provide it (null for a folder on PYTHONPATH);
                  empty for a built-in environment (rwcore's own code is the package's version, never checked)
    provenance    the environment's optional `provenance()` -> {entry: digest} (e.g. {"train_file /abs/f.jsonl":
                  "<sha256>"}), {} when it has none

`check_environment(run, record)` compares a run folder's recorded file with the environment built now and
raises ValueError (one line) naming the first module or provenance entry that differs: resuming or evaluating
with other task code would mix two environments in one run's results. A run folder without the file (written
by an older release) is not checked.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import sys
from pathlib import Path

from rwcore._io import atomic_write_bytes
from rwcore.trainer.envs.registry import resolve

__all__ = ["FILE", "check_environment", "environment_record", "source_digest", "write_environment"]

FILE = "environment.json"


def source_digest(top: str) -> tuple[str, int, str] | None:
    """(sha256, number of files, path) of the top-level module `top`'s source: every .py file of its package,
    or its one file; None when it has no source file (built into Python, a namespace without files)."""
    module = sys.modules.get(top)
    if module is None:
        return None
    locations = list(getattr(module, "__path__", []) or [])
    if locations:
        files = sorted(
            (path.relative_to(Path(root)).as_posix(), path)
            for root in locations
            for path in Path(root).rglob("*.py")
            if "__pycache__" not in path.parts
        )
        where = str(Path(locations[0]).resolve())
    elif getattr(module, "__file__", None):
        path = Path(module.__file__)
        files, where = [(path.name, path)], str(path.resolve())
    else:
        return None
    digest = hashlib.sha256()
    for relative, path in files:
        digest.update(relative.encode() + b"\0" + hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\n")
    return digest.hexdigest(), len(files), where


def _distribution(top: str) -> tuple[str | None, str | None]:
    """The installed distribution that provides the top-level module `top`, and its version (None, None when
    the module is not installed, e.g. a folder on PYTHONPATH)."""
    names = importlib.metadata.packages_distributions().get(top) or []
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


def environment_record(name: str, env) -> dict:
    """What the environment `env` (built for `env.name=name`) was built from (see the module docstring)."""
    factory = resolve(name)
    module = getattr(factory, "__module__", None) or type(factory).__module__
    tops = sorted({module.split(".")[0], type(env).__module__.split(".")[0]} - {"rwcore", "builtins"})
    modules = {}
    for top in tops:
        found = source_digest(top)
        if found is None:
            continue
        sha, count, where = found
        distribution, version = _distribution(top)
        modules[top] = {"sha256": sha, "files": count, "distribution": distribution, "version": version, "path": where}
    return {
        "env.name": name,
        "factory": f"{module}:{getattr(factory, '__qualname__', type(factory).__qualname__)}",
        "modules": modules,
        "provenance": _provided(name, env),
    }


def _provided(name: str, env) -> dict[str, str]:
    method = getattr(env, "provenance", None)
    if not callable(method):
        return {}
    entries = method()
    if entries is None:
        return {}
    if not isinstance(entries, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in entries.items()):
        raise ValueError(f"env.name {name!r}: provenance() must return a dict of strings, got {entries!r:.200}")
    return dict(sorted(entries.items()))


def write_environment(run: str | os.PathLike, record: dict) -> None:
    """`record` as the run folder's environment.json (written whole through a temporary and a rename)."""
    atomic_write_bytes(Path(run) / FILE, (json.dumps(record, indent=1) + "\n").encode())


def _read(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{str(path)!r} is not readable JSON ({error})") from None
    if not isinstance(recorded, dict) or not isinstance(recorded.get("modules", {}), dict):
        raise ValueError(f"{str(path)!r} is not an environment record (a JSON object with 'modules')")
    return recorded


def check_environment(run: str | os.PathLike, record: dict, replaced: tuple[str, ...] = ()) -> None:
    """Refuses (ValueError naming the module or provenance entry) when the environment built now differs from
    the one run folder `run` recorded in environment.json; nothing to check when the file is absent.
    `replaced`: prefixes of provenance entries the caller replaced on purpose (`rw eval --tasks-file` gives the
    run another held-out file: "eval_file "), left unchecked."""
    path = Path(run) / FILE
    recorded = _read(path)
    if recorded is None:
        return
    fix = "restore it, or start a new run (its results would mix two environments)"
    was_modules, now_modules = recorded.get("modules") or {}, record["modules"]
    for top in sorted(set(was_modules) | set(now_modules)):
        was, now = was_modules.get(top), now_modules.get(top)
        if was is None or now is None:
            state = "was not part of it" if was is None else "is no longer imported"
            raise ValueError(
                f"environment module {top!r} {state} when the run started ({str(path)!r}, env.name "
                f"{record['env.name']!r}); {fix}"
            )
        if was.get("sha256") != now["sha256"]:
            raise ValueError(
                f"environment module {top!r} changed since the run started: its source sha256 is {now['sha256'][:16]}"
                f", {str(path)!r} recorded {str(was.get('sha256'))[:16]} ({now['path']}); {fix}"
            )
        # a version is compared where both are known: the same code installed later (or run from its folder) is
        # the same environment; another release of it with the same .py files may still ship other data files
        if was.get("version") and now["version"] and was.get("version") != now["version"]:
            raise ValueError(
                f"environment module {top!r} changed since the run started: {now['distribution'] or top} version "
                f"{now['version']}, {str(path)!r} recorded {was.get('version')}; {fix}"
            )
    ours = all(str(f).startswith("rwcore.") for f in (recorded.get("factory"), record["factory"]))
    if recorded.get("factory") != record["factory"] and not ours:  # rwcore moving its own factory is no change
        raise ValueError(
            f"environment factory changed since the run started: env.name {record['env.name']!r} now builds with "
            f"{record['factory']}, {str(path)!r} recorded {recorded.get('factory')}; {fix}"
        )
    was_entries, now_entries = recorded.get("provenance") or {}, record["provenance"]
    for key in sorted(set(was_entries) | set(now_entries)):
        if key.startswith(replaced) and replaced:
            continue
        if was_entries.get(key) != now_entries.get(key):
            raise ValueError(
                f"environment provenance entry {key!r} changed since the run started: now "
                f"{str(now_entries.get(key))[:16]}, {str(path)!r} recorded {str(was_entries.get(key))[:16]}; {fix}"
            )
