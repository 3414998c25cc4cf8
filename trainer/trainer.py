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

Run folder (see rwcore.trainer.report for the plots, rwcore.trainer.analyze for the tables):
config.yaml (resolved), method.json (the variant, its components and every method setting),
metrics.jsonl, sampling.jsonl, reward_stages.json, reward_history.json, diagnostics.json,
pool_counts.json, pool_events.json, pool_rubrics.json, checkpoints/step_NNNNNN/ (+ checkpoints/latest), and the
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
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from rwcore._io import atomic_write_bytes
from rwcore.kernels import fused_linear_entropy, fused_linear_logprobs, fused_linear_policy_loss
from rwcore.kernels.rollout_correction import PREFIX as CORRECTION_PREFIX
from rwcore.kernels.rollout_correction import merge_metrics
from rwcore.method import AdaptiveMethod, get_variant
from rwcore.method.loop import MethodLoop
from rwcore.method.method import judge_groups
from rwcore.trainer import checkpoint as ckpt
from rwcore.trainer import envs
from rwcore.trainer.config import Config, config_to_dict, load_config, rollout_correction, save_config
from rwcore.trainer.engines import DeepSpeedEngine, TorchEngine
from rwcore.trainer.entropy_control import AdaptiveEntropyControl
from rwcore.trainer.judging import GroupJudging, can_overlap
from rwcore.trainer.lora import (
    check_checkpoint,
    checkpoint_record,
    is_lora,
    load_checkpoint_state_dict,
    merged_state_dict,
    policy_with_adapters,
)
from rwcore.trainer.method_setup import build_judge, build_providers, method_settings, task_contexts
from rwcore.trainer.policy import Policy
from rwcore.trainer.prior import ensure_prior, language_of, prior_record, resolve_init, resolve_probe_at_eval
from rwcore.trainer.prior.pretrain import corpus_spec
from rwcore.trainer.prior.probe import EvaluationProbe
from rwcore.trainer.prior.retention import ReadingRetention, check_reading_retention
from rwcore.trainer.rollout import Rollout, batch_tensors, run_episodes, score_behavior
from rwcore.trainer.run_logs import truncate_after
from rwcore.trainer.trackers import Trackers

EVAL_SEED = 1_000_003  # eval episodes use their own seeds: the same tasks and draws at every evaluation
DIAGNOSTIC_SEED = 2_000_003  # the fixed diagnostic set's episodes (appendix G), the same at every boundary


def _step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7_919 + 17) % (2**63)


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


class Trainer:
    """Runs `rw train`: build with a Config and an output folder, then setup(), train(), cleanup()."""

    def __init__(self, config: Config, out_dir: str | os.PathLike, quiet: bool = False) -> None:
        self.config = config
        self.out = Path(out_dir)
        self.quiet = quiet
        self.step = 0  # optimizer steps completed
        self._resume_from: Path | None = None
        self._verified: Path | None = None  # the checkpoint resume() verified against its manifest
        self._evaluation_only = False  # rw eval: load a checkpoint, leave the run's logs alone
        self._retention = None  # loss.reading_retention's corpus batches (set up in setup())
        self._reading_probe = None  # train.probe_at_eval's light probe (set up in setup())
        self.trackers: Trackers | None = None  # train.loggers (set up in setup(); none for rw eval)

    @property
    def rollout_correction(self):
        """The run's rollout correction (`loss.rollout_correction`), None for "off"."""
        return rollout_correction(self.config)

    # ------------------------------------------------------------------ construction

    @classmethod
    def resume(cls, run_dir: str | os.PathLike, quiet: bool = False) -> "Trainer":
        """A trainer that continues the run in `run_dir` from its newest intact checkpoint: each
        `checkpoints/step_N` is verified against its manifest, newest first; one skipped for damage is
        named on stderr with the reason. Raises ValueError naming the run folder when none is intact."""
        run = Path(run_dir)
        candidates = ckpt.step_folders(run / "checkpoints")
        if not candidates:
            raise ValueError(f"--resume: {run} has no checkpoint (no checkpoints/step_* folder)")
        config = load_config(str(run / "config.yaml"))
        skipped = []
        for path in candidates:
            try:
                ckpt.verify(path)
            except ckpt.CheckpointError as error:
                skipped.append((path, error))
                continue
            if skipped and os.environ.get("RANK", "0") == "0":
                for bad, error in skipped:
                    print(
                        f"rw: checkpoint {bad.name} skipped ({error}); resuming from {path.name}",
                        file=sys.stderr,
                        flush=True,
                    )
            trainer = cls(config, run, quiet)
            trainer._resume_from = path
            trainer._verified = path
            return trainer
        reasons = "; ".join(f"{path.name}: {error}" for path, error in skipped)
        raise ValueError(f"no intact checkpoint in {run} ({reasons})")

    def setup(self) -> None:
        cfg = self.config
        if self._evaluation_only:
            cfg.train.engine = "torch"  # evaluation needs no optimizer; DeepSpeed checkpoints hold model.pt
            cfg.rollout.engine = "hf"
        self._check_batch(cfg)
        # train.loggers: a tracker whose package is missing is refused here, before anything is written
        self.trackers = None if self._evaluation_only else Trackers(cfg.train.loggers, cfg.train.tracker_project)
        self._seed_everything(cfg.train.seed)
        self.device = self._device()
        self.env = envs.make(cfg.env.name, **dict(cfg.env.options))
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
        # what the LLM roles cost: metrics prefix -> the client whose Usage counts its requests
        self._llm_clients = {
            prefix: client
            for prefix, owner in (("judge", self.judge), ("reflector", self.method.providers.reflector))
            if (client := getattr(owner, "client", None)) is not None and hasattr(client, "usage")
        }
        self._usage_totals = {prefix: 0.0 for prefix in self._llm_clients}  # money so far (judge/cost_total)
        # rows partition the usage: each row reports what happened since the previous one (the first: since the
        # clients were made, so library admission and the first diagnosis count too)
        self._usage_marks = {prefix: {} for prefix in self._llm_clients}
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
                save_config(cfg, self.out / "config.yaml")
                atomic_write_bytes(self.out / "method.json", json.dumps(self.method.resolved(), indent=1).encode())
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

    def _start_method(self) -> None:
        """Before step 0: instance rubrics (rw_instance_specific) and RewardWeaver's first stage from a
        diagnosis batch of the initial policy. Arise's pool starts empty: nothing is rolled out for it."""
        if self.method.needs_instance_contexts:
            if self.main:
                self.method.set_instance_contexts(task_contexts(self.env, self.train_tasks.values()))
            self._share_method_state()
        if self.method.stage_due(-1):
            self._adapt(-1)

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
                if self._llm_clients:  # what judging the diagnostic set cost: a row of its own
                    self._log({"step": self.step, "kind": "usage", **self._usage_row()})
            if _due(self.step, cfg.train.checkpoint_every) or self.step == total:
                self.save_checkpoint()
            self._report_progress(progress, row)
        if progress is not None:
            progress.close()
        if self.main:
            self._print_summary()

    def _log_evaluation(self) -> dict:
        evaluation = self.evaluate("eval")
        evaluation.update(self._probe_row())
        evaluation.update(self._usage_row())  # every row says what the LLM roles cost since the previous one
        self._log(evaluation)
        if self.config.train.eval_with_skills == "on":
            self._log(self.evaluate("eval", with_skills=True))
        return evaluation

    def _exploration_row(self, k: int) -> dict:
        """Before training: k episodes of every held-out task with the starting policy (no skills, fixed seeds;
        each rank samples its block) -> pass@1, pass@k, zero-variance and all-failed groups, pass@k per task type
        (rwcore.trainer.exploration)."""
        from rwcore.trainer.exploration import exploration_figures, sample_groups

        cfg = self.config
        first, last = self._my_groups(len(self.eval_tasks))
        outcomes, successes = sample_groups(
            self.env,
            self.policy,
            self.eval_tasks[first:last],
            k,
            temperature=cfg.rollout.temperature,
            max_new_tokens=cfg.rollout.max_new_tokens,
            generator=self.generator,
            offset=first,
        )
        parts = self._gathered([(outcomes, successes)])
        outcomes = np.concatenate([part[0] for part in parts])
        successes = np.concatenate([part[1] for part in parts])
        figures = exploration_figures(self.eval_tasks, outcomes, successes)
        row = {"step": self.step, "kind": "exploration", **{f"exploration/{key}": v for key, v in figures.items()}}
        return {**row, **self._usage_row()}  # every row says what the LLM roles cost since the previous one

    def _print_summary(self) -> None:
        """The run in three numbers: held-out success before and after, and what adaptation cost."""
        rows = [json.loads(line) for line in self._metrics_path.read_text().splitlines() if line]
        evals = [r for r in rows if r.get("kind") == "eval"]
        fractions = [r["time/adaptive_fraction"] for r in rows if r.get("kind") == "train"]
        if evals and fractions:
            costs = ""
            for prefix in self._llm_clients:
                requests = sum(r.get(f"{prefix}/requests", 0) for r in rows)
                tokens = sum(
                    r.get(f"{prefix}/prompt_tokens", 0) + r.get(f"{prefix}/completion_tokens", 0) for r in rows
                )
                money = (
                    f", cost {self._usage_totals[prefix]:.4f}"
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
        torch.manual_seed(_step_seed(cfg.train.seed, index) + self.rank)
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
                _step_seed(cfg.train.seed, index),
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
        self.engine.set_lr(
            learning_rate(index, cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.schedule, cfg.train.steps)
        )
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
        judged = scored.judged
        outcomes = np.array([t.outcome for t in trajectories], dtype=np.float64)
        row = {
            "step": self.step,
            "kind": "train",
            "success_rate": float(np.mean([t.metadata.get("success", False) for t in trajectories])),
            "outcome_mean": float(outcomes.mean()),
            "reward_mean": float(np.mean(scored.rewards)),
            "process_term_mean": float(np.mean(scored.process_terms)),
            "advantage_std": float(np.std(scored.advantages)),
            "rubrics/process": len(scored.process_rubrics),
            "rubrics/advantage": len(scored.advantage_rubrics),
            # pool rubrics also in RewardWeaver's set: counted in the process reward only
            "rubrics/shared": len(scored.shared_rubrics),
            "judgments": int(judged.codes.size),
            "invalid_rate": judged.invalid_fraction(),
            **judged.invalid_rate_metrics(),
            "generated_tokens_mean": float(np.mean([t.generated_length for t in trajectories])),
            "lr": learning_rate(index, cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.schedule, cfg.train.steps),
            **judged.rubric_rate_metrics(),
            **self.method.metrics(),
            **update,
            "time/step": elapsed,
            "time/adaptive": adaptive,
            "time/diagnosis": diagnosis_seconds,
            "time/rollout_wait": waited,
            "rollout/version_lag": float(np.mean([index - v for v in versions])),
            # groups whose evidence entered the sampler at a version older than the one being trained
            "evidence/late_groups": int(sum(v < index for v in versions)),
            "rollout/trajectories": len(trajectories),
            # episodes ended by the partner's failure: no advantage, no loss, no evidence (see envs.base)
            "partner_failures": int(sum(bool(t.partner_failure) for t in trajectories)),
            # groups whose outcomes are all equal give outcome-only GRPO no gradient (rwcore.trainer.exploration)
            **{f"groups/{key}": value for key, value in _group_row(trajectories, len(task_ids)).items()},
            **environment_metrics([t.metadata.get("outcome_details") for t in trajectories]),
            "time/adaptive_fraction": adaptive / elapsed if elapsed > 0 else 0.0,
            # judging happens after the step's rollouts end, so none of it is hidden behind generation
            "time/judge": self._judge_seconds,
            "time/judge_wait": self._judge_wait,
            **self._usage_row(),
        }
        return row

    def _request_rollouts(self, step: int) -> float:
        """Asks the rollout process for step `step`'s rollouts (the method samples its tasks now, and its
        current training prompt goes with them); returns the seconds spent in the method."""
        cfg = self.config
        clock = time.perf_counter()
        plan = self.loop.plan(step, self.env.system_prompt)
        task_ids, prompt = plan.task_ids, plan.system_prompt
        seconds = time.perf_counter() - clock
        seed = _step_seed(cfg.train.seed, step)
        jobs = [
            (self.train_tasks[task_ids[i]], seed + 31 * i + j, f"s{step}/t{i}")
            for i in range(len(task_ids))
            for j in range(cfg.rollout.group_size)
        ]
        self.rollouts_ahead.submit(step, task_ids, jobs, prompt, seed)
        return seconds

    def _my_groups(self, count: int) -> tuple[int, int]:
        """[first, last): the block of `count` task groups (or evaluation tasks) this rank runs."""
        return count * self.rank // self.world_size, count * (self.rank + 1) // self.world_size

    def _rollout(
        self, task_ids: Sequence, seed: int, label: str, prompt: str, on_group=None
    ) -> tuple[list[Rollout], list]:
        """(this rank's rollouts, every rank's trajectories in group order): G episodes per task. `on_group`:
        called with each group as soon as it has ended (`run_episodes`)."""
        cfg = self.config
        first, last = self._my_groups(len(task_ids))
        jobs = []
        for i in range(first, last):
            for j in range(cfg.rollout.group_size):
                jobs.append((self.train_tasks[task_ids[i]], seed + 31 * i + j, f"{label}/t{i}"))
        rollouts = run_episodes(
            self.env,
            self.policy,
            jobs,
            prompt,
            cfg.rollout.temperature,
            cfg.rollout.max_new_tokens,
            generator=self.generator,
            on_group=on_group,
        )
        if cfg.rollout.behavior_logprobs == "trainer" or any(not r.behavior_logprobs.numel() for r in rollouts):
            score_behavior(self.policy, rollouts, cfg.rollout.temperature, cfg.loss.backend)
        return rollouts, self._gathered([r.trajectory for r in rollouts])

    def _gathered(self, items: list) -> list:
        """Every rank's `items`, concatenated in rank order (the items themselves on one process)."""
        if self.world_size == 1:
            return items
        return [item for part in self.engine.all_gather(items) for item in part]

    def _judge(self, trajectories: Sequence, plans: Sequence[Sequence]) -> list:
        """Reports for every trajectory (plans: the rubrics of each task group); each rank judges its own
        block of groups and the reports are gathered."""
        group = self.config.rollout.group_size
        first, last = self._my_groups(len(plans))
        clock = time.perf_counter()
        mine = judge_groups(self.judge, trajectories[first * group : last * group], plans[first:last], group)
        self._judge_seconds += time.perf_counter() - clock
        self._judge_wait += time.perf_counter() - clock  # nothing else ran meanwhile
        return self._gathered(mine)

    def _usage_row(self) -> dict:
        """What each LLM role cost since the previous row, summed over the processes: `judge/requests`,
        `judge/prompt_tokens`, `judge/completion_tokens` (the server's usage), `judge/cache_hits`, `judge/retries`,
        `judge/rate_limited`, `judge/failed`, `judge/seconds`, and with judge.price_in / price_out set `judge/cost`
        and `judge/cost_total`; the same under `reflector/` for the reflection model."""
        from rwcore.judges.client import USAGE_FIELDS, usage_cost

        marks = {prefix: client.usage.snapshot() for prefix, client in self._llm_clients.items()}
        mine = {
            prefix: {name: marks[prefix][name] - self._usage_marks[prefix].get(name, 0) for name in USAGE_FIELDS}
            for prefix in self._llm_clients
        }
        self._usage_marks = marks
        parts = self._gathered([mine])
        row = {}
        j = self.config.judge
        for prefix in self._llm_clients:
            total = {name: sum(part[prefix][name] for part in parts) for name in USAGE_FIELDS}
            for name in USAGE_FIELDS:
                row[f"{prefix}/{name}"] = total[name] if name == "seconds" else int(total[name])
            if j.price_in or j.price_out:
                cost = usage_cost(total, j.price_in, j.price_out)
                self._usage_totals[prefix] += cost
                row[f"{prefix}/cost"] = cost
                row[f"{prefix}/cost_total"] = self._usage_totals[prefix]
        return row

    # ------------------------------------------------------------------ adaptation

    def _adapt(self, index: int) -> tuple[bool, float, float]:
        """The method's scheduled adaptation at the end of step `index` (-1: before training), through the
        loop (`MethodLoop.start` / `end_step`): a fresh on-policy diagnosis batch of the updated policy and
        the fixed diagnostic set at stage boundaries, then method.adapt on rank 0, whose state every rank
        then loads. Returns (changed, seconds in the method, seconds of the diagnosis and diagnostic-set
        rollouts and judging)."""
        method = self.method
        due = method.stage_due(index) or method.pool_due(index)
        self._adapting, self._diagnosis_seconds = index, 0.0
        clock = time.perf_counter()
        if index < 0:
            self.loop.start()
        else:
            self.loop.end_step(index)
        if not due:
            return False, 0.0, 0.0
        seconds = time.perf_counter() - clock - self._diagnosis_seconds
        self._share_method_state()
        return True, seconds, self._diagnosis_seconds

    def _diagnosis(self, tasks: Sequence, specs: Sequence) -> tuple[list, list]:
        """The loop's `diagnose`: RewardWeaver's fresh on-policy batch of the current policy, G rollouts of
        each task under the training prompt, judged on `specs` (the whole library). Its own seeds; torch's
        global generator is left as it was."""
        clock = time.perf_counter()
        index = self._adapting
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_step_seed(self.config.train.seed, index) + 104_729 + self.rank)
            _, trajectories = self._rollout(
                tasks,
                _step_seed(self.config.train.seed, index) + 104_729,
                f"diagnosis{index + 1}",
                self.method.system_prompt(self.env.system_prompt),
            )
        reports = self._judge(trajectories, [list(specs)] * len(tasks))
        self._diagnosis_seconds += time.perf_counter() - clock
        return trajectories, reports

    def _diagnostic_reports(self, tasks: Sequence, specs: Sequence) -> list:
        """The loop's `diagnostic`: appendix G's fixed diagnostic tasks, one episode each with fixed seeds and
        no skills, judged on `specs` (the library)."""
        clock = time.perf_counter()
        tasks = list(tasks)
        first, last = self._my_groups(len(tasks))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(DIAGNOSTIC_SEED + self.rank)
            jobs = [
                (self.train_tasks[tasks[i]], DIAGNOSTIC_SEED + i, f"diagnostic{self._adapting + 1}/{i}")
                for i in range(first, last)
            ]
            rollouts = run_episodes(
                self.env,
                self.policy,
                jobs,
                self.method.system_prompt(self.env.system_prompt, True),
                self.config.rollout.temperature,
                self.config.rollout.max_new_tokens,
                generator=self.generator,
            )
        reports = self._gathered(
            judge_groups(self.judge, [r.trajectory for r in rollouts], [list(specs)] * len(rollouts), 1)
        )
        self._diagnosis_seconds += time.perf_counter() - clock
        return reports

    def _share_method_state(self) -> None:
        """Rank 0's method state on every rank (adaptation may call an LLM, so only rank 0 runs it)."""
        if self.world_size == 1:
            return
        state = self.engine.broadcast(self.method.state_dict() if self.main else None)
        if not self.main:
            self.method.load_state_dict(state)

    def _update_policy(self, rollouts: Sequence[Rollout], advantages: np.ndarray) -> dict:
        cfg = self.config
        input_ids, attention, generated = batch_tensors(rollouts, self.policy.codec.pad_id, self.device)
        behavior = torch.nn.utils.rnn.pad_sequence([r.behavior_logprobs for r in rollouts], batch_first=True).to(
            self.device
        )
        _, labels = self.policy.action_space(input_ids[:, 1:])
        mask = generated[:, 1:] & (attention[:, 1:] != 0)
        # an episode ended by its counterpart's failure (Trajectory.partner_failure) gets no loss at all
        partner = torch.tensor(
            [bool(r.trajectory.partner_failure) for r in rollouts], dtype=torch.bool, device=mask.device
        )
        mask = mask & ~partner[:, None]
        adv = torch.as_tensor(np.asarray(advantages), dtype=torch.float32, device=self.device)[:, None].expand_as(
            labels
        )
        total_tokens = self.engine.tokens_denominator(self.engine.all_sum_tensor(mask.sum()).clamp_min(1))
        rows = torch.arange(len(rollouts))
        parts = torch.tensor_split(rows, cfg.optim.minibatches)
        correction = self.rollout_correction
        # the decoupled form's proximal policy: the training model before this update, one no-grad pass
        proximal = (
            self._proximal_logprobs(input_ids, attention, labels, parts)
            if correction and not correction.bypass
            else None
        )
        stats_sum: dict[str, float] = {}
        mismatch: list[dict] = []
        loss_value = retention_value = 0.0
        # loss.adaptive_entropy: TRL's controller; each optimizer step applies the coefficient of the previous one
        control = self._entropy_control() if cfg.loss.adaptive_entropy else None
        applied: list[float] = []
        for epoch in range(cfg.optim.epochs):
            self.engine.zero_grad()
            entropy_coef = cfg.loss.entropy_coef if control is None else control.applied()
            applied.append(entropy_coef)
            measured = [0.0, 0.0]  # the optimizer step's entropy sum and model tokens (adaptive_entropy)
            for part in parts:
                # the (restricted) head is taken afresh for every backward pass: a slice of the weight made
                # once would hold a freed graph after the first minibatch and stale values after a step
                head_weight, head_bias = self._action_head(input_ids)
                hidden = self.policy.hidden_states(input_ids[part], attention[part])[:, :-1]
                hidden = hidden.reshape(-1, hidden.shape[-1])
                loss, stats = fused_linear_policy_loss(
                    hidden,
                    head_weight,
                    labels[part].reshape(-1),
                    behavior[part, 1:].reshape(-1),
                    adv[part].reshape(-1),
                    mask[part].reshape(-1),
                    bias=head_bias,
                    temperature=cfg.rollout.temperature,
                    ratio_low=cfg.loss.ratio_low,
                    ratio_high=cfg.loss.ratio_high,
                    clip_c=cfg.loss.clip_c,
                    num_model_tokens=total_tokens,
                    backend=cfg.loss.backend,
                    validate=False,
                    proximal_logprobs=None if proximal is None else proximal[part].reshape(-1),
                    rollout_correction=correction,
                    cu_seqlens=torch.arange(len(part) + 1) * labels.shape[1],  # on the CPU: no device sync
                    mismatch_metrics=epoch == 0,
                )
                if epoch == 0:
                    # the mismatch before any update of this step (decoupled: proximal vs behavior, else the
                    # current policy's), one dict per minibatch, merged below
                    mismatch.append({k: stats.pop(k) for k in [k for k in stats if k.startswith(CORRECTION_PREFIX)]})
                if entropy_coef > 0:
                    entropy = self._entropy_sum(hidden, head_weight, head_bias, mask[part].reshape(-1))
                    loss = loss - entropy_coef * entropy / total_tokens
                    stats["entropy"] = entropy.detach() / mask[part].sum().clamp_min(1)  # per model token
                elif control is not None:  # no bonus this step, but the controller measures the entropy
                    with torch.no_grad():
                        entropy = self._entropy_sum(hidden, head_weight, head_bias, mask[part].reshape(-1))
                    stats["entropy"] = entropy / mask[part].sum().clamp_min(1)
                if control is not None:
                    measured[0] += float(entropy.detach())
                    measured[1] += float(mask[part].sum())
                if self._retention is not None and part is parts[0]:
                    # loss.reading_retention: the reading prior's corpus loss, once per optimizer step
                    kept = self._retention.loss(self.policy.model, self.step)
                    loss = loss + cfg.loss.reading_retention * kept
                    retention_value += float(kept.detach())
                self.engine.accumulate(loss)
                loss_value += float(loss.detach())
                for name, value in stats.items():
                    stats_sum[name] = stats_sum.get(name, 0.0) + float(value) * len(part) / len(rollouts)
            grad_norm = self.engine.step()
            if control is not None:  # the step's mean entropy over every process's model tokens moves the coefficient
                totals = self.engine.all_sum_tensor(torch.tensor(measured, dtype=torch.float64))
                control.update(float(totals[0]), float(totals[1]))
        epochs = max(1, cfg.optim.epochs)
        tokens = [float(mask[part].sum()) for part in parts]
        # Each rank's loss is its share of the step's tokens scaled by the world size, so the mean over ranks is
        # the whole batch's loss; the statistics are each rank's token fractions, averaged.
        figures = self.engine.all_mean(
            {
                "loss": loss_value / epochs,
                **{name: value / epochs for name, value in stats_sum.items()},
                **merge_metrics(mismatch, tokens),
                **({"reading_retention_loss": retention_value / epochs} if self._retention is not None else {}),
            }
        )
        out = {"loss": figures.pop("loss"), "grad_norm": grad_norm, **figures}
        if control is not None:  # the coefficient applied this step (mean over its optimizer steps, optim.epochs)
            out["entropy_coef"] = float(np.mean(applied))
        return out

    def _entropy_control(self) -> AdaptiveEntropyControl:
        """loss.adaptive_entropy's controller, built from the config on first use (its state is in state.pt)."""
        control = getattr(self, "_adaptive_entropy", None)
        if control is None:
            loss = self.config.loss
            control = self._adaptive_entropy = AdaptiveEntropyControl(
                loss.entropy_coef,
                loss.entropy_target,
                loss.entropy_coef_delta,
                loss.entropy_coef_min,
                loss.entropy_coef_max,
            )
        return control

    def _action_head(self, input_ids: torch.Tensor):
        """(weight [K, H], bias [K] or None) of the LM head restricted to the action space the sampler drew from."""
        weight, _ = self.policy.action_space(input_ids[:0, 1:])
        bias = self.policy.head.bias
        if bias is not None and self.policy.allowed is not None:
            bias = bias[self.policy.allowed]
        return weight, bias

    @torch.no_grad()
    def _proximal_logprobs(self, input_ids, attention, labels, parts) -> torch.Tensor:
        """[B, T - 1] fp32 log-probs of the labels under the training model as it is now (before the update), one
        minibatch at a time through the chunked head (never the [T, V] logits)."""
        out = torch.zeros(labels.shape, dtype=torch.float32, device=self.device)
        head_weight, head_bias = self._action_head(input_ids)
        for part in parts:
            hidden = self.policy.hidden_states(input_ids[part], attention[part])[:, :-1]
            hidden = hidden.reshape(-1, hidden.shape[-1])
            logp = fused_linear_logprobs(
                hidden,
                head_weight,
                labels[part].reshape(-1),
                bias=head_bias,
                temperature=self.config.rollout.temperature,
                backend=self.config.loss.backend,
                validate=False,
            )
            out[part] = logp.reshape(len(part), -1).float()
        return out

    def _entropy_sum(self, hidden: torch.Tensor, weight: torch.Tensor, bias, mask: torch.Tensor) -> torch.Tensor:
        """Sum over model tokens of the policy's entropy at the sampling temperature (fp32, differentiable),
        one chunk of logits at a time (never the [N, V] logits)."""
        entropy = fused_linear_entropy(
            hidden,
            weight,
            bias,
            temperature=self.config.rollout.temperature,
            backend=self.config.loss.backend,
            validate=False,
        )
        return (entropy * mask).sum()

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self, split: str = "eval", max_tasks: int | None = None, with_skills: bool = False) -> dict:
        """Success rate and mean outcome on a split, one sampled episode per task with fixed seeds.

        The prompt is the environment's base prompt: Arise withholds the evolved skills at evaluation.
        `with_skills` (analysis only) adds the active skills and labels the metrics eval_with_skills/*.
        """
        tasks = self.eval_tasks if split == "eval" else list(self.train_tasks.values())
        tasks = tasks[:max_tasks] if max_tasks else tasks
        first, last = self._my_groups(len(tasks))
        prompt = self._skills_prompt() if with_skills else self.env.system_prompt
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(EVAL_SEED + self.rank)
            jobs = [(tasks[i], EVAL_SEED + i, f"eval/{i}") for i in range(first, last)]
            rollouts = run_episodes(
                self.env,
                self.policy,
                jobs,
                prompt,
                self.config.rollout.temperature,
                self.config.rollout.max_new_tokens,
                generator=self.generator,
            )
        outcomes = self._gathered(
            [
                (r.outcome.success, r.outcome.reward, tasks[first + k].tags[0] if tasks[first + k].tags else "untagged")
                for k, r in enumerate(rollouts)
            ]
        )
        details = self._gathered([r.outcome.details for r in rollouts])
        name = f"{split}_with_skills" if with_skills else split
        successes = np.array([float(success) for success, _, _ in outcomes])
        row = {
            "step": self.step,
            "kind": "eval_with_skills" if with_skills else "eval",
            f"{name}/success_rate": float(successes.mean()),
            # binomial standard error of the success rate: sqrt(p (1 - p) / n)
            f"{name}/success_se": float(np.sqrt(successes.mean() * (1 - successes.mean()) / len(successes))),
            f"{name}/outcome_mean": float(np.mean([reward for _, reward, _ in outcomes])),
            f"{name}/episodes": len(outcomes),
        }
        for tag in sorted({tag for _, _, tag in outcomes}):
            row[f"{name}/success/{tag}"] = float(np.mean([s for s, _, t in outcomes if t == tag]))
        row.update({f"{name}/{key}": value for key, value in environment_metrics(details).items()})
        ceiling = envs.provided(self.env, "ceiling") if split == "eval" else None
        if ceiling is not None:  # the best held-out success any policy can reach (normalizes areas under curves)
            row[f"{name}/ceiling"] = float(ceiling)
        return row

    def _build_reading_probe(self) -> EvaluationProbe | None:
        """The light skill-reading probe of train.probe_at_eval (None when off)."""
        if not resolve_probe_at_eval(self.config, self.env):
            return None
        return EvaluationProbe(self.env, language_of(self.env), corpus_spec(self.config))

    def _probe_row(self) -> dict:
        """train.probe_at_eval: does the policy still read guidance? `eval/probe/heldout_with`,
        `eval/probe/heldout_without`, `eval/probe/skill_lift_mean`, `eval/probe/skill_lift_min`
        (rwcore.trainer.prior.probe, light mode) and `time/probe`, on rank 0. The probe draws from its own
        seeded generators under torch.random.fork_rng and leaves the model's mode as it was: no other value
        of the run changes."""
        if self._reading_probe is None or not self.main:
            return {}
        clock = time.perf_counter()
        row = self._reading_probe.metrics(self.policy.model, self.policy.codec)
        return {**row, "time/probe": time.perf_counter() - clock}

    def _skills_prompt(self) -> str:
        if self.method is not None:
            return self.method.system_prompt(self.env.system_prompt)
        return self._eval_skills_prompt or self.env.system_prompt

    @classmethod
    def evaluate_checkpoint(
        cls, path: str | os.PathLike, split: str = "eval", max_tasks: int | None = None, with_skills: bool = False
    ) -> dict:
        """Metrics of a saved checkpoint (a checkpoints/step_N folder, or a run folder: its latest)."""
        trainer = cls.from_checkpoint(path)
        return trainer.evaluate(split, max_tasks, with_skills=with_skills)

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike) -> "Trainer":
        """A trainer set up for evaluation with a saved checkpoint's policy and method state (a
        checkpoints/step_N folder, or a run folder: its latest), after verifying it against its manifest."""
        path = Path(path)
        latest = ckpt.latest_checkpoint(path)  # refuses a pointer that leads out of this run folder
        if latest is not None:
            path = latest
        elif (path / "checkpoints").is_dir():
            newest = ckpt.step_folders(path / "checkpoints")
            if not newest:
                raise ValueError(f"{path} has no checkpoint (no checkpoints/step_* folder)")
            path = newest[0]
        run = path.parent.parent
        ckpt.verify(path)  # before anything is built: a damaged file is named, never loaded
        trainer = cls(load_config(str(run / "config.yaml")), run, quiet=True)
        trainer._resume_from = path
        trainer._verified = path
        trainer._evaluation_only = True
        trainer.setup()
        return trainer

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

    def save_checkpoint(self) -> Path:
        """Everything an exact resume needs, written to a temporary folder and renamed into place.

        Every file is fsynced, then manifest.json (size and sha256 of each file) is written last and the
        folders are fsynced before the rename; the checkpoints folder is fsynced after it. A write that
        fails (disk full, ...) removes the temporary folder and raises RunFolderError naming the
        checkpoint; the previous checkpoint and `latest` are left as they were."""
        folder = self.out / "checkpoints"
        name = f"step_{self.step:06d}"
        staging = folder / f".{name}.tmp"
        target = folder / name
        try:
            with ckpt.writing(target):
                if self.main:
                    shutil.rmtree(staging, ignore_errors=True)
                    staging.mkdir(parents=True)
                self.engine.barrier()
                self.engine.save(staging)  # collective under DeepSpeed
                rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
                if self.main:
                    ckpt.save(
                        {
                            "step": self.step,
                            "config": config_to_dict(self.config),
                            "world_size": self.world_size,
                            "method": self.method.state_dict(),
                            "usage_totals": dict(self._usage_totals),
                            "rng": rng,
                            # rollout.max_lag > 0: rollouts already requested from older versions, trained on next
                            "rollouts_ahead": self.rollouts_ahead.state_dict()
                            if self.rollouts_ahead is not None
                            else {},
                            # loss.adaptive_entropy: the coefficient and the last measured entropy
                            **(
                                {"entropy_control": self._entropy_control().state_dict()}
                                if self.config.loss.adaptive_entropy
                                else {}
                            ),
                            # model.lora: the adapter settings and the digest of the base they were trained on
                            **(
                                {"lora": checkpoint_record(self.policy.model, self.config.model.lora)}
                                if is_lora(self.policy.model)
                                else {}
                            ),
                        },
                        staging / "state.pt",
                    )
                else:
                    ckpt.save(rng, staging / f"rng_rank{self.rank}.pt")
                self.engine.barrier()
                if self.main:
                    ckpt.write_manifest(staging, self.step)  # fsyncs every file, the manifest and the folders
                    shutil.rmtree(target, ignore_errors=True)
                    os.replace(staging, target)
                    ckpt.fsync_dir(folder)
                    atomic_write_bytes(folder / "latest", name.encode())
        except BaseException as error:
            if self.main:
                shutil.rmtree(staging, ignore_errors=True)  # never a half-written folder left behind
            if isinstance(error, ckpt.RunFolderError):
                earlier = ckpt.step_folders(folder) if folder.is_dir() else []
                kept = (
                    f"the latest checkpoint, {earlier[0].name}, is intact"
                    if earlier
                    else "the run has no checkpoint yet"
                )
                raise ckpt.RunFolderError(
                    f"{error} (step {self.step}'s checkpoint was not written; {kept})"
                ) from error.__cause__
            raise
        self.engine.barrier()
        return target

    def _load_checkpoint(self, path: Path) -> None:
        if not path.is_dir():
            raise ValueError(f"checkpoint {path} does not exist")
        if self._verified != path:
            ckpt.verify(path)  # raises CheckpointError naming the damaged file
        state = ckpt.load(path / "state.pt")
        # model.lora: adapters of this setting, trained on the very base model.name gives now (else refused)
        check_checkpoint(self.policy.model, state.get("lora"), path, self.config.model.name)
        if self._evaluation_only:
            load_checkpoint_state_dict(self.policy.model, ckpt.load(path / "model.pt"), path / "model.pt")
            if (state.get("method") or {}).get("pool"):
                self._eval_skills_prompt = AdaptiveMethod.system_prompt_from_state(
                    state["method"], self.env.system_prompt
                )
            self.step = int(state["step"])
            return
        saved_world = int(state.get("world_size", 1))
        if saved_world != self.world_size:
            raise ValueError(
                f"--resume: checkpoint {path} was written by {saved_world} process(es); resume it "
                f"with the same number (this run has {self.world_size})"
            )
        if self.engine.name == "torch" and not (path / "optimizer.pt").exists():
            raise ValueError(
                f"--resume: checkpoint {path} was written by train.engine=deepspeed; the run's "
                "config must keep that engine"
            )
        if "method" not in state:
            raise ValueError(f"--resume: checkpoint {path} predates rwcore.AdaptiveMethod; start a new run")
        rng = state["rng"] if self.main else ckpt.load(path / f"rng_rank{self.rank}.pt")
        self.method.load_state_dict(state["method"])  # refuses another variant, naming train.method
        if self.config.loss.adaptive_entropy and state.get("entropy_control"):  # else it starts afresh, as TRL's
            self._entropy_control().load_state_dict(state["entropy_control"])
        self._usage_totals.update(
            {k: float(v) for k, v in (state.get("usage_totals") or {}).items() if k in self._usage_totals}
        )
        self.engine.load(path)
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        self.step = int(state["step"])
        self.policy.version = self.step
        self._pending_rollouts = dict(state.get("rollouts_ahead") or {})
        if self._pending_rollouts and not self.config.rollout.max_lag:
            raise ValueError(
                f"--resume: checkpoint {path} holds rollouts requested ahead (rollout.max_lag); the "
                "run's config must keep rollout.max_lag"
            )
        if self.main:
            with ckpt.writing(self.out):
                # a torn last line is dropped with a note; damage mid-file raises RunLogError (a ValueError)
                for note in truncate_after([self._metrics_path, self._sampling_path], self.step):
                    print(f"rw: {note}", file=sys.stderr, flush=True)
        self.engine.barrier()  # no rank starts before rank 0 has truncated the logs

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


def environment_metrics(details: Sequence) -> dict:
    """The environment's own per-episode numbers (Outcome.details["metrics"], e.g. a verifiers environment's
    @metric and @reward values) as `env/<name>`: the mean over the episodes that report a finite value."""
    values: dict[str, list[float]] = {}
    for detail in details:
        metrics = detail.get("metrics") if isinstance(detail, dict) else None
        if not isinstance(metrics, dict):
            continue
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                values.setdefault(str(key), []).append(float(value))
    return {f"env/{key}": float(np.mean(found)) for key, found in sorted(values.items())}


def _group_row(trajectories: Sequence, groups: int) -> dict:
    """The step's zero-variance and all-failed shares over its task groups (groups contiguous, equal size)."""
    from rwcore.trainer.exploration import group_figures

    outcomes = np.array([t.outcome for t in trajectories], dtype=np.float64).reshape(groups, -1)
    successes = np.array([bool(t.metadata.get("success", False)) for t in trajectories]).reshape(groups, -1)
    figures = group_figures(outcomes, successes)
    return {"zero_variance": figures["zero_variance_groups"], "all_failed": figures["all_failed_groups"]}


def _due(step: int, every: int) -> bool:
    """Whether a periodic action (every 0 = never) falls on `step`."""
    return every > 0 and step % every == 0
