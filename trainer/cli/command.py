"""What every `rw` subcommand shares: the `Command` base class, `CommandError` (bad input: one line, an exit
code), the argument types, the --config lookup (a file or a shipped config's name) and the run-folder lock."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

__all__ = ["PROG", "Command", "CommandError"]

PROG = "rw"


class CommandError(Exception):
    """Bad input to a command: printed as one line, exit code `code` (2 by default)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


class Command:
    """One subcommand."""

    name = ""
    help = ""
    description = ""
    epilog = ""
    parser: argparse.ArgumentParser | None = None  # its own parser (set by build_parser): its usage errors

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:  # pragma: no cover
        raise NotImplementedError

    def run(self, args: argparse.Namespace) -> int:  # pragma: no cover
        raise NotImplementedError


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _override(text: str) -> str:
    if "=" not in text or text.startswith("="):
        raise argparse.ArgumentTypeError(f"expected section.key=value (e.g. train.steps=20), got {text!r}")
    return text


def _lock_run_folder(folder: Path) -> Any:
    """The lock of a run folder this command writes (trainer/run_lock.py), made when missing; a folder another
    process writes, or a lock file that is not a plain file, is a CommandError (exit 2), one that cannot be
    made exit 1, each naming the path."""
    from rwcore.trainer.run_lock import RunLockError, acquire

    try:
        return acquire(folder)
    except RunLockError as error:
        raise CommandError(str(error)) from None
    except OSError as error:
        raise CommandError(f"cannot write {error.filename or folder}: {error.strerror or error}", code=1) from None


def _shipped_configs() -> dict[str, Path]:
    """Config name -> YAML file shipped in rwcore/trainer/configs."""
    folder = Path(__file__).resolve().parents[1] / "configs"
    return {path.stem: path for path in sorted(folder.glob("*.yaml"))}


def _config_file(value: str | None) -> str | None:
    """--config: a file path, or the name of a shipped config."""
    if value is None or os.path.exists(value):
        return value
    shipped = _shipped_configs()
    if value in shipped:
        return str(shipped[value])
    if os.sep in value or value.endswith((".yaml", ".yml")):
        return value  # a missing file: load_config says it cannot be read
    raise CommandError(f"--config {value!r} is neither a file nor a shipped config; shipped: {', '.join(shipped)}")
