"""Feeds the rubric verdicts of each TRL step to a rwcore sampler (the body of `RubricFeedbackCallback`)."""

from __future__ import annotations

from rwcore.verdict import Verdict

from .rewards import RubricRecorder


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
        merged.append(
            {
                "task_ids": [t for part in parts for t in part["task_ids"]],
                "verdicts": [v for part in parts for v in part["verdicts"]],
                "outcomes": [o for part in parts for o in part["outcomes"]],
                "policy_version": parts[0]["policy_version"],
            }
        )
    return merged


class _RubricFeedbackLogic:
    """The body of `RubricFeedbackCallback` (which adds `transformers.TrainerCallback` as a base)."""

    def __init__(
        self, sampler, recorder: RubricRecorder, *, group_size: int | None = None, set_rubrics: bool = True
    ) -> None:
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


class _AdaptiveMethodCallbackLogic:
    """The body of `AdaptiveMethodCallback`: calls the method's `adapt` after each optimizer step."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer._rw_adapt(int(state.global_step) - 1)
        for name, value in self.trainer.rw_method.metrics().items():
            self.trainer._metrics["train"][f"rw/method/{name}"].append(float(value))
