"""rwcore inside a verifiers environment (and so prime-rl): the adaptive method's task sampling, skills,
process reward and evidence, through verifiers' own extension points (its v1 API, `verifiers.v1`).

    import verifiers.v1 as vf
    from rwcore import AdaptiveMethod, MethodSettings
    from rwcore.integrations.verifiers import AdaptiveRubric, AdaptiveTaskset

    class MyTasks(AdaptiveTaskset[MyTask]):                     # the taskset package prime-rl loads by id
        def __init__(self, config: vf.TasksetConfig):
            inner = MyTaskset(config)                           # your verifiers taskset (bounded)
            method = AdaptiveMethod("arise", AdaptiveTaskset.method_tasks(inner),
                                    MethodSettings(batch_size=B, group_size=G), Providers(reflector=...))
            rubric = AdaptiveRubric(method, judge)              # registered as "default" in this process
            super().__init__(inner, rubric)                     # rounds of method.sample(step), G copies each

    # the rubric's reward and metric in the tasks' config (verifiers loads them by import path):
    #   [env.taskset.task.rewards.rwcore_process] fn = "rwcore.integrations.verifiers.rubric:process_reward"
    #   [env.taskset.task.metrics.rwcore_verdicts] fn = "rwcore.integrations.verifiers.rubric:rubric_verdicts"
    # or in Python: task_config = rubric.plug(vf.TaskConfig())
    # after each policy update:  rubric.end_step()              # evidence in, pool / stage update when due

One module per job (checked against verifiers 0.4.0, `VERIFIERS_RANGE`; outside it the first use warns once):

- `trajectory`: `trajectory_from_trace(trace, task_id=...)`, a verifiers `Trace` (its last branch; sampled
  assistant messages generated) as a `rwcore.Trajectory` whose outcome is the trace's weighted reward over
  the environment's own rewards (`env_outcome`); `default_task_id`, `default_tags`.
- `rubric`: `AdaptiveRubric(method, judge)`: per trace the method's process term (RewardWeaver's 1/|A| sum
  of the active set's judge scores) as the reward `rwcore_process` and each judged rubric's verdict as a
  metric `rw/rubric/<id>` (1 PASS, 0 FAIL or INVALID), so `trace.reward` = outcome + process term;
  complete groups of G traces go to `method.observe`; `end_step()` / `advance(step)` adapt on schedule
  (`rwcore.method.MethodLoop`); `state_dict()`. The module-level async functions `process_reward` /
  `rubric_verdicts` are what `TaskConfig.rewards` / `.metrics` plug; `AdaptiveRubricMixin` gives a `Task`
  the same as `@vf.reward` / `@vf.metric` methods.
- `taskset`: `AdaptiveTaskset(inner, rubric)`, a `verifiers.v1.Taskset` whose iteration yields the inner
  tasks `method.sample(step)` picks, G times each, with the skills in their system prompt;
  `method_tasks(inner)` -> {task id: tags} for `AdaptiveMethod`.
- `compat`: the verifiers import and its version check.

verifiers is imported on first use of `AdaptiveTaskset`, `AdaptiveRubricMixin` or `AdaptiveRubric.plug`
(module attribute access); the other pieces need none of it. Without verifiers those raise ImportError
saying `pip install 'verifiers==0.4.0' (or RWCORE_EXTRAS=...,verifiers bash scripts/setup.sh)`.

The rubric and the taskset live in one process: the one that iterates the taskset and scores the traces
(verifiers' env server, or your own loop); an environment served by several worker processes would hold
one method per process.
"""

from __future__ import annotations

from .compat import INSTALL_HINT, VERIFIERS_RANGE
from .compat import require_verifiers as _require_verifiers  # noqa: F401
from .rubric import (
    METRIC_NAME,
    METRIC_PREFIX,
    REWARD_NAME,
    AdaptiveRubric,
    TraceScore,
    get_rubric,
    process_reward,
    rubric_verdicts,
)
from .taskset import method_tasks
from .trajectory import default_tags, default_task_id, env_outcome, trajectory_from_trace

__all__ = [
    "INSTALL_HINT",
    "METRIC_NAME",
    "METRIC_PREFIX",
    "REWARD_NAME",
    "VERIFIERS_RANGE",
    "AdaptiveRubric",
    "AdaptiveRubricMixin",
    "AdaptiveTaskset",
    "TraceScore",
    "default_tags",
    "default_task_id",
    "env_outcome",
    "get_rubric",
    "method_tasks",
    "process_reward",
    "rubric_verdicts",
    "trajectory_from_trace",
]


def __getattr__(name: str):
    if name == "AdaptiveTaskset":
        from .taskset import taskset_class

        cls = taskset_class()
    elif name == "AdaptiveRubricMixin":
        from .rubric import mixin_class

        cls = mixin_class()
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = cls
    return cls
