"""The trainer classes that subclass TRL's `GRPOTrainer`, built on first use (importing rwcore never imports TRL).

The top of the package's layering: it builds on `trainer` (RWGRPOMixin), `method` (AdaptiveGRPOMixin) and
`callbacks`.
"""

from __future__ import annotations

import functools

from .callbacks import PACKAGE, callback_class
from .compat import require_trl as _require_trl
from .method import AdaptiveGRPOMixin
from .trainer import RWGRPOMixin

_TRAINERS = {
    "RWGRPOTrainer": (
        RWGRPOMixin,
        "`trl.GRPOTrainer` with rwcore's filtered dual-clip loss, optional adaptive task sampler and rubric "
        "feedback; see `RWGRPOMixin` for the extra arguments.",
    ),
    "AdaptiveGRPOTrainer": (
        AdaptiveGRPOMixin,
        "`trl.GRPOTrainer` driven by a `rwcore.AdaptiveMethod` (sampler, rewards, advantages, pool and skills, "
        "RewardWeaver's active set); see rwcore.integrations.trl.method.",
    ),
}


@functools.cache
def build(name: str) -> type:
    """`RWGRPOTrainer`, `AdaptiveGRPOTrainer` or one of the callbacks (`callbacks.callback_class`), built once."""
    if name not in _TRAINERS:
        return callback_class(name)
    trl, _ = _require_trl()
    mixin, doc = _TRAINERS[name]
    return type(name, (mixin, trl.GRPOTrainer), {"__module__": PACKAGE, "__qualname__": name, "__doc__": doc})
