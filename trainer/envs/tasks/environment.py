"""`TaskFileEnv`: tasks from files and an outcome function as an `rw train` environment (see the package
docstring)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

from rwcore.trainer.envs.base import Episode, Outcome, Rule, Task
from rwcore.trainer.envs.tasks.files import TaskRow, read_tasks
from rwcore.trainer.envs.tasks.functions import UserFunction, file_digest, reward_value
from rwcore.types import Trajectory


class TaskFileEnv:
    """env.name=tasks. Options (env.options.*):

    train_file / eval_file: the task files of the two splits (.jsonl or .parquet; rwcore.trainer.envs.tasks.files
        gives the row format); the splits share no task id.
    reward: the outcome function, "module:function" (rwcore.trainer.envs.tasks.functions gives its arguments
        and return values).
    rubrics: a rubrics file (YAML/JSON) for the methods (rwcore.trainer.envs.tasks.rubrics); optional.
    system_prompt: the policy's base system prompt (default: none).
    success_threshold: a numeric reward counts as success when >= it (default 1.0).
    vocabulary: extra words for the built-in word-level model (model.name unset), whose tokenizer is the
        words of the prompts.
    """

    name = "tasks"
    max_turns = 1  # one agent reply per episode: the opening is the conversation so far

    def __init__(
        self,
        train_file: str = "",
        eval_file: str = "",
        reward: str = "",
        rubrics: str = "",
        system_prompt: str = "",
        success_threshold: float = 1.0,
        vocabulary: Sequence[str] = (),
    ) -> None:
        for key, value in (("train_file", train_file), ("eval_file", eval_file), ("reward", reward)):
            if not isinstance(value, str) or not value:
                what = "'module:function', the outcome function" if key == "reward" else "a task file (.jsonl/.parquet)"
                raise ValueError(f"env.options.{key}: env.name=tasks needs it: {what}")
        if not isinstance(system_prompt, str):
            raise ValueError(f"env.options.system_prompt: a string, got {system_prompt!r}")
        if isinstance(success_threshold, bool) or not isinstance(success_threshold, (int, float)):
            raise ValueError(f"env.options.success_threshold: a number in [0, 1], got {success_threshold!r}")
        if not 0.0 <= float(success_threshold) <= 1.0:
            raise ValueError(f"env.options.success_threshold: a number in [0, 1], got {success_threshold!r}")
        # everything is read and checked here, before rw train writes anything
        self.files = {"train": Path(train_file).resolve(), "eval": Path(eval_file).resolve()}
        rows = {split: read_tasks(path, f"env.options.{split}_file") for split, path in self.files.items()}
        train_ids = {row.task_id for row in rows["train"]}
        shared = [row for row in rows["eval"] if row.task_id in train_ids]
        if shared:
            raise ValueError(
                f"{shared[0].where}:id: task id {shared[0].task_id!r} is also in env.options.train_file; the splits "
                "must be disjoint (rename one, or score the training tasks with rw eval --split train)"
            )
        self._rows = {row.task_id: row for split in rows.values() for row in split}
        self._splits = {
            split: [Task(row.task_id, row.tags, {"split": split, "metadata": row.metadata}) for row in split_rows]
            for split, split_rows in rows.items()
        }
        self.reward = UserFunction(reward, "env.options.reward")
        self.success_threshold = float(success_threshold)
        self.system_prompt = system_prompt
        self._rubrics = None
        if rubrics:
            from rwcore.trainer.envs.tasks.rubrics import TaskRubrics

            self._rubrics = TaskRubrics(rubrics)
        self._extra_words = [str(w) for w in vocabulary]

    # -- the simulator ----------------------------------------------------------------------

    def tasks(self, split: str) -> list[Task]:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        return list(self._splits[split])

    def _row(self, task: Task) -> TaskRow:
        row = self._rows.get(task.task_id)
        if row is None:
            raise ValueError(f"env.name 'tasks': unknown task {task.task_id!r}")
        return row

    def opening(self, task: Task) -> list[tuple[str, str]]:
        """The conversation before the task's last user message, as (role, text) with role "partner" (the
        user) or "assistant": the rollout encodes it ahead of the first observation."""
        return [("partner" if role == "user" else "assistant", text) for role, text in self._row(task).opening[:-1]]

    def reset(self, task: Task, seed: int) -> Episode:
        return Episode(task, self._row(task).opening[-1][1], False, {})

    def step(self, episode: Episode, action: str) -> Episode:
        return Episode(episode.task, "", True, {"completion": str(action)})

    def outcome(self, episode: Episode) -> Outcome:
        arguments, where = self._arguments(episode.task, episode.state.get("completion", ""))
        reward, success = reward_value(self.reward.call(where, arguments), self.reward, where, self.success_threshold)
        return Outcome(reward, success, f"{self.reward.spec} -> {reward:g}")

    def _arguments(self, task: Task, completion: str) -> tuple[dict, str]:
        """(the user functions' arguments for `completion` on `task`, "task ID (FILE:LINE)")."""
        row = self._row(task)
        messages = [{"role": role, "content": text} for role, text in row.opening]
        messages.append({"role": "assistant", "content": completion})
        arguments = {
            "completion": completion,
            "messages": messages,
            "metadata": copy.deepcopy(row.metadata),
            "task_id": row.task_id,
            "tags": list(row.tags),
        }
        return arguments, f"task {row.task_id!r} ({row.where})"

    def _trajectory_arguments(self, trajectory: Trajectory) -> tuple[dict, str]:
        completion = (trajectory.metadata.get("env_state") or {}).get("completion")
        if completion is None:  # a trajectory built elsewhere: its last agent message
            completion = next((t.content for t in reversed(trajectory.turns) if t.role == "assistant"), "")
        return self._arguments(self._row(Task(trajectory.task_id, ())), completion)

    def vocabulary(self) -> list[str]:
        words = set(self.system_prompt.lower().split()) | {w.lower() for w in self._extra_words}
        for row in self._rows.values():
            for _, text in row.opening:
                words |= set(text.lower().split())
        return sorted(w for w in words if w)

    # -- providers: the rubrics file ------------------------------------------------------------

    def rules(self) -> list[Rule] | None:
        return None if self._rubrics is None else self._rubrics.rules(self._trajectory_arguments)

    def reflector(self):
        rules = self.rules()
        if not rules:
            return None
        from rwcore.trainer.envs.rule_providers import RuleReflector

        return RuleReflector(rules, self._rubrics.skills)

    def attributor(self):
        rules = self.rules()
        if not rules:
            return None
        from rwcore.trainer.envs.rule_providers import RuleAttributor

        return RuleAttributor(rules)

    def capability_candidates(self):
        return None if self._rubrics is None else list(self._rubrics.specs)

    # -- provenance -------------------------------------------------------------------------------

    def provenance(self) -> dict[str, str]:
        """sha256 of everything the run's tasks and rewards come from: the reward's module source, the task
        files, and (when given) the rubrics file and its checks' modules."""
        out = {f"reward module {self.reward.module_name}": self.reward.digest()}
        for split, path in self.files.items():
            out[f"{split}_file {path}"] = file_digest(path)
        if self._rubrics is not None:
            out[f"rubrics {self._rubrics.path}"] = self._rubrics.digest()
            for function in self._rubrics.checks.values():
                out[f"check module {function.module_name}"] = function.digest()
        return out
