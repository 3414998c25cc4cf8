"""`AdaptiveRubric`: an `AdaptiveMethod`'s process reward and rubric verdicts as verifiers reward functions.

    rubric = AdaptiveRubric(method, judge)                       # registered under its name ("default")
    config = rubric.plug(vf.TaskConfig())                        # TaskConfig.rewards / .metrics entries
    # or, in a TOML / CLI config:  rubric.reward_functions()
    #   {"rewards": {"rwcore_process": {"fn": "rwcore.integrations.verifiers.rubric:process_reward", "weight": 1.0}},
    #    "metrics": {"rwcore_verdicts": {"fn": "rwcore.integrations.verifiers.rubric:rubric_verdicts"}}}

verifiers loads a plugged function by its import path (`utils/loaders.py: load_plugged_fn`) and calls it with
the task's `TaskData` and the `Trace`. The module-level async functions `process_reward` and
`rubric_verdicts` serve the rubric registered as "default"; `process_reward__<name>` and
`rubric_verdicts__<name>` (module attributes made on demand) serve the rubric registered as `<name>`. A
`Task` subclass can take both as methods instead: `AdaptiveRubricMixin` (`@vf.reward rwcore_process`,
`@vf.metric rwcore_verdicts`, rubric named by the class attribute `rwcore_rubric`).

Per trace, at the rubric's current step k:

- the task id is `task_id_fn(data)` (default `default_task_id`: data.id, else data.name, else idx-<idx>) and
  its tags `tags_fn(data)` (default: a `tags` field of the TaskData);
- the trace becomes a `Trajectory` (`trajectory_from_trace`) and is judged on `method.rubrics_to_judge(k,
  [task_id])` by the rwcore judge (`safe_evaluate`: a judge that raises gives INVALID judgments; the judge
  runs in a worker thread, off verifiers' event loop);
- the reward `rwcore_process` is `method.score([trajectory], [report]).process_terms[0]`: RewardWeaver's
  1/|A| sum of the active set's judge scores (0 for variants without a process reward), so with weight 1
  `trace.reward` = the environment's outcome + the process term = RewardWeaver's R(tau);
- the metric `rwcore_verdicts` records `rw/rubric/<id>` per judged rubric: 1 for PASS, 0 for FAIL and for
  INVALID (INVALID scores as a FAIL, as everywhere in rwcore); NA records nothing;
- a trace that cannot be read (a malformed graph, a TaskData without an id) gets INVALID judgments: reward
  0, metrics 0. Nothing the policy writes raises out of the reward function.

The judgment is made once per trace (cached by `trace.id`): the metric runs first (verifiers scores metrics
before rewards), the reward reads the same judgment. Each judged trace of a training task joins its task's
group; once G (`settings.group_size`) traces of a task are judged and their scoring is over (the
environment's own rewards, which verifiers computes concurrently with ours, are recorded), the group goes to
`method.score` + `method.observe` (the sampler's and the pool's evidence) with outcome R_o =
`outcome_fn(trace)` when given (called when the trace is judged, so the judge sees it too), else the trace's
weighted reward over the environment's own rewards (`env_outcome`; the judge then sees outcome 0).

The trainer ends each step after its policy update: `end_step()` observes the complete groups, runs
`MethodLoop.end_step(k)` (the pool update every delta_pool steps, RewardWeaver's stage every
adaptation_interval steps with `diagnose=`, a fresh batch of the updated policy) and moves to step k + 1
(`advance(step)` ends steps up to `step`). A partial group whose rubrics the adaptation changed is dropped
(its judgments do not cover the new rubric set); one whose rubrics are unchanged waits for its other
traces and enters the evidence at the step it completes, at the policy version of its first trace.

The rubric lives in the process that scores the traces (verifiers' env server: build it where the
taskset is built); one rubric per method. `state_dict()` holds the method, the step and the pending groups.
"""

from __future__ import annotations

import asyncio
import functools
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping

from rwcore.method.loop import MethodLoop
from rwcore.method.method import AdaptiveMethod
from rwcore.method.records import AdaptReport
from rwcore.validation import check_int

from .compat import require_verifiers
from .groups import GroupEvidence, _Entry
from .scoring import METRIC_PREFIX, TraceScore, TraceScoring
from .trajectory import REWARD_NAME, default_tags, default_task_id

__all__ = [
    "METRIC_NAME",
    "METRIC_PREFIX",
    "REWARD_NAME",
    "AdaptiveRubric",
    "TraceScore",
    "get_rubric",
    "mixin_class",
    "process_reward",
    "rubric_verdicts",
]

METRIC_NAME = "rwcore_verdicts"
MODULE = __name__
_FORMAT = "rwcore.verifiers_rubric"
_VERSION = 1
_NAME = re.compile(r"^[A-Za-z0-9_]+$")
_RUBRICS: dict[str, AdaptiveRubric] = {}


def get_rubric(name: str = "default") -> AdaptiveRubric:
    """The `AdaptiveRubric` registered as `name`; LookupError naming the registered ones."""
    rubric = _RUBRICS.get(name)
    if rubric is None:
        raise LookupError(
            f"no rwcore AdaptiveRubric is registered as {name!r} in this process (registered: {sorted(_RUBRICS)}); "
            "build AdaptiveRubric(method, judge, name=...) where the taskset is built"
        )
    return rubric


class AdaptiveRubric(TraceScoring, GroupEvidence):
    """An `AdaptiveMethod`'s process reward and verdicts for verifiers tasks (see the module docstring).

    method: the `rwcore.AdaptiveMethod` (its tasks: `AdaptiveTaskset.method_tasks(inner)`).
    judge: a `rwcore.types.Judge` (`evaluate(trajectories, rubrics) -> list[JudgeReport]`).
    outcome_fn: `trace -> float`, R_o of a trace (default: its weighted reward over the env's own rewards).
    task_id_fn / tags_fn: `TaskData -> str` / `TaskData -> tags` (defaults `default_task_id`, `default_tags`);
        they must not read `idx` or `system_prompt` (the adaptive stream renumbers the one and puts the
        skills in the other).
    reward_name / metric_name: the names the plugged functions get (`reward_functions`, `plug`).
    metric_prefix: prefix of the per-rubric verdict metrics.
    name: the registry name the module-level plugged functions find the rubric by (a later rubric of the
        same name replaces it in the registry).
    diagnose / diagnostic: as `MethodLoop`'s (required / optional for variants with RewardWeaver stages).
    exclude_rewards: more reward names that are not the environment's outcome.
    judge_in_thread: run the judge in a worker thread (`asyncio.to_thread`), off verifiers' event loop.
    cache_size: judged traces remembered (by trace id) so that the metric and the reward share one judgment.
    """

    def __init__(
        self,
        method: AdaptiveMethod,
        judge,
        *,
        outcome_fn: Callable[[object], float] | None = None,
        task_id_fn: Callable[[object], str] | None = None,
        tags_fn: Callable[[object], Iterable[str]] | None = None,
        reward_name: str = REWARD_NAME,
        metric_name: str = METRIC_NAME,
        metric_prefix: str = METRIC_PREFIX,
        name: str = "default",
        diagnose: Callable | None = None,
        diagnostic: Callable | None = None,
        exclude_rewards: Iterable[str] = (),
        judge_in_thread: bool = True,
        cache_size: int = 4096,
    ) -> None:
        if judge is None or not callable(getattr(judge, "evaluate", None)):
            raise ValueError(f"judge must have an evaluate(trajectories, rubrics) method, got {type(judge).__name__}")
        # the method's one loop (rwcore.method.loop), shared with rw train, TRL and verl; checks method / diagnose
        self.loop = MethodLoop(method, judge=judge, diagnose=diagnose, diagnostic=diagnostic)
        for argument, value in (("reward_name", reward_name), ("metric_name", metric_name)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{argument} must be a non-empty string, got {value!r}")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"name must be letters, digits and underscores, got {name!r}")
        for argument, fn in (("outcome_fn", outcome_fn), ("task_id_fn", task_id_fn), ("tags_fn", tags_fn)):
            if fn is not None and not callable(fn):
                raise ValueError(f"{argument} must be callable, got {type(fn).__name__}")
        self.method = method
        self.judge = judge
        self.outcome_fn = outcome_fn
        self.task_id_fn = task_id_fn or default_task_id
        self.tags_fn = tags_fn or default_tags
        self.reward_name, self.metric_name, self.metric_prefix = reward_name, metric_name, str(metric_prefix)
        self.name = name
        self.exclude_rewards = frozenset({reward_name, *exclude_rewards})
        self.judge_in_thread = bool(judge_in_thread)
        self._cache_size = check_int(cache_size, "cache_size", low=1)
        self._known = set(method.task_ids)
        self._lock = threading.RLock()
        self._cache: OrderedDict[str, TraceScore | asyncio.Future] = OrderedDict()
        self.step = 0
        self.rounds = 0
        self._pending: dict[str, list[_Entry]] = {}
        self._complete: list[list[_Entry]] = []
        self.counters = {
            "traces": 0,
            "unreadable_traces": 0,
            "judge_failures": 0,
            "unknown_tasks": 0,
            "groups_observed": 0,
            "traces_dropped": 0,
        }
        self._warned: set[str] = set()
        _RUBRICS[name] = self

    # ------------------------------------------------------------------ wiring into verifiers

    @property
    def settings(self):
        return self.method.settings

    def reward_functions(self, weight: float = 1.0) -> dict:
        """The `TaskConfig` entries (plain dicts, as a TOML config holds them): {"rewards": {reward_name: {fn,
        weight}}, "metrics": {metric_name: {fn}}}, pointing at this rubric's module-level functions."""
        weight = float(weight)
        if not math.isfinite(weight):
            raise ValueError(f"weight must be finite, got {weight!r}")
        suffix = "" if self.name == "default" else f"__{self.name}"
        return {
            "rewards": {self.reward_name: {"fn": f"{MODULE}:process_reward{suffix}", "weight": weight}},
            "metrics": {self.metric_name: {"fn": f"{MODULE}:rubric_verdicts{suffix}"}},
        }

    def plug(self, task_config=None, weight: float = 1.0):
        """A copy of `task_config` (a `verifiers.v1.TaskConfig`; default a fresh one) with the rubric's reward and
        metric plugged in; ValueError when it already has entries of those names."""
        vf = require_verifiers()
        config = task_config if task_config is not None else vf.TaskConfig()
        entries = self.reward_functions(weight)
        clash = sorted(set(entries["rewards"]) & set(config.rewards)) + sorted(
            set(entries["metrics"]) & set(config.metrics)
        )
        if clash:
            raise ValueError(f"task_config already plugs {clash}: pass reward_name= / metric_name= to AdaptiveRubric")
        rewards = {**config.rewards, **{k: vf.RewardFunctionConfig(**v) for k, v in entries["rewards"].items()}}
        metrics = {**config.metrics, **{k: vf.DecoratedFunctionConfig(**v) for k, v in entries["metrics"].items()}}
        return config.model_copy(update={"rewards": rewards, "metrics": metrics})

    def system_prompt(self, base: str | None, evaluation: bool = False) -> str:
        """`method.system_prompt(base)`: the pool's active skills appended during training."""
        return self.method.system_prompt(base or "", evaluation=evaluation)

    # ------------------------------------------------------------------ the step

    def start(self) -> AdaptReport | None:
        """Before step 0 (once; a resumed rubric does nothing): RewardWeaver's first stage (`MethodLoop.start`)."""
        with self._lock:
            return self.loop.start()

    def plan_round(self) -> list:
        """The next round's task ids: `method.sample(step)` (B ids) after the evidence of finished groups
        (`AdaptiveTaskset` draws its rounds here)."""
        with self._lock:
            self.loop.start()
            self.flush()
            task_ids = self.loop.plan(self.step).task_ids
            self.rounds += 1
            return task_ids

    def end_step(self) -> AdaptReport | None:
        """After the policy update of the current step k: the complete groups' evidence, then
        `MethodLoop.end_step(k)` (pool update, RewardWeaver's stage, when due); the rubric moves to k + 1."""
        with self._lock:
            self.loop.start()  # no-op once started (the first round starts it)
            step = self.step
            self.flush(force=True)
            report = self.loop.end_step(step)
            self.step = step + 1
            self._prune_pending()
            return report

    def advance(self, step: int) -> list[AdaptReport | None]:
        """Ends every step before `step` (`end_step` each), so that the current step is `step`."""
        step = check_int(step, "step", low=0)
        with self._lock:
            if step < self.step:
                raise ValueError(f"advance({step}): the rubric is already at step {self.step}")
            return [self.end_step() for _ in range(step - self.step)]

    # scoring one trace: TraceScoring (rwcore.integrations.verifiers.scoring); groups of judged traces and the
    # evidence they give: GroupEvidence (rwcore.integrations.verifiers.groups)

    def metrics(self) -> dict:
        """The method's metrics plus the rubric's step and counters (`verifiers/*`)."""
        row = dict(self.method.metrics())
        row["verifiers/step"] = self.step
        row["verifiers/pending_traces"] = self.pending_traces()
        row.update({f"verifiers/{k}": v for k, v in self.counters.items()})
        return row

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """The method's state, the loop's, the step, the rounds drawn, the pending groups (outcomes read now)
        and the counters: what an exact resume needs (take it between steps, after the traces are scored)."""
        with self._lock:
            return {
                "format": _FORMAT,
                "version": _VERSION,
                "method": self.method.state_dict(),
                "loop": self.loop.state_dict(),
                "step": self.step,
                "rounds": self.rounds,
                "pending": [self._entry_state(e) for entries in self._pending.values() for e in entries],
                "complete": [[self._entry_state(e) for e in group] for group in self._complete],
                "counters": dict(self.counters),
            }

    def load_state_dict(self, state: Mapping) -> None:
        """Restores `state_dict()` (the method's settings and variant must match); nothing is applied when the
        state is refused."""
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT or state.get("version") != _VERSION:
            raise ValueError(f"state must be a {_FORMAT!r} version {_VERSION} mapping")
        step = check_int(state.get("step"), "state['step']", low=0)
        rounds = check_int(state.get("rounds"), "state['rounds']", low=0)
        try:
            pending = [self._entry_from_state(s) for s in state["pending"]]
            complete = [[self._entry_from_state(s) for s in group] for group in state["complete"]]
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"state['pending'] / state['complete']: not this rubric's groups ({error})") from error
        unknown = sorted({e.task_id for e in pending + [e for g in complete for e in g]} - self._known)
        if unknown:
            raise ValueError(f"state holds groups of tasks the method does not have: {unknown[:5]}")
        counters = {k: int(v) for k, v in dict(state.get("counters", {})).items() if k in self.counters}
        with self._lock:
            self.method.load_state_dict(state["method"])
            self.loop.load_state_dict(state["loop"])
            self.step, self.rounds = step, rounds
            self._pending = {}
            for entry in pending:
                self._pending.setdefault(entry.task_id, []).append(entry)
            self._complete = complete
            self.counters.update(counters)
            self._cache.clear()


# ---------------------------------------------------------------------- what verifiers' config plugs in


async def process_reward(task, trace) -> float:
    """Plugged reward (`rwcore.integrations.verifiers.rubric:process_reward`) of the rubric registered as "default"."""
    return await get_rubric("default").process_reward(task, trace)


async def rubric_verdicts(task, trace) -> dict[str, float]:
    """Plugged metric (`rwcore.integrations.verifiers.rubric:rubric_verdicts`) of the rubric registered as "default"."""
    return await get_rubric("default").verdict_metrics(task, trace)


def _plugged(attribute: str, rubric_name: str, kind: str):
    async def reward(task, trace) -> float:
        return await get_rubric(rubric_name).process_reward(task, trace)

    async def metric(task, trace) -> dict[str, float]:
        return await get_rubric(rubric_name).verdict_metrics(task, trace)

    fn = reward if kind == "reward" else metric
    fn.__name__ = fn.__qualname__ = attribute
    fn.__module__ = MODULE
    return fn


def __getattr__(name: str):
    """`process_reward__<rubric name>` / `rubric_verdicts__<rubric name>`: the plugged functions of a named rubric."""
    for prefix, kind in (("process_reward__", "reward"), ("rubric_verdicts__", "metric")):
        if name.startswith(prefix) and _NAME.match(name[len(prefix) :]):
            return _plugged(name, name[len(prefix) :], kind)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def mixin_class() -> type:
    """`AdaptiveRubricMixin` (needs verifiers): a `Task` mixin whose `@vf.metric rwcore_verdicts` and `@vf.reward
    rwcore_process` methods serve the rubric named by the class attribute `rwcore_rubric` (a registry name, or
    the `AdaptiveRubric` itself; default "default"). Its rubric keeps the default reward name."""
    vf = require_verifiers()

    def _rubric(task) -> AdaptiveRubric:
        named = getattr(task, "rwcore_rubric", "default")
        rubric = named if isinstance(named, AdaptiveRubric) else get_rubric(str(named))
        if rubric.reward_name != REWARD_NAME:
            raise ValueError(
                f"AdaptiveRubricMixin records the reward as {REWARD_NAME!r}; rubric {rubric.name!r} names it "
                f"{rubric.reward_name!r}: plug it through TaskConfig instead (AdaptiveRubric.plug)"
            )
        return rubric

    class AdaptiveRubricMixin:
        """Mix into a verifiers `Task` subclass: rwcore's process reward and verdict metrics as its methods."""

        rwcore_rubric: str | AdaptiveRubric = "default"

        @vf.metric
        async def rwcore_verdicts(self, trace) -> dict[str, float]:
            rubric = _rubric(self)
            return await rubric.verdict_metrics(self.data, trace)

        @vf.reward
        async def rwcore_process(self, trace) -> float:
            return await _rubric(self).process_reward(self.data, trace)

    AdaptiveRubricMixin.__module__ = "rwcore.integrations.verifiers"
    return AdaptiveRubricMixin
