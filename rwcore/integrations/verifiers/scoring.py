"""How `AdaptiveRubric` scores one trace (`TraceScoring`): the trace read as a `Trajectory`, judged once (cached by
trace id) on the rubrics the method reads for its task, every judgment kept to the judge's contract (`_sound`:
anything else is INVALID), and the method's process term; the result is a `TraceScore`, and the judged trace
joins its group (rwcore.integrations.verifiers.groups). See rwcore.integrations.verifiers.rubric.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from rwcore.judges.client import MissingAPIKeyError
from rwcore.method.judging import safe_evaluate
from rwcore.types import JudgeReport, RubricJudgment, RubricSpec, Trajectory
from rwcore.verdict import Verdict

from .trajectory import trajectory_from_trace

logger = logging.getLogger("rwcore.integrations.verifiers.rubric")  # the rubric's one logger

METRIC_PREFIX = "rw/rubric/"


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


class TraceScoring:
    """`AdaptiveRubric`'s scoring of traces (it holds the method, judge, functions, cache and counters used here)."""

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
        except Exception as error:  # a task without a usable id is INVALID, never a crash
            problems.append(f"no task id ({type(error).__name__}: {error})")
        plan: list[RubricSpec] = []
        if task_id is not None:
            try:
                plan = list(self.method.rubrics_to_judge(step, [task_id])[0])
            except Exception as error:  # e.g. an instance-rubric task the method does not know
                problems.append(f"no rubrics for task {task_id!r} ({type(error).__name__}: {error})")
        trajectory_id = key or f"trace-{id(trace)}"
        outcome = 0.0
        if self.outcome_fn is not None:
            try:
                outcome = float(self.outcome_fn(trace))
                if not math.isfinite(outcome):
                    raise ValueError(f"outcome_fn returned {outcome!r}")
            except Exception as error:  # the outcome function reads the policy's text too
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
            except Exception as error:  # an unreadable trace is INVALID, never a crash
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
        except Exception as error:  # a judge that breaks its contract: INVALID, never a crash
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
        except Exception as error:  # e.g. an instance-rubric task without rubrics: no process term
            self._warn("process", f"rwcore AdaptiveRubric: no process term ({type(error).__name__}: {error})")
            return 0.0
        return value if math.isfinite(value) else 0.0

    def _warn(self, key: str, message: str) -> None:
        if key in self._warned:
            logger.debug(message)
            return
        self._warned.add(key)
        logger.warning(message)
