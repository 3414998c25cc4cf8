"""Which keys of the metrics rows the experiment trackers leave out: those that do not apply to the run's settings.

metrics.jsonl holds every key its row kind declares (rwcore.trainer.metrics), whatever the settings, so that its
schema and the tools that read it (`rw report`, `rw analyze`, `rw compare`) stay the same from run to run. Some of
those keys measure nothing under some settings: the rollout-correction figures `rollout_corr/*` without a rollout
correction, where the behaviour log-probs come from the trained weights themselves (their ratios differ from 1 by
float rounding alone), the asynchronous-rollout lag without asynchronous rollouts (always 0), the rubric counts of
a variant without rubrics (always 0). A dashboard would show each as a flat curve of its own. `NOT_APPLICABLE`
declares them, each with the settings under which they do apply; `not_applicable(config)` is the predicate the
trainer hands to `rwcore.trainer.trackers.Trackers`, which drops those keys from every row it sends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rwcore.method import get_variant
from rwcore.trainer.config import Config, rollout_correction

__all__ = ["NOT_APPLICABLE", "NotApplicable", "not_applicable"]


@dataclass(frozen=True)
class NotApplicable:
    """Keys of one row kind that the trackers get only when `applies(config)`.

    keys: the keys as the row holds them; one ending in `/` stands for every key it begins.
    when: the condition `applies` tests, in words (docs/trackers.md)."""

    kind: str
    keys: tuple[str, ...]
    applies: Callable[[Config], bool]
    when: str

    def covers(self, key: str) -> bool:
        return any(key.startswith(name) if name.endswith("/") else key == name for name in self.keys)


def _mismatch_measured(config: Config) -> bool:
    """A rollout correction is on, or the behaviour log-probs come from other weights than the trained ones: a
    vLLM engine's copy, or an older policy version (asynchronous rollouts), as the engine scored them."""
    rollout = config.rollout
    other_weights = rollout.engine == "vllm" or rollout.max_lag > 0
    return rollout_correction(config) is not None or (rollout.behavior_logprobs == "engine" and other_weights)


def _components(config: Config):
    return get_variant(config.train.method)


NOT_APPLICABLE: tuple[NotApplicable, ...] = (
    NotApplicable(
        "train",
        ("rollout_corr/",),
        _mismatch_measured,
        "loss.rollout_correction is not off, or rollout.behavior_logprobs=engine with rollout.engine=vllm or "
        "rollout.max_lag > 0",
    ),
    NotApplicable(
        "train",
        ("rollout/version_lag", "evidence/late_groups"),
        lambda config: config.rollout.max_lag > 0,
        "rollout.max_lag > 0",
    ),
    NotApplicable(
        "train",
        ("judgments", "invalid_rate", "active_rubrics", "time/judge", "time/judge_wait"),
        lambda config: _components(config).process_reward is not None or _components(config).arise_rubrics is not None,
        "the variant judges rubrics (RewardWeaver's process reward or Arise's pool)",
    ),
    NotApplicable(
        "train",
        ("process_term_mean", "rubrics/process", "groups/process_varies", "time/diagnosis"),
        lambda config: _components(config).process_reward is not None,
        "the variant has RewardWeaver's process reward",
    ),
    NotApplicable(
        "train",
        ("rubrics/advantage",),
        lambda config: _components(config).arise_rubrics is not None,
        "the variant has Arise's rubric pool",
    ),
    NotApplicable(
        "train",
        ("rubrics/shared",),
        lambda config: _components(config).process_reward is not None and _components(config).arise_rubrics is not None,
        "the variant has both (`combined`)",
    ),
)
"""The keys the trackers leave out unless their settings apply (metrics.jsonl keeps them)."""


def not_applicable(config: Config) -> Callable[[str, str], bool]:
    """(row kind, key) -> True for a key that does not apply to `config`'s run (`NOT_APPLICABLE`)."""
    rules = [rule for rule in NOT_APPLICABLE if not rule.applies(config)]

    def omitted(kind: str, key: str) -> bool:
        return any(rule.kind == kind and rule.covers(key) for rule in rules)

    return omitted
