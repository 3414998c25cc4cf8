"""How `AdaptiveRubric` turns judged traces into the method's evidence (`GroupEvidence`): each judged trace of a
training task waits in its task's group (`_Entry`); a complete group whose traces' scoring is over goes to
`method.score` + `method.observe`, one judged on rubrics the method no longer reads is dropped; pending groups
are written to and read back from the rubric's state. See rwcore.integrations.verifiers.rubric.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from rwcore.types import JudgeReport, RubricJudgment, Trajectory
from rwcore.validation import check_int
from rwcore.verdict import Verdict

from .trajectory import env_outcome

logger = logging.getLogger("rwcore.integrations.verifiers.rubric")  # the rubric's one logger


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


class GroupEvidence:
    """`AdaptiveRubric`'s groups of judged traces (it holds the method, lock, pending and complete groups and the
    counters used here)."""

    def flush(self, force: bool = False) -> int:
        """Observes the complete groups, in the order they completed, whose traces' scoring is over (all of
        them with `force`); returns how many groups entered the evidence."""
        done = 0
        with self._lock:
            while self._complete and (force or all(entry.ready() for entry in self._complete[0])):
                group = self._complete.pop(0)
                try:
                    done += self._observe(group)
                except Exception as error:  # evidence is best effort: scoring never stops here
                    self.counters["traces_dropped"] += len(group)
                    self._warn("observe", f"a group of {group[0].task_id!r} left out of the evidence ({error})")
        return done

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
        except Exception:  # rewards that cannot be read: no outcome
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
