"""`rw config` and `rw variants`: what a run would be set to, and the method variants train.method takes."""

from __future__ import annotations

import argparse
import json

from rwcore.trainer.cli.command import Command, CommandError, _config_file, _override, _shipped_configs
from rwcore.trainer.config import describe_config, dump_config, load_config

__all__ = ["ConfigCommand", "VariantsCommand"]


class ConfigCommand(Command):
    name = "config"
    help = "print the resolved config (or every key with its type and meaning)"
    description = "Resolves defaults, --config and overrides exactly as `rw train` does."
    epilog = """examples:
  rw config                                    # the embedded default as YAML
  rw config --config my.yaml train.steps=20    # what rw train would run
  rw config --describe                         # every key, its type, default and meaning
  rw config --list                             # the shipped configs (rw train --config NAME)
  rw config --config arise-qwen                # what a shipped config resolves to
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--config", metavar="FILE", help="YAML config file")
        parser.add_argument("--describe", action="store_true", help="list every key with its type and documentation")
        parser.add_argument("--list", action="store_true", help="list the shipped configs")
        parser.add_argument("overrides", nargs="*", metavar="key=value", type=_override, help="config overrides")

    def run(self, args: argparse.Namespace) -> int:
        if args.list:
            for name, path in _shipped_configs().items():
                first = next((line[1:].strip() for line in path.read_text().splitlines() if line.startswith("#")), "")
                print(f"{name:24s} {first}")
            return 0
        try:
            config = load_config(_config_file(args.config), args.overrides)
        except ValueError as error:
            raise CommandError(str(error)) from None
        print(describe_config(config) if args.describe else dump_config(config), end="\n")
        return 0


class VariantsCommand(Command):
    name = "variants"
    help = "list the method variants train.method takes, with the paper rows they reproduce"
    description = (
        "Each ablation differs from its parent in exactly one component (process_reward, "
        "arise_rubrics, skills, sampler)."
    )
    epilog = """examples:
  rw variants
  rw variants --json
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="machine-readable output")

    def run(self, args: argparse.Namespace) -> int:
        from rwcore.method import VARIANTS

        if args.json:
            print(json.dumps([v.to_dict() for v in VARIANTS.values()], indent=1))
            return 0
        for variant in VARIANTS.values():
            c = variant.components
            parts = (
                f"process_reward={c['process_reward']} arise_rubrics={c['arise_rubrics']} "
                f"skills={'on' if c['skills'] else 'off'} sampler={c['sampler']}"
            )
            parent = f" (ablates {variant.parent})" if variant.parent else ""
            print(f"{variant.name:28s} {variant.paper_row}{parent}\n{'':28s} {variant.description}\n{'':28s} {parts}")
        return 0
