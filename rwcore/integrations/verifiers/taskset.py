"""`AdaptiveTaskset`: a verifiers `Taskset` whose iteration is the method's task sampling.

    inner = MyTaskset(vf.TasksetConfig())                       # any bounded verifiers taskset
    method = AdaptiveMethod("arise", AdaptiveTaskset.method_tasks(inner), MethodSettings(batch_size=B, group_size=G),
                            Providers(reflector=...))
    rubric = AdaptiveRubric(method, judge)
    taskset = AdaptiveTaskset(inner, rubric)                     # iterate it, or taskset.select(SelectConfig(...))

Iterating yields rounds: each round is `method.sample(k)` (B distinct task ids, drawn when the iteration
reaches the round, at the rubric's current step k, after the evidence of the groups already scored), each
inner task yielded `repeat` times in a row (default G = settings.group_size: a consumer that takes one
rollout per yielded task, such as prime-rl with `rollouts_per_example = 1`, sees G rollouts of each; with a
consumer that repeats each task G times itself, e.g. `rollouts_per_example = G`, pass `repeat=1`). A
synchronous consumer draws round k, rolls it out, scores it, updates the policy, calls `rubric.end_step()`
and draws round k + 1; rounds drawn before `end_step` (a consumer that reads ahead) are drawn at the same
step. The first round runs `rubric.start()` (RewardWeaver's first stage, from `diagnose=`) unless it ran
before. The stream is infinite (`INFINITE`) unless `rounds=` bounds it; verifiers' views bound it too
(`take(n)`, `select(SelectConfig(limit=n))`), and each new iteration continues with the next round.

- Task ids: `rubric.task_id_fn(task.data)` of the inner tasks (`default_task_id`: data.id, else data.name,
  else "idx-<idx>", the position in the inner taskset's `load()` stream); they must be distinct, and the
  method's tasks must all be among them. A yielded task whose TaskData has no id gets its task id as
  `data.id` (a TaskData id is never changed), so the id survives verifiers' renumbering of `idx`
  (`Taskset.__iter__` numbers the adaptive stream) and reaches the rubric through the trace
  (`trace.task.data.id`).
- Tags: `rubric.tags_fn(task.data)` (default: a `tags` field of the TaskData subclass).
- Skills: a yielded task's `system_prompt` is `method.system_prompt(inner system prompt)`: the pool's
  active skills appended (training only; evaluate on the inner taskset, which has none).
- `task_type()`: declare the inner task type where verifiers needs it from the class (an `Env` reads
  `type(taskset).task_type()`): `class MyAdaptive(AdaptiveTaskset[MyTask]): ...`.

The class subclasses `verifiers.v1.Taskset` and is built on first use (importing rwcore never imports verifiers).
`state_dict()` / `load_state_dict()` are the rubric's (the pair's state: method, step, pending groups).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

from .compat import require_verifiers
from .rubric import AdaptiveRubric
from .trajectory import default_tags, default_task_id

__all__ = ["method_tasks", "taskset_class"]


def _index(inner, task_id_fn: Callable, tags_fn: Callable) -> tuple[dict, dict]:
    """{task id: inner task} and {task id: tags} of a bounded taskset, in its order; ValueError on a repeated id."""
    if not getattr(inner, "bounded", True):
        raise ValueError(
            f"{type(inner).__name__} is infinite: bound it first (inner.take(n), or closed include idx ranges)"
        )
    tasks, tags = {}, {}
    for task in inner:
        task_id = str(task_id_fn(task.data))
        if task_id in tasks:
            raise ValueError(
                f"task id {task_id!r} names two tasks of {type(inner).__name__} (idx {tasks[task_id].data.idx} and "
                f"{task.data.idx}): give the tasks distinct TaskData ids, or pass task_id_fn"
            )
        tasks[task_id] = task
        tags[task_id] = tuple(str(tag) for tag in tags_fn(task.data))
    if not tasks:
        raise ValueError(f"{type(inner).__name__} yields no task")
    return tasks, tags


def method_tasks(
    inner, task_id_fn: Callable | None = None, tags_fn: Callable | None = None
) -> dict[str, tuple[str, ...]]:
    """{task id: task-type tags} of a bounded verifiers taskset: the `tasks` argument of `AdaptiveMethod`
    (ids and tags as `AdaptiveTaskset` and `AdaptiveRubric` read them; see the module docstring)."""
    return _index(inner, task_id_fn or default_task_id, tags_fn or default_tags)[1]


@functools.cache
def taskset_class() -> type:
    """`AdaptiveTaskset` (a `verifiers.v1.Taskset` subclass), built once."""
    vf = require_verifiers()
    from verifiers.v1.task import TaskT
    from verifiers.v1.taskset import TasksetConfigT
    from verifiers.v1.utils.generic import concrete_type

    class AdaptiveTaskset(vf.Taskset[TaskT, TasksetConfigT]):
        """The method's task sampling as a verifiers taskset over `inner` (see rwcore.integrations.verifiers.taskset).

        inner: a bounded verifiers `Taskset` (its tasks are read once, here).
        rubric: the `AdaptiveRubric` of the method (its step, sampler and skills).
        repeat: yields of each chosen task per round (default the method's group size G).
        rounds: rounds per iteration (None: infinite).
        config: this taskset's `TasksetConfig` (default: the inner one's without its `system_prompt` file,
            which the inner iteration already applied).
        """

        def __init__(
            self,
            inner,
            rubric: AdaptiveRubric,
            *,
            repeat: int | None = None,
            rounds: int | None = None,
            config=None,
        ) -> None:
            if not isinstance(inner, vf.Taskset):
                raise ValueError(f"inner must be a verifiers.v1.Taskset, got {type(inner).__name__}")
            if not isinstance(rubric, AdaptiveRubric):
                raise ValueError(f"rubric must be a rwcore AdaptiveRubric, got {type(rubric).__name__}")
            g = rubric.method.settings.group_size
            repeat = g if repeat is None else repeat
            for name, value in (("repeat", repeat), ("rounds", rounds)):
                if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                    raise ValueError(f"{name} must be a positive integer, got {value!r}")
            if config is None:
                config = inner.config.model_copy(update={"system_prompt": None})
            super().__init__(config)
            self.inner = inner
            self.rubric = rubric
            self.repeat = repeat
            self.rounds = rounds
            self.INFINITE = rounds is None
            self._tasks, self.tags = _index(inner, rubric.task_id_fn, rubric.tags_fn)
            missing = [t for t in rubric.method.task_ids if t not in self._tasks]
            if missing:
                raise ValueError(
                    f"the method's tasks {missing[:5]} are not tasks of {type(inner).__name__} (its ids: "
                    f"{list(self._tasks)[:5]}...): build the method with AdaptiveTaskset.method_tasks(inner)"
                )

        method_tasks = staticmethod(method_tasks)

        @classmethod
        def task_type(cls):
            return (
                concrete_type(cls, vf.Task, origin=AdaptiveTaskset)
                or concrete_type(cls, vf.Task, origin=vf.Taskset)
                or vf.Task
            )

        @property
        def method(self):
            return self.rubric.method

        def task(self, task_id: str):
            """The inner task of `task_id` as a round yields it: the training prompt; `data.id` = the task id when
            the TaskData had none."""
            task = self._tasks[task_id]
            update = {"system_prompt": self.rubric.system_prompt(task.data.system_prompt) or None}
            if task.data.id is None:
                update["id"] = task_id
            return task.with_data(**update)

        def load(self) -> Iterable:
            done = 0
            while self.rounds is None or done < self.rounds:
                for task_id in self.rubric.plan_round():
                    task = self.task(task_id)
                    for _ in range(self.repeat):
                        yield task
                done += 1

        def state_dict(self) -> dict:
            """The pair's state: `rubric.state_dict()`."""
            return self.rubric.state_dict()

        def load_state_dict(self, state) -> None:
            self.rubric.load_state_dict(state)

    AdaptiveTaskset.__module__ = "rwcore.integrations.verifiers"
    return AdaptiveTaskset
