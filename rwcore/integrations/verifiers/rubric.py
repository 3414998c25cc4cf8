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
import logging
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from rwcore.judges.client import MissingAPIKeyError
from rwcore.method.loop import MethodLoop
from rwcore.method.method import AdaptiveMethod, AdaptReport, safe_evaluate
from rwcore.types import JudgeReport, RubricJudgment, RubricSpec, Trajectory
from rwcore.validation import check_int
from rwcore.verdict import Verdict

from .compat import require_verifiers
from .trajectory import REWARD_NAME, default_tags, default_task_id, env_outcome, trajectory_from_trace

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

logger = logging.getLogger(__name__)

METRIC_NAME = "rwcore_verdicts"
METRIC_PREFIX = "rw/rubric/"
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


@dataclass(frozen=True)
class TraceScore:
    """What the rubric made of one trace: its task, the step, the process term, the verdicts of the rubrics
    judged (`plan`, in order) and the report; `error` says why the trace could not be read ("" normally)."""

    task_id: str | None
    step: int
    process: float
    plan: tuple[str, ...]
    verdicts: Mapping[str, Verdict]
    report: JudgeReport
    error: str = ""

    def metrics(self, prefix: str = METRIC_PREFIX) -> dict[str, float]:
        """`prefix + rubric id` -> 1.0 for PASS, 0.0 for FAIL or INVALID; NA left out."""
        return {
            f"{prefix}{rid}": (1.0 if verdict == Verdict.PASS else 0.0)
            for rid, verdict in self.verdicts.items()
            if verdict != Verdict.NA
        }


@dataclass
class _Entry:
    """One judged trace waiting for the rest of its group. `trace` is held (not saved) until its outcome is read."""

    task_id: str
    trajectory: Trajectory
    report: JudgeReport
    plan: tuple[str, ...]
    step: int
    trace: object | None = field(default=None, repr=False)

    def ready(self) -> bool:
        """Whether the trace's scoring is over (no reward still unscored), so its outcome can be read."""
        if self.trace is None:
            return True
        rewards = getattr(self.trace, "rewards", None) or {}
        return all(value is not None for value in rewards.values())


def _judgment_state(judgment: RubricJudgment) -> dict:
    return {
        "verdict": int(judgment.verdict),
        "score": judgment.score,
        "confidence": judgment.confidence,
        "evidence": judgment.evidence,
        "error": judgment.error,
    }


def _report_state(report: JudgeReport) -> dict:
    return {
        "trajectory_id": report.trajectory_id,
        "judgments": {rid: _judgment_state(j) for rid, j in report.judgments.items()},
        "uncovered": list(report.uncovered),
    }


def _report_from_state(state: Mapping) -> JudgeReport:
    judgments = {
        rid: RubricJudgment(
            rid,
            Verdict(int(j["verdict"])),
            j.get("score"),
            j.get("confidence"),
            j.get("evidence", ""),
            j.get("error", ""),
        )
        for rid, j in dict(state["judgments"]).items()
    }
    return JudgeReport(str(state["trajectory_id"]), judgments, tuple(state.get("uncovered", ())))


def _sound(judgment, rubric_id: str) -> RubricJudgment:
    """The judge's judgment when it keeps the contract (a Verdict; a score in [0, 1] or none), else INVALID."""
    if not isinstance(judgment, RubricJudgment):
        return RubricJudgment(rubric_id, Verdict.INVALID, error="the judge returned no judgment")
    if not isinstance(judgment.verdict, Verdict):
        return RubricJudgment(rubric_id, Verdict.INVALID, error=f"the judge returned verdict {judgment.verdict!r}")
    score = judgment.score
    if score is not None and (
        isinstance(score, bool) or not isinstance(score, (int, float)) or not (math.isfinite(score) and 0 <= score <= 1)
    ):
        return RubricJudgment(rubric_id, Verdict.INVALID, error=f"the judge returned score {score!r}")
    if judgment.rubric_id != rubric_id:
        return RubricJudgment(
            rubric_id, judgment.verdict, score, judgment.confidence, judgment.evidence, judgment.error
        )
    return judgment


class AdaptiveRubric:
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

    def flush(self, force: bool = False) -> int:
        """Observes the complete groups, in the order they completed, whose traces' scoring is over (all of
        them with `force`); returns how many groups entered the evidence."""
        done = 0
        with self._lock:
            while self._complete and (force or all(entry.ready() for entry in self._complete[0])):
                group = self._complete.pop(0)
                try:
                    done += self._observe(group)
                except Exception as error:  # noqa: BLE001 - evidence is best effort: scoring never stops here
                    self.counters["traces_dropped"] += len(group)
                    self._warn("observe", f"a group of {group[0].task_id!r} left out of the evidence ({error})")
        return done

    # ------------------------------------------------------------------ scoring one trace

    async def process_reward(self, task, trace) -> float:
        """The trace's process term (what the plugged reward returns)."""
        return (await self.score_trace(task, trace)).process

    async def verdict_metrics(self, task, trace) -> dict[str, float]:
        """The trace's verdict metrics (what the plugged metric returns)."""
        return (await self.score_trace(task, trace)).metrics(self.metric_prefix)

    async def score_trace(self, task, trace) -> TraceScore:
        """Judges `trace` of `task` (its TaskData; None reads trace.task.data) once, and records it in its group."""
        key = getattr(trace, "id", None)
        key = key if isinstance(key, str) and key else None
        loop = asyncio.get_running_loop()
        if key is not None:
            cached = self._cache.get(key)
            if isinstance(cached, TraceScore):
                self._cache.move_to_end(key)
                return cached
            if isinstance(cached, asyncio.Future) and not cached.done() and cached.get_loop() is loop:
                return await asyncio.shield(cached)
        future = loop.create_future()
        if key is not None:
            self._cache[key] = future
        try:
            result = await self._score(task, trace, key)
        except BaseException as error:
            if key is not None and self._cache.get(key) is future:
                del self._cache[key]
            if isinstance(error, Exception):
                future.set_exception(error)
                future.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            else:
                future.cancel()
            raise
        future.set_result(result)
        if key is not None:
            self._cache[key] = result
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return result

    async def _score(self, task, trace, key: str | None) -> TraceScore:
        self.flush()
        step = self.step
        data = task if task is not None else getattr(getattr(trace, "task", None), "data", None)
        problems: list[str] = []
        task_id, tags = None, ()
        try:
            task_id = str(self.task_id_fn(data))
            tags = tuple(str(tag) for tag in self.tags_fn(data))
        except Exception as error:  # noqa: BLE001 - a task without a usable id is INVALID, never a crash
            problems.append(f"no task id ({type(error).__name__}: {error})")
        plan: list[RubricSpec] = []
        if task_id is not None:
            try:
                plan = list(self.method.rubrics_to_judge(step, [task_id])[0])
            except Exception as error:  # noqa: BLE001 - e.g. an instance-rubric task the method does not know
                problems.append(f"no rubrics for task {task_id!r} ({type(error).__name__}: {error})")
        trajectory_id = key or f"trace-{id(trace)}"
        outcome = 0.0
        if self.outcome_fn is not None:
            try:
                outcome = float(self.outcome_fn(trace))
                if not math.isfinite(outcome):
                    raise ValueError(f"outcome_fn returned {outcome!r}")
            except Exception as error:  # noqa: BLE001 - the outcome function reads the policy's text too
                problems.append(f"outcome_fn failed ({type(error).__name__}: {error})")
                outcome = 0.0
        trajectory = None
        if task_id is not None:
            try:
                trajectory = trajectory_from_trace(
                    trace,
                    task_id=task_id,
                    tags=tags,
                    outcome=outcome,
                    group_id=f"{task_id}@{step}",
                    trajectory_id=trajectory_id,
                    policy_version=step,
                    exclude_rewards=self.exclude_rewards,
                )
            except Exception as error:  # noqa: BLE001 - an unreadable trace is INVALID, never a crash
                problems.append(f"the trace could not be read ({type(error).__name__}: {error})")
        error_text = "; ".join(problems)[:500]
        if trajectory is None:
            self.counters["unreadable_traces"] += 1
            self._warn("unreadable", f"rwcore AdaptiveRubric: a trace is INVALID: {error_text}")
            trajectory = Trajectory(task_id or "", [], outcome, tags, trajectory_id=trajectory_id)
            report = JudgeReport(trajectory_id, {})
        elif plan:
            report = await self._judge(trajectory, plan)
        else:
            report = JudgeReport(trajectory_id, {})
        message = error_text or "the judge returned no judgment"
        judgments = {}
        for spec in plan:
            given = report.judgments.get(spec.rubric_id) if isinstance(report.judgments, Mapping) else None
            judgments[spec.rubric_id] = (
                _sound(given, spec.rubric_id)
                if given is not None
                else RubricJudgment(spec.rubric_id, Verdict.INVALID, error=message)
            )
        uncovered = tuple(t for t in getattr(report, "uncovered", ()) if isinstance(t, str))
        report = JudgeReport(trajectory_id, judgments, uncovered)
        process = self._process_term(trajectory, report)
        plan_ids = tuple(spec.rubric_id for spec in plan)
        result = TraceScore(
            task_id,
            step,
            process,
            plan_ids,
            {rid: judgments[rid].verdict for rid in plan_ids},
            report,
            error_text,
        )
        self.counters["traces"] += 1
        if key is not None and task_id is not None:
            self._record(task_id, trajectory, report, plan_ids, step, trace)
        return result

    async def _judge(self, trajectory: Trajectory, plan: list[RubricSpec]) -> JudgeReport:
        failures: list[str] = []
        try:
            if self.judge_in_thread:
                reports = await asyncio.to_thread(safe_evaluate, self.judge, [trajectory], plan, failures)
            else:
                reports = safe_evaluate(self.judge, [trajectory], plan, failures)
            report = reports[0]
            if not isinstance(report, JudgeReport):
                raise ValueError(f"the judge returned {type(report).__name__}, not a JudgeReport")
        except MissingAPIKeyError:
            raise  # configuration, not the policy: no judgment can cure it
        except Exception as error:  # noqa: BLE001 - a judge that breaks its contract: INVALID, never a crash
            failures.append(f"{type(error).__name__}: {error}"[:500])
            report = JudgeReport(trajectory.trajectory_id, {})
        if failures:
            self.counters["judge_failures"] += 1
            self._warn(
                f"judge@{self.step}",
                f"judge {type(self.judge).__name__} failed; the trace's judgments are INVALID ({failures[0]})",
            )
            report = JudgeReport(
                trajectory.trajectory_id,
                {
                    spec.rubric_id: RubricJudgment(
                        spec.rubric_id, Verdict.INVALID, error=f"the judge failed: {failures[0]}"
                    )
                    for spec in plan
                },
            )
        return report

    def _process_term(self, trajectory: Trajectory, report: JudgeReport) -> float:
        try:
            scored = self.method.score([trajectory], [report], group_ids=np.zeros(1, dtype=np.int64))
            value = float(scored.process_terms[0])
        except Exception as error:  # noqa: BLE001 - e.g. an instance-rubric task without rubrics: no process term
            self._warn("process", f"rwcore AdaptiveRubric: no process term ({type(error).__name__}: {error})")
            return 0.0
        return value if math.isfinite(value) else 0.0

    def _warn(self, key: str, message: str) -> None:
        if key in self._warned:
            logger.debug(message)
            return
        self._warned.add(key)
        logger.warning(message)

    # ------------------------------------------------------------------ groups and evidence

    def _record(self, task_id: str, trajectory, report, plan: tuple[str, ...], step: int, trace) -> None:
        if task_id not in self._known:
            self.counters["unknown_tasks"] += 1
            self._warn(
                f"unknown:{task_id}",
                f"rwcore AdaptiveRubric: task {task_id!r} is not one of the method's tasks; its traces are scored "
                "but give no evidence",
            )
            return
        entry = _Entry(task_id, trajectory, report, plan, step, trace if self.outcome_fn is None else None)
        g = self.method.settings.group_size
        with self._lock:
            entries = self._pending.setdefault(task_id, [])
            entries.append(entry)
            if len(entries) >= g:
                self._complete.append(entries[:g])
                del entries[:g]

    def _outcome(self, entry: _Entry) -> float:
        """R_o of the entry: read from its trace while it holds one (the env's own rewards), else kept."""
        if entry.trace is None:
            return entry.trajectory.outcome
        try:
            outcome = env_outcome(entry.trace, self.exclude_rewards)
        except Exception:  # noqa: BLE001 - rewards that cannot be read: no outcome
            return 0.0
        return outcome if math.isfinite(outcome) else 0.0

    def _resolved(self, entry: _Entry) -> Trajectory:
        """The entry's trajectory with its outcome read from the (now scored) trace, which is then let go."""
        entry.trajectory.outcome = self._outcome(entry)
        entry.trace = None
        return entry.trajectory

    def _current_plan(self, task_id: str) -> set[str]:
        return {spec.rubric_id for spec in self.method.rubrics_to_judge(self.step, [task_id])[0]}

    def _observe(self, group: list[_Entry]) -> int:
        task_id = group[0].task_id
        needed = self._current_plan(task_id)
        if any(not needed <= set(entry.plan) for entry in group):
            self.counters["traces_dropped"] += len(group)
            logger.info("a group of %r judged before the method's rubrics changed is left out of the evidence", task_id)
            return 0
        trajectories = [self._resolved(entry) for entry in group]
        reports = [entry.report for entry in group]
        scored = self.method.score(trajectories, reports)
        self.method.observe(
            self.step, [task_id], trajectories, scored.judged, policy_versions=[min(e.step for e in group)]
        )
        self.counters["groups_observed"] += 1
        return 1

    def _prune_pending(self) -> None:
        """Partial groups judged on rubrics the method no longer reads cannot complete: dropped."""
        for task_id, entries in self._pending.items():
            if not entries:
                continue
            needed = self._current_plan(task_id)
            kept = [entry for entry in entries if needed <= set(entry.plan)]
            self.counters["traces_dropped"] += len(entries) - len(kept)
            entries[:] = kept

    def pending_traces(self) -> int:
        """Judged traces not yet in the evidence (partial groups and complete ones awaiting their outcome)."""
        with self._lock:
            return sum(len(e) for e in self._pending.values()) + sum(len(g) for g in self._complete)

    def metrics(self) -> dict:
        """The method's metrics plus the rubric's step and counters (`verifiers/*`)."""
        row = dict(self.method.metrics())
        row["verifiers/step"] = self.step
        row["verifiers/pending_traces"] = self.pending_traces()
        row.update({f"verifiers/{k}": v for k, v in self.counters.items()})
        return row

    # ------------------------------------------------------------------ state

    def _entry_state(self, entry: _Entry) -> dict:
        trajectory = entry.trajectory.to_dict()
        trajectory["outcome"] = self._outcome(entry)
        return {
            "task_id": entry.task_id,
            "trajectory": trajectory,
            "report": _report_state(entry.report),
            "plan": list(entry.plan),
            "step": entry.step,
        }

    @staticmethod
    def _entry_from_state(state: Mapping) -> _Entry:
        return _Entry(
            str(state["task_id"]),
            Trajectory.from_dict(state["trajectory"]),
            _report_from_state(state["report"]),
            tuple(str(rid) for rid in state["plan"]),
            check_int(state["step"], "step", low=0),
        )

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
