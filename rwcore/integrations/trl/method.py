"""TRL's `GRPOTrainer` driven by one `rwcore.AdaptiveMethod`: its sampler, rewards, advantages, pool and skills.

    method = AdaptiveMethod("arise", tasks, MethodSettings(batch_size=K, group_size=G), Providers(reflector=...))
    trainer = AdaptiveGRPOTrainer(model, method=method, judge=judge, args=GRPOConfig(num_generations=G,
                                  generation_batch_size=K * G, ...), train_dataset=dataset)
    trainer.train()

Per generation round (one TRL `_generate_and_score_completions` call) at step k = state.global_step:

- the K tasks are `method.sample(k)`, drawn when the round starts (after round k-1's `observe`), each
  task's dataset row repeated G times in a row (the rows TRL's loader brought are replaced);
- the prompts get `method.system_prompt(...)`: the pool's skills in the system message (training only);
- the single reward function judges the completions on `method.rubrics_to_judge(k, task_ids)`
  (`rwcore.method.judge_groups`) and returns `method.score(...).rewards` -- RewardWeaver's active-set
  process term included -- which TRL logs as `rewards/rwcore_method/mean`;
- TRL's group-normalized advantages are replaced by `method.score(...).advantages` (Arise eq. 16 over
  the pool's rubrics), which the filtered dual-clip loss then uses; TRL's own keys choose how they are
  scaled and combined: `GRPOConfig.scale_rewards` (True / False too) is the method's `scale_rewards`,
  `multi_objective_aggregation` its `aggregation` (a method setting left at its default takes TRL's value;
  one set otherwise must agree);
- `method.observe(k, ...)` records the evidence (sampler, pool window, reflection window);
- after each optimizer step, `method.adapt(k)`: the pool every delta_pool steps, RewardWeaver's stages
  every adaptation_interval steps with `diagnose(task_ids, rubrics) -> (trajectories, reports)`, a fresh
  on-policy diagnosis batch (required for variants with stages; before training too, at k = -1).

`outcome_fn(trajectory) -> float` gives the task outcome R_o of each completion (default 0: rubric
terms only). Single process only (the method scores whole groups; TRL splits a generation batch over
processes): `world_size > 1` is refused at start, as are a generation batch that is not K * G and
`num_iterations * steps_per_generation != 1` (the method scores each rollout once, for one update).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from rwcore.validation import check_int

from .trainer import RWGRPOMixin

REWARD_NAME = "rwcore_method"


class AdaptiveGRPOMixin(RWGRPOMixin):
    """`RWGRPOMixin` whose sampler, rewards and advantages come from an `AdaptiveMethod` (see the module)."""

    def __init__(
        self,
        *args,
        method,
        judge,
        outcome_fn: Callable | None = None,
        diagnose: Callable | None = None,
        base_system_prompt: str = "",
        task_id_column: str = "task_id",
        tags_column: str | None = "tags",
        keep_rounds: int = 16,
        **kwargs,
    ) -> None:
        from rwcore.method.loop import MethodLoop

        if judge is None:
            raise ValueError("judge must have an evaluate(trajectories, rubrics) method, got None")
        # the method's one loop (rwcore.method.loop), shared with rw train and verl; checks method / judge / diagnose
        self.rw_loop = MethodLoop(method, judge=judge, diagnose=diagnose)
        for name in ("reward_funcs", "task_sampler", "rubric_recorder"):
            if name in kwargs:
                raise ValueError(f"AdaptiveGRPOTrainer takes no {name}=: the method provides it")
        self.rw_method = method
        self.rw_outcome_fn = outcome_fn
        self.rw_base_system_prompt = base_system_prompt
        self.rw_tags_column = tags_column
        # the last `keep_rounds` generation rounds (task ids, trajectories, reports, Scored), for inspection;
        # bounded, since each holds a whole round's trajectories
        self.rw_scored: deque[dict] = deque(maxlen=check_int(keep_rounds, "keep_rounds", low=1))
        self._rw_rounds = 0
        self._rw_pending = None

        def rwcore_method(prompts, completions, completion_ids=None, **columns):
            return self._rw_score(prompts, completions, columns)

        rwcore_method.__name__ = rwcore_method.__qualname__ = REWARD_NAME
        # TRL's own RepeatSampler fills the loader; each round's rows are then replaced by the rows of
        # method.sample(step), drawn when the round starts -- after the previous round's observe(), as in
        # the method's loop (a sampler behind the loader would be drawn a batch early: accelerate prefetches).
        super().__init__(*args, reward_funcs=[rwcore_method], task_id_column=task_id_column, **kwargs)
        self._rw_check_method_setup()
        self._rw_read_credit_settings()
        self._rw_rows = self._rw_index_rows()
        self.rw_loop.start()  # RewardWeaver's first diagnosis, before training
        from .callbacks import callback_class

        self.add_callback(callback_class("AdaptiveMethodCallback")(self))

    def _rw_check_method_setup(self) -> None:
        s, args = self.rw_method.settings, self.args
        if getattr(args, "world_size", 1) != 1:
            raise ValueError(
                f"AdaptiveGRPOTrainer runs on one process (the method scores whole groups); "
                f"world_size is {args.world_size}"
            )
        if self.num_generations != s.group_size:
            raise ValueError(
                f"GRPOConfig.num_generations ({self.num_generations}) must equal the method's "
                f"MethodSettings.group_size ({s.group_size})"
            )
        if args.generation_batch_size != s.batch_size * s.group_size:
            raise ValueError(
                f"GRPOConfig.generation_batch_size ({args.generation_batch_size}) must equal the "
                f"method's batch_size * group_size ({s.batch_size} * {s.group_size})"
            )
        if self.num_iterations * args.steps_per_generation != 1:
            raise ValueError(
                "the method scores each rollout for one policy update: set GRPOConfig num_iterations=1 "
                f"and steps_per_generation=1 (got {self.num_iterations} and {args.steps_per_generation})"
            )

    def _rw_read_credit_settings(self) -> None:
        """TRL's own keys set the method's credit settings: `GRPOConfig.scale_rewards` (True / False as TRL maps
        them: "group" / "none") -> `MethodSettings.scale_rewards`, `GRPOConfig.multi_objective_aggregation` ->
        `MethodSettings.aggregation`. A method setting left at its default takes GRPOConfig's value; one set
        otherwise must equal it (ValueError naming both keys)."""
        from rwcore.method.settings import MethodSettings

        args, settings, defaults = self.args, self.rw_method.settings, MethodSettings()
        scale = getattr(args, "scale_rewards", defaults.scale_rewards)
        if isinstance(scale, bool):
            scale = "group" if scale else "none"
        wanted = {
            "scale_rewards": ("GRPOConfig.scale_rewards", scale),
            "aggregation": (
                "GRPOConfig.multi_objective_aggregation",
                getattr(args, "multi_objective_aggregation", defaults.aggregation),
            ),
        }
        changes = {}
        for name, (key, value) in wanted.items():
            mine = getattr(settings, name)
            if value == mine:
                continue
            if mine != getattr(defaults, name):
                raise ValueError(
                    f"{key}={value!r} and the method's MethodSettings.{name}={mine!r} disagree: "
                    f"AdaptiveGRPOTrainer reads {key}; set it to {mine!r} there (or leave the method's at its default)"
                )
            changes[name] = value
        if changes:
            try:
                self.rw_method.set_credit_settings(**changes)
            except ValueError as error:
                keys = ", ".join(f"{wanted[name][0]}={value!r}" for name, value in changes.items())
                raise ValueError(f"{keys}: {error}") from None

    def _rw_index_rows(self) -> dict:
        dataset, column = self.train_dataset, self.rw_task_id_column
        if column not in getattr(dataset, "column_names", ()):
            raise ValueError(f"task_id_column {column!r} is not a column of train_dataset")
        rows: dict = {}
        for index, task_id in enumerate(dataset[column]):
            rows.setdefault(task_id, index)
        missing = [t for t in self.rw_method.task_ids if t not in rows]
        if missing:
            raise ValueError(f"the method's tasks {missing[:5]} have no row in train_dataset[{column!r}]")
        return rows

    # -- per generation round ------------------------------------------------------------

    def _rw_with_system_prompt(self, prompt):
        text = self.rw_method.system_prompt(self.rw_base_system_prompt)
        if not text:
            return prompt
        if isinstance(prompt, str):
            return text + "\n\n" + prompt
        messages = [dict(m) for m in prompt]
        if messages and messages[0].get("role") == "system":
            messages[0]["content"] = self.rw_method.system_prompt(messages[0].get("content") or "")
        else:
            messages.insert(0, {"role": "system", "content": text})
        return messages

    def _generate_and_score_completions(self, inputs):
        if len(inputs) != self.args.generation_batch_size:
            raise RuntimeError(f"a generation round of {len(inputs)} rows, expected {self.args.generation_batch_size}")
        task_ids = self.rw_loop.plan(int(self.state.global_step)).task_ids
        rows = [self.train_dataset[self._rw_rows[t]] for t in task_ids for _ in range(self.num_generations)]
        inputs = [dict(row, prompt=self._rw_with_system_prompt(row["prompt"])) for row in rows]
        output = super()._generate_and_score_completions(inputs)
        pending, self._rw_pending = self._rw_pending, None
        if pending is None:
            raise RuntimeError("TRL computed no method rewards for this generation round")
        import torch

        advantages = torch.as_tensor(
            pending["scored"].advantages, dtype=output["advantages"].dtype, device=output["advantages"].device
        )
        if advantages.shape != output["advantages"].shape:
            raise RuntimeError(
                f"method advantages {tuple(advantages.shape)} do not match TRL's {tuple(output['advantages'].shape)}"
            )
        output["advantages"] = advantages
        pending["advantages_used"] = advantages.detach().cpu().clone()
        return output

    def _rw_score(self, prompts, completions, columns):
        from .rewards import trajectory_from_trl

        g = self.num_generations
        step = int(self.state.global_step)
        ids = columns.get(self.rw_task_id_column)
        if ids is None:
            raise ValueError(f"the dataset has no {self.rw_task_id_column!r} column (the method's task ids)")
        tags = columns.get(self.rw_tags_column) if self.rw_tags_column else None
        trajectories = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions)):
            trajectory = trajectory_from_trl(
                prompt,
                completion,
                ids[i],
                tags=tags[i] if tags is not None else (),
                trajectory_id=f"s{step}-r{self._rw_rounds}-{i}",
                group_id=f"s{step}-g{i // g}",
                policy_version=step,
            )
            if self.rw_outcome_fn is not None:
                trajectory.outcome = float(self.rw_outcome_fn(trajectory))
            trajectories.append(trajectory)
        task_ids = [trajectories[i].task_id for i in range(0, len(trajectories), g)]
        for k, task_id in enumerate(task_ids):
            if any(t.task_id != task_id for t in trajectories[k * g : (k + 1) * g]):
                raise ValueError("a TRL reward batch is not made of groups of num_generations completions of one task")
        result = self.rw_loop.finish(step, task_ids, trajectories)  # judge, score, observe
        reports, scored = result.reports, result.scored
        record = {
            "step": step,
            "task_ids": task_ids,
            "trajectories": trajectories,
            "reports": reports,
            "scored": scored,
        }
        self.rw_scored.append(record)
        self._rw_rounds += 1
        self._rw_pending = record
        return [float(r) for r in scored.rewards]

    def _rw_adapt(self, step: int) -> None:
        """After optimizer step `step` (0-based): the pool and RewardWeaver's stage, when due."""
        self.rw_loop.end_step(step)
