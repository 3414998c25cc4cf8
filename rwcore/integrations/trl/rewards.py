"""Rubric reward functions for TRL: one reward function per rubric, the judge run once per batch, verdicts recorded."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence

from rwcore.types import ROLES, JudgeReport, RubricJudgment, RubricSpec, Trajectory, Turn
from rwcore.verdict import Verdict

logger = logging.getLogger(__name__)

# Keyword arguments TRL passes to reward functions that are not dataset columns.
_TRL_RESERVED_KWARGS = frozenset({"completion_ids", "trainer_state", "log_extra", "log_metric", "environments"})


def _text(content) -> str:
    """Message content as text: a string as is, content blocks as their text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, Mapping) and isinstance(block.get("text"), str):
                parts.append(block["text"])
        return "\n".join(parts)
    return str(content)


_ROLE_ALIASES = {"developer": "system", "environment": "tool", "function": "tool", "ipython": "tool"}


def _turns(messages, generated: bool) -> list[Turn]:
    if isinstance(messages, str):
        return [Turn("assistant" if generated else "user", messages, generated=generated)]
    turns = []
    for message in messages:
        role = _ROLE_ALIASES.get(message.get("role"), message.get("role"))
        if role not in ROLES:
            role = "user"
        content = _text(message.get("content"))
        if message.get("tool_calls"):
            content = (content + "\n" if content else "") + f"[tool calls] {message['tool_calls']!r}"
        turns.append(Turn(role, content, generated=generated and role == "assistant"))
    return turns


def trajectory_from_trl(
    prompt,
    completion,
    task_id,
    *,
    tags: Sequence = (),
    trajectory_id: str = "",
    group_id: str = "",
    policy_version: int = 0,
    outcome: float = 0.0,
    metadata: Mapping | None = None,
) -> Trajectory:
    """A `rwcore.Trajectory` from one TRL prompt and completion (plain strings or chat messages).

    Prompt messages become non-generated turns; completion messages become turns whose assistant
    messages are marked generated (tool results in a multi-turn completion are not). Roles outside
    rwcore's (system, user, assistant, tool, partner) map to "user" ("developer" to "system").
    """
    turns = _turns(prompt, generated=False) + _turns(completion, generated=True)
    if isinstance(tags, str):
        tags = (tags,)
    return Trajectory(
        task_id=str(task_id),
        turns=turns,
        outcome=float(outcome),
        tags=tuple(str(t) for t in tags),
        group_id=group_id,
        policy_version=int(policy_version),
        trajectory_id=trajectory_id,
        metadata=dict(metadata or {}),
    )


class RubricRecorder:
    """The rubric verdicts rubric reward functions produced, until `RubricFeedbackCallback` drains them.

    One entry per reward computation (a TRL generation batch on this process), in order:
    {"task_ids": [...], "verdicts": [{rubric_id: Verdict}, ...], "outcomes": [float | None, ...],
    "policy_version": int | None} with one element per completion.
    """

    def __init__(self) -> None:
        self.rubric_capabilities: dict[str, str] = {}
        self._calls: list[dict] = []

    def __len__(self) -> int:
        return len(self._calls)

    def record(
        self,
        task_ids: Sequence,
        verdicts: Sequence[Mapping],
        outcomes: Sequence | None = None,
        policy_version: int | None = None,
    ) -> None:
        if len(verdicts) != len(task_ids) or (outcomes is not None and len(outcomes) != len(task_ids)):
            raise ValueError("RubricRecorder.record: task_ids, verdicts and outcomes must have the same length")
        self._calls.append(
            {
                "task_ids": list(task_ids),
                "verdicts": [dict(v) for v in verdicts],
                "outcomes": list(outcomes) if outcomes is not None else [None] * len(task_ids),
                "policy_version": policy_version,
            }
        )

    def drain(self) -> list[dict]:
        """Every entry recorded since the last drain, oldest first; the recorder is left empty."""
        calls, self._calls = self._calls, []
        return calls

    def clear(self) -> None:
        self._calls = []


class RubricRewardFuncs(list):
    """The list `rubric_reward_funcs` returns: TRL reward functions, plus `.recorder`, `.rubrics`, `.judge`."""

    recorder: RubricRecorder
    rubrics: list
    judge: object


class _SharedJudgement:
    """Runs the judge once per batch for every rubric and serves each rubric's reward function from it.

    TRL (1.16, `GRPOTrainer._calculate_rewards`) calls every reward function with the same `prompts`
    and `completions` list objects; a call with other objects, or a second call of the same function,
    is a new batch.
    """

    def __init__(self, judge, rubrics, recorder, task_id_column, tags_column, outcome_fn) -> None:
        self.judge = judge
        self.rubrics = rubrics
        self.recorder = recorder
        self.task_id_column = task_id_column
        self.tags_column = tags_column
        self.outcome_fn = outcome_fn
        self._key: tuple | None = None  # strong references: their ids cannot be reused while cached
        self._served: set[int] = set()
        self._rows: list[dict] = []

    def judgments(self, func_index: int, prompts, completions, kwargs) -> list[dict]:
        same = (
            self._key is not None
            and self._key[0] is prompts
            and self._key[1] is completions
            and func_index not in self._served
        )
        if not same:
            self._rows = self._evaluate(prompts, completions, kwargs)
            self._key = (prompts, completions)
            self._served = set()
        self._served.add(func_index)
        return self._rows

    def _column(self, kwargs, name, count, required):
        values = kwargs.get(name)
        if values is None:
            if required:
                raise ValueError(
                    f"rubric reward functions need the dataset column {name!r} (task_id_column): TRL passes "
                    f"dataset columns to reward functions as keyword arguments; got only {sorted(kwargs)}"
                )
            return None
        if len(values) != count:
            raise ValueError(f"column {name!r} holds {len(values)} values for {count} completions")
        return values

    def _evaluate(self, prompts, completions, kwargs) -> list[dict]:
        count = len(prompts)
        if len(completions) != count:
            raise ValueError(f"got {len(completions)} completions for {count} prompts")
        task_ids = self._column(kwargs, self.task_id_column, count, required=True)
        tags = self._column(kwargs, self.tags_column, count, required=False) if self.tags_column else None
        state = kwargs.get("trainer_state")
        step = getattr(state, "global_step", None)
        version = int(step) if step is not None else None
        extra = {
            key: value
            for key, value in kwargs.items()
            if key not in _TRL_RESERVED_KWARGS
            and isinstance(value, Sequence)
            and not isinstance(value, (str, bytes))
            and len(value) == count
        }
        trajectories = [
            trajectory_from_trl(
                prompts[i],
                completions[i],
                task_ids[i],
                tags=tags[i] if tags is not None and tags[i] is not None else (),
                trajectory_id=f"{task_ids[i]}/{version if version is not None else '-'}/{i}",
                group_id=f"{task_ids[i]}/{version if version is not None else '-'}",
                policy_version=version or 0,
                metadata={key: values[i] for key, values in extra.items()},
            )
            for i in range(count)
        ]
        from rwcore.method.judging import safe_evaluate

        failures: list[str] = []
        reports = safe_evaluate(self.judge, trajectories, self.rubrics, failures)  # raising -> INVALID
        if failures:
            logger.warning("the judge raised; this batch's judgments are INVALID (%s)", failures[0])
        rows = []
        for report in reports:
            judgments = report.judgments if isinstance(report, JudgeReport) else report
            row = {}
            for rubric in self.rubrics:
                judgment = judgments.get(rubric.rubric_id)
                if not isinstance(judgment, RubricJudgment):
                    judgment = RubricJudgment(rubric.rubric_id, Verdict.INVALID, error="the judge returned no judgment")
                row[rubric.rubric_id] = judgment
            rows.append(row)
        outcomes = None
        if self.outcome_fn is not None:
            outcomes = [self.outcome_fn(trajectory) for trajectory in trajectories]
        if self.recorder is not None:
            self.recorder.record(
                list(task_ids),
                [{rid: j.verdict for rid, j in row.items()} for row in rows],
                outcomes,
                version,
            )
        return rows


def rubric_reward_funcs(
    judge,
    rubrics: Sequence[RubricSpec],
    *,
    task_id_column: str = "task_id",
    tags_column: str | None = None,
    recorder: RubricRecorder | None = None,
    na_value: float | None = None,
    invalid_value: float = 0.0,
    outcome_fn: Callable[[Trajectory], float] | None = None,
    name_prefix: str = "rubric/",
) -> RubricRewardFuncs:
    """TRL reward functions, one per rubric, judged by `judge` (any `rwcore.types.Judge`, e.g. `RuleJudge`).

    Each function has TRL's signature `f(prompts, completions, completion_ids=None, **kwargs) ->
    list[float | None]` and is named `name_prefix + rubric_id` (TRL logs `rewards/<name>/mean`). Its
    reward is the judgment's value: the score of a scored rubric, else 1.0 for PASS and 0.0 for FAIL.
    NA (the rubric does not apply) gives `na_value`, None by default: TRL (>= 1.x) reads None as "not
    applicable" (NaN), leaves it out of the other functions' weighted sum and of the group statistics,
    and gives a completion for which every function returned None an advantage of 0. INVALID (the
    judge failed, or raised: `rwcore.method.safe_evaluate`) gives `invalid_value`, 0.0 by default - a
    FAIL's lowest value - and must be a number <= 0: an INVALID left out like NA would score higher
    than a FAIL, so a policy would gain by making its judge fail.

    Each completion becomes a `Trajectory` (`trajectory_from_trl`) whose task id is the dataset column
    `task_id_column` (required), whose tags come from `tags_column` (optional), and whose `metadata`
    holds the row's other dataset columns (e.g. a reference answer a rule can check). The judge runs once
    per batch for all rubrics; the verdicts (and `outcome_fn(trajectory)` in [0, 1], which
    `OutcomeSampler` needs) go to `recorder` (a new `RubricRecorder` when None), which the returned
    list exposes as `.recorder` for `RubricFeedbackCallback` (`RWGRPOTrainer` finds it by itself).
    """
    from rwcore.validation import check_rubrics

    rubrics = check_rubrics(rubrics)
    if not rubrics:
        raise ValueError("rubrics must hold at least one RubricSpec")
    if not callable(getattr(judge, "evaluate", None)):
        raise ValueError(f"judge must have an evaluate(trajectories, rubrics) method, got {type(judge).__name__}")
    if not isinstance(task_id_column, str) or not task_id_column:
        raise ValueError(f"task_id_column must be a column name, got {task_id_column!r}")
    if na_value is not None and (isinstance(na_value, bool) or not isinstance(na_value, (int, float))):
        raise ValueError(f"na_value must be None or a number, got {na_value!r}")
    if (
        isinstance(invalid_value, bool)
        or not isinstance(invalid_value, (int, float))
        or not math.isfinite(invalid_value)
        or invalid_value > 0.0
    ):
        raise ValueError(
            f"invalid_value must be a finite number <= 0 (an INVALID judgment scores no higher than "
            f"a FAIL), got {invalid_value!r}"
        )
    recorder = RubricRecorder() if recorder is None else recorder
    for rubric in rubrics:
        if rubric.capability:
            recorder.rubric_capabilities[rubric.rubric_id] = rubric.capability
    shared = _SharedJudgement(judge, rubrics, recorder, task_id_column, tags_column, outcome_fn)

    def make(index: int, rubric_id: str):
        def reward(prompts, completions, completion_ids=None, **kwargs):
            rows = shared.judgments(index, prompts, completions, kwargs)
            values = []
            for row in rows:
                judgment = row[rubric_id]
                if judgment.verdict == Verdict.NA:
                    values.append(na_value)
                elif judgment.verdict == Verdict.INVALID:
                    values.append(invalid_value)
                else:
                    values.append(judgment.value)
            return values

        reward.__name__ = reward.__qualname__ = f"{name_prefix}{rubric_id}"
        reward.rw_recorder = recorder
        reward.rw_rubric_id = rubric_id
        return reward

    funcs = RubricRewardFuncs(make(i, rubric.rubric_id) for i, rubric in enumerate(rubrics))
    funcs.recorder, funcs.rubrics, funcs.judge = recorder, list(rubrics), judge
    return funcs
