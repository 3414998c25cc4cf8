"""rwcore inside TRL's `GRPOTrainer`: the filtered dual-clip loss, the adaptive task sampler, rubric rewards.

    from rwcore import CapabilitySampler
    from rwcore.integrations.trl import RWGRPOTrainer, rubric_reward_funcs
    from trl import GRPOConfig

    rubrics = [RubricSpec("cites-order-id", "...", capability="Verification"), ...]
    reward_funcs = rubric_reward_funcs(judge, rubrics)             # one TRL reward function per rubric
    sampler = CapabilitySampler({row["task_id"]: row["tags"] for row in dataset},
                                batch_size=generation_batch_size // num_generations, group_size=num_generations)
    trainer = RWGRPOTrainer(model, reward_funcs=reward_funcs, args=GRPOConfig(...), train_dataset=dataset,
                            task_sampler=sampler, ratio_low=0.5, ratio_high=5.0, clip_c=3.0)
    trainer.train()

What each piece does, and the TRL internals it uses (checked against TRL 1.16 / transformers 5.24):

- `RWGRPOTrainer` (= `RWGRPOMixin` + `trl.GRPOTrainer`) overrides `GRPOTrainer._compute_loss`: TRL's
  per-token log-probs (`_get_per_token_logps_and_entropies`), `old_per_token_logps` (or the detached
  current log-probs when TRL skipped them because the step is on-policy: ratio 1), `advantages` and
  `completion_mask` (times `tool_mask` in multi-turn runs) go to `rwcore.kernels.filtered_dual_clip_loss`.
  Its denominator is TRL's `"dapo"` normalizer: the model tokens of the whole generation batch over all
  processes, rescaled to one gradient-accumulation window, so the loss is already scaled the way TRL
  hands it to `Trainer` (no further division). With `beta > 0` TRL's k3 KL term is added with the same
  normalizer. The loss statistics go to TRL's metrics as `rw/kept_fraction`, `rw/filtered_low_fraction`,
  `rw/filtered_high_fraction`, `rw/dual_clipped_fraction`, `rw/mean_ratio` (token-weighted over processes).
  TRL's `loss_type`, `epsilon`, `epsilon_high` and `delta` do not apply (the filter bounds and `clip_c`
  replace them); TRL features that reweight per-token losses are refused with a message.
- `task_sampler=` (a `CapabilitySampler`, `OutcomeSampler` or `UniformSampler`) replaces TRL's
  `RepeatSampler` in `_get_train_sampler` with `GroupRepeatSampler`, which keeps its structure: each
  generation round takes `sampler.sample(policy_version)` (K distinct tasks, K = generation_batch_size //
  num_generations), yields every chosen row `num_generations` times in a row, and repeats the round
  `num_iterations * steps_per_generation` times, exactly as TRL's sampler does with its own chunks. The
  dataset column `task_id_column` maps rows to the sampler's task ids (through `rwcore.AdaptiveBatchSampler`).
- `rubric_reward_funcs(judge, rubrics)` returns TRL reward functions `(prompts, completions, **kwargs) ->
  list[float | None]`, one per rubric (metric `rewards/rubric/<id>/mean`). The judge runs once per batch
  for all rubrics; the verdicts also go to a `RubricRecorder`.
- `RubricFeedbackCallback` (a `transformers.TrainerCallback`, added automatically when the trainer has both
  a task sampler and rubric reward functions) drains the recorder at `on_step_end`, cuts each generation
  batch into its groups of `num_generations` completions and calls `record_group(task_id, verdicts,
  policy_version)` on the sampler, then advances the sampler's policy version to `state.global_step`.

TRL and transformers are imported on first use of `RWGRPOTrainer` or `RubricFeedbackCallback` (module
attribute access); `rubric_reward_funcs`, `RubricRecorder`, `GroupRepeatSampler` and
`trajectory_from_trl` need neither. Without TRL, using the trainer raises ImportError saying `pip install trl`.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Mapping, Sequence

from torch.utils.data import Sampler

from rwcore.types import ROLES, JudgeReport, RubricJudgment, RubricSpec, Trajectory, Turn
from rwcore.verdict import Verdict

logger = logging.getLogger(__name__)

__all__ = [
    "GroupRepeatSampler",
    "RWGRPOMixin",
    "RWGRPOTrainer",
    "RubricFeedbackCallback",
    "RubricRecorder",
    "RubricRewardFuncs",
    "rubric_reward_funcs",
    "trajectory_from_trl",
]

TESTED_TRL_VERSION = "1.16"
STAT_METRICS = {
    "kept_fraction": "rw/kept_fraction",
    "filtered_low_fraction": "rw/filtered_low_fraction",
    "filtered_high_fraction": "rw/filtered_high_fraction",
    "dual_clipped_fraction": "rw/dual_clipped_fraction",
    "mean_ratio": "rw/mean_ratio",
}
# Keyword arguments TRL passes to reward functions that are not dataset columns.
_TRL_RESERVED_KWARGS = frozenset({"completion_ids", "trainer_state", "log_extra", "log_metric", "environments"})


def _require_trl():
    """(trl, transformers) modules, or ImportError saying what to install."""
    try:
        import transformers
        import trl
    except ImportError as error:
        raise ImportError(
            "rwcore.integrations.trl needs TRL (and transformers): pip install trl "
            f"(tested with trl {TESTED_TRL_VERSION}). Import error: {error}"
        ) from error
    return trl, transformers


# --------------------------------------------------------------------------- rubric rewards


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


def trajectory_from_trl(prompt, completion, task_id, *, tags: Sequence = (), trajectory_id: str = "",
                        group_id: str = "", policy_version: int = 0, outcome: float = 0.0,
                        metadata: Mapping | None = None) -> Trajectory:
    """A `rwcore.Trajectory` from one TRL prompt and completion (plain strings or chat messages).

    Prompt messages become non-generated turns; completion messages become turns whose assistant
    messages are marked generated (tool results in a multi-turn completion are not). Roles outside
    rwcore's (system, user, assistant, tool, partner) map to "user" ("developer" to "system").
    """
    turns = _turns(prompt, generated=False) + _turns(completion, generated=True)
    if isinstance(tags, str):
        tags = (tags,)
    return Trajectory(
        task_id=str(task_id), turns=turns, outcome=float(outcome), tags=tuple(str(t) for t in tags),
        group_id=group_id, policy_version=int(policy_version), trajectory_id=trajectory_id,
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

    def record(self, task_ids: Sequence, verdicts: Sequence[Mapping], outcomes: Sequence | None = None,
               policy_version: int | None = None) -> None:
        if len(verdicts) != len(task_ids) or (outcomes is not None and len(outcomes) != len(task_ids)):
            raise ValueError("RubricRecorder.record: task_ids, verdicts and outcomes must have the same length")
        self._calls.append({
            "task_ids": list(task_ids),
            "verdicts": [dict(v) for v in verdicts],
            "outcomes": list(outcomes) if outcomes is not None else [None] * len(task_ids),
            "policy_version": policy_version,
        })

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
        same = (self._key is not None and self._key[0] is prompts and self._key[1] is completions
                and func_index not in self._served)
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
            key: value for key, value in kwargs.items()
            if key not in _TRL_RESERVED_KWARGS and isinstance(value, Sequence) and not isinstance(value, (str, bytes))
            and len(value) == count
        }
        trajectories = [
            trajectory_from_trl(
                prompts[i], completions[i], task_ids[i],
                tags=tags[i] if tags is not None and tags[i] is not None else (),
                trajectory_id=f"{task_ids[i]}/{version if version is not None else '-'}/{i}",
                group_id=f"{task_ids[i]}/{version if version is not None else '-'}",
                policy_version=version or 0,
                metadata={key: values[i] for key, values in extra.items()},
            )
            for i in range(count)
        ]
        from rwcore.method.method import safe_evaluate

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
                    judgment = RubricJudgment(rubric.rubric_id, Verdict.INVALID,
                                              error="the judge returned no judgment")
                row[rubric.rubric_id] = judgment
            rows.append(row)
        outcomes = None
        if self.outcome_fn is not None:
            outcomes = [self.outcome_fn(trajectory) for trajectory in trajectories]
        if self.recorder is not None:
            self.recorder.record(
                list(task_ids), [{rid: j.verdict for rid, j in row.items()} for row in rows], outcomes, version,
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
    if isinstance(invalid_value, bool) or not isinstance(invalid_value, (int, float)) \
            or not math.isfinite(invalid_value) or invalid_value > 0.0:
        raise ValueError(f"invalid_value must be a finite number <= 0 (an INVALID judgment scores no higher than "
                         f"a FAIL), got {invalid_value!r}")
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


# --------------------------------------------------------------------------- sampler


class GroupRepeatSampler(Sampler):
    """TRL's `RepeatSampler` structure over batches chosen by a rwcore sampler.

    `batch_sampler` is a `rwcore.AdaptiveBatchSampler`; each of its batches (K distinct dataset
    indices, drawn lazily when the data loader reaches it) is yielded `repeat_count` times, every index
    `mini_repeat_count` times in a row:
    [a, a, b, b] * repeat_count for K=2, mini_repeat_count=2. In `RWGRPOTrainer`,
    mini_repeat_count = num_generations and repeat_count = num_iterations * steps_per_generation.
    """

    def __init__(self, batch_sampler, mini_repeat_count: int, repeat_count: int = 1) -> None:
        super().__init__()
        for name, value in (("mini_repeat_count", mini_repeat_count), ("repeat_count", repeat_count)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.batch_sampler = batch_sampler
        self.mini_repeat_count = mini_repeat_count
        self.repeat_count = repeat_count

    def __iter__(self):
        for batch in self.batch_sampler:
            for _ in range(self.repeat_count):
                for index in batch:
                    for _ in range(self.mini_repeat_count):
                        yield index

    def __len__(self) -> int:
        per_batch = self.batch_sampler.sampler.batch_size
        return len(self.batch_sampler) * per_batch * self.mini_repeat_count * self.repeat_count


# --------------------------------------------------------------------------- feedback callback


def _gather_calls(calls: list[dict], world_size: int) -> list[dict]:
    """Every process's recorder entries merged into global generation batches (process order)."""
    if world_size <= 1:
        return calls
    from accelerate.utils import gather_object

    per_process = gather_object([calls])
    counts = {len(p) for p in per_process}
    if len(counts) != 1:
        raise RuntimeError(f"processes recorded different numbers of reward batches: {[len(p) for p in per_process]}")
    merged = []
    for parts in zip(*per_process):
        merged.append({
            "task_ids": [t for part in parts for t in part["task_ids"]],
            "verdicts": [v for part in parts for v in part["verdicts"]],
            "outcomes": [o for part in parts for o in part["outcomes"]],
            "policy_version": parts[0]["policy_version"],
        })
    return merged


class _RubricFeedbackLogic:
    """The body of `RubricFeedbackCallback` (which adds `transformers.TrainerCallback` as a base)."""

    def __init__(self, sampler, recorder: RubricRecorder, *, group_size: int | None = None,
                 set_rubrics: bool = True) -> None:
        if not callable(getattr(sampler, "record_group", None)) and not callable(getattr(sampler, "feedback", None)):
            raise ValueError(
                "sampler must be a rwcore sampler (record_group) or an AdaptiveBatchSampler (feedback), "
                f"got {type(sampler).__name__}"
            )
        if not isinstance(recorder, RubricRecorder):
            raise ValueError(f"recorder must be a RubricRecorder, got {type(recorder).__name__}")
        self.target = sampler
        self.recorder = recorder
        self._group_size_arg = group_size
        self.group_size = group_size
        self.set_rubrics = set_rubrics
        self.policy_version = int(getattr(sampler, "policy_version", 0))
        self.groups_recorded = 0

    @property
    def sampler(self):
        """The rwcore task sampler (unwrapped from an AdaptiveBatchSampler)."""
        inner = getattr(self.target, "sampler", None)
        return inner if inner is not None and callable(getattr(self.target, "feedback", None)) else self.target

    # -- TrainerCallback events -------------------------------------------

    def on_train_begin(self, args, state, control, **kwargs):
        self.recorder.clear()
        trl_group = getattr(args, "num_generations", None)
        sampler_group = getattr(self.sampler, "group_size", None)
        if self._group_size_arg is not None and trl_group is not None and self._group_size_arg != trl_group:
            raise ValueError(f"group_size ({self._group_size_arg}) must equal TRL's num_generations ({trl_group})")
        group_size = self._group_size_arg or trl_group or sampler_group
        if sampler_group is not None and group_size != sampler_group:
            raise ValueError(
                f"the sampler's group_size ({sampler_group}) must equal TRL's num_generations ({group_size})"
            )
        self.group_size = group_size
        pool = self.recorder.rubric_capabilities
        if self.set_rubrics and pool and hasattr(self.sampler, "set_rubrics") and not self.sampler.rubrics:
            self.sampler.set_rubrics(dict(pool))
        self._advance(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        self.flush(getattr(args, "world_size", 1))
        self._advance(state.global_step)

    def on_evaluate(self, args, state, control, **kwargs):
        self.recorder.clear()  # evaluation completions never feed the training sampler

    # -- work ---------------------------------------------------------------

    def _advance(self, version: int) -> None:
        self.policy_version = int(version)
        if callable(getattr(self.target, "advance_policy", None)):
            self.target.advance_policy(self.policy_version)

    def flush(self, world_size: int = 1) -> int:
        """Records every complete group the recorder holds; returns how many groups were recorded."""
        calls = _gather_calls(self.recorder.drain(), world_size)
        sampler = self.sampler
        group = self.group_size or sampler.group_size
        active = getattr(sampler, "rubrics", None)
        recorded = 0
        for call in calls:
            task_ids, verdicts, outcomes = call["task_ids"], call["verdicts"], call["outcomes"]
            version = call["policy_version"] if call["policy_version"] is not None else self.policy_version
            if len(task_ids) % group:
                raise ValueError(
                    f"a reward batch of {len(task_ids)} completions is not made of groups of {group} "
                    "(num_generations); was the batch built by TRL's group-repeat sampler?"
                )
            for start in range(0, len(task_ids), group):
                block = slice(start, start + group)
                ids = task_ids[block]
                if any(t != ids[0] for t in ids):
                    raise ValueError(
                        f"completions {start}..{start + group - 1} of a reward batch belong to different tasks "
                        f"{ids!r}: TRL's groups of num_generations must share one prompt row"
                    )
                rows = verdicts[block]
                rubric_ids = [r for r in rows[0] if active is None or r in active]
                group_verdicts = {r: [row.get(r, Verdict.INVALID) for row in rows] for r in rubric_ids}
                group_outcomes = outcomes[block]
                if any(o is None for o in group_outcomes):
                    group_outcomes = None
                else:
                    group_outcomes = [float(o) for o in group_outcomes]
                sampler.record_group(ids[0], group_verdicts, version, outcomes=group_outcomes)
                recorded += 1
        self.groups_recorded += recorded
        return recorded


# --------------------------------------------------------------------------- trainer mixin


class RWGRPOMixin:
    """rwcore's loss and task sampler for a `trl.GRPOTrainer` subclass (`RWGRPOTrainer` is the ready one).

    Extra keyword arguments (everything else goes to `GRPOTrainer`):
        ratio_low, ratio_high, clip_c: the filtered dual-clip loss (Arise eq. 18-19) [0.5, 5.0, 3.0].
        rw_loss: False keeps TRL's own loss (e.g. to ablate the loss while keeping the sampler).
        loss_backend: "auto" | "torch" | "triton" for `filtered_dual_clip_loss`.
        task_sampler: a rwcore sampler; its batch_size must be generation_batch_size // num_generations
            and its group_size num_generations. None keeps TRL's `RepeatSampler`.
        task_id_column: the dataset column with each row's sampler task id [task_id].
        rubric_recorder: the `RubricRecorder` whose verdicts feed the sampler; by default the one of the
            `rubric_reward_funcs` among `reward_funcs`.
    """

    def __init__(self, *args, ratio_low: float = 0.5, ratio_high: float = 5.0, clip_c: float = 3.0,
                 rw_loss: bool = True, loss_backend: str = "auto", task_sampler=None,
                 task_id_column: str = "task_id", rubric_recorder: RubricRecorder | None = None, **kwargs) -> None:
        from rwcore.kernels import _checks
        from rwcore.kernels._backend import BACKENDS

        bounds = _checks.check_loss_bounds(ratio_low, ratio_high, clip_c)
        self.rw_ratio_low, self.rw_ratio_high, self.rw_clip_c = bounds
        if not isinstance(rw_loss, bool):
            raise ValueError(f"rw_loss must be True or False, got {rw_loss!r}")
        if loss_backend not in BACKENDS:
            raise ValueError(f"loss_backend must be one of {BACKENDS}, got {loss_backend!r}")
        self.rw_loss = rw_loss
        self.rw_loss_backend = loss_backend
        self.rw_task_sampler = task_sampler
        self.rw_task_id_column = task_id_column
        self.rw_batch_sampler = None
        self.rw_feedback_callback = None
        super().__init__(*args, **kwargs)
        if self.rw_loss:
            self._rw_check_loss_support()
        self.rw_recorder = rubric_recorder if rubric_recorder is not None else self._rw_find_recorder()
        if task_sampler is not None:
            self.rw_batch_sampler = self._rw_build_batch_sampler()
            if self.rw_recorder is None:
                warnings.warn(
                    "RWGRPOTrainer got a task_sampler but no rubric reward functions (rubric_reward_funcs) or "
                    "rubric_recorder: the sampler will get no feedback", stacklevel=2,
                )
            else:
                callback_class = _build("RubricFeedbackCallback")
                callback = callback_class(self.rw_batch_sampler, self.rw_recorder, group_size=self.num_generations)
                self.add_callback(callback)
                self.rw_feedback_callback = callback

    # -- set-up -------------------------------------------------------------

    def _rw_check_loss_support(self) -> None:
        refused = []
        if self.importance_sampling_level != "token":
            refused.append(f"importance_sampling_level={self.importance_sampling_level!r} (the loss is token-level)")
        if self.top_entropy_quantile < 1.0:
            refused.append(f"top_entropy_quantile={self.top_entropy_quantile}")
        if self.off_policy_mask_threshold is not None:
            refused.append(f"off_policy_mask_threshold={self.off_policy_mask_threshold}")
        if getattr(self, "_entropy_bonus_enabled", False):
            refused.append("an entropy bonus (entropy_coef / use_adaptive_entropy)")
        if self.use_vllm and self.vllm_importance_sampling_correction:
            refused.append("vllm_importance_sampling_correction=True (set it to False: the ratio filter of the "
                           "loss handles the behavior/current mismatch)")
        if refused:
            raise ValueError(
                "RWGRPOTrainer's filtered dual-clip loss does not support " + "; ".join(refused)
                + ". Pass rw_loss=False to keep TRL's loss, or change these GRPOConfig settings."
            )
        if self.loss_type != "dapo":
            logger.info("RWGRPOTrainer: loss_type=%r is ignored; the filtered dual-clip loss uses TRL's 'dapo' "
                        "token normalization", self.loss_type)

    def _rw_find_recorder(self):
        found = []
        for func in getattr(self, "reward_funcs", []):
            recorder = getattr(func, "rw_recorder", None)
            if recorder is not None and all(recorder is not r for r in found):
                found.append(recorder)
        if len(found) > 1:
            raise ValueError("reward_funcs hold rubric reward functions with different recorders; "
                             "share one (rubric_reward_funcs(..., recorder=...)) or pass rubric_recorder=")
        return found[0] if found else None

    def _rw_build_batch_sampler(self):
        from datasets import IterableDataset

        from rwcore.data import AdaptiveBatchSampler

        sampler, dataset, column = self.rw_task_sampler, self.train_dataset, self.rw_task_id_column
        if isinstance(dataset, IterableDataset):
            raise ValueError("task_sampler needs a map-style train_dataset (datasets.Dataset), "
                             "not an IterableDataset")
        if column not in dataset.column_names:
            raise ValueError(f"task_id_column {column!r} is not a column of train_dataset "
                             f"(columns: {dataset.column_names})")
        if getattr(self.args, "remove_unused_columns", False):
            raise ValueError(f"remove_unused_columns=True would drop the {column!r} column; set it to False")
        per_round = self.args.generation_batch_size // self.num_generations
        if sampler.group_size != self.num_generations:
            raise ValueError(f"task_sampler.group_size ({sampler.group_size}) must equal num_generations "
                             f"({self.num_generations})")
        if sampler.batch_size != per_round:
            raise ValueError(
                f"task_sampler.batch_size ({sampler.batch_size}) must equal generation_batch_size // num_generations "
                f"({self.args.generation_batch_size} // {self.num_generations} = {per_round})"
            )
        num_batches = max(1, len(sampler.task_ids) // per_round)
        return AdaptiveBatchSampler(sampler, dataset[column], num_batches=num_batches)

    # -- TRL extension points -------------------------------------------------

    def _get_train_sampler(self, dataset=None):
        if self.rw_batch_sampler is None:
            return super()._get_train_sampler(dataset)
        if dataset is not None and len(dataset) != len(self.train_dataset):
            raise ValueError("RWGRPOTrainer's task sampler indexes train_dataset; got another dataset")
        return GroupRepeatSampler(
            self.rw_batch_sampler,
            mini_repeat_count=self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
        )

    def _rw_denominator(self, inputs, mode: str):
        """TRL's "dapo" normalizer: model tokens of the generation batch per process and accumulation window."""
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if mode == "train":
            normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return normalizer

    def _compute_loss(self, model, inputs):
        if not self.rw_loss:
            return super()._compute_loss(model, inputs)
        import torch

        from rwcore.kernels import filtered_dual_clip_loss
        from rwcore.kernels.policy_loss import STAT_NAMES

        # As GRPOTrainer._compute_loss (TRL 1.16) up to the loss itself.
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep,
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            pixel_values=inputs.get("pixel_values"),
            image_grid_thw=inputs.get("image_grid_thw"),
            num_images=inputs.get("num_images"),
            pixel_attention_mask=inputs.get("pixel_attention_mask"),
            spatial_shapes=inputs.get("spatial_shapes"),
            num_tiles=inputs.get("num_tiles"),
            image_sizes=inputs.get("image_sizes"),
            token_type_ids=inputs.get("token_type_ids"),
            mm_token_type_ids=inputs.get("mm_token_type_ids"),
            image_position_ids=inputs.get("image_position_ids"),
        )
        # On-policy steps carry no old_per_token_logps (TRL skips them): the behavior policy is the
        # current one, ratio 1, as in TRL.
        old_per_token_logps = inputs.get("old_per_token_logps")
        behavior = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
        mode = "train" if self.model.training else "eval"
        denominator = self._rw_denominator(inputs, mode)

        loss, stats = filtered_dual_clip_loss(
            per_token_logps, behavior, inputs["advantages"], mask,
            ratio_low=self.rw_ratio_low, ratio_high=self.rw_ratio_high, clip_c=self.rw_clip_c,
            num_model_tokens=denominator, backend=self.rw_loss_backend,
        )

        per_token_kl = None
        if self.beta != 0.0:
            ref_per_token_logps = inputs["ref_per_token_logps"]
            log_ratio_ref = ref_per_token_logps - per_token_logps
            per_token_kl = torch.exp(log_ratio_ref) - log_ratio_ref - 1
            if self.args.use_bias_correction_kl:
                per_token_kl = per_token_kl * torch.exp(per_token_logps - behavior)
            loss = loss + self.beta * (per_token_kl * mask).sum() / denominator
        if self.aux_loss_enabled:
            normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            loss = loss + self.router_aux_loss_coef * aux_loss / normalizer
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())

        # Metrics: token-weighted means over every process, in one reduction.
        with torch.no_grad():
            count = mask.sum().float()
            fmask = mask.float()
            values = [stats[name].float() * count for name in STAT_NAMES]
            values.append((entropies.float() * fmask).sum())
            if per_token_kl is not None:
                values.append((per_token_kl.float() * fmask).sum())
            values.append(count)
            totals = self.accelerator.reduce(torch.stack(values), reduction="sum").tolist()
        total_count = max(totals[-1], 1.0)
        for name, total in zip(STAT_NAMES, totals):
            self._metrics[mode][STAT_METRICS[name]].append(total / total_count)
        self._metrics[mode]["entropy"].append(totals[len(STAT_NAMES)] / total_count)
        if per_token_kl is not None:
            self._metrics[mode]["kl"].append(totals[len(STAT_NAMES) + 1] / total_count)
        return loss

    def log(self, logs, start_time=None):
        sampler = self.rw_task_sampler
        if sampler is not None and self.model.training and callable(getattr(sampler, "coverage", None)):
            self._metrics["train"]["rw/sampler_coverage"].append(float(sampler.coverage()))
        return super().log(logs, start_time)


# --------------------------------------------------------------------------- lazily built classes

_BUILT: dict[str, type] = {}


def _build(name: str) -> type:
    if name not in _BUILT:
        trl, transformers = _require_trl()
        if name == "RWGRPOTrainer":
            bases = (RWGRPOMixin, trl.GRPOTrainer)
            doc = ("`trl.GRPOTrainer` with rwcore's filtered dual-clip loss, optional adaptive task sampler "
                   "and rubric feedback; see `RWGRPOMixin` for the extra arguments.")
        else:
            bases = (_RubricFeedbackLogic, transformers.TrainerCallback)
            doc = ("`transformers.TrainerCallback` that feeds the rubric verdicts of each step's completions "
                   "(from a `RubricRecorder`) to a rwcore sampler with `record_group` and advances its policy "
                   "version to `state.global_step`. Args: sampler (a rwcore sampler or AdaptiveBatchSampler), "
                   "recorder, group_size (default: args.num_generations), set_rubrics (give the sampler the "
                   "rubrics' capabilities at train start when its pool is empty).")
        cls = type(name, bases, {"__module__": __name__, "__qualname__": name, "__doc__": doc})
        _BUILT[name] = cls
    return _BUILT[name]


def __getattr__(name: str):
    if name in ("RWGRPOTrainer", "RubricFeedbackCallback"):
        cls = _build(name)
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
