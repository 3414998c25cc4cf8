"""The classes that subclass TRL / transformers types, built on first use so that importing rwcore never imports TRL."""

from __future__ import annotations

from .compat import require_trl as _require_trl
from .feedback import _RubricFeedbackLogic
from .trainer import RWGRPOMixin

PACKAGE = __name__.rpartition(".")[0]  # rwcore.integrations.trl: the public, picklable name

_BUILT: dict[str, type] = {}


def build(name: str) -> type:
    """`RWGRPOTrainer` or `RubricFeedbackCallback`, built once (imports TRL and transformers)."""
    if name not in _BUILT:
        trl, transformers = _require_trl()
        if name == "AdaptiveGRPOTrainer":
            from .method import AdaptiveGRPOMixin

            bases = (AdaptiveGRPOMixin, trl.GRPOTrainer)
            doc = ("`trl.GRPOTrainer` driven by a `rwcore.AdaptiveMethod` (sampler, rewards, advantages, pool and "
                   "skills, RewardWeaver's active set); see rwcore.integrations.trl.method.")
        elif name == "AdaptiveMethodCallback":
            from .method import _AdaptiveMethodCallbackLogic

            bases = (_AdaptiveMethodCallbackLogic, transformers.TrainerCallback)
            doc = "`transformers.TrainerCallback` that runs `AdaptiveMethod.adapt` after each optimizer step."
        elif name == "RWGRPOTrainer":
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
        cls = type(name, bases, {"__module__": PACKAGE, "__qualname__": name, "__doc__": doc})
        _BUILT[name] = cls
    return _BUILT[name]
