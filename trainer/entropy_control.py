"""`AdaptiveEntropyControl`: TRL's adaptive entropy coefficient (`use_adaptive_entropy`, Skywork-OR1 arXiv
2505.22312) for `rw train` (`loss.adaptive_entropy`).

TRL 1.16's rule (GRPOTrainer._compute_loss), kept here with TRL's names:

- the coefficient applied during an optimizer step is the one from the end of the previous step, and only
  while the last measured entropy is at or below `entropy_target` (before any measurement: none, the last
  entropy starts at +inf);
- after each optimizer step, with H the step's mean entropy per model token (every token of every
  micro-batch, summed over processes):
      coef <- min(coef + entropy_coef_delta, entropy_coef_max)   if H <= entropy_target
      coef <- max(coef - entropy_coef_delta, entropy_coef_min)   otherwise
  and H becomes the last measured entropy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["AdaptiveEntropyControl"]

_FORMAT = "rwcore.adaptive_entropy"


@dataclass
class AdaptiveEntropyControl:
    """The controller's settings (loss.entropy_coef as the initial `coef`, loss.entropy_target, ...) and state
    (`coef`, `last_entropy`, in nats per model token)."""

    coef: float
    target: float
    delta: float
    coef_min: float
    coef_max: float
    last_entropy: float = math.inf

    def applied(self) -> float:
        """The coefficient of the entropy bonus for the coming optimizer step (0 while the last entropy is
        above the target)."""
        return self.coef if self.last_entropy <= self.target else 0.0

    def update(self, entropy_sum: float, tokens: float) -> float:
        """After an optimizer step: `entropy_sum` over its `tokens` model tokens (all processes); returns the
        step's mean entropy. With no token the mean is 0, as TRL's (sum / max(count, 1))."""
        entropy = float(entropy_sum) / max(float(tokens), 1.0)
        if not math.isfinite(entropy):
            raise ValueError(f"loss.adaptive_entropy: the step's mean entropy is {entropy!r}")
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.coef_max)
        else:
            self.coef = max(self.coef - self.delta, self.coef_min)
        self.last_entropy = entropy
        return entropy

    def state_dict(self) -> dict:
        return {"format": _FORMAT, "coef": float(self.coef), "last_entropy": float(self.last_entropy)}

    def load_state_dict(self, state: Mapping) -> None:
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT:
            raise ValueError(f"state must be a {_FORMAT!r} mapping")
        self.coef, self.last_entropy = float(state["coef"]), float(state["last_entropy"])
