"""The `transformers.TrainerCallback` subclasses, built on first use (importing rwcore never imports transformers).

Below the trainers in the package's layering: `trainer` and `method` add these callbacks; `classes` builds the
trainer classes on top of both.
"""

from __future__ import annotations

import functools

from .compat import require_trl
from .feedback import _AdaptiveMethodCallbackLogic, _RubricFeedbackLogic

PACKAGE = __name__.rpartition(".")[0]  # rwcore.integrations.trl: the public, picklable name

_LOGIC = {
    "RubricFeedbackCallback": (
        _RubricFeedbackLogic,
        "`transformers.TrainerCallback` that feeds the rubric verdicts of each step's completions (from a "
        "`RubricRecorder`) to a rwcore sampler with `record_group` and advances its policy version to "
        "`state.global_step`. Args: sampler (a rwcore sampler or AdaptiveBatchSampler), recorder, group_size "
        "(default: args.num_generations), set_rubrics (give the sampler the rubrics' capabilities at train start "
        "when its pool is empty).",
    ),
    "AdaptiveMethodCallback": (
        _AdaptiveMethodCallbackLogic,
        "`transformers.TrainerCallback` that ends the method's step (`MethodLoop.end_step`) after each optimizer step.",
    ),
}


@functools.cache
def callback_class(name: str) -> type:
    """`RubricFeedbackCallback` or `AdaptiveMethodCallback` (built once; imports transformers)."""
    if name not in _LOGIC:
        raise ValueError(f"callback must be one of {sorted(_LOGIC)}, got {name!r}")
    _, transformers = require_trl()
    logic, doc = _LOGIC[name]
    return type(
        name, (logic, transformers.TrainerCallback), {"__module__": PACKAGE, "__qualname__": name, "__doc__": doc}
    )
