"""`MethodLoop`: the one order in which every trainer drives an `AdaptiveMethod`.

`rw train`, TRL's `AdaptiveGRPOTrainer` and verl's `AdaptiveMethodDriver` are thin adapters over this
class; they keep rollouts, the policy update, processes and checkpoints. One step k:

    loop = MethodLoop(method, judge=judge, diagnose=diagnose)
    loop.start()                                   # once, before step 0: RewardWeaver's first stage
    for k in range(steps):
        plan = loop.plan(k, base_prompt)           # the k-th batch: B task ids and the training prompt
        trajectories = roll_out(plan.task_ids, plan.system_prompt)        # G per task, groups contiguous
        result = loop.finish(k, plan.task_ids, trajectories)              # judge, score, observe
        update_policy(trajectories, result.scored.advantages)
        loop.end_step(k)                           # after the update: pool update, stage boundary

- `finish` judges each group on `method.rubrics_to_judge(k, task_ids)` (or takes the reports a
  trainer's own reward workers produced), computes rewards and advantages (`method.score`) and records
  the evidence (`method.observe`): evidence is data, so it may enter before the update.
- `end_step` runs what depends on the updated policy: at a RewardWeaver stage boundary the fresh
  on-policy diagnosis batch is rolled out by `diagnose(task_ids, rubrics) -> (trajectories, reports)`
  *after* the update (and, in a trainer whose inference engine receives new weights separately, after
  that sync), then `method.adapt(k, diagnosis)`.
- A trainer that cannot call `end_step` where the update ends (a checkpoint written in between, a
  trainer with no hook there) leaves it pending: `pending_end_step` is part of `state_dict()`, and the
  next `plan` runs it first — still after the update, never before it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rwcore.method.judging import judge_groups
from rwcore.method.method import AdaptiveMethod
from rwcore.method.records import AdaptReport, Scored
from rwcore.types import JudgeReport, Trajectory
from rwcore.validation import check_int

__all__ = ["MethodLoop", "StepPlan", "StepResult"]

_FORMAT = "rwcore.method_loop"


@dataclass(frozen=True)
class StepPlan:
    """What the trainer rolls out at step `step`: `task_ids` (B ids, G rollouts each) under `system_prompt`
    (the base prompt with the active skills during training)."""

    step: int
    task_ids: list
    system_prompt: str


@dataclass(frozen=True)
class StepResult:
    """`finish`'s answer: the step's reports (one per trajectory) and `Scored` (rewards, advantages, verdicts)."""

    step: int
    task_ids: list
    reports: list[JudgeReport]
    scored: Scored


class MethodLoop:
    """Drives `method` in the order of the module docstring.

    judge: judges groups in `finish` when the trainer passes no reports (`rwcore.types.Judge`).
    diagnose: `(task_ids, rubrics) -> (trajectories, reports)`, a fresh on-policy batch of the current
        (updated) policy, G rollouts per task; required for variants with RewardWeaver stages.
    diagnostic: `(task_ids, rubrics) -> reports`, appendix G's fixed diagnostic set rolled out once per task
        without skills; optional (then no diagnostic scores are recorded).
    leader: False on the other processes of a data-parallel run: they roll out and judge their share of
        the diagnosis but do not adapt (the trainer broadcasts the leader's method state afterwards).
    """

    def __init__(
        self,
        method: AdaptiveMethod,
        *,
        judge=None,
        diagnose: Callable | None = None,
        diagnostic: Callable | None = None,
        leader: bool = True,
    ) -> None:
        if not isinstance(method, AdaptiveMethod):
            raise ValueError(f"method must be a rwcore.AdaptiveMethod, got {type(method).__name__}")
        if judge is not None and not callable(getattr(judge, "evaluate", None)):
            raise ValueError(f"judge must have an evaluate(trajectories, rubrics) method, got {type(judge).__name__}")
        if method.variant.has_stages and diagnose is None:
            raise ValueError(
                f"variant {method.variant.name!r} has RewardWeaver stages: pass diagnose=(task_ids, "
                "rubrics) -> (trajectories, reports), a fresh on-policy diagnosis batch"
            )
        self.method = method
        self.judge = judge
        self.diagnose = diagnose
        self.diagnostic = diagnostic
        self.leader = bool(leader)
        self.pending_end_step: int | None = None
        self.started = False

    # ------------------------------------------------------------------ the step

    def start(self) -> AdaptReport | None:
        """Before step 0 (once; a resumed loop does nothing): RewardWeaver's first stage from a diagnosis
        batch of the initial policy. Arise's pool starts empty."""
        if self.started:
            return None
        self.started = True
        if not self.method.stage_due(-1):
            return None
        return self._adapt(-1)

    def plan(self, step: int, base_prompt: str = "") -> StepPlan:
        """Step `step`'s tasks and training prompt (a pending `end_step` runs first)."""
        step = check_int(step, "step", low=0)
        self.catch_up()
        return StepPlan(step, list(self.method.sample(step)), self.method.system_prompt(base_prompt))

    def rubrics(self, step: int, task_ids: Sequence[str]) -> list:
        """Per task group, the rubrics its trajectories are judged on (for trainers that judge elsewhere)."""
        return self.method.rubrics_to_judge(step, list(task_ids))

    def finish(
        self,
        step: int,
        task_ids: Sequence[str],
        trajectories: Sequence[Trajectory],
        reports: Sequence[JudgeReport] | None = None,
        *,
        policy_versions: Sequence[int] | None = None,
        judge: Callable | None = None,
    ) -> StepResult:
        """Judges (unless `reports` are given), scores and observes step `step`'s trajectories (groups of G
        contiguous, in `task_ids` order); the end of the step is pending until `end_step`.

        judge: `(trajectories, plans) -> reports`, a trainer's own way of judging the plans (one rubric
        list per group), e.g. split over processes; default `judge_groups(self.judge, ...)`."""
        step = check_int(step, "step", low=0)
        task_ids = list(task_ids)
        if reports is None:
            plans = self.rubrics(step, task_ids)
            if judge is not None:
                reports = judge(trajectories, plans)
            elif self.judge is not None:
                reports = judge_groups(self.judge, trajectories, plans, self.method.settings.group_size)
            else:
                raise ValueError("finish needs reports, or a judge (MethodLoop(judge=...) or finish(judge=...))")
        reports = list(reports)
        scored = self.method.score(trajectories, reports)
        self.method.observe(step, task_ids, trajectories, scored.judged, policy_versions=policy_versions)
        self.pending_end_step = step
        return StepResult(step, task_ids, reports, scored)

    def end_step(self, step: int | None = None) -> AdaptReport | None:
        """After the policy update of step `step` (default: the pending one): the scheduled adaptation.
        Returns None when nothing was due."""
        if step is None:
            step = self.pending_end_step
            if step is None:
                return None
        step = check_int(step, "step", low=0)
        if self.pending_end_step is not None and step != self.pending_end_step:
            raise ValueError(f"end_step({step}): step {self.pending_end_step} is the one pending")
        self.pending_end_step = None
        if not self.method.stage_due(step) and not self.method.pool_due(step):
            return None
        return self._adapt(step)

    def catch_up(self) -> AdaptReport | None:
        """Runs a pending `end_step` (after a resume, or in a trainer that ends steps lazily)."""
        return self.end_step() if self.pending_end_step is not None else None

    def end_training(self, steps: int) -> None:
        """After the last step: appendix G's diagnostic set at the end of the last stage (once)."""
        self.catch_up()
        method = self.method
        if (
            self.diagnostic is not None
            and method.diagnostic_set
            and all(point["step"] != steps for point in method.diagnostic_scores())
        ):
            self._score_diagnostic_set(steps)

    # ------------------------------------------------------------------ adaptation

    def _adapt(self, step: int) -> AdaptReport | None:
        method = self.method
        diagnosis = None
        if method.stage_due(step):
            diagnosis = self.diagnose(method.diagnosis_tasks(step), method.diagnosis_rubrics())
            if self.diagnostic is not None and method.diagnostic_set:
                self._score_diagnostic_set(step + 1)
        if not self.leader:
            return None
        return method.adapt(step, diagnosis=diagnosis)

    def _score_diagnostic_set(self, step: int) -> None:
        reports = self.diagnostic(list(self.method.diagnostic_set), self.method.diagnostic_rubrics())
        self.method.record_diagnostic_scores(step, reports)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """The loop's own state (the method's is `method.state_dict()`)."""
        return {"format": _FORMAT, "started": self.started, "pending_end_step": self.pending_end_step}

    def load_state_dict(self, state: Mapping) -> None:
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT:
            raise ValueError(f"state must be a {_FORMAT!r} mapping")
        pending = state.get("pending_end_step")
        self.pending_end_step = None if pending is None else check_int(pending, "pending_end_step", low=0)
        self.started = bool(state.get("started"))
