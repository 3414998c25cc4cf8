"""`Trainer`: the whole RewardWeaver / Arise loop, one class with setup / train / save_checkpoint / cleanup.

Per step: the sampler picks tasks -> G rollouts each (behavior log-probs
recorded) -> the judge evaluates the active rubrics -> rewards (outcome, or
RewardWeaver's process reward) -> Arise advantages (task + rubric verdicts)
-> one policy update with the fused filtered dual-clip loss -> evidence for
the sampler and the pool. Every `pool.delta_pool` steps Arise's pool evolves
(skills injected into the system prompt); every
`rewardweaver.adaptation_interval` steps RewardWeaver re-attributes failures
and re-selects its active set.

Methods: "rewardweaver" (process reward from the active capabilities, outcome
advantages), "arise" (outcome reward, pool rubrics in the advantages and the
sampler, skills), "combined" (both), "outcome_only" (neither).

Run folder (see rwcore.trainer.report for the plots made from it):
config.yaml, metrics.jsonl, sampling.jsonl, reward_stages.json,
pool_counts.json, pool_events.json, checkpoints/step_NNNNNN/ (+ checkpoints/latest).

Processes: with train.engine=deepspeed under `deepspeed` / `torchrun`, every
rank draws the same batch, rolls out and judges its own block of groups, and
gathers the trajectories and verdicts, so rewards, advantages, the sampler
and the evidence are computed identically everywhere; reflection and
attribution (which may call an LLM) run on rank 0 and their state is
broadcast. Rank 0 alone writes the run folder.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from rwcore import CapabilitySampler, OutcomeSampler, UniformSampler, Verdict, compute_advantages, length_regularize
from rwcore._io import atomic_write_bytes
from rwcore.kernels import fused_linear_policy_loss, token_logprobs
from rwcore.trainer import envs
from rwcore.trainer.config import Config, config_to_dict, load_config, save_config
from rwcore.trainer.engines import DeepSpeedEngine, TorchEngine
from rwcore.trainer.policy import Policy, WordCodec, build_model, load_pretrained
from rwcore.trainer.rollout import Rollout, batch_tensors, run_episodes, score_behavior
from rwcore.types import JudgeReport, RubricJudgment, RubricSpec

EVAL_SEED = 1_000_003  # eval episodes use their own seeds: the same tasks and draws at every evaluation


def _step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7_919 + 17) % (2**63)


class Trainer:
    """Runs `rw train`: build with a Config and an output folder, then setup(), train(), cleanup()."""

    def __init__(self, config: Config, out_dir: str | os.PathLike, quiet: bool = False) -> None:
        self.config = config
        self.out = Path(out_dir)
        self.quiet = quiet
        self.step = 0  # optimizer steps completed
        self._resume_from: Path | None = None
        self._evaluation_only = False  # rw eval: load a checkpoint, leave the run's logs alone

    # ------------------------------------------------------------------ construction

    @classmethod
    def resume(cls, run_dir: str | os.PathLike, quiet: bool = False) -> "Trainer":
        """A trainer that continues the run in `run_dir` from its latest checkpoint."""
        run = Path(run_dir)
        latest = run / "checkpoints" / "latest"
        if not latest.exists():
            raise ValueError(f"--resume: {run} has no checkpoint (checkpoints/latest is missing)")
        config = load_config(str(run / "config.yaml"))
        trainer = cls(config, run, quiet)
        trainer._resume_from = run / "checkpoints" / latest.read_text().strip()
        return trainer

    def setup(self) -> None:
        cfg = self.config
        if self._evaluation_only:
            cfg.train.engine = "torch"  # evaluation needs no optimizer; DeepSpeed checkpoints hold model.pt
            cfg.rollout.engine = "hf"
        self._check_batch(cfg)
        self._seed_everything(cfg.train.seed)
        self.device = self._device()
        self.env = envs.make(cfg.env.name, **dict(cfg.env.options))
        self.train_tasks = {task.task_id: task for task in self.env.tasks("train")}
        self.eval_tasks = self.env.tasks("eval")
        self.rules = {rule.spec.rubric_id: rule for rule in self.env.rules()}
        self.policy = self._build_policy()
        self.engine = self._build_engine()
        self.rank, self.world_size = self.engine.rank, self.engine.world_size
        self.main = self.rank == 0  # the process that writes the run folder
        self.generator = self._build_generator()  # before any file is written: vLLM may be missing
        if self.main:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "checkpoints").mkdir(exist_ok=True)
            if not self._evaluation_only:
                save_config(cfg, self.out / "config.yaml")
        self.engine.barrier()
        self.judge = self._build_judge()
        self.sampler = self._build_sampler()
        self.pool = self._build_pool() if cfg.train.method in ("arise", "combined") else None
        self.weaver = self._build_weaver() if cfg.train.method in ("rewardweaver", "combined") else None
        self._metrics_path = self.out / "metrics.jsonl"
        self._sampling_path = self.out / "sampling.jsonl"
        if self._resume_from is not None:
            self._load_checkpoint(self._resume_from)
            self._sync_generator()  # the rollout engine starts from the checkpoint's weights
        else:
            if self.main:
                for path in (self._metrics_path, self._sampling_path):
                    atomic_write_bytes(path, b"")
            self._initial_analysis()
        self._sync_sampler_rubrics()
        if not self._evaluation_only:
            self._write_adaptation_files()

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
        """None for HF generate on the training model; a vLLM engine for rollout.engine=vllm."""
        cfg = self.config
        if cfg.rollout.engine != "vllm":
            return None
        from rwcore.trainer.vllm_rollout import VLLMGenerator

        return VLLMGenerator(self.policy, cfg.model.name, cfg.model.dtype, cfg.rollout.vllm_gpu_memory_utilization,
                             cfg.rollout.vllm_max_model_len or cfg.model.max_length, seed=cfg.train.seed + self.rank)

    def _sync_generator(self) -> None:
        if self.generator is not None:
            self.generator.sync(self.policy.model)

    def _check_batch(self, cfg: Config) -> None:
        world = int(os.environ.get("WORLD_SIZE", "1")) if cfg.train.engine == "deepspeed" else 1
        if cfg.rollout.tasks_per_step < world:
            raise ValueError(f"rollout.tasks_per_step={cfg.rollout.tasks_per_step} is smaller than the number of "
                             f"processes ({world}): every process needs at least one task group")
        smallest = (cfg.rollout.tasks_per_step // world) * cfg.rollout.group_size
        if cfg.optim.minibatches > smallest:
            raise ValueError(f"optim.minibatches={cfg.optim.minibatches} is more than the {smallest} rollouts a "
                             f"process updates on per step (rollout.tasks_per_step x rollout.group_size / processes)")

    def _build_engine(self):
        cfg = self.config
        model = self.policy.model
        if cfg.train.engine == "deepspeed":
            return DeepSpeedEngine(model, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay,
                                   grad_clip=cfg.optim.grad_clip, zero_stage=cfg.train.zero_stage,
                                   micro_batches=cfg.optim.minibatches, dtype=cfg.model.dtype,
                                   config_file=cfg.train.deepspeed_config)
        return TorchEngine(model, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay, grad_clip=cfg.optim.grad_clip)

    def _build_policy(self) -> Policy:
        cfg = self.config.model
        if cfg.name:
            model, codec = load_pretrained(cfg.name, self.device, cfg.dtype)
        else:
            codec = WordCodec(self.env.vocabulary())
            model = build_model(len(codec), cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.intermediate_size,
                                cfg.max_length, self.config.train.seed).to(self.device)
        model.train()
        policy = Policy(model, codec, self.device)
        if self.config.rollout.action_words == "on":
            if cfg.name or not hasattr(self.env, "action_vocabulary"):
                raise ValueError("rollout.action_words=on needs the built-in model (model.name=null) and an "
                                 "environment with action_vocabulary()")
            policy.restrict([codec.vocab[w] for w in self.env.action_vocabulary()] + [codec.end_id])
        return policy

    def _build_judge(self):
        cfg = self.config.judge
        if cfg.kind == "openai":
            from rwcore.judges import OpenAIJudge

            return OpenAIJudge(cfg.model, base_url=cfg.base_url or None, api_key_env=cfg.api_key_env,
                               max_concurrency=cfg.max_concurrency, timeout=cfg.timeout,
                               cache_dir=cfg.cache_dir or None)
        from rwcore.judges import RuleJudge

        return RuleJudge({rubric_id: rule.check for rubric_id, rule in self.rules.items()})

    def _build_sampler(self):
        cfg, rollout = self.config.sampler, self.config.rollout
        tasks = {task_id: list(task.tags) for task_id, task in self.train_tasks.items()}
        common = dict(batch_size=rollout.tasks_per_step, group_size=rollout.group_size, seed=self.config.train.seed)
        if cfg.kind == "uniform":
            return UniformSampler(tasks, **common)
        if cfg.kind == "outcome":
            return OutcomeSampler(tasks, gamma_obs=cfg.gamma_obs, gamma_unobs=cfg.gamma_unobs, **common)
        return CapabilitySampler(tasks, rho_min=cfg.rho_min, quota_fraction=cfg.quota_fraction,
                                 gamma_obs=cfg.gamma_obs, gamma_unobs=cfg.gamma_unobs, **common)

    def _build_pool(self, proposals=()):
        from rwcore.pool import RubricSkillPool

        cfg = self.config.pool
        return RubricSkillPool(self._reflector(), max_pool=cfg.max_pool, max_new=cfg.max_new, delta_pool=cfg.delta_pool,
                               eta_high=cfg.eta_high, eta_low=cfg.eta_low, proposals=proposals)

    def _reflector(self):
        cfg = self.config.judge
        if cfg.kind == "openai":
            from rwcore.judges import OpenAIReflector

            return OpenAIReflector(cfg.model, base_url=cfg.base_url or None, api_key_env=cfg.api_key_env,
                                   max_concurrency=cfg.max_concurrency)
        return self.env.reflector()

    def _build_weaver(self):
        from rwcore.judges import RuleJudge
        from rwcore.rewardweaver import Capability, CapabilityLibrary, RewardWeaver

        cfg = self.config.rewardweaver
        library = CapabilityLibrary()
        evaluator = RuleJudge({rubric_id: rule.check for rubric_id, rule in self.rules.items()})
        for rubric_id, rule in self.rules.items():
            candidate = Capability(capability_id=rubric_id, definition=rule.spec.criterion, family=rule.family,
                                   applicability=rule.spec.applicability, evaluator_prompt=rule.spec.evaluator_prompt,
                                   scored=False)
            cases = [case for case in self.env.labelled_cases([rubric_id])
                     if case.trajectory.metadata.get("labelled_rule", rubric_id) == rubric_id]
            library.admit(candidate, evaluator, cases, evaluator_id="env-rules")
        if not library.ids():
            raise ValueError(f"env.name {self.config.env.name!r}: no capability passed admission")
        return RewardWeaver(library, self.env.attributor(), strategy=cfg.selection, budget=cfg.budget,
                            low_outcome=cfg.low_outcome, min_confidence=cfg.min_confidence,
                            min_support=cfg.min_support, seed=self.config.train.seed)

    def _initial_analysis(self) -> None:
        """Arise's initial trajectory analysis and RewardWeaver's first attribution, on one rollout batch."""
        if self.pool is None and self.weaver is None:
            return
        torch.manual_seed(_step_seed(self.config.train.seed, -1) + self.rank)
        _, trajectories = self._rollout(self.sampler.sample(0), step=-1)
        reports = self._judge(trajectories, self.weaver.library.rubrics(self.weaver.library.ids())) \
            if self.weaver is not None else []
        if self.main:
            if self.pool is not None:
                self.pool = self._build_pool(
                    self._reflector().propose_rubric_skills(trajectories, [], self.config.pool.max_new))
            if self.weaver is not None:
                self.weaver.update(trajectories, reports, step=0)
        self._share_adaptive_state()

    # ------------------------------------------------------------------ the loop

    def train(self) -> None:
        cfg = self.config
        total = cfg.train.steps
        progress = None
        if not self.quiet and self.main:
            from tqdm import tqdm

            progress = tqdm(total=total, initial=self.step, desc="rw train", unit="step", dynamic_ncols=True)
        if self.step == 0:
            self._log(self.evaluate("eval"))
        while self.step < total:
            row = self.train_step()
            self._log(row)
            if _due(self.step, cfg.train.eval_every) or self.step == total:
                evaluation = self.evaluate("eval")
                self._log(evaluation)
                row.update(evaluation)
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
            print(f"held-out success {evals[0]['eval/success_rate']:.3f} -> {evals[-1]['eval/success_rate']:.3f} "
                  f"(step {evals[0]['step']} -> {evals[-1]['step']}); adaptive machinery "
                  f"{100 * float(np.mean(fractions)):.1f}% of step time; run folder {self.out}", flush=True)

    def _report_progress(self, progress, row: dict) -> None:
        figures = {
            "reward": f"{row['reward_mean']:.3f}", "success": f"{row['success_rate']:.2f}",
            "kept": f"{row['kept_fraction']:.2f}", "rubrics": row["active_rubrics"],
        }
        if "eval/success_rate" in row:
            figures["eval"] = f"{row['eval/success_rate']:.2f}"
        if progress is not None:
            progress.set_postfix(figures, refresh=False)
            progress.update(1)
        elif self.main and self.step % self.config.train.log_every == 0:
            print(f"step {self.step}/{self.config.train.steps} " + " ".join(f"{k}={v}" for k, v in figures.items()),
                  flush=True)

    def train_step(self) -> dict:
        cfg = self.config
        index = self.step
        torch.manual_seed(_step_seed(cfg.train.seed, index) + self.rank)
        started = time.perf_counter()
        adaptive = 0.0

        clock = time.perf_counter()
        task_ids = self.sampler.sample(index)
        adaptive += time.perf_counter() - clock
        rollouts, trajectories = self._rollout(task_ids, step=index)  # this rank's rollouts; every trajectory
        reports = self._judge(trajectories, self._judged_rubrics(index))

        clock = time.perf_counter()
        outcomes = np.array([t.outcome for t in trajectories], dtype=np.float64)
        group_index = np.repeat(np.arange(len(task_ids)), cfg.rollout.group_size)
        rewards = self.weaver.reward(trajectories, reports) if self.weaver is not None else outcomes.copy()
        rewards = length_regularize(rewards, np.array([t.generated_length for t in trajectories]), group_index,
                                    alpha=cfg.advantage.length_alpha, threshold=cfg.advantage.length_threshold,
                                    eps=cfg.advantage.eps)
        rubric_ids = [spec.rubric_id for spec in self.pool.active_rubrics()] if self.pool is not None else []
        verdicts = _verdict_matrix(reports, rubric_ids)
        advantages = compute_advantages(rewards, verdicts, group_index, lam=cfg.advantage.lam, eps=cfg.advantage.eps,
                                        ddof=cfg.advantage.ddof)
        adaptive += time.perf_counter() - clock

        first, last = self._my_groups(len(task_ids))
        group = cfg.rollout.group_size
        update = self._update_policy(rollouts, advantages[first * group:last * group])
        self._sync_generator()

        clock = time.perf_counter()
        self._record_evidence(task_ids, trajectories, reports, index)
        changed = self._adapt(index, trajectories, reports)
        adaptive += time.perf_counter() - clock
        self.step += 1
        self.policy.version = self.step

        if self.main and (changed or self.step % max(1, cfg.train.eval_every // 5) == 0):
            self._write_sampling()
        if self.main and changed:
            self._write_adaptation_files()
        elapsed = time.perf_counter() - started
        judgments = [j for report in reports for j in report.judgments.values()]
        invalid = sum(1 for j in judgments if j.verdict == Verdict.INVALID)
        row = {
            "step": self.step, "kind": "train",
            "success_rate": float(np.mean([t.metadata.get("success", False) for t in trajectories])),
            "outcome_mean": float(outcomes.mean()), "reward_mean": float(np.mean(rewards)),
            "advantage_std": float(np.std(advantages)), "active_rubrics": self._active_count(),
            "judgments": len(judgments), "invalid_rate": invalid / len(judgments) if judgments else 0.0,
            "generated_tokens_mean": float(np.mean([t.generated_length for t in trajectories])),
            **update, "time/step": elapsed, "time/adaptive": adaptive,
            "time/adaptive_fraction": adaptive / elapsed if elapsed > 0 else 0.0,
        }
        if isinstance(self.sampler, CapabilitySampler):
            row["sampler/coverage"] = self.sampler.coverage()
        return row

    def _my_groups(self, count: int) -> tuple[int, int]:
        """[first, last): the block of `count` task groups (or evaluation tasks) this rank runs."""
        return count * self.rank // self.world_size, count * (self.rank + 1) // self.world_size

    def _rollout(self, task_ids: Sequence, step: int) -> tuple[list[Rollout], list]:
        """(this rank's rollouts, every rank's trajectories in group order)."""
        cfg = self.config
        first, last = self._my_groups(len(task_ids))
        jobs = []
        for i in range(first, last):
            for j in range(cfg.rollout.group_size):
                jobs.append((self.train_tasks[task_ids[i]], _step_seed(cfg.train.seed, step) + 31 * i + j,
                             f"s{step}/t{i}"))
        rollouts = run_episodes(self.env, self.policy, jobs, self._system_prompt(), cfg.rollout.temperature,
                                cfg.rollout.max_new_tokens, generator=self.generator)
        score_behavior(self.policy, rollouts, cfg.rollout.temperature, cfg.loss.backend)
        return rollouts, self._gathered([r.trajectory for r in rollouts])

    def _gathered(self, items: list) -> list:
        """Every rank's `items`, concatenated in rank order (the items themselves on one process)."""
        if self.world_size == 1:
            return items
        return [item for part in self.engine.all_gather(items) for item in part]

    def _judge(self, trajectories: Sequence, specs: Sequence[RubricSpec]) -> list[JudgeReport]:
        """Reports for every trajectory; each rank judges its own block and the reports are gathered."""
        if not specs:
            return [JudgeReport(t.trajectory_id, {}) for t in trajectories]
        first, last = self._my_groups(len(trajectories) // self.config.rollout.group_size)
        group = self.config.rollout.group_size
        return self._gathered(self.judge.evaluate(trajectories[first * group:last * group], specs))

    def _system_prompt(self) -> str:
        if self.pool is not None and self.config.pool.skills == "on":
            return self.pool.system_prompt(self.env.system_prompt)
        return self.env.system_prompt

    def _judged_rubrics(self, index: int) -> list[RubricSpec]:
        """The pool's active rubrics, RewardWeaver's active set, and at adaptation steps its whole library."""
        specs: dict[str, RubricSpec] = {}
        if self.pool is not None:
            specs.update({spec.rubric_id: spec for spec in self.pool.active_rubrics()})
        if self.weaver is not None:
            ids = self.weaver.library.ids() if self._adaptation_due(index) else self.weaver.active
            specs.update({spec.rubric_id: spec for spec in self.weaver.library.rubrics(ids)})
        return list(specs.values())

    def _adaptation_due(self, index: int) -> bool:
        return self.weaver is not None and (index + 1) % self.config.rewardweaver.adaptation_interval == 0

    def _update_policy(self, rollouts: Sequence[Rollout], advantages: np.ndarray) -> dict:
        cfg = self.config
        input_ids, attention, generated = batch_tensors(rollouts, self.policy.codec.pad_id, self.device)
        behavior = torch.nn.utils.rnn.pad_sequence([r.behavior_logprobs for r in rollouts],
                                                   batch_first=True).to(self.device)
        head_weight, labels = self.policy.action_space(input_ids[:, 1:])
        mask = generated[:, 1:] & (attention[:, 1:] != 0)
        adv = torch.as_tensor(np.asarray(advantages), dtype=torch.float32, device=self.device)[:, None].expand_as(labels)
        head_bias = self.policy.head.bias
        if head_bias is not None and self.policy.allowed is not None:
            head_bias = head_bias[self.policy.allowed]
        total_tokens = self.engine.tokens_denominator(self.engine.all_sum_tensor(mask.sum()))
        rows = torch.arange(len(rollouts))
        stats_sum: dict[str, float] = {}
        loss_value = 0.0
        for _ in range(cfg.optim.epochs):
            self.engine.zero_grad()
            for part in torch.tensor_split(rows, cfg.optim.minibatches):
                hidden = self.policy.hidden_states(input_ids[part], attention[part])[:, :-1]
                hidden = hidden.reshape(-1, hidden.shape[-1])
                loss, stats = fused_linear_policy_loss(
                    hidden, head_weight, labels[part].reshape(-1), behavior[part, 1:].reshape(-1),
                    adv[part].reshape(-1), mask[part].reshape(-1), bias=head_bias, temperature=cfg.rollout.temperature,
                    ratio_low=cfg.loss.ratio_low, ratio_high=cfg.loss.ratio_high, clip_c=cfg.loss.clip_c,
                    num_model_tokens=total_tokens, backend=cfg.loss.backend, validate=False,
                )
                if cfg.loss.entropy_coef > 0:
                    entropy = self._entropy_sum(hidden, head_weight, head_bias, mask[part].reshape(-1))
                    loss = loss - cfg.loss.entropy_coef * entropy / total_tokens
                    stats["entropy"] = entropy.detach() / mask[part].sum().clamp_min(1)  # per model token
                self.engine.accumulate(loss)
                loss_value += float(loss.detach())
                for name, value in stats.items():
                    stats_sum[name] = stats_sum.get(name, 0.0) + float(value) * len(part) / len(rollouts)
            grad_norm = self.engine.step()
        epochs = max(1, cfg.optim.epochs)
        # Each rank's loss is its share of the step's tokens scaled by the world size, so the mean over ranks is
        # the whole batch's loss; the statistics are each rank's token fractions, averaged.
        figures = self.engine.all_mean({"loss": loss_value / epochs,
                                        **{name: value / epochs for name, value in stats_sum.items()}})
        return {"loss": figures.pop("loss"), "grad_norm": grad_norm, **figures}

    def _entropy_sum(self, hidden: torch.Tensor, weight: torch.Tensor, bias, mask: torch.Tensor) -> torch.Tensor:
        """Sum over model tokens of the policy's entropy at the sampling temperature (fp32, differentiable).
        Materializes the [N, V] logits of the action space: meant for small vocabularies or action words."""
        logits = torch.nn.functional.linear(hidden, weight, bias).float()
        placeholder = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        _, entropy = token_logprobs(logits, placeholder, temperature=self.config.rollout.temperature,
                                    return_entropy=True, backend=self.config.loss.backend, validate=False)
        return (entropy * mask).sum()

    def _record_evidence(self, task_ids, trajectories, reports, index: int) -> None:
        group = self.config.rollout.group_size
        sampler_rubrics = self.sampler.rubrics
        for i, task_id in enumerate(task_ids):
            chunk = reports[i * group:(i + 1) * group]
            verdicts = {rubric_id: [report.judgments.get(rubric_id, _INVALID).verdict for report in chunk]
                        for rubric_id in sampler_rubrics}
            outcomes = [t.outcome for t in trajectories[i * group:(i + 1) * group]]
            self.sampler.record_group(task_id, verdicts, index, outcomes=[min(1.0, max(0.0, o)) for o in outcomes])
        if self.pool is not None:
            self.pool.record([_only(report, {s.rubric_id for s in self.pool.active_rubrics()}) for report in reports],
                             index)

    def _adapt(self, index: int, trajectories, reports) -> bool:
        changed = False
        if self.main:
            if self.pool is not None and self.pool.maybe_update(index, trajectories) is not None:
                changed = True
            if self._adaptation_due(index):
                self.weaver.update(trajectories, reports, step=index + 1)
                changed = True
        changed = self._share_adaptive_state(changed)
        if changed:
            self._sync_sampler_rubrics()
        return changed

    def _share_adaptive_state(self, changed: bool = True) -> bool:
        """Rank 0's pool and RewardWeaver state on every rank (reflection may call an LLM, so only rank 0
        runs it); returns rank 0's `changed`."""
        if self.world_size == 1:
            return changed
        shared = self.engine.broadcast({
            "changed": changed,
            "pool": self.pool.state_dict() if changed and self.pool is not None else None,
            "weaver": self.weaver.state_dict() if changed and self.weaver is not None else None,
        })
        if not self.main and shared["changed"]:
            if shared["pool"] is not None:
                self.pool.load_state_dict(shared["pool"])
            if shared["weaver"] is not None:
                self.weaver.load_state_dict(shared["weaver"])
        return shared["changed"]

    def _sync_sampler_rubrics(self) -> None:
        """The sampler follows the rubrics that currently steer training."""
        if self.pool is not None:
            rubrics = self.pool.rubric_capabilities()
        elif self.weaver is not None:
            rubrics = {rubric_id: self.rules[rubric_id].spec.capability for rubric_id in self.weaver.active}
        else:
            rubrics = {}
        if rubrics != self.sampler.rubrics:
            self.sampler.set_rubrics(rubrics)

    def _active_count(self) -> int:
        count = len(self.pool.active_rubrics()) if self.pool is not None else 0
        return count + (len(self.weaver.active) if self.weaver is not None else 0)

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self, split: str = "eval", max_tasks: int | None = None) -> dict:
        """Success rate and mean outcome on a split, one sampled episode per task with fixed seeds."""
        tasks = self.eval_tasks if split == "eval" else list(self.train_tasks.values())
        tasks = tasks[:max_tasks] if max_tasks else tasks
        first, last = self._my_groups(len(tasks))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(EVAL_SEED + self.rank)
            jobs = [(tasks[i], EVAL_SEED + i, f"eval/{i}") for i in range(first, last)]
            rollouts = run_episodes(self.env, self.policy, jobs, self._system_prompt(), self.config.rollout.temperature,
                                    self.config.rollout.max_new_tokens, generator=self.generator)
        outcomes = self._gathered([(r.outcome.success, r.outcome.reward) for r in rollouts])
        return {
            "step": self.step, "kind": "eval",
            f"{split}/success_rate": float(np.mean([success for success, _ in outcomes])),
            f"{split}/outcome_mean": float(np.mean([reward for _, reward in outcomes])),
            f"{split}/episodes": len(outcomes),
        }

    @classmethod
    def evaluate_checkpoint(cls, path: str | os.PathLike, split: str = "eval", max_tasks: int | None = None) -> dict:
        """Metrics of a saved checkpoint (a checkpoints/step_N folder, or a run folder: its latest)."""
        path = Path(path)
        if (path / "checkpoints" / "latest").exists():
            path = path / "checkpoints" / (path / "checkpoints" / "latest").read_text().strip()
        run = path.parent.parent
        trainer = cls(load_config(str(run / "config.yaml")), run, quiet=True)
        trainer._resume_from = path
        trainer._evaluation_only = True
        trainer.setup()
        return trainer.evaluate(split, max_tasks)

    # ------------------------------------------------------------------ files

    def _log(self, row: dict) -> None:
        if not self.main:
            return
        with open(self._metrics_path, "a") as stream:
            stream.write(json.dumps(row) + "\n")

    def _write_sampling(self) -> None:
        if not isinstance(self.sampler, CapabilitySampler):
            return
        pairs = self.sampler.pair_probabilities(self.step, num_draws=500)
        line = {"step": self.step, "pairs": [{"tag": tag, "capability": cap, "probability": p}
                                             for (tag, cap), p in pairs.items()]}
        with open(self._sampling_path, "a") as stream:
            stream.write(json.dumps(line) + "\n")

    def _write_adaptation_files(self) -> None:
        if self.weaver is not None:
            families = {cid: self.weaver.library[cid].capability.family for cid in self.weaver.library.ids()}
            stages = []
            for record in self.weaver.history.stages:
                stages.append({"stage": record.stage, "start_step": record.start_step, "end_step": record.end_step,
                               "active": list(record.active), "families": {c: families.get(c, "") for c in record.active},
                               "strategy": record.strategy, "reason": record.reason})
            atomic_write_bytes(self.out / "reward_stages.json", json.dumps(stages, indent=1).encode())
            atomic_write_bytes(self.out / "reward_history.json",
                               json.dumps(self.weaver.history.state_dict(), indent=1, default=str).encode())
        if self.pool is not None:
            counts = [{"step": row["step"], "active": row["active_rubrics"], "added": row["added"],
                       "retired": row["retired"]} for row in self.pool.counts()]
            atomic_write_bytes(self.out / "pool_counts.json", json.dumps(counts, indent=1).encode())
            atomic_write_bytes(self.out / "pool_events.json", json.dumps(self.pool.history(), indent=1).encode())

    def save_checkpoint(self) -> Path:
        """Everything an exact resume needs, written to a temporary folder and renamed into place."""
        folder = self.out / "checkpoints"
        name = f"step_{self.step:06d}"
        staging = folder / f".{name}.tmp"
        if self.main:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
        self.engine.barrier()
        self.engine.save(staging)  # collective under DeepSpeed
        rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        if self.main:
            torch.save({
                "step": self.step, "config": config_to_dict(self.config), "world_size": self.world_size,
                "sampler": self.sampler.state_dict(),
                "pool": self.pool.state_dict() if self.pool is not None else None,
                "weaver": self.weaver.state_dict() if self.weaver is not None else None,
                "rng": rng,
            }, staging / "state.pt")
        else:
            torch.save(rng, staging / f"rng_rank{self.rank}.pt")
        self.engine.barrier()
        target = folder / name
        if self.main:
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
            atomic_write_bytes(folder / "latest", name.encode())
        self.engine.barrier()
        return target

    def _load_checkpoint(self, path: Path) -> None:
        if not path.is_dir():
            raise ValueError(f"checkpoint {path} does not exist")
        state = torch.load(path / "state.pt", weights_only=False)
        if self._evaluation_only:
            self.policy.model.load_state_dict(torch.load(path / "model.pt", weights_only=True))
        else:
            saved_world = int(state.get("world_size", 1))
            if saved_world != self.world_size:
                raise ValueError(f"--resume: checkpoint {path} was written by {saved_world} process(es); resume it "
                                 f"with the same number (this run has {self.world_size})")
            if self.engine.name == "torch" and not (path / "optimizer.pt").exists():
                raise ValueError(f"--resume: checkpoint {path} was written by train.engine=deepspeed; the run's "
                                 "config must keep that engine")
            self.engine.load(path)
        self.sampler.load_state_dict(state["sampler"])
        if self.pool is not None:
            if not state["pool"]:
                raise ValueError(f"checkpoint {path} has no pool state but train.method={self.config.train.method}")
            self.pool.load_state_dict(state["pool"])
        if self.weaver is not None:
            self.weaver.load_state_dict(state["weaver"])
        rng = state["rng"] if self.main else torch.load(path / f"rng_rank{self.rank}.pt", weights_only=False)
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        self.step = int(state["step"])
        self.policy.version = self.step
        if not self._evaluation_only and self.main:
            for log in (self._metrics_path, self._sampling_path):
                _truncate_after(log, self.step)
        self.engine.barrier()  # no rank starts before rank 0 has truncated the logs

    def cleanup(self) -> None:
        """Releases the engines (DeepSpeed's buffers and hooks, vLLM's temporary model folder)."""
        for engine in (getattr(self, "generator", None), getattr(self, "engine", None)):
            if engine is not None:
                engine.close()


def _due(step: int, every: int) -> bool:
    """Whether a periodic action (every 0 = never) falls on `step`."""
    return every > 0 and step % every == 0


_INVALID = RubricJudgment("", Verdict.INVALID, error="not judged")


def _only(report: JudgeReport, rubric_ids: set) -> JudgeReport:
    return JudgeReport(report.trajectory_id, {k: v for k, v in report.judgments.items() if k in rubric_ids},
                       report.uncovered)


def _verdict_matrix(reports: Sequence[JudgeReport], rubric_ids: Sequence[str]) -> np.ndarray:
    """[N, R]: 1.0 pass, 0.0 fail, NaN for not applicable / invalid / not judged."""
    matrix = np.full((len(reports), len(rubric_ids)), np.nan)
    for row, report in enumerate(reports):
        for col, rubric_id in enumerate(rubric_ids):
            judgment = report.judgments.get(rubric_id)
            if judgment is not None and judgment.verdict in (Verdict.PASS, Verdict.FAIL):
                matrix[row, col] = 1.0 if judgment.verdict == Verdict.PASS else 0.0
    return matrix


def _truncate_after(path: Path, step: int) -> None:
    """Drops log lines written after `step` (a resumed run writes them again)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line and json.loads(line).get("step", 0) <= step]
    atomic_write_bytes(path, ("\n".join(kept) + "\n").encode() if kept else b"")
