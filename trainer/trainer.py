"""`Trainer`: `rw train` - rollouts, the policy update, processes and checkpoints around an
`rwcore.AdaptiveMethod`, which holds the method itself (sampler, pool, RewardWeaver).

Per step k: the method picks tasks -> G rollouts each under the method's training prompt
(behavior log-probs recorded) -> the judge evaluates what the method asks for -> the method's
rewards and advantages -> one policy update with the fused filtered dual-clip loss -> the
method takes the evidence. When the method says a RewardWeaver stage boundary falls at the end of
step k (and before step 0), the trainer rolls out a *fresh on-policy* diagnosis batch of the
updated policy and the fixed diagnostic set (without skills, appendix G); then `method.adapt`
runs the pool update and / or the new stage. Held-out evaluation never shows skills.

Variants: `train.method` is any name of `rwcore.AdaptiveMethod.variants()` (`rw variants`).

This module holds the run's orchestration (setup, the step loop, the run folder's logs, cleanup). The
`Trainer`'s other parts, each in its own module: this process's episodes and their gathering across ranks
(rwcore.trainer.rank_rollouts), the method's adaptation (rwcore.trainer.adaptation), evaluation and `rw eval`
(rwcore.trainer.evaluation), and what a checkpoint holds and how a run resumes (rwcore.trainer.run_state; the
on-disk format is rwcore.trainer.checkpoint's). Beside it: the tensor-level policy update
(rwcore.trainer.update), the metrics rows and their keys (rwcore.trainer.metrics; docs/metrics.md lists every
key) and what the LLM roles cost (rwcore.trainer.usage).

Run folder (see rwcore.trainer.report for the plots, rwcore.trainer.analyze for the tables):
config.yaml (resolved), method.json (the variant, its components and every method setting), environment.json
(what the environment was built from: rwcore.trainer.envs.provenance),
metrics.jsonl, sampling.jsonl, reward_stages.json, reward_history.json, diagnostics.json,
pool_counts.json, pool_events.json, pool_rubrics.json, run_info.json (every invocation: command line, versions, commit,
machine; rwcore.trainer.run_info), checkpoints/step_NNNNNN/ (+ checkpoints/latest; train.keep_checkpoints prunes them:
rwcore.trainer.checkpoint_retention), and the
folders of the experiment trackers train.loggers names (tensorboard/, wandb/, mlflow/, trackio/: trackers.py).

Processes: with train.engine=deepspeed under `deepspeed` / `torchrun`, every rank draws the same
batch, rolls out and judges its own block of groups, and gathers the trajectories and verdicts, so
rewards, advantages and the method's evidence are computed identically everywhere; adaptation and
library admission (which may call an LLM) run on rank 0 and the method's state is broadcast.
Rank 0 alone writes the run folder.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from rwcore._io import atomic_write_bytes
from rwcore.method import AdaptiveMethod, get_variant
from rwcore.method.loop import MethodLoop
from rwcore.trainer import checkpoint as ckpt
from rwcore.trainer import envs
from rwcore.trainer.adaptation import TrainerAdaptation
from rwcore.trainer.config import Config, config_to_dict, rollout_correction, save_config
from rwcore.trainer.engines import DeepSpeedEngine, TorchEngine
from rwcore.trainer.envs.provenance import check_environment, environment_record, write_environment
from rwcore.trainer.evaluation import TrainerEvaluation
from rwcore.trainer.judging import GroupJudging, can_overlap
from rwcore.trainer.lora import merged_state_dict, policy_with_adapters
from rwcore.trainer.method_setup import build_judge, build_providers, method_settings
from rwcore.trainer.metrics import TrainStep, train_row, usage_metrics, usage_row
from rwcore.trainer.policy import Policy
from rwcore.trainer.prior import ensure_prior, prior_record, resolve_init
from rwcore.trainer.prior.retention import ReadingRetention, check_reading_retention
from rwcore.trainer.rank_rollouts import RankRollouts, step_seed
from rwcore.trainer.rollout import Rollout
from rwcore.trainer.run_info import append_run_info, command_line, invocation
from rwcore.trainer.run_state import RunState
from rwcore.trainer.tracker_rows import not_applicable
from rwcore.trainer.trackers import Trackers
from rwcore.trainer.update import PolicyUpdate
from rwcore.trainer.usage import LLMUsage


def learning_rate(step: int, base: float, warmup: int, schedule: str, total: int) -> float:
    """The learning rate of optimizer step `step` (0-based): linear warm-up over `warmup` steps, then
    constant, or linear / cosine decay to 0 at `total`."""
    if warmup and step < warmup:
        return base * (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return base
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return base * (1.0 - progress)
    return base * 0.5 * (1.0 + math.cos(math.pi * progress))


class Trainer(RankRollouts, TrainerAdaptation, TrainerEvaluation, RunState):
    """Runs `rw train`: build with a Config and an output folder, then setup(), train(), cleanup().

    `resume`, `save_checkpoint` (RunState), `evaluate`, `evaluate_checkpoint`, `from_checkpoint`
    (TrainerEvaluation) come from the mixins named in the module docstring."""

    def __init__(self, config: Config, out_dir: str | os.PathLike, quiet: bool = False) -> None:
        self.config = config
        self.out = Path(out_dir)
        self.quiet = quiet
        self.step = 0  # optimizer steps completed
        self._resume_from: Path | None = None
        self._verified: Path | None = None  # the checkpoint resume() verified against its manifest
        self._evaluation_only = False  # rw eval: load a checkpoint, leave the run's logs alone
        self._replaced_entries: tuple[str, ...] = ()  # rw eval --tasks-file: provenance entries it replaces
        self._retention = None  # loss.reading_retention's corpus batches (set up in setup())
        self._reading_probe = None  # train.probe_at_eval's light probe (set up in setup())
        self.trackers: Trackers | None = None  # train.loggers (set up in setup(); none for rw eval)
        self.resumed: dict | None = None  # resume(): the checkpoint continued from, its step, the steps before
        self.command_line: list[str] | None = None  # what run_info.json records (default: this process's argv)

    @property
    def rollout_correction(self):
        """The run's rollout correction (`loss.rollout_correction`), None for "off"."""
        return rollout_correction(self.config)

    # ------------------------------------------------------------------ construction

    def setup(self) -> None:
        cfg = self.config
        if self._evaluation_only:
            cfg.train.engine = "torch"  # evaluation needs no optimizer; DeepSpeed checkpoints hold model.pt
            cfg.rollout.engine = "hf"
        self._check_batch(cfg)
        # train.loggers: a tracker whose package is missing is refused here, before anything is written
        # (the keys that do not apply to this run's settings stay in metrics.jsonl only: tracker_rows)
        self.trackers = (
            None
            if self._evaluation_only
            else Trackers(cfg.train.loggers, cfg.train.tracker_project, omit=not_applicable(cfg))
        )
        self._seed_everything(cfg.train.seed)
        self.device = self._device()
        envs.check_outside(cfg.env.name, self.out)  # never code that came inside the run folder
        self.env = envs.make(cfg.env.name, **dict(cfg.env.options))
        # what the environment was built from (its code's digest, its provenance()): a resumed or evaluated run
        # must be the same environment (rwcore.trainer.envs.provenance)
        self._environment = environment_record(cfg.env.name, self.env)
        if self._resume_from is not None:
            check_environment(self.out, self._environment, replaced=self._replaced_entries)
        if cfg.judge.kind == "openai" and callable(getattr(self.env, "configure_llm_defaults", None)):
            # the judge's server is the default for the environment's LLM roles left unset (e.g. an outcome evaluator)
            self.env.configure_llm_defaults(cfg.judge.model, cfg.judge.base_url or None, cfg.judge.api_key_env)
        self.train_tasks = {task.task_id: task for task in self.env.tasks("train")}
        self.eval_tasks = self.env.tasks("eval")
        cfg.model.init = resolve_init(cfg, self.env)  # config.yaml records what the run started from
        self._reading_probe = self._build_reading_probe()  # refuses train.probe_at_eval=on where it cannot run
        check_reading_retention(cfg, self.env)  # refuses loss.reading_retention before anything is written
        self.prior = None  # the reading prior a fresh run starts from (model.init=pretrained)
        if cfg.model.init == "pretrained" and self._resume_from is None:
            self.prior = ensure_prior(cfg, self.env, progress=not self.quiet and os.environ.get("RANK", "0") == "0")
        self.policy = self._build_policy()
        # loss.reading_retention > 0: the reading prior's corpus loss joins every optimizer step
        self._retention = (
            ReadingRetention(cfg, self.env, self.policy.codec, self.device) if cfg.loss.reading_retention else None
        )
        self.engine = self._build_engine()
        # the tensor-level update of every step (rwcore.trainer.update), with loss.adaptive_entropy's controller
        self.policy_update = PolicyUpdate(cfg, self.policy, self.engine, self.device, self._retention)
        self.rank, self.world_size = self.engine.rank, self.engine.world_size
        self.main = self.rank == 0  # the process that writes the run folder
        self.generator = self._build_generator()  # before any file is written: vLLM may be missing
        if callable(getattr(self.env, "attach_policy", None)):  # self-play: the policy writes the partner's turns
            from rwcore.trainer.rollout import policy_text_generator

            self.env.attach_policy(
                policy_text_generator(
                    self.policy, self.generator, cfg.rollout.temperature, cfg.rollout.max_new_tokens, cfg.train.seed
                )
            )
        self.rollouts_ahead = None  # the asynchronous rollout process (rollout.max_lag > 0), started last
        self._pending_rollouts: dict = {}
        self.variant = get_variant(cfg.train.method, "train.method")
        self.method = None
        self._eval_skills_prompt = None
        if self._evaluation_only:
            self._load_checkpoint(self._resume_from)
            return
        self.judge = build_judge(cfg, self.env)
        self.method = self._build_method()  # may refuse pool.frozen_from before anything is written
        # the method's loop (rwcore.method.loop), shared with the TRL and verl adapters: plan, finish, end_step
        self.loop = MethodLoop(
            self.method,
            judge=self.judge,
            diagnose=self._diagnosis,
            diagnostic=self._diagnostic_reports,
            leader=self.main,
        )
        self._adapting = -1
        self._diagnosis_seconds = 0.0
        # what the LLM roles cost, row by row (rwcore.trainer.usage)
        self.usage = LLMUsage({"judge": self.judge, "reflector": self.method.providers.reflector})
        self._judge_seconds = self._judge_wait = 0.0
        self._metrics_path = self.out / "metrics.jsonl"
        self._sampling_path = self.out / "sampling.jsonl"
        if self._resume_from is not None:
            self._load_checkpoint(self._resume_from)  # refuses another variant before any file changes
        if self.main:
            with ckpt.writing(self.out):
                self.out.mkdir(parents=True, exist_ok=True)
                ckpt.clean_temporaries(self.out)  # what a killed run left behind (staging folders, .tmp files)
                (self.out / "checkpoints").mkdir(exist_ok=True)
                save_config(cfg, self.out / "config.yaml")  # on resume: with the new train.steps of an extension
                append_run_info(self.out, self._invocation())  # the command line, versions, commit and machine
                atomic_write_bytes(self.out / "method.json", json.dumps(self.method.resolved(), indent=1).encode())
                if self._resume_from is None or not (self.out / "environment.json").exists():
                    write_environment(self.out, self._environment)
                if self.prior is not None:
                    atomic_write_bytes(self.out / "prior.json", json.dumps(prior_record(self.prior), indent=1).encode())
        self.engine.barrier()
        if self.main and self.trackers is not None:  # after config.yaml: each tracker's run gets the same config
            resumed_at = self.step if self._resume_from is not None else None
            self.trackers.start(config_to_dict(cfg), self.out, resume_step=resumed_at)
        if self._resume_from is not None:
            self._sync_generator()  # the rollout engine starts from the checkpoint's weights
        else:
            if self.main:
                with ckpt.writing(self.out):
                    for path in (self._metrics_path, self._sampling_path):
                        atomic_write_bytes(path, b"")
            self._start_method()
        self._write_adaptation_files()
        if cfg.rollout.max_lag:
            self._start_rollout_process()

    def _invocation(self) -> dict:
        """This invocation's record in run_info.json (rwcore.trainer.run_info)."""
        argv = self.command_line or command_line()
        if self.resumed is None:
            return invocation(argv, "start", steps=self.config.train.steps)
        resumed = {**self.resumed, "checkpoint": os.path.relpath(self.resumed["checkpoint"], self.out)}
        return invocation(argv, "resume", resumed_from=resumed, steps=self.config.train.steps)

    def _start_rollout_process(self) -> None:
        """rollout.max_lag > 0: the rollout process with the policy's current weights (and the rollouts a
        resumed checkpoint had already requested); the CPU threads are split between it and training."""
        from rwcore.trainer.async_rollout import RolloutProcess

        threads = torch.get_num_threads()
        worker = max(1, threads // 2)
        self._threads_before = threads  # restored by cleanup()
        torch.set_num_threads(max(1, threads - worker))
        # (a LoRA policy's merged weights: the process holds the plain model)
        self.rollouts_ahead = RolloutProcess(
            self.config, worker, merged_state_dict(self.policy.model), self.policy.version
        )
        self.rollouts_ahead.load_state_dict(self._pending_rollouts)
        self._pending_rollouts = {}

    def _build_method(self) -> AdaptiveMethod:
        """The variant with its providers; RewardWeaver's library is admitted on rank 0 with the training
        judge and broadcast (admission may call an LLM)."""
        cfg = self.config
        providers = build_providers(cfg, self.env, self.judge, self.variant, admit=self.main)
        if self.world_size > 1:
            library = self.engine.broadcast(providers.library.state_dict() if providers.library is not None else None)
            if not self.main and library is not None:
                providers.library.load_state_dict(library)
        tasks = {task_id: list(task.tags) for task_id, task in self.train_tasks.items()}
        return AdaptiveMethod(self.variant, tasks, method_settings(cfg), providers)

    def _seed_everything(self, seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % (2**32))
        torch.manual_seed(seed)

    def _device(self) -> torch.device:
        wanted = self.config.model.device
        if wanted == "auto":
            if not torch.cuda.is_available():
                return torch.device("cpu")
            # Under a launcher each process drives the GPU of its local rank.
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device(wanted)

    def _build_generator(self):
        """None for HFGenerator on the training model; a vLLM engine for rollout.engine=vllm (with
        rollout.max_lag > 0 the rollout process builds its own, and evaluation uses HFGenerator)."""
        cfg = self.config
        if cfg.rollout.engine != "vllm":
            return None
        from rwcore.trainer.vllm_rollout import VLLMGenerator, check_vllm

        if cfg.rollout.max_lag:
            check_vllm(self.policy, cfg.model.name)  # the rollout process builds the engine later
            return None

        return VLLMGenerator.for_config(self.policy, cfg, rank=self.rank)

    def _sync_generator(self) -> None:
        """The rollout engine (colocated vLLM, or the asynchronous rollout process) gets the policy's weights
        (a LoRA policy's merged into the base: rwcore.trainer.lora.merged_state_dict)."""
        if self.generator is not None:
            self.generator.sync(self.policy.model)
        if self.rollouts_ahead is not None:
            self.rollouts_ahead.push(merged_state_dict(self.policy.model), self.policy.version)

    def _check_batch(self, cfg: Config) -> None:
        world = int(os.environ.get("WORLD_SIZE", "1")) if cfg.train.engine == "deepspeed" else 1
        if cfg.rollout.max_lag and world > 1:
            raise ValueError(
                f"rollout.max_lag={cfg.rollout.max_lag}: asynchronous rollouts run one rollout process "
                f"beside one training process; with {world} data-parallel processes use "
                "rollout.max_lag=0"
            )
        if cfg.rollout.tasks_per_step < world:
            raise ValueError(
                f"rollout.tasks_per_step={cfg.rollout.tasks_per_step} is smaller than the number of "
                f"processes ({world}): every process needs at least one task group"
            )
        smallest = (cfg.rollout.tasks_per_step // world) * cfg.rollout.group_size
        if cfg.optim.minibatches > smallest:
            raise ValueError(
                f"optim.minibatches={cfg.optim.minibatches} is more than the {smallest} rollouts a "
                f"process updates on per step (rollout.tasks_per_step x rollout.group_size / processes)"
            )

    def _build_engine(self):
        cfg = self.config
        model = self.policy.model
        if cfg.train.engine == "deepspeed":
            return DeepSpeedEngine(
                model,
                lr=cfg.optim.lr,
                weight_decay=cfg.optim.weight_decay,
                grad_clip=cfg.optim.grad_clip,
                zero_stage=cfg.train.zero_stage,
                micro_batches=cfg.optim.minibatches,
                dtype=cfg.model.dtype,
                config_file=cfg.train.deepspeed_config,
            )
        return TorchEngine(model, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay, grad_clip=cfg.optim.grad_clip)

    def _build_policy(self) -> Policy:
        # model.lora: adapters wrapped in place (rwcore.trainer.lora), the rest as policy.build_policy builds it
        return policy_with_adapters(
            self.config, self.env, self.device, weights=self.prior.state_dict if self.prior is not None else None
        )

    # ------------------------------------------------------------------ the loop

    def train(self) -> None:
        cfg = self.config
        total = cfg.train.steps
        progress = None
        if not self.quiet and self.main:
            from tqdm import tqdm

            progress = tqdm(total=total, initial=self.step, desc="rw train", unit="step", dynamic_ncols=True)
        if self.step == 0:
            self._log_evaluation()
            if cfg.train.start_pass_k:
                self._log(self._exploration_row(cfg.train.start_pass_k))
        while self.step < total:
            row = self.train_step()
            self._log(row)
            if _due(self.step, cfg.train.eval_every) or self.step == total:
                row.update(self._log_evaluation())
            if (
                self.step == total
                and self.method.diagnostic_set
                and all(point["step"] != total for point in self.method.diagnostic_scores())
            ):
                self._adapting = total - 1
                self.loop.end_training(total)  # appendix G: the last stage's end
                self._write_adaptation_files()
                if self.usage:  # what judging the diagnostic set cost: a row of its own
                    self._log(usage_row(self.step, self._usage_row()))
            if _due(self.step, cfg.train.checkpoint_every) or self.step == total:
                self.save_checkpoint()
            self._report_progress(progress, row)
        if progress is not None:
            progress.close()
        if self.main:
            self._print_summary()

    def _print_summary(self) -> None:
        """The run in three numbers: held-out success before and after, and what adaptation cost."""
        rows = [json.loads(line) for line in self._metrics_path.read_text().splitlines() if line]
        evals = [r for r in rows if r.get("kind") == "eval"]
        fractions = [r["time/adaptive_fraction"] for r in rows if r.get("kind") == "train"]
        if evals and fractions:
            costs = ""
            for prefix in self.usage.clients:
                requests = sum(r.get(f"{prefix}/requests", 0) for r in rows)
                tokens = sum(
                    r.get(f"{prefix}/prompt_tokens", 0) + r.get(f"{prefix}/completion_tokens", 0) for r in rows
                )
                money = (
                    f", cost {self.usage.totals[prefix]:.4f}"
                    if self.config.judge.price_in or self.config.judge.price_out
                    else ""
                )
                costs += f"; {prefix} {requests} requests, {tokens} tokens{money}"
            print(
                f"held-out success {evals[0]['eval/success_rate']:.3f} -> {evals[-1]['eval/success_rate']:.3f} "
                f"(step {evals[0]['step']} -> {evals[-1]['step']}, train.method={self.variant.name}); adaptive "
                f"machinery {100 * float(np.mean(fractions)):.1f}% of step time{costs}; run folder {self.out}",
                flush=True,
            )

    def _report_progress(self, progress, row: dict) -> None:
        figures = {
            "reward": f"{row['reward_mean']:.3f}",
            "success": f"{row['success_rate']:.2f}",
            "kept": f"{row['kept_fraction']:.2f}",
            "rubrics": row["active_rubrics"],
        }
        if "eval/success_rate" in row:
            figures["eval"] = f"{row['eval/success_rate']:.2f}"
        if progress is not None:
            progress.set_postfix(figures, refresh=False)
            progress.update(1)
        elif self.main and self.step % self.config.train.log_every == 0:
            print(
                f"step {self.step}/{self.config.train.steps} " + " ".join(f"{k}={v}" for k, v in figures.items()),
                flush=True,
            )

    def train_step(self) -> dict:
        cfg = self.config
        index = self.step
        self._judge_seconds = self._judge_wait = 0.0
        torch.manual_seed(step_seed(cfg.train.seed, index) + self.rank)
        started = time.perf_counter()
        adaptive = 0.0

        judging = None
        if self.rollouts_ahead is not None:
            clock = time.perf_counter()
            if index not in self.rollouts_ahead.pending():  # step 0: nothing was requested ahead yet
                adaptive += self._request_rollouts(index)
            task_ids, rollouts = self.rollouts_ahead.take(index)
            waited = time.perf_counter() - clock
            trajectories = [r.trajectory for r in rollouts]
            # Request every step up to index + max_lag now (from version index), so that judging, scoring,
            # the update and adaptation all overlap with their generation; their tasks are sampled from the
            # evidence observed so far (up to step index - 1).
            for ahead in range(index + 1, min(cfg.train.steps, index + cfg.rollout.max_lag + 1)):
                if ahead not in self.rollouts_ahead.pending():
                    adaptive += self._request_rollouts(ahead)
        else:
            clock = time.perf_counter()
            plan = self.loop.plan(index, self.env.system_prompt)
            task_ids, prompt = plan.task_ids, plan.system_prompt
            adaptive += time.perf_counter() - clock
            judging = None
            if cfg.judge.overlap and can_overlap(self.judge):  # each group judged as soon as it has ended
                first, last = self._my_groups(len(task_ids))
                plans = self.loop.rubrics(index, task_ids)  # the method does not change while the step rolls out
                judging = GroupJudging(
                    self.judge, plans[first:last], {f"s{index}/t{i}": i - first for i in range(first, last)}
                )
            clock = time.perf_counter()
            rollouts, trajectories = self._rollout(
                task_ids,
                step_seed(cfg.train.seed, index),
                f"s{index}",
                prompt,
                on_group=judging.submit if judging is not None else None,
            )
            waited = time.perf_counter() - clock
        if judging is not None:
            mine, busy, wait = judging.collect(last - first)
            reports = self._gathered(mine)
            self._judge_seconds += busy
            self._judge_wait += wait
        else:
            reports = self._judge(trajectories, self.loop.rubrics(index, task_ids))

        clock = time.perf_counter()
        group = cfg.rollout.group_size
        # each group's evidence enters at the version that generated it (eq. 20: late under max_lag)
        versions = [int(trajectories[i * group].policy_version) for i in range(len(task_ids))]
        scored = self.loop.finish(index, task_ids, trajectories, reports, policy_versions=versions).scored
        adaptive += time.perf_counter() - clock

        first, last = self._my_groups(len(task_ids))
        lr = learning_rate(index, cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.schedule, cfg.train.steps)
        self.engine.set_lr(lr)
        update = self._update_policy(rollouts, scored.advantages[first * group : last * group])
        self.policy.version = index + 1  # diagnosis rollouts below come from the updated policy
        self._sync_generator()

        changed, adapt_seconds, diagnosis_seconds = self._adapt(index)
        adaptive += adapt_seconds
        self.step += 1

        if self.main and (changed or self.step % max(1, cfg.train.eval_every // 5) == 0):
            self._write_sampling()
        if self.main and changed:
            self._write_adaptation_files()
        elapsed = time.perf_counter() - started
        return train_row(
            TrainStep(
                step=self.step,
                index=index,
                trajectories=trajectories,
                scored=scored,
                groups=len(task_ids),
                versions=versions,
                lr=lr,
                method=self.method.metrics(),
                update=update,
                step_seconds=elapsed,
                adaptive_seconds=adaptive,
                diagnosis_seconds=diagnosis_seconds,
                rollout_wait_seconds=waited,
                judge_seconds=self._judge_seconds,
                judge_wait_seconds=self._judge_wait,
                usage=self._usage_row(),
            )
        )

    def _usage_row(self) -> dict:
        """What each LLM role cost since the previous row, summed over the processes (`judge/requests`, ...:
        rwcore.trainer.usage, rwcore.trainer.metrics)."""
        j = self.config.judge
        return usage_metrics(self.usage.since_last_row(self._gathered, j.price_in, j.price_out))

    def _update_policy(self, rollouts: Sequence[Rollout], advantages: np.ndarray) -> dict:
        """The step's policy update on this process's rollouts (rwcore.trainer.update.PolicyUpdate)."""
        return self.policy_update.update(rollouts, advantages, self.step)

    # ------------------------------------------------------------------ files

    def _log(self, row: dict) -> None:
        if not self.main:
            return
        with ckpt.writing(self._metrics_path), open(self._metrics_path, "a") as stream:
            stream.write(json.dumps(row) + "\n")
        if self.trackers is not None:  # the same row; a tracker that raises is named once and dropped
            self.trackers.log(row)

    def _write_sampling(self) -> None:
        pairs = self.method.sampling_probabilities(self.step, num_draws=500)
        if pairs is None:
            return
        line = {
            "step": self.step,
            "pairs": [{"tag": tag, "capability": cap, "probability": p} for (tag, cap), p in pairs.items()],
        }
        with ckpt.writing(self._sampling_path), open(self._sampling_path, "a") as stream:
            stream.write(json.dumps(line) + "\n")

    def _write_adaptation_files(self) -> None:
        if not self.main:
            return
        for name, payload in self.method.run_files().items():
            with ckpt.writing(self.out / name):
                atomic_write_bytes(self.out / name, json.dumps(payload, indent=1, default=str).encode())

    def cleanup(self) -> None:
        """Releases the engines (DeepSpeed's buffers and hooks, vLLM's temporary model folder) and the
        environment's resources when it has a `close` (the tools sandboxes of interrupted episodes). The
        trackers close first: their runs finish and their threads and service processes end."""
        if getattr(self, "trackers", None) is not None:
            self.trackers.close(complete=self.step >= self.config.train.steps)
            self.trackers = None
        for engine in (
            getattr(self, "rollouts_ahead", None),
            getattr(self, "generator", None),
            getattr(self, "engine", None),
            getattr(self, "env", None),
        ):
            if engine is not None and callable(getattr(engine, "close", None)):
                engine.close()
        if getattr(self, "_threads_before", None):
            torch.set_num_threads(self._threads_before)
            self._threads_before = None


def _due(step: int, every: int) -> bool:
    """Whether a periodic action (every 0 = never) falls on `step`."""
    return every > 0 and step % every == 0
