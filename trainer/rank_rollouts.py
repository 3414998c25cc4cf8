"""`RankRollouts`: the trainer's episodes, this process's share of them and the gathering of every process's.

With train.engine=deepspeed every rank draws the same batch, runs its own block of task groups (`_my_groups`),
and gathers the trajectories and verdicts in rank order (`_gathered`), so that what follows is computed
identically everywhere. `_episodes` is the one place where the trainer runs episodes (training, diagnosis, the
diagnostic set, evaluation); `_request_rollouts` asks the asynchronous rollout process (rollout.max_lag > 0)
for a step's episodes instead.

A mixin of `rwcore.trainer.trainer.Trainer`: it reads the trainer's config, env, policy, generator, engine,
judge, loop, train_tasks, rollouts_ahead, rank and world_size, and adds to its judging clocks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rwcore.method.judging import judge_groups
from rwcore.trainer.rollout import Rollout, run_episodes, score_behavior


def step_seed(seed: int, step: int) -> int:
    """The seed of step `step`'s episodes (and, offset, of its diagnosis batch) in a run seeded with `seed`."""
    return (seed * 1_000_003 + step * 7_919 + 17) % (2**63)


class RankRollouts:
    """This process's episodes and judging, and the gathering of every process's (mixed into the Trainer)."""

    def _request_rollouts(self, step: int) -> float:
        """Asks the rollout process for step `step`'s rollouts (the method samples its tasks now, and its
        current training prompt goes with them); returns the seconds spent in the method."""
        cfg = self.config
        clock = time.perf_counter()
        plan = self.loop.plan(step, self.env.system_prompt)
        task_ids, prompt = plan.task_ids, plan.system_prompt
        seconds = time.perf_counter() - clock
        seed = step_seed(cfg.train.seed, step)
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

    def _episodes(self, jobs: Sequence, prompt: str, on_group=None, greedy: bool = False) -> list[Rollout]:
        """One episode per (task, seed, group id) job of this rank under `prompt`, at the run's sampling settings
        (`run_episodes`; `greedy`: argmax decoding, for `rw eval --greedy`): every episode of training,
        diagnosis, the diagnostic set and evaluation starts here."""
        return run_episodes(
            self.env,
            self.policy,
            jobs,
            prompt,
            self.config.rollout.temperature,
            self.config.rollout.max_new_tokens,
            greedy=greedy,
            generator=self.generator,
            on_group=on_group,
        )

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
        rollouts = self._episodes(jobs, prompt, on_group=on_group)
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
