"""`env.name=tasks`: your own tasks from a file, scored by your own outcome function.

    rw train env.name=tasks env.options.train_file=train.jsonl env.options.eval_file=eval.jsonl \\
        env.options.reward=my_rewards:score model.name=path/to/chat-model

- Task files (`env.options.train_file`, `env.options.eval_file`): JSONL (or parquet, with pyarrow), one task per
  row: `prompt` or a multi-turn opening `messages`, optional `id`, `metadata` (handed to the reward) and `tags`
  (capability tags for Arise's sampler). Every row of both files is checked when the environment is built,
  before `rw train` writes anything; the first bad one is refused as `FILE:LINE:FIELD: ...`
  (rwcore.trainer.envs.tasks.files).
- The outcome function (`env.options.reward=module:function`), imported from an installed package or a module on
  PYTHONPATH, is called with keyword arguments among completion, messages, metadata, task_id and tags, and
  returns a reward in [0, 1] (or a bool, or (reward, success)); raising or returning anything else stops the run
  naming the function and the task (rwcore.trainer.envs.tasks.functions).
- Rubrics for RewardWeaver and Arise (`env.options.rubrics`, optional): a YAML file of rubric definitions, with
  `module:function` checks for judge.kind=rule or without for an LLM judge (rwcore.trainer.envs.tasks.rubrics).

An episode is one agent reply: the opening (a prompt, or the conversation so far ending with a user message) is
the agent's context, its reply ends the episode (max_turns = 1), and the outcome function scores it. The
environment has no guidance language, so the built-in model starts from random weights (model.init=auto); with
`model.name` a chat model's own tokenizer and template are used. Reference: docs/environments.md (section tasks).
"""

from rwcore.trainer.envs.base import register
from rwcore.trainer.envs.tasks.environment import TaskFileEnv
from rwcore.trainer.envs.tasks.functions import UserFunctionError

register("tasks", TaskFileEnv)

__all__ = ["TaskFileEnv", "UserFunctionError"]
