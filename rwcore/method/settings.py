"""`MethodSettings`: every number the method uses, each declared once (`setting`) with its default, help,
`rw train` config key and range; which settings a variant cannot apply (`inapplicable_settings`).

`rw train`'s config sections, `rw config --describe`, the YAML files, verl's `algorithm.rwcore` keys and the
range checks all follow from these declarations (`rwcore.settings`): a bound is written once, here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from rwcore.method.variants import Variant, get_variant
from rwcore.rewardweaver.selection import RELEASING_STRATEGIES
from rwcore.settings import check_settings, describe_settings, setting, settings_dict
from rwcore.tasks import DEFAULT_CAPABILITIES

__all__ = [
    "CREDIT_SETTINGS",
    "MethodSettings",
    "check_applicable",
    "inapplicable_settings",
    "pin_settings",
    "setting",
]


@dataclass(frozen=True)
class MethodSettings:
    """Every number the method uses; each field carries its default (the papers'; docs/design.md), its help
    and its `rw train` config key (`setting`). `MethodSettings.describe()` lists them.

    In every reward and advantage an INVALID judgment scores as a FAIL (`JudgedBatch.reward_values`);
    evidence keeps it INVALID.
    """

    # batch
    batch_size: int = setting(16, "Tasks sampled per training step (batch size B).", "rollout.tasks_per_step", gt=0)
    group_size: int = setting(8, "Rollouts per task (group size G).", "rollout.group_size", gt=0)
    seed: int = setting(
        0,
        "Seed for every random generator (0 to 2**32 - 1, what numpy's legacy seeding takes).",
        "train.seed",
        ge=0,
        le=2**32 - 1,
    )
    # Arise's sampler (§3.2.2, B.5)
    rho_min: float = setting(0.1, "Minimum discovery share of a batch.", "sampler.rho_min", ge=0, le=1)
    quota_fraction: float = setting(
        0.25, "Per-pair quota as a fraction of the batch.", "sampler.quota_fraction", gt=0, le=1
    )
    gamma_obs: float = setting(0.2, "Evidence decay on a new observation.", "sampler.gamma_obs", ge=0, le=1)
    gamma_unobs: float = setting(
        0.999, "Evidence decay per unobserved policy version.", "sampler.gamma_unobs", ge=0, le=1
    )
    capabilities: tuple[str, ...] = setting(
        DEFAULT_CAPABILITIES, "The capability categories rubrics belong to (Arise table 3)."
    )
    # advantages (eq. 15-17, B.4)
    lam: float = setting(0.3, "Weight of the rubric advantages.", "advantage.lam", ge=0, le=1)
    eps: float = setting(1e-9, "Epsilon in the normalizations.", "advantage.eps", gt=0)
    ddof: int = setting(1, "Delta degrees of freedom of the group standard deviation.", "advantage.ddof", ge=0, le=1)
    length_alpha: float = setting(0.5, "Length-regularization strength alpha.", "advantage.length_alpha", ge=0)
    length_threshold: int = setting(
        16384, "Length regularization applies above this length.", "advantage.length_threshold", ge=0
    )
    # credit settings beyond the papers (docs/method.md "Credit and exploration settings"); defaults = the papers'
    scale_rewards: Literal["group", "batch", "none"] = setting(
        "group",
        "What advantages are divided by after centring on the group mean (TRL's scale_rewards): the group's "
        "std (group, the papers'), the std over the whole batch (batch), or nothing (none); Arise's rubric "
        "advantages alike, per rubric.",
        "advantage.scale_rewards",
    )
    aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = setting(
        "sum_then_normalize",
        "RewardWeaver's composite reward (TRL's multi_objective_aggregation): normalize R_o + process term "
        "(sum_then_normalize, the paper's), or normalize each within its group by scale_rewards, sum, and "
        "normalize the sum over the batch (normalize_then_sum, GDPO). Needs a RewardWeaver process reward.",
        "advantage.aggregation",
    )
    process_gate: Literal["off", "success_groups", "success_only"] = setting(
        "off",
        "Where process credit (RewardWeaver's process term and Arise's rubric advantages) applies: everywhere "
        "(off, the papers'), in groups holding a success (success_groups), or on successful trajectories only "
        "(success_only, Posterior-GRPO); success = outcome >= rewardweaver.low_outcome. Needs process credit.",
        "advantage.process_gate",
    )
    # Arise's pool (eq. 4-8, B.3)
    delta_pool: int = setting(10, "Steps between pool updates.", "pool.delta_pool", gt=0)
    eta_high: float = setting(
        0.9, "Pass rate at or above which a pair retires.", "pool.eta_high", ge=0, le=1, above="eta_low"
    )
    eta_low: float = setting(
        0.3, "Pass rate at or below which a skill activates or refines.", "pool.eta_low", ge=0, le=1
    )
    retire_while_shown: bool = setting(
        False,
        "Retire a pair whose window pass rate reaches eta_high even while its skill is shown (true: eq. 5 read "
        "alone; the variant arise_retire_while_shown); false (default): hide the skill instead and retire only on "
        "a window measured with the skill hidden, the activate-hide-retire lifecycle of the paper's tables 7-10 "
        "and appendix G (a pass rate borrowed from a shown skill is not mastery).",
        "pool.retire_while_shown",
    )
    max_pool: int = setting(64, "Maximum pool size.", "pool.max_pool", gt=0)
    max_new: int = setting(8, "Maximum new pairs per reflection.", "pool.max_new", ge=0)
    max_records: int = setting(
        256, "Records of the window one generation call reads at most (Arise B.3).", "pool.max_records", gt=0
    )
    # RewardWeaver
    adaptation_interval: int = setting(
        30, "Steps per stage (between active-set selections).", "rewardweaver.adaptation_interval", gt=0
    )
    budget: int = setting(6, "Active-set budget B (RewardWeaver §2.3: 6).", "rewardweaver.budget", gt=0)
    low_outcome: float = setting(
        0.5, "Outcome reward below which a trajectory is low-outcome.", "rewardweaver.low_outcome"
    )
    min_confidence: float = setting(0.5, "Minimum attribution confidence.", "rewardweaver.min_confidence", ge=0, le=1)
    min_support: int = setting(3, "Minimum number of supporting trajectories (k).", "rewardweaver.min_support", ge=1)
    release_uninformative: bool = setting(
        False,
        "Select passes over a failure mode whose judgment varied within no rollout group of the stage's diagnosis "
        "batch (failed, or passed, in every trajectory: it carries no credit) and gives its slot to the next "
        "informative mode (true); false: the paper's Select as written. Attribution strategies only.",
        "rewardweaver.release_uninformative",
    )
    rank_by: Literal["rate", "support"] = setting(
        "rate",
        "How attribution ranks recurrent failure modes for the active set: 'rate' (deficit rate among the "
        "trajectories a capability was a candidate for, then support) or 'support' (trajectories blamed).",
        "rewardweaver.rank_by",
    )
    max_candidates: int = setting(
        8,
        "Candidate capabilities retrieved per failed trajectory (from its judged applicable capabilities).",
        "rewardweaver.max_candidates",
        gt=0,
    )
    diagnosis_tasks: int = setting(
        16,
        "Tasks of the fresh on-policy diagnosis batch at each stage boundary (group_size rollouts each).",
        "rewardweaver.diagnosis_tasks",
        gt=0,
    )
    diagnostic_tasks: int = setting(
        16,
        "Fixed diagnostic tasks scored at every stage boundary (appendix G); 0 = none.",
        "rewardweaver.diagnostic_tasks",
        ge=0,
    )
    success_sample: int = setting(
        32,
        "Success trajectories attributed per stage for appendix E (F_succ); 0 = none.",
        "rewardweaver.success_sample",
        ge=0,
    )
    expansion: bool = setting(
        True, "Controlled expansion of the library at stage boundaries.", "rewardweaver.expansion"
    )
    max_new_capabilities: int = setting(
        2, "Candidate capabilities proposed per expansion.", "rewardweaver.max_new", ge=0
    )
    max_revisions: int = setting(
        1, "Evaluator revisions of a rejected candidate (development partition).", "rewardweaver.max_revisions", ge=0
    )
    process_normalization: Literal["active_set", "applicable"] = setting(
        "active_set",
        "Process term: 1/|A| over the active set with NA / INVALID judgments counting 0 (the paper's "
        "formula), or the mean over the judgments that apply (rewards not reaching a check).",
        "rewardweaver.process_normalization",
    )

    def __post_init__(self) -> None:
        check_settings(self)  # every declared type, range, choice and order (what the config checks too)

    def to_dict(self) -> dict:
        return settings_dict(self)

    @classmethod
    def describe(cls) -> str:
        """One line per setting: name, config key, default and help."""
        return describe_settings(cls)


CREDIT_SETTINGS = ("scale_rewards", "aggregation", "process_gate")
"""The `MethodSettings` fields that change only how `AdaptiveMethod.score` turns rewards into advantages (what a
trainer's own keys may set on a built method: `AdaptiveMethod.set_credit_settings`)."""


def inapplicable_settings(variant: str | Variant, settings: MethodSettings) -> list[str]:
    """The config keys of `settings` that `variant` cannot apply (empty when every setting applies):
    `advantage.aggregation` other than the default without a RewardWeaver process reward,
    `advantage.process_gate` other than "off" for a variant with no process credit at all (neither
    RewardWeaver's process reward nor Arise's rubric advantages: outcome-only), and
    `pool.retire_while_shown` other than the default for a variant that shows no skills, and
    `rewardweaver.release_uninformative` other than the default for a variant whose active set is not chosen by
    attribution."""
    variant = variant if isinstance(variant, Variant) else get_variant(variant)
    if not isinstance(settings, MethodSettings):
        raise ValueError(f"settings must be a MethodSettings, got {type(settings).__name__}")
    defaults, keys = MethodSettings(), {f.name: f.metadata.get("config") for f in fields(MethodSettings)}
    found = []
    if variant.process_reward is None and settings.aggregation != defaults.aggregation:
        found.append(keys["aggregation"])
    if variant.process_reward is None and variant.arise_rubrics is None and settings.process_gate != "off":
        found.append(keys["process_gate"])
    if not variant.skills and settings.retire_while_shown != defaults.retire_while_shown:
        found.append(keys["retire_while_shown"])
    if (
        variant.process_reward not in RELEASING_STRATEGIES
        and settings.release_uninformative != defaults.release_uninformative
    ):
        found.append(keys["release_uninformative"])
    return found


def pin_settings(variant: str | Variant, settings: MethodSettings) -> MethodSettings:
    """`settings` with the fields `variant` pins (`Variant.pinned`) set to the variant's values. A pinned field
    given at another value than both its default and the variant's is a ValueError naming its config key."""
    import dataclasses

    variant = variant if isinstance(variant, Variant) else get_variant(variant)
    if not variant.pinned:
        return settings
    defaults, keys = MethodSettings(), {f.name: f.metadata.get("config") for f in fields(MethodSettings)}
    for name, value in variant.pinned.items():
        given = getattr(settings, name)
        if given != value and given != getattr(defaults, name):
            raise ValueError(
                f"{keys[name]}={given!r}: train.method={variant.name} fixes it to {value!r} (that is the variant); "
                f"leave it out"
            )
    return dataclasses.replace(settings, **variant.pinned)


def check_applicable(variant: Variant, settings: MethodSettings) -> None:
    """ValueError naming each config key `variant` cannot apply (`inapplicable_settings`)."""
    reasons = {
        "advantage.aggregation": "combines RewardWeaver's process reward with the outcome, which it has none of; "
        "leave it at 'sum_then_normalize'",
        "advantage.process_gate": "gates process credit, which it has none of (no RewardWeaver process reward, "
        "no Arise rubric advantages); leave it at 'off'",
        "pool.retire_while_shown": "concerns skills shown in the training prompt, which it never shows; leave it "
        f"at {str(MethodSettings().retire_while_shown).lower()}",
        "rewardweaver.release_uninformative": "changes how attribution chooses the active set, which it does not "
        f"choose by attribution; leave it at {str(MethodSettings().release_uninformative).lower()}",
    }
    bad = inapplicable_settings(variant, settings)
    if bad:
        values = {f.metadata.get("config"): getattr(settings, f.name) for f in fields(settings)}
        raise ValueError(
            "; ".join(
                f"{key}={values[key]!r} does not apply to variant {variant.name!r}: {reasons[key]}" for key in bad
            )
        )
