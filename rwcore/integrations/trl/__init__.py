"""rwcore inside TRL's `GRPOTrainer`: the filtered dual-clip loss, the adaptive task sampler, rubric rewards and
the method.

    from rwcore import AdaptiveMethod, CapabilitySampler, RubricSpec
    from rwcore.integrations.trl import AdaptiveGRPOTrainer, RWGRPOTrainer, rubric_reward_funcs
    from trl import GRPOConfig

    rubrics = [RubricSpec("cites-order-id", "...", capability="Verification"), ...]
    reward_funcs = rubric_reward_funcs(judge, rubrics)             # one TRL reward function per rubric
    sampler = CapabilitySampler({row["task_id"]: row["tags"] for row in dataset},
                                batch_size=generation_batch_size // num_generations, group_size=num_generations)
    trainer = RWGRPOTrainer(model, reward_funcs=reward_funcs, args=GRPOConfig(...), train_dataset=dataset,
                            task_sampler=sampler)  # the loss's settings: LossSettings' keywords (clip_c=...)
    trainer.train()

    # or the whole method (rewards, advantages, sampler, pool and skills, active set) -- see .method:
    trainer = AdaptiveGRPOTrainer(model, method=AdaptiveMethod(...), args=GRPOConfig(...), train_dataset=dataset)

One module per job (checked against TRL's releases in `TRL_RANGE`; outside it the first use warns once):

- `rewards`: `rubric_reward_funcs(judge, rubrics)` -> TRL reward functions `(prompts, completions, **kwargs)
  -> list[float | None]`, one per rubric (metric `rewards/rubric/<id>/mean`); the judge runs once per
  batch for all rubrics; the verdicts also go to a `RubricRecorder`. `trajectory_from_trl`.
- `sampler`: `GroupRepeatSampler`, TRL's `RepeatSampler` structure over batches a rwcore sampler chooses:
  each generation round takes `sampler.sample(policy_version)` (K distinct tasks, K = generation_batch_size
  // num_generations), yields every chosen row `num_generations` times in a row, and repeats the round
  `num_iterations * steps_per_generation` times.
- `feedback`: `RubricFeedbackCallback` (a `transformers.TrainerCallback`, added automatically when the
  trainer has both a task sampler and rubric reward functions) drains the recorder at `on_step_end`,
  cuts each generation batch into its groups and calls `record_group(task_id, verdicts, policy_version)`.
- `trainer`: `RWGRPOTrainer` (= `RWGRPOMixin` + `trl.GRPOTrainer`) overrides `GRPOTrainer._compute_loss`
  with `rwcore.kernels.filtered_dual_clip_loss` (TRL's "dapo" token normalizer; `beta > 0` adds TRL's
  k3 KL term; statistics as `rw/*` metrics) and `_get_train_sampler` with `GroupRepeatSampler`. With vLLM
  importance sampling on (`use_vllm`, `vllm_importance_sampling_correction`, any of TRL's four
  `vllm_importance_sampling_mode`s), TRL's `importance_sampling_ratio` multiplies each token's term as in
  TRL's own loss (`rollout_is_weights`), and with both vLLM's and the old log-probs the train-inference
  mismatch metrics are logged as `rw/rollout_corr/*`. `trainer.correction_from_trl_args(args)` gives the
  same correction as a `rwcore.kernels.RolloutCorrection` for the plain loss functions.
- `method`: `AdaptiveGRPOTrainer` -- TRL's trainer driven by one `rwcore.AdaptiveMethod`.
- `compat`: the TRL import and its version check.

TRL and transformers are imported on first use of `RWGRPOTrainer`, `RubricFeedbackCallback` or
`AdaptiveGRPOTrainer` (module attribute access); the other pieces need neither. Without TRL, using the
trainer raises ImportError saying `pip install trl`.
"""

from __future__ import annotations

from .compat import TRL_RANGE
from .compat import require_trl as _require_trl  # noqa: F401
from .feedback import _gather_calls, _RubricFeedbackLogic  # noqa: F401  (tests and subclasses use them)
from .rewards import RubricRecorder, RubricRewardFuncs, rubric_reward_funcs, trajectory_from_trl
from .sampler import GroupRepeatSampler
from .trainer import STAT_METRICS, RWGRPOMixin

__all__ = [
    "TRL_RANGE",
    "STAT_METRICS",
    "AdaptiveGRPOTrainer",
    "GroupRepeatSampler",
    "RWGRPOMixin",
    "RWGRPOTrainer",
    "RubricFeedbackCallback",
    "RubricRecorder",
    "RubricRewardFuncs",
    "rubric_reward_funcs",
    "trajectory_from_trl",
]

_LAZY = ("RWGRPOTrainer", "RubricFeedbackCallback", "AdaptiveGRPOTrainer")


def __getattr__(name: str):
    if name in _LAZY:
        from .classes import build

        cls = build(name)
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
