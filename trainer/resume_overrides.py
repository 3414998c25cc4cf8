"""What `rw train --resume RUN key=value ...` may change: only settings that cannot change the steps already trained.

`train.steps` extends a run (finished or interrupted) to more steps, as TRL's `resume_from_checkpoint` with a
larger `max_steps` and verl's raised `trainer.total_training_steps` do; it must exceed the steps the checkpoint
holds. The cadences (`train.eval_every`, `train.checkpoint_every`, `train.log_every`) and
`train.keep_checkpoints` only decide what is written from now on. Every other key is refused by name: the resumed
run would not be the run its first steps belong to (another learning rate, method, model, seed...). The trackers
(`train.loggers`, `train.tracker_project`) are refused too: a tracker added on resume would hold only the rest of
the run, and one moved to another project would start a second run there; the run folder's metrics.jsonl holds
every row for a tracker started later.

What depends on `train.steps` itself: a decaying learning rate (`optim.schedule=linear|cosine`) reaches 0 at
`train.steps`, so the steps already trained followed the old horizon; extending such a run would give the rest a
schedule no single run has, so it is refused (start a new run with the longer horizon). Nothing else in a run's
math reads `train.steps`: the method's schedules (Arise's pool updates every `pool.delta_pool` steps,
RewardWeaver's stages every `rewardweaver.adaptation_interval` steps), the entropy controller and the samplers
count steps from 0 without a horizon, so an extended run continues as a run started with the new `train.steps`
would, except for what the old end added: its held-out evaluation and, for RewardWeaver, the diagnostic set
scored at the last step (rows and points recorded at that step, which stay).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rwcore.trainer.config import Config, load_config

__all__ = ["RESUME_KEYS", "check_extension", "resume_config"]

RESUME_KEYS = (
    "train.steps",
    "train.eval_every",
    "train.checkpoint_every",
    "train.log_every",
    "train.keep_checkpoints",
)


def resume_config(config_file: str | Path, overrides: Sequence[str]) -> tuple[Config, int]:
    """The run's saved config with the overrides `--resume` allows applied, and the train.steps it had. Raises
    ValueError naming the first key that is not in RESUME_KEYS, and an extension of a decaying learning rate."""
    for override in overrides:
        key = override.split("=", 1)[0].strip()
        if key not in RESUME_KEYS:
            raise ValueError(
                f"{key} cannot change on resume: a resumed run keeps the config its first steps were trained "
                f"with; it may change only {', '.join(RESUME_KEYS)} (start a new run with --out to change {key})"
            )
    before = load_config(str(config_file)).train.steps
    config = load_config(str(config_file), list(overrides))
    if config.train.steps != before and config.optim.schedule != "constant":
        raise ValueError(
            f"train.steps={config.train.steps}: the run's learning rate decays to 0 at train.steps={before} "
            f"(optim.schedule={config.optim.schedule}), which the steps already trained followed; extending "
            f"it would give the rest a schedule no single run has: start a new run with "
            f"train.steps={config.train.steps}"
        )
    return config, before


def check_extension(config: Config, before: int, done: int) -> None:
    """A changed train.steps must exceed `done`, the steps the checkpoint to resume from holds (ValueError)."""
    if config.train.steps != before and config.train.steps <= done:
        raise ValueError(
            f"train.steps={config.train.steps}: the checkpoint to resume from has {done} steps trained already; "
            f"extend the run to more than {done}"
        )
