"""`rw export`: a run's trained model as a Hugging Face folder (trainer/export.py)."""

from __future__ import annotations

import argparse

from rwcore.trainer.cli.command import Command, CommandError

__all__ = ["ExportCommand"]


class ExportCommand(Command):
    name = "export"
    help = "write a run's trained model as a Hugging Face folder (transformers, vLLM)"
    description = (
        "Writes the policy of the run's newest intact checkpoint (or --step N) into the new folder --out: "
        "config.json, model.safetensors, the tokenizer, generation_config.json and rwcore_export.json (run, "
        "step, checkpoint). A LoRA run's adapters are merged; --adapter-only writes PEFT's adapter folder "
        "instead. Nothing is written when the run has no intact checkpoint or --out is not empty (exit 2)."
    )
    epilog = """examples:
  rw export runs/demo --out exports/demo              # newest intact checkpoint
  rw export runs/demo --step 200 --out exports/demo-200
  rw export runs/qwen-lora --out exports/qwen-merged    # LoRA merged into the weights
  rw export runs/qwen-lora --adapter-only --out exports/qwen-adapter
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", metavar="RUN", help="a run folder written by rw train")
        parser.add_argument(
            "--step",
            type=int,
            default=None,
            metavar="N",
            help="export the checkpoint of step N (default: the newest intact checkpoint)",
        )
        parser.add_argument("--out", metavar="DIR", required=True, help="a new or empty folder for the export")
        parser.add_argument(
            "--adapter-only",
            action="store_true",
            help="a LoRA run: write PEFT's adapter folder (adapter_config.json, adapter_model.safetensors) and "
            "the tokenizer instead of the merged model",
        )

    def run(self, args: argparse.Namespace) -> int:
        from rwcore.trainer.checkpoint import CheckpointError, RunFolderError
        from rwcore.trainer.export import export_run

        try:
            result = export_run(args.run_dir, args.out, step=args.step, adapter_only=args.adapter_only)
        except (ValueError, CheckpointError) as error:
            raise CommandError(str(error)) from None
        except RunFolderError as error:
            raise CommandError(str(error), code=1) from None
        what = "adapter" if result.kind == "adapter" else "model"
        print(f"exported the {what} of {result.checkpoint} to {result.out}")
        return 0
