"""`run_info.json`: every invocation that wrote a run folder - the command line, the package versions, the commit
when rwcore runs from a git checkout, and the machine - one record per start or `--resume`, appended in order.

A run folder then says how each of its parts was made: which command started it, which extended it, on which
CPU (torch's kernels dispatch on the CPU's vector ISA, which changes float rounding), with which torch and
transformers. The file is rewritten whole through a temporary and a rename (`rwcore._io`), so a reader sees the
records before the new one or all of them.

Secrets are never recorded: in the command line, the value of every `key=value` override and `--flag value` whose
key names a secret (api_key, token, password, ...) is replaced with `<redacted>`, and so is the user:password part
of a URL; of the environment only a fixed list of variables that change how a run runs is kept (the API keys the
judge reads stay where they are). rwcore's configuration itself never holds a key, only the NAME of the variable
(`judge.api_key_env`), and that name is redacted too, as a key that names a secret.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from rwcore._io import atomic_write_bytes
from rwcore.trainer.machine import machine_record
from rwcore.trainer.run_paths import run_path

__all__ = ["RUN_INFO", "append_run_info", "invocation", "redact_argv", "read_run_info"]

RUN_INFO = "run_info.json"
REDACTED = "<redacted>"
# A key (an override's, a flag's, an environment variable's) whose value is a secret.
_SECRET = re.compile(r"api[_-]?key|token|secret|passw(or)?d|credential|private[_-]?key|access[_-]?key|auth", re.I)
_URL_USER = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]+@", re.I)
# Packages whose version changes what a run computes or how it runs; those installed are recorded.
PACKAGES = (
    "rwcore",
    "torch",
    "numpy",
    "transformers",
    "tokenizers",
    "triton",
    "vllm",
    "trl",
    "verl",
    "peft",
    "deepspeed",
    "accelerate",
    "ray",
    "openai",
    "tensorboard",
    "wandb",
    "mlflow",
    "trackio",
)
# Environment variables that change how a run runs (threads, devices, processes, offline modes, caches).
ENVIRONMENT = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "TRITON_INTERPRET",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "WANDB_MODE",
    "RWCORE_CACHE",
)


def _redact_value(value: str) -> str:
    return _URL_USER.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", value)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """`argv` with the value of every `key=value`, `--key=value` and `--key value` whose key names a secret
    replaced by `<redacted>`, and any URL's user:password part too."""
    out: list[str] = []
    hide_next = False
    for arg in map(str, argv):
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        key, equals, _ = arg.partition("=")
        if equals and _SECRET.search(key):
            out.append(f"{key}={REDACTED}")
        elif arg.startswith("-") and not equals and _SECRET.search(arg):
            out.append(arg)
            hide_next = True  # `--api-key VALUE`
        else:
            out.append(_redact_value(arg))
    return out


def _versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _commit() -> dict | None:
    """The git commit of the checkout rwcore runs from (and whether tracked files differ from it); None for an
    installed rwcore, or where git cannot say."""
    from rwcore._checkout import ROOT

    if not (ROOT / "setup.py").is_file() or not (ROOT / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head, "modified": bool(changed), "checkout": str(ROOT)}


def invocation(argv: Sequence[str], kind: str, **details: Any) -> dict:
    """One record: when, what command (redacted), from which folder, the packages, the commit, the machine, the
    environment variables of `ENVIRONMENT` that are set, and `details` (the step resumed from, the steps...)."""
    environment = {name: _redact_value(os.environ[name]) for name in ENVIRONMENT if name in os.environ}
    return {
        "kind": kind,
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "argv": redact_argv(argv),
        "cwd": os.getcwd(),
        **details,
        "versions": _versions(),
        "git": _commit(),
        "machine": machine_record(),
        "environment": environment,
    }


def read_run_info(run: str | os.PathLike) -> list[dict]:
    """The records of the run folder's run_info.json (empty when there is none). A file that is not a JSON list
    of records is a ValueError naming it."""
    path = run_path(Path(run) / RUN_INFO, "file")
    if not path.exists():
        return []
    try:
        records = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{path} is unreadable ({type(error).__name__}); move it away to resume") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError(f"{path} is not a list of records; move it away to resume")
    return records


def append_run_info(run: str | os.PathLike, record: dict) -> None:
    """Appends `record` to the run folder's run_info.json (a new run starts it), atomically."""
    path = run_path(Path(run) / RUN_INFO, "file")
    records = read_run_info(run) if record.get("kind") == "resume" else []
    atomic_write_bytes(path, json.dumps([*records, record], indent=1).encode())


def command_line() -> list[str]:
    """This process's command line as the user typed it (`rw train ...`), for a caller that was not given one."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    return [name, *sys.argv[1:]]
