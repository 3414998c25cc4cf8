"""`TrainerEvaluation`: what the trainer measures besides training - held-out evaluation (and, for analysis, with
the active skills), the exploration row before training, the light skill-reading probe, and `rw eval`'s
evaluation of a saved checkpoint.

Held-out evaluation never shows skills: the prompt is the environment's base prompt. Its episodes have their own
seeds (EVAL_SEED), the same tasks and draws at every evaluation, under torch.random.fork_rng: evaluating leaves
every other value of the run as it was.

A mixin of `rwcore.trainer.trainer.Trainer`: it reads the trainer's config, env, policy, generator, method,
step, rank, main, train_tasks and eval_tasks, and runs its episodes through `RankRollouts`
(rwcore.trainer.rank_rollouts).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from rwcore.trainer import checkpoint as ckpt
from rwcore.trainer import envs
from rwcore.trainer.config import load_config
from rwcore.trainer.metrics import Evaluation, evaluation_row, exploration_row
from rwcore.trainer.prior import language_of, resolve_probe_at_eval
from rwcore.trainer.prior.pretrain import corpus_spec
from rwcore.trainer.prior.probe import EvaluationProbe
from rwcore.trainer.transcripts import Transcript, transcript_of

EVAL_SEED = 1_000_003  # eval episodes use their own seeds: the same tasks and draws at every evaluation

T = TypeVar("T", bound="TrainerEvaluation")


class TrainerEvaluation:
    """Held-out evaluation, the exploration row, the reading probe and `rw eval` (mixed into the Trainer)."""

    def _log_evaluation(self) -> dict:
        evaluation, transcripts = self._evaluate("eval", transcripts=self._transcripts_wanted())
        evaluation.update(self._probe_row())
        evaluation.update(self._usage_row())  # every row says what the LLM roles cost since the previous one
        self._log(evaluation)
        if self.main and self.trackers is not None:
            self.trackers.log_transcripts("eval", transcripts, self.step)
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
        # every row says what the LLM roles cost since the previous one
        return exploration_row(self.step, figures, self._usage_row())

    def _transcripts_wanted(self) -> int:
        """train.tracker_transcripts when a tracker is named (the same on every rank: gathering them is collective)."""
        trackers = [name for name in self.config.train.loggers if name != "console"]
        return self.config.train.tracker_transcripts if trackers else 0

    def evaluate(
        self,
        split: str = "eval",
        max_tasks: int | None = None,
        with_skills: bool = False,
        greedy: bool = False,
        transcripts: list | None = None,
    ) -> dict:
        """Success rate and mean outcome on a split, one sampled episode per task with fixed seeds.

        The prompt is the environment's base prompt: Arise withholds the evolved skills at evaluation.
        `with_skills` (analysis only) adds the active skills and labels the metrics eval_with_skills/*.
        `greedy`: argmax decoding instead of sampling at rollout.temperature. `transcripts`: a list that
        gets every episode's transcript (`transcript_of`), in task order (this rank's block).
        """
        return self._evaluate(split, max_tasks, with_skills, greedy=greedy, every_transcript=transcripts)[0]

    @torch.no_grad()
    def _evaluate(
        self,
        split: str = "eval",
        max_tasks: int | None = None,
        with_skills: bool = False,
        transcripts: int = 0,
        greedy: bool = False,
        every_transcript: list | None = None,
    ) -> tuple[dict, list[Transcript]]:
        """`evaluate`'s row, and the transcripts of the first `transcripts` episodes (of every rank, in task order)
        for the trackers; `every_transcript` (`rw eval --transcripts`) gets this rank's episodes as `transcript_of`
        dicts."""
        tasks = self.eval_tasks if split == "eval" else list(self.train_tasks.values())
        tasks = tasks[:max_tasks] if max_tasks else tasks
        first, last = self._my_groups(len(tasks))
        prompt = self._skills_prompt() if with_skills else self.env.system_prompt
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(EVAL_SEED + self.rank)
            jobs = [(tasks[i], EVAL_SEED + i, f"eval/{i}") for i in range(first, last)]
            rollouts = self._episodes(jobs, prompt, greedy=greedy)
        if every_transcript is not None:
            every_transcript.extend(transcript_of(r) for r in rollouts)
        outcomes = self._gathered(
            [
                (r.outcome.success, r.outcome.reward, tasks[first + k].tags[0] if tasks[first + k].tags else "untagged")
                for k, r in enumerate(rollouts)
            ]
        )
        details = self._gathered([r.outcome.details for r in rollouts])
        sampled = (
            self._gathered([Transcript.of(first + k, r) for k, r in enumerate(rollouts) if first + k < transcripts])
            if transcripts
            else []
        )
        row = evaluation_row(
            Evaluation(
                step=self.step,
                name=f"{split}_with_skills" if with_skills else split,
                with_skills=with_skills,
                outcomes=outcomes,
                details=details,
                # the best held-out success any policy can reach (normalizes areas under curves)
                ceiling=envs.provided(self.env, "ceiling") if split == "eval" else None,
            )
        )
        return row, sampled

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
        cls,
        path: str | os.PathLike,
        split: str = "eval",
        max_tasks: int | None = None,
        with_skills: bool = False,
        greedy: bool = False,
        tasks_file: str | None = None,
        transcripts: list | None = None,
        loaded: Callable[[], None] | None = None,
    ) -> dict:
        """Metrics of a saved checkpoint (a checkpoints/step_N folder, or a run folder: its latest); `greedy`,
        `transcripts` as `evaluate`; `tasks_file` as `from_checkpoint`. `loaded()` is called once the checkpoint
        is verified and loaded, before the episodes run (`rw eval` says there what it evaluates: a refusal
        before it stays one line)."""
        trainer = cls.from_checkpoint(path, tasks_file=tasks_file)
        if loaded is not None:
            loaded()
        return trainer.evaluate(split, max_tasks, with_skills=with_skills, greedy=greedy, transcripts=transcripts)

    @classmethod
    def from_checkpoint(cls: type[T], path: str | os.PathLike, tasks_file: str | None = None) -> T:
        """A trainer set up for evaluation with a saved checkpoint's policy and method state (a
        checkpoints/step_N folder, or a run folder: its latest), after verifying it against its manifest.
        `tasks_file`: the held-out split read from this task file instead (env.name=tasks runs only: its
        env.options.eval_file replaced; ValueError for another environment)."""
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
        config = load_config(str(run / "config.yaml"))
        if tasks_file is not None:
            if config.env.name != "tasks":
                raise ValueError(
                    f"--tasks-file scores a task file with an env.name=tasks run; this run's env.name is "
                    f"{config.env.name!r}"
                )
            config.env.options["eval_file"] = str(Path(tasks_file).resolve())
        trainer = cls(config, run, quiet=True)
        trainer._resume_from = path
        trainer._verified = path
        trainer._evaluation_only = True
        if tasks_file is not None:  # the held-out file is replaced on purpose: not a changed environment
            trainer._replaced_entries = ("eval_file ",)
        trainer.setup()
        return trainer
