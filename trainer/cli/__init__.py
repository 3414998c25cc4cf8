"""The `rw` command line: `rw train`, `rw pretrain`, `rw probe`, `rw eval`, `rw export`, `rw report`,
`rw analyze`, `rw variants`, `rw ablate`, `rw compare`, `rw config` and `rw bench`.

Each subcommand is one small class with `name`, `help`, `add_arguments(parser)` and
`run(args) -> int`; `main(argv=None) -> int` parses and dispatches. Exit codes: 0 success,
2 bad input (argparse usage errors, config errors, missing folders, damaged or unsafe checkpoints —
one line on stderr, no traceback), 1 a missing optional dependency or a run folder that cannot be
written (disk full, a file where a folder should be — one line naming the path), 130 interrupted.

The subcommands, by module: training.py (train, pretrain, probe, eval), export.py, results.py (report,
analyze, compare), config.py (config, variants), ablate.py, bench.py; command.py holds what they share.

`python -m rwcore.trainer` and `python -m rwcore.trainer.cli` are the same as `rw`.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Sequence

from rwcore.trainer.cli.ablate import AblateCommand
from rwcore.trainer.cli.bench import BenchCommand
from rwcore.trainer.cli.command import PROG, Command, CommandError, _override
from rwcore.trainer.cli.config import ConfigCommand, VariantsCommand
from rwcore.trainer.cli.export import ExportCommand
from rwcore.trainer.cli.results import AnalyzeCommand, CompareCommand, ReportCommand
from rwcore.trainer.cli.training import EvalCommand, PretrainCommand, ProbeCommand, TrainCommand

__all__ = ["main", "build_parser", "parse_argv", "CommandError"]


def _print_err(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)


COMMANDS: tuple[type[Command], ...] = (
    TrainCommand,
    PretrainCommand,
    ProbeCommand,
    EvalCommand,
    ExportCommand,
    ReportCommand,
    AnalyzeCommand,
    VariantsCommand,
    AblateCommand,
    CompareCommand,
    ConfigCommand,
    BenchCommand,
)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Command]]:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Reinforcement learning of LLM agents with adaptive rewards and task mix (RewardWeaver, Arise).",
        epilog="examples:\n  rw train --out runs/demo\n  rw pretrain\n  rw probe runs/demo\n  rw report runs/demo\n"
        "  rw analyze runs/demo\n"
        "  rw variants\n  rw ablate --paper arise --out runs/ablate-arise\n  rw compare runs/a runs/b\n"
        "  rw eval runs/demo/checkpoints/step_200\n"
        "  rw export runs/demo --out exports/demo\n"
        "  rw bench --quick\n"
        "run `rw COMMAND --help` for a command's options",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    commands: dict[str, Command] = {}
    for cls in COMMANDS:
        command = cls()
        child = sub.add_parser(
            command.name,
            help=command.help,
            description=textwrap.fill(command.description or command.help, 88),
            epilog=command.epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(child)
        command.parser = child
        commands[command.name] = command
    return parser, commands


def _take_local_rank(argv: list[str]) -> list[str]:
    """The `deepspeed` launcher puts --local_rank=N before the subcommand (torchrun sets LOCAL_RANK
    instead): it goes into the environment, where the engine reads it, and out of the arguments."""
    kept = []
    flags = ("--local_rank", "--local-rank")
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.split("=", 1)[0] in flags:
            value = arg.split("=", 1)[1] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            i += 1 if "=" in arg else 2
            if not value.isdigit():
                raise ValueError(f"--local_rank needs a non-negative integer, got {value!r}")
            os.environ.setdefault("LOCAL_RANK", value)
            continue
        kept.append(arg)
        i += 1
    return kept


def parse_argv(argv: Sequence[str]) -> tuple[Command, argparse.Namespace]:
    """The subcommand and its parsed arguments, as `rw` reads them (nothing is run). A usage error, or --help,
    prints what argparse prints and raises SystemExit (code 2, or 0 for --help). The docs' test checks the
    `rw` commands of README.md and docs/ with it."""
    parser, commands = build_parser()
    args, extra = parser.parse_known_args(list(argv))
    if extra:
        child = commands[args.command].parser
        # key=value overrides may follow options too (`--out DIR optim.lr=1e-3`): argparse takes a positional
        # list once, so the later ones arrive here; anything else is the subcommand's usage error
        if isinstance(getattr(args, "overrides", None), list) and not any(e.startswith("-") for e in extra):
            try:
                args.overrides += [_override(text) for text in extra]
            except argparse.ArgumentTypeError as error:
                child.error(f"argument key=value: {error}")
        else:
            child.error(f"unrecognized arguments: {' '.join(extra)}")
    return commands[args.command], args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `rw` console script; returns the exit code."""
    try:
        argv = _take_local_rank(list(sys.argv[1:] if argv is None else argv))
    except ValueError as error:
        _print_err(str(error))
        return 2
    try:
        command, args = parse_argv(argv)
    except SystemExit as stop:  # --help (0) or a usage error (2, already printed)
        return int(stop.code) if isinstance(stop.code, int) else (0 if stop.code is None else 2)
    args.argv = list(argv)  # what was typed after the program's name (rw train records it in run_info.json)
    try:
        return command.run(args)
    except CommandError as error:
        _print_err(str(error))
        return error.code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `rw variants | head`: the reader left; nothing to report
        sys.stderr = open(os.devnull, "w")
        return 0
