"""`TrainerAdaptation`: the method's scheduled adaptation inside `rw train` - before step 0 and at the end of a
step, through the method's loop (rwcore.method.loop.MethodLoop).

At a RewardWeaver stage boundary the loop asks for a fresh on-policy diagnosis batch of the updated policy
(`_diagnosis`) and for the fixed diagnostic set (`_diagnostic_reports`, appendix G: no skills, fixed seeds);
both draw under torch.random.fork_rng, so the run's own random state is left as it was. Adaptation (which may
call an LLM) runs on rank 0 and its state is broadcast to every rank (`_share_method_state`).

A mixin of `rwcore.trainer.trainer.Trainer`: it reads the trainer's config, env, method, loop, judge,
train_tasks, rank, main and world_size, and runs its episodes through `RankRollouts` (rwcore.trainer.rank_rollouts).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from rwcore.method.judging import judge_groups
from rwcore.trainer.method_setup import task_contexts
from rwcore.trainer.rank_rollouts import step_seed

DIAGNOSTIC_SEED = 2_000_003  # the fixed diagnostic set's episodes (appendix G), the same at every boundary


class TrainerAdaptation:
    """The method's adaptation before training and at the end of each step (mixed into the Trainer)."""

    def _start_method(self) -> None:
        """Before step 0: instance rubrics (rw_instance_specific) and RewardWeaver's first stage from a
        diagnosis batch of the initial policy. Arise's pool starts empty: nothing is rolled out for it."""
        if self.method.needs_instance_contexts:
            if self.main:
                self.method.set_instance_contexts(task_contexts(self.env, self.train_tasks.values()))
            self._share_method_state()
        if self.method.stage_due(-1):
            self._adapt(-1)

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
            torch.manual_seed(step_seed(self.config.train.seed, index) + 104_729 + self.rank)
            _, trajectories = self._rollout(
                tasks,
                step_seed(self.config.train.seed, index) + 104_729,
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
            rollouts = self._episodes(jobs, self.method.system_prompt(self.env.system_prompt, True))
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
