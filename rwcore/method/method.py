"""`AdaptiveMethod`: RewardWeaver and Arise composed as each paper describes, behind one interface.

The method owns the task sampler, Arise's rubric-skill pool and its evidence window, and
RewardWeaver's capability library, active set and reward history; it routes one step's judge
verdicts (a `JudgedBatch`) to all of them. A trainer - `rw train`, TRL, verl or your own loop -
keeps rollouts, the policy update, processes and checkpoints, and drives the method so:

    method = AdaptiveMethod("combined", tasks, settings, providers)
    if method.stage_due(-1):                                    # RewardWeaver's first diagnosis
        method.adapt(-1, diagnosis=roll_out_and_judge(method.diagnosis_tasks(-1), method.diagnosis_rubrics()))
    for step in range(steps):
        task_ids = method.sample(step)
        prompt = method.system_prompt(base_prompt)              # skills only here, never at evaluation
        trajectories = roll_out(task_ids, prompt)               # G per task, groups contiguous
        reports = judge_groups(trajectories, method.rubrics_to_judge(step, task_ids))
        scored = method.score(trajectories, reports)            # rewards, advantages, the JudgedBatch
        update_policy(trajectories, scored.advantages)
        method.observe(step, task_ids, trajectories, scored.judged)
        diagnosis = ...same as above when method.stage_due(step)...
        method.adapt(step, diagnosis=diagnosis)                 # pool every delta_pool, stages every interval

Rewards and advantages (Arise eq. 15-17, RewardWeaver §2.4), with each rubric counted once:

    R_task = length_regularize(R_o)                 (B.4: on the task outcome only)
    R      = R_task + mean_{d in A} J_d             (RewardWeaver's process term; 0 without it)
    A      = compute_advantages(R, verdicts of P \\ A)

where A is RewardWeaver's rubric set of the step (the active set, the stage's open-vocabulary
dimensions, or the task's instance rubrics) and P Arise's pool. A rubric in both is counted in
the process reward only; `score(...).advantage_rubrics` / `.process_rubrics` say which went where.
The credit settings (`MethodSettings.scale_rewards`, `.aggregation`, `.process_gate`; defaults: the
formulas above) choose how R is scaled and combined and where process credit applies
(docs/method.md "Credit and exploration settings"); a variant refuses one it cannot apply
(`inapplicable_settings`).

Schedules (0-based step k, the iteration that just updated the policy):
- Arise: the pool starts empty; at the end of every step with (k + 1) % delta_pool == 0 it is
  updated from the window's evidence (first pairs at k = delta_pool - 1, i.e. after delta_pool
  optimizer steps). Reflection reads up to `max_records` records of the window, refinement the
  window's failures of that rubric; a reflector that fails is logged and the lifecycle still runs.
- RewardWeaver: a stage boundary before training (k = -1) and at the end of every step with
  (k + 1) % adaptation_interval == 0. Each boundary needs a *fresh on-policy* diagnosis batch of
  the current policy (`diagnosis_tasks`, judged on `diagnosis_rubrics`); the method never
  reuses a training batch for diagnosis.
- Appendix G: `record_diagnostic_scores` takes the reports of the fixed `diagnostic_set`,
  rolled out without skills, at every boundary and at the end of training.
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Literal

import numpy as np

from rwcore.arise.advantages import compute_advantages, length_regularize, process_credit_mask
from rwcore.judged import JudgedBatch
from rwcore.judges.client import MissingAPIKeyError
from rwcore.method.variants import VARIANTS, Variant, get_variant
from rwcore.method.window import ReflectionWindow
from rwcore.tasks import DEFAULT_CAPABILITIES
from rwcore.types import (
    Attributor,
    CapabilityProposer,
    EvaluatorReviser,
    InstanceRubricWriter,
    Judge,
    JudgeReport,
    RubricJudgment,
    RubricReflector,
    RubricSkillProposal,
    RubricSpec,
    Trajectory,
)
from rwcore.validation import check_int, check_trajectories, check_unit
from rwcore.verdict import Verdict

logger = logging.getLogger("rwcore.method")

__all__ = [
    "CREDIT_SETTINGS",
    "AdaptiveMethod",
    "AdaptReport",
    "MethodSettings",
    "Providers",
    "Scored",
    "inapplicable_settings",
    "judge_groups",
    "safe_evaluate",
    "setting",
]

_FORMAT = "rwcore.adaptive_method"
_VERSION = 1


def setting(default, help: str, config: str | None = None, **bounds) -> object:
    """A `MethodSettings` field declared once: its default, its help, the `rw train` config key it appears
    under (`section.key`; None = not a config key) and its range (ge / gt / le / lt). `rw train`'s config
    sections, `rw config --describe` and the YAML files are generated from these fields."""
    unknown = set(bounds) - {"ge", "gt", "le", "lt"}
    if unknown:
        raise TypeError(f"setting(): unknown bounds {sorted(unknown)}")
    return field(default=default, metadata={"help": help, "config": config, **bounds})


@dataclass(frozen=True)
class MethodSettings:
    """Every number the method uses; each field carries its default (from the papers; DESIGN.md), its help
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
    eta_high: float = setting(0.9, "Pass rate at or above which a pair retires.", "pool.eta_high", ge=0, le=1)
    eta_low: float = setting(
        0.3, "Pass rate at or below which a skill activates or refines.", "pool.eta_low", ge=0, le=1
    )
    retire_while_shown: bool = setting(
        True,
        "Retire a pair whose window pass rate reaches eta_high even while its skill is shown (eq. 5 as written, "
        "the default); false: hide the skill instead and retire only on a window measured with the skill hidden "
        "(appendix F's activate-hide-retire lifecycle; for a policy that follows a shown skill at once).",
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
        for name in (
            "batch_size",
            "group_size",
            "delta_pool",
            "max_pool",
            "max_records",
            "adaptation_interval",
            "budget",
            "min_support",
            "max_candidates",
            "diagnosis_tasks",
        ):
            check_int(getattr(self, name), name, low=1)
        for name in ("seed", "max_new", "diagnostic_tasks", "success_sample", "max_new_capabilities", "max_revisions"):
            check_int(getattr(self, name), name, low=0)
        check_int(self.ddof, "ddof", low=0, high=1)
        for name in ("rho_min", "quota_fraction", "lam", "eta_high", "eta_low", "min_confidence"):
            check_unit(getattr(self, name), name)
        if not self.eta_low < self.eta_high:
            raise ValueError(f"eta_low must be below eta_high, got {self.eta_low} and {self.eta_high}")
        for name in ("expansion", "retire_while_shown"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        hints = _settings_hints(type(self))
        for f in fields(self):  # every declared range and choice (what the config checks too)
            value, meta = getattr(self, f.name), f.metadata
            if typing.get_origin(hints[f.name]) is Literal and value not in typing.get_args(hints[f.name]):
                raise ValueError(f"{f.name} must be one of {typing.get_args(hints[f.name])}, got {value!r}")
            for bound, ok in (
                ("ge", lambda v, b: v >= b),
                ("gt", lambda v, b: v > b),
                ("le", lambda v, b: v <= b),
                ("lt", lambda v, b: v < b),
            ):
                if bound in meta and isinstance(value, (int, float)) and not ok(value, meta[bound]):
                    raise ValueError(f"{f.name} must be {bound} {meta[bound]}, got {value!r}")

    def to_dict(self) -> dict:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}

    @classmethod
    def describe(cls) -> str:
        """One line per setting: name, config key, default and help."""
        lines = []
        for f in fields(cls):
            key = f.metadata.get("config") or "(not a config key)"
            lines.append(f"{f.name} [{key}] = {f.default!r}: {f.metadata.get('help', '')}")
        return "\n".join(lines)


def _settings_hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


CREDIT_SETTINGS = ("scale_rewards", "aggregation", "process_gate")
"""The `MethodSettings` fields that change only how `AdaptiveMethod.score` turns rewards into advantages (what a
trainer's own keys may set on a built method: `AdaptiveMethod.set_credit_settings`)."""


def inapplicable_settings(variant: str | Variant, settings: MethodSettings) -> list[str]:
    """The config keys of `settings` that `variant` cannot apply (empty when every setting applies):
    `advantage.aggregation` other than the default without a RewardWeaver process reward,
    `advantage.process_gate` other than "off" for a variant with no process credit at all (neither
    RewardWeaver's process reward nor Arise's rubric advantages: outcome-only), and
    `pool.retire_while_shown` other than the default for a variant that shows no skills."""
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
    return found


def _check_applicable(variant: Variant, settings: MethodSettings) -> None:
    """ValueError naming each config key `variant` cannot apply (`inapplicable_settings`)."""
    reasons = {
        "advantage.aggregation": "combines RewardWeaver's process reward with the outcome, which it has none of; "
        "leave it at 'sum_then_normalize'",
        "advantage.process_gate": "gates process credit, which it has none of (no RewardWeaver process reward, "
        "no Arise rubric advantages); leave it at 'off'",
        "pool.retire_while_shown": "concerns skills shown in the training prompt, which it never shows; leave it "
        "at true",
    }
    bad = inapplicable_settings(variant, settings)
    if bad:
        values = {f.metadata.get("config"): getattr(settings, f.name) for f in fields(settings)}
        raise ValueError(
            "; ".join(
                f"{key}={values[key]!r} does not apply to variant {variant.name!r}: {reasons[key]}" for key in bad
            )
        )


@dataclass
class Providers:
    """What the method calls out to; a variant needs only its own (a missing one is a ValueError
    naming it when the method is built).

    library: RewardWeaver's validated capability library (`CapabilityLibrary`, already admitted
        with `evaluator`) - library strategies.
    attributor: RewardWeaver's failure attribution - strategies that attribute, and appendix E.
    evaluator: the judge that scores training; controlled expansion admits new capabilities with
        this same object, so the admitted evaluator is the one that scores.
    proposer: capability proposals - controlled expansion and open-vocabulary dimensions.
    acceptance_cases: candidate -> labelled cases for its admission test (expansion).
    reviser: evaluator revision from a rejected candidate's development partition (optional).
    reflector: Arise's reflection model - the evolving pool and skill refinement.
    frozen_rubrics: the fixed rubric-skill pairs of `arise_frozen_rubrics`.
    instance_writer: rubrics per task instance - `rw_instance_specific`.
    """

    library: object | None = None
    attributor: Attributor | None = None
    evaluator: Judge | None = None
    proposer: CapabilityProposer | None = None
    acceptance_cases: Callable | None = None
    reviser: EvaluatorReviser | None = None
    reflector: RubricReflector | None = None
    frozen_rubrics: Sequence[RubricSkillProposal] = ()
    instance_writer: InstanceRubricWriter | None = None


@dataclass(frozen=True)
class Scored:
    """What `score` returns for one step (N trajectories).

    rewards: float64 [N], R = length-regularized outcome + process term.
    advantages: float64 [N], eq. 16 over `advantage_rubrics` (under the settings' scale_rewards, aggregation
        and process_gate).
    task_rewards: float64 [N], the length-regularized outcome alone.
    process_terms: float64 [N], RewardWeaver's mean over `process_rubrics` (0 without, and 0 where
        `MethodSettings.process_gate` gates process credit off).
    judged: the step's JudgedBatch (every rubric judged).
    process_rubrics / advantage_rubrics: where each rubric was counted (disjoint).
    shared_rubrics: the pool's rubrics that are also in RewardWeaver's set (counted in the process reward only).
    """

    rewards: np.ndarray
    advantages: np.ndarray
    task_rewards: np.ndarray
    process_terms: np.ndarray
    judged: JudgedBatch
    process_rubrics: tuple[str, ...]
    advantage_rubrics: tuple[str, ...]
    shared_rubrics: tuple[str, ...] = ()


@dataclass(frozen=True)
class AdaptReport:
    """What `adapt` changed: the pool update and / or the new stage (None when not due)."""

    pool_update: object | None = None
    stage: int | None = None
    reflection_error: str | None = None

    @property
    def changed(self) -> bool:
        return self.pool_update is not None or self.stage is not None


class _SilentReflector:
    """Stands in for a reflector that failed: no new pairs, skills kept (the lifecycle still runs)."""

    def propose_rubric_skills(self, trajectories, existing, max_new, **_):
        return []

    def refine_skill(self, rubric, skill, failures):
        return skill


class AdaptiveMethod:
    """One variant of the method over a task set (see the module docstring).

    variant: a name from `AdaptiveMethod.variants()` (or a `Variant`).
    tasks: task id -> task-type tags (the training split).
    settings: `MethodSettings` (defaults when None).
    providers: `Providers` for what the variant calls out to.
    """

    def __init__(
        self,
        variant: str | Variant,
        tasks: Mapping[str, Sequence[str]],
        settings: MethodSettings | None = None,
        providers: Providers | None = None,
    ) -> None:
        self.variant = variant if isinstance(variant, Variant) else get_variant(variant)
        self.settings = settings if settings is not None else MethodSettings()
        if not isinstance(self.settings, MethodSettings):
            raise ValueError(f"settings must be a MethodSettings, got {type(self.settings).__name__}")
        self.providers = providers if providers is not None else Providers()
        if not isinstance(tasks, Mapping) or not tasks:
            raise ValueError("tasks must be a non-empty mapping of task id -> task-type tags")
        self._tasks = {task_id: tuple(tags) for task_id, tags in tasks.items()}
        self._task_ids = list(self._tasks)
        _check_applicable(self.variant, self.settings)
        self._check_providers()
        s = self.settings
        self.sampler = self._build_sampler()
        self.pool = self._build_pool() if self.variant.arise_rubrics is not None else None
        self.window = ReflectionWindow(s.max_records, seed=s.seed) if self.pool is not None else None
        # RewardWeaver's process reward, from the registry (rwcore.rewardweaver.process_rewards): the stage driver
        # RewardWeaver for library strategies, or the open-vocabulary / instance-specific rubric source
        entry = self._process_entry()
        built = entry.build(s, self.providers) if entry is not None else None
        self.weaver = built if entry is not None and entry.uses_library else None
        self._process = built if entry is not None and not entry.uses_library else None
        self._diagnostic_scores: list[dict] = []  # appendix G points
        self._reflection_errors = 0
        self._stage_errors = 0
        rng = np.random.default_rng([s.seed, 0xD1A6])
        size = min(s.diagnostic_tasks, len(self._task_ids))
        self._diagnostic_set = tuple(
            self._task_ids[i] for i in sorted(rng.choice(len(self._task_ids), size, replace=False))
        )
        self._sync_sampler()

    # ------------------------------------------------------------------ the catalogue

    @classmethod
    def variants(cls) -> dict[str, Variant]:
        """name -> Variant (description, paper_row, parent, components) for every variant."""
        return dict(VARIANTS)

    def set_credit_settings(self, **changes) -> None:
        """Sets `CREDIT_SETTINGS` fields (scale_rewards, aggregation, process_gate) on the built method: how a
        trainer's own keys (TRL's scale_rewards, verl's norm_adv_by_std_in_grpo) reach `score`. The new settings
        are checked like the method's (`MethodSettings`, `inapplicable_settings`); nothing changes on error."""
        unknown = sorted(set(changes) - set(CREDIT_SETTINGS))
        if unknown:
            raise ValueError(f"set_credit_settings takes only {list(CREDIT_SETTINGS)}, got {unknown}")
        settings = dataclasses.replace(self.settings, **changes)
        _check_applicable(self.variant, settings)
        self.settings = settings

    def resolved(self) -> dict:
        """The variant and every setting it runs with (what `rw train` writes to method.json)."""
        return {
            "variant": self.variant.to_dict(),
            "settings": self.settings.to_dict(),
            "counting": "a rubric in RewardWeaver's rubric set of the step is counted in the process reward "
            "only; Arise's rubric advantages use the pool's other rubrics",
        }

    # ------------------------------------------------------------------ construction

    def _process_entry(self):
        from rwcore.rewardweaver.process_rewards import get_process_reward

        return get_process_reward(self.variant.process_reward) if self.variant.process_reward is not None else None

    def _check_providers(self) -> None:
        v, p = self.variant, self.providers
        needs: list[tuple[str, object, type | None]] = []
        if v.arise_rubrics is not None:  # generation (evolving) and skill refinement (both)
            needs.append(("reflector", p.reflector, RubricReflector))
        if v.arise_rubrics == "frozen" and not p.frozen_rubrics:
            raise ValueError(
                f"variant {v.name!r} needs providers.frozen_rubrics: the rubric-skill pairs a previous "
                "Arise run produced (rw train: pool.frozen_from=RUN_DIR)"
            )
        entry = self._process_entry()
        protocols = {
            "attributor": Attributor,
            "proposer": CapabilityProposer,
            "instance_writer": InstanceRubricWriter,
            "reflector": RubricReflector,
        }
        for name in entry.needs(self.settings) if entry is not None else ():  # what the registry entry calls
            if name == "library":
                from rwcore.rewardweaver import CapabilityLibrary

                if not isinstance(p.library, CapabilityLibrary) or not p.library.ids():
                    raise ValueError(
                        f"variant {v.name!r} needs providers.library: a CapabilityLibrary with at least "
                        "one admitted capability"
                    )
            else:
                needs.append((name, getattr(p, name), protocols.get(name)))
        for name, value, protocol in needs:
            if value is None or (protocol is not None and not isinstance(value, protocol)):
                kind = f"a rwcore.types.{protocol.__name__}" if protocol is not None else "a provider"
                raise ValueError(f"variant {v.name!r} needs providers.{name} ({kind}), got {type(value).__name__}")

    def _build_sampler(self):
        from rwcore.sampling import build_sampler

        return build_sampler(self.variant.sampler, self._tasks, self.settings)  # the sampler registry

    def _build_pool(self):
        from rwcore.arise.pool import RubricSkillPool

        s, frozen = self.settings, self.variant.arise_rubrics == "frozen"
        return RubricSkillPool(
            self.providers.reflector,
            max_pool=max(s.max_pool, len(self.providers.frozen_rubrics)) if frozen else s.max_pool,
            max_new=s.max_new,
            delta_pool=s.delta_pool,
            eta_high=s.eta_high,
            eta_low=s.eta_low,
            capabilities=s.capabilities,
            proposals=list(self.providers.frozen_rubrics) if frozen else (),
            max_failures=s.max_records,
            frozen=frozen,
            retire_while_shown=s.retire_while_shown,
        )

    # ------------------------------------------------------------------ per step

    def sample(self, step: int) -> list:
        """The step's B task ids (the variant's sampler; policy version = step)."""
        return self.sampler.sample(max(0, int(step)))

    def system_prompt(self, base: str, evaluation: bool = False) -> str:
        """The policy's system prompt: `base` with the active skills appended during training when the
        variant injects skills; `base` itself at evaluation (Arise withholds skills there)."""
        if evaluation or self.pool is None or not self.variant.skills:
            return base
        return self.pool.system_prompt(base)

    @classmethod
    def system_prompt_from_state(cls, state: Mapping, base: str) -> str:
        """The training prompt of the method whose `state_dict()` is `state` (a checkpoint's), without building
        it: `base` with the pool's active skills (`base` itself when the variant has no pool)."""
        pool = state.get("pool") if isinstance(state, Mapping) else None
        if not pool:
            return base
        from rwcore.arise.pool import RubricSkillPool

        return RubricSkillPool.system_prompt_from_state(pool, base)

    def process_rubrics(self, task_id: str | None = None) -> list[RubricSpec]:
        """RewardWeaver's rubric set A of the current stage (for instance-specific rubrics: `task_id`'s)."""
        if self.weaver is not None:
            return self.weaver.active_rubrics()
        return self._process.rubrics(task_id) if self._process is not None else []

    def rubrics_to_judge(self, step: int, task_ids: Sequence[str]) -> list[list[RubricSpec]]:
        """For each task group of the step, the rubrics its trajectories are judged on: the pool's rubrics
        and RewardWeaver's rubric set (each once). Groups usually share one list; instance-specific
        rubrics differ per task."""
        pool = self.pool.active_rubrics() if self.pool is not None else []
        plans = []
        for task_id in task_ids:
            specs = {spec.rubric_id: spec for spec in self.process_rubrics(task_id)}
            for spec in pool:
                specs.setdefault(spec.rubric_id, spec)
            plans.append(list(specs.values()))
        return plans

    def score(
        self,
        trajectories: Sequence[Trajectory],
        reports: Sequence[JudgeReport],
        group_ids: Sequence | np.ndarray | None = None,
    ) -> Scored:
        """Rewards, advantages and the step's JudgedBatch (see the module docstring for the formulas).

        trajectories: the step's N rollouts, groups contiguous (G per task) unless `group_ids` says
            otherwise; reports: their judge reports, in the same order.
        """
        trajectories = check_trajectories(trajectories, finite_outcomes=True)
        n = len(trajectories)
        if len(reports) != n:
            raise ValueError(f"reports holds {len(reports)} reports for {n} trajectories")
        groups = (
            np.repeat(np.arange(n // self.settings.group_size), self.settings.group_size)
            if group_ids is None
            else np.asarray(group_ids)
        )
        if groups.shape != (n,):
            raise ValueError(
                f"group_ids must have shape ({n},); without group_ids N must be a multiple of "
                f"group_size={self.settings.group_size}"
            )
        # every rubric the method reads, plus whatever else the judge returned; one a report lacks is INVALID
        expected = [spec.rubric_id for spec in (self.pool.active_rubrics() if self.pool is not None else [])]
        for task_id in dict.fromkeys(t.task_id for t in trajectories):
            expected += [spec.rubric_id for spec in self.process_rubrics(task_id)]
        judged_ids = list(dict.fromkeys([*expected, *(rid for report in reports for rid in report.judgments)]))
        # A trajectory whose counterpart failed (Trajectory.partner_failure) is never charged to the agent:
        # its verdicts are INVALID (no evidence for the sampler, the pool or reflection) and its advantage 0.
        failed = np.array([bool(t.partner_failure) for t in trajectories], dtype=bool)
        if failed.any():
            reports = [
                JudgeReport(t.trajectory_id, {}) if bad else report
                for t, report, bad in zip(trajectories, reports, failed)
            ]
        judged = JudgedBatch.from_reports(reports, judged_ids, [t.trajectory_id for t in trajectories])
        s = self.settings
        outcomes = np.array([t.outcome for t in trajectories], dtype=np.float64)
        lengths = np.array([t.generated_length for t in trajectories], dtype=np.float64)
        task_rewards = length_regularize(
            outcomes, lengths, groups, alpha=s.length_alpha, threshold=s.length_threshold, eps=s.eps
        )
        process_terms, process_ids = self._process_terms(trajectories, judged)
        # process credit where advantage.process_gate lets it in (everywhere by default); a partner failure is
        # no success and is left out of its group's count
        successes = (outcomes >= s.low_outcome) & ~failed
        if s.process_gate != "off":
            process_terms = np.where(process_credit_mask(successes, groups, s.process_gate), process_terms, 0.0)
        rewards = task_rewards + process_terms
        advantage_ids = tuple(
            spec.rubric_id
            for spec in (self.pool.active_rubrics() if self.pool is not None else [])
            if spec.rubric_id not in process_ids and spec.rubric_id in judged
        )
        verdicts = judged.columns(advantage_ids).reward_verdict_matrix()  # INVALID scores as a FAIL
        credit = dict(
            lam=s.lam,
            eps=s.eps,
            ddof=s.ddof,
            scale_rewards=s.scale_rewards,
            aggregation=s.aggregation,
            process_gate=s.process_gate,
        )
        if failed.any():  # left out of their groups' normalization; the rest of each group as usual
            keep = ~failed
            advantages = np.zeros(n, dtype=np.float64)
            if keep.any():
                advantages[keep] = compute_advantages(
                    task_rewards[keep],
                    verdicts[keep],
                    groups[keep],
                    process_rewards=process_terms[keep],
                    successes=successes[keep],
                    **credit,
                )
        else:
            advantages = compute_advantages(
                task_rewards, verdicts, groups, process_rewards=process_terms, successes=successes, **credit
            )
        pool_ids = set(self.pool.rubric_ids()) if self.pool is not None else set()
        return Scored(
            rewards,
            np.asarray(advantages, dtype=np.float64),
            task_rewards,
            process_terms,
            judged,
            tuple(process_ids),
            advantage_ids,
            tuple(rid for rid in process_ids if rid in pool_ids),
        )

    def _process_terms(self, trajectories: Sequence[Trajectory], judged: JudgedBatch) -> tuple[np.ndarray, list[str]]:
        """RewardWeaver's 1/|A| sum_d J_d per trajectory (rwcore.rewardweaver.process_terms with
        settings.process_normalization; 0 when nothing is defined). An INVALID judgment counts as a
        FAIL (0.0) under both normalizations (`JudgedBatch.reward_values`): invalidity never pays."""
        from rwcore.rewardweaver import process_terms

        n = len(trajectories)
        normalize = self.settings.process_normalization
        if self.variant.process_reward is None:
            return np.zeros(n), []
        if hasattr(self._process, "terms"):  # per-trajectory rubric sets (instance-specific)
            return self._process.terms(trajectories, judged, normalize)
        ids = [spec.rubric_id for spec in self.process_rubrics()]
        if not ids:
            return np.zeros(n), []
        return process_terms(judged.columns(ids).reward_values(), normalize=normalize)[0], ids

    def observe(
        self,
        step: int,
        task_ids: Sequence[str],
        trajectories: Sequence[Trajectory],
        judged: JudgedBatch,
        policy_versions: Sequence[int] | None = None,
    ) -> None:
        """Evidence of one step: the sampler (per complete group, at the group's policy version), the pool's
        window counts, and Arise's reflection window."""
        step = check_int(step, "step", low=0)
        g = self.settings.group_size
        if len(trajectories) != len(task_ids) * g or len(judged) != len(trajectories):
            raise ValueError(
                f"observe needs {len(task_ids)} groups of {g} trajectories and their JudgedBatch, got "
                f"{len(trajectories)} trajectories and {len(judged)} judged"
            )
        versions = [step] * len(task_ids) if policy_versions is None else [int(v) for v in policy_versions]
        if len(versions) != len(task_ids):
            raise ValueError(f"policy_versions holds {len(versions)} versions for {len(task_ids)} groups")
        sampler_rubrics = list(self.sampler.rubrics)
        missing = [rid for rid in sampler_rubrics if rid not in judged]
        if missing:
            raise ValueError(f"judged lacks the sampler's rubrics {missing[:5]} (judge rubrics_to_judge(...) first)")
        columns = judged.columns(sampler_rubrics) if sampler_rubrics else None
        for i, task_id in enumerate(task_ids):
            rows = slice(i * g, (i + 1) * g)
            verdicts = {rid: [Verdict(int(c)) for c in columns.codes[rows, j]] for j, rid in enumerate(sampler_rubrics)}
            outcomes = [min(1.0, max(0.0, float(t.outcome))) for t in trajectories[rows]]
            failed = [bool(t.partner_failure) for t in trajectories[rows]]
            if any(failed):  # a partner failure is no outcome evidence: it takes its group's mean (0.5 if none)
                kept = [o for o, bad in zip(outcomes, failed) if not bad]
                fill = float(np.mean(kept)) if kept else 0.5
                outcomes = [fill if bad else o for o, bad in zip(outcomes, failed)]
            self.sampler.record_group(task_id, verdicts, versions[i], outcomes=outcomes)
        if self.pool is not None:
            self.pool.record_judged(judged, step)
        if self.window is not None:
            pool_ids = [rid for rid in self.pool.rubric_ids() if rid in judged]
            failed = set()
            if pool_ids:
                codes = judged.columns(pool_ids).codes
                failed = {tid for tid, row in zip(judged.trajectory_ids, codes) if (row == Verdict.FAIL).any()}
            # a partner failure says nothing about the policy: reflection does not read it
            kept = [i for i, t in enumerate(trajectories) if not t.partner_failure]
            self.window.add([trajectories[i] for i in kept], tuple(judged.uncovered[i] for i in kept), failed)

    # ------------------------------------------------------------------ schedules

    def stage_due(self, step: int) -> bool:
        """Whether a RewardWeaver stage boundary falls at the end of `step` (-1: before training)."""
        if not self.variant.has_stages:
            return False
        return step == -1 or (step >= 0 and (step + 1) % self.settings.adaptation_interval == 0)

    def pool_due(self, step: int) -> bool:
        return self.pool is not None and step >= 0 and self.pool.is_update_step(step)

    def diagnosis_tasks(self, step: int) -> list[str]:
        """The tasks of the fresh on-policy diagnosis batch at the boundary after `step` (seeded from the
        run's seed and the step, so a resumed run draws the same ones; G rollouts each)."""
        rng = np.random.default_rng([self.settings.seed, 0xD1A9, step + 1])
        size = min(self.settings.diagnosis_tasks, len(self._task_ids))
        return [self._task_ids[i] for i in rng.choice(len(self._task_ids), size, replace=False)]

    def diagnosis_rubrics(self) -> list[RubricSpec]:
        """What the diagnosis batch is judged on: the whole capability library (retrieval, failure rates,
        expansion triggers) for library strategies; nothing for open-vocabulary dimensions."""
        return self.weaver.library.rubrics() if self.weaver is not None else []

    @property
    def diagnostic_set(self) -> tuple[str, ...]:
        """Appendix G's fixed diagnostic tasks (empty when settings.diagnostic_tasks = 0 or no stages)."""
        return self._diagnostic_set if self.weaver is not None else ()

    def diagnostic_rubrics(self) -> list[RubricSpec]:
        return self.diagnosis_rubrics()

    # ------------------------------------------------------------------ adaptation

    def adapt(
        self, step: int, diagnosis: tuple[Sequence[Trajectory], Sequence[JudgeReport]] | None = None
    ) -> AdaptReport:
        """The scheduled adaptation at the end of `step`: the pool update when due, then the stage boundary
        when due (`diagnosis` = (trajectories, reports) of the fresh on-policy batch; required then)."""
        pool_update = error = None
        if self.pool_due(step):
            pool_update, error = self._update_pool(step)
        stage = None  # stays None when the stage update failed (logged; the active set is kept)
        if self.stage_due(step):
            if diagnosis is None:
                raise ValueError(
                    f"step {step} is a RewardWeaver stage boundary: adapt needs diagnosis=(trajectories, "
                    "reports) of a fresh on-policy batch (diagnosis_tasks / diagnosis_rubrics)"
                )
            stage = self._new_stage(step, *diagnosis)
        self._sync_sampler()
        return AdaptReport(pool_update, stage, error)

    def _update_pool(self, step: int):
        evidence, diagnostics = self.window.evidence() if self.window is not None else ([], None)
        failures = self.window.failures() if self.window is not None else []
        try:
            update = self.pool.maybe_update(step, failures, evidence=evidence, diagnostics=diagnostics)
            error = None
        except Exception as exc:  # noqa: BLE001 - an LLM reflector may fail; training must not stop
            error = f"{type(exc).__name__}: {exc}"
            self._reflection_errors += 1
            logger.warning(
                "pool update at step %d: the reflector failed (%s); the lifecycle runs without new "
                "pairs or refinements",
                step,
                error,
            )
            update = self.pool.maybe_update(step, failures, reflector=_SilentReflector())
        if self.window is not None:
            self.window.clear()
        return update, error

    def _new_stage(self, step: int, trajectories: Sequence[Trajectory], reports: Sequence[JudgeReport]) -> int:
        trajectories = check_trajectories(trajectories, "diagnosis trajectories", need_ids=True, finite_outcomes=True)
        if not trajectories:
            raise ValueError("diagnosis trajectories must not be empty")
        if self.weaver is not None:
            judged = JudgedBatch.from_reports(
                reports, self.weaver.library.ids(), [t.trajectory_id for t in trajectories]
            )
            try:
                self.weaver.update(trajectories, judged, step=step + 1)
            except (ValueError, TypeError):
                raise  # bad input or a broken provider contract: the caller's bug, not the model's
            except Exception as exc:  # noqa: BLE001 - an LLM attributor or proposer may fail; keep training
                self._stage_errors += 1
                logger.warning(
                    "stage boundary after step %d: RewardWeaver's update failed (%s: %s); the current "
                    "active set stays for another stage",
                    step,
                    type(exc).__name__,
                    exc,
                )
                return None
            return int(self.weaver.stage)
        # open vocabulary: the proposer's dimensions for this stage's failures, used as they come
        errors = self._process.errors
        stage = self._process.new_stage(step, trajectories)
        self._stage_errors += self._process.errors - errors
        return stage

    def set_instance_contexts(self, contexts: Mapping[str, Trajectory]) -> None:
        """rw_instance_specific: writes each task's rubrics from its context (once per task; kept in the
        state). Every training task needs a context."""
        if hasattr(self._process, "set_contexts"):
            self._process.set_contexts(self._task_ids, contexts)

    @property
    def needs_instance_contexts(self) -> bool:
        return hasattr(self._process, "set_contexts") and self._process.missing(self._task_ids)

    def record_diagnostic_scores(self, step: int, reports: Sequence[JudgeReport]) -> dict:
        """Appendix G: S_d at this point = mean normalized score over applicable episodes of the fixed
        diagnostic set (rolled out without skills), for every library capability."""
        ids = list(self.weaver.library.ids()) if self.weaver is not None else []
        judged = JudgedBatch.from_reports(reports, ids)
        values = judged.values
        applicable = np.isfinite(values).sum(axis=0)
        sums = np.where(np.isfinite(values), values, 0.0).sum(axis=0)
        point = {
            "step": int(step),
            "stage": self.weaver.stage if self.weaver is not None else None,
            "episodes": len(judged),
            "scores": {rid: (float(sums[j] / applicable[j]) if applicable[j] else None) for j, rid in enumerate(ids)},
            "applicable": {rid: int(applicable[j]) for j, rid in enumerate(ids)},
        }
        self._diagnostic_scores = [p for p in self._diagnostic_scores if p["step"] != point["step"]] + [point]
        return point

    def _sync_sampler(self) -> None:
        """The capability sampler follows the pool's rubrics (Arise's R_k)."""
        if self.variant.sampler != "capability":
            return
        rubrics = self.pool.rubric_capabilities() if self.pool is not None else {}
        if rubrics != self.sampler.rubrics:
            self.sampler.set_rubrics(rubrics)

    # ------------------------------------------------------------------ what the run folder shows

    def run_files(self) -> dict[str, object]:
        """file name -> JSON payload: what this variant's run folder holds about the method (RewardWeaver's
        stages, history and appendix-G diagnostics; Arise's pool counts, events and rubrics)."""
        files: dict[str, object] = {}
        if self.variant.has_stages:
            files["reward_stages.json"] = self.reward_stages()
            if self.reward_history() is not None:
                files["reward_history.json"] = self.reward_history()
                files["diagnostics.json"] = self.diagnostic_scores()
        if self.pool is not None:
            files["pool_counts.json"] = self.pool_counts()
            files["pool_events.json"] = self.pool_events()
            files["pool_rubrics.json"] = self.pool_rubrics()
        return files

    def sampling_probabilities(self, step: int, num_draws: int = 500) -> dict | None:
        """(task-type tag, capability) -> probability that the sampler draws a task of that pair at `step`
        (estimated from `num_draws` draws); None for samplers without pairs."""
        if not hasattr(self.sampler, "pair_probabilities"):
            return None
        return self.sampler.pair_probabilities(step, num_draws=num_draws)

    @property
    def task_ids(self) -> list:
        """The training tasks' ids, in the order the method was given them."""
        return list(self._task_ids)

    def active_rubric_count(self) -> int:
        """Distinct rubrics that steer training now (pool rubrics plus RewardWeaver's set)."""
        ids = {spec.rubric_id for spec in self.pool.active_rubrics()} if self.pool is not None else set()
        ids |= {spec.rubric_id for spec in self.process_rubrics()}
        if hasattr(self._process, "all_rubric_ids"):
            ids |= self._process.all_rubric_ids()
        return len(ids)

    @property
    def reflection_errors(self) -> int:
        return self._reflection_errors

    def pool_events(self) -> list[dict]:
        """The pool's event history; `step` counts optimizer steps done when it happened (an update at
        the end of 0-based iteration k is step k + 1, the row of metrics.jsonl it follows)."""
        if self.pool is None:
            return []
        return [{**event, "step": event["step"] + 1} for event in self.pool.history()]

    def pool_counts(self) -> list[dict]:
        if self.pool is None:
            return []
        return [
            {"step": row["step"] + 1, "active": row["active_rubrics"], "added": row["added"], "retired": row["retired"]}
            for row in self.pool.counts()
        ]

    def pool_rubrics(self) -> list[dict]:
        """Every rubric the pool ever held (current and retired) with its skill: what
        `arise_frozen_rubrics` reads from a source run."""
        if self.pool is None:
            return []
        pairs = self.pool.pairs() + self.pool.retired_pairs()
        out = []
        for pair in pairs:
            r = pair.rubric
            out.append(
                {
                    "rubric_id": r.rubric_id,
                    "criterion": r.criterion,
                    "applicability": r.applicability,
                    "capability": r.capability,
                    "evaluator_prompt": r.evaluator_prompt,
                    "scored": r.scored,
                    "skill": pair.skill.text,
                    "created_step": pair.created_step + 1,
                    "retired_step": None if pair.retired_step is None else pair.retired_step + 1,
                }
            )
        return out

    def reward_stages(self) -> list[dict]:
        """One record per RewardWeaver stage: steps, active set (with families), strategy, reason."""
        if self.weaver is not None:
            library = self.weaver.library
            return [
                {
                    "stage": r.stage,
                    "start_step": r.start_step,
                    "end_step": r.end_step,
                    "active": list(r.active),
                    "families": {c: library[c].capability.family for c in r.active},
                    "strategy": r.strategy,
                    "reason": r.reason,
                    "admitted": list(r.admitted),
                    "expansion": r.diagnosis.get("expansion"),
                }
                for r in self.weaver.history.stages
            ]
        return self._process.reward_stages() if hasattr(self._process, "reward_stages") else []

    def reward_history(self) -> dict | None:
        return self.weaver.history.state_dict() if self.weaver is not None else None

    def diagnostic_scores(self) -> list[dict]:
        return [dict(point) for point in self._diagnostic_scores]

    def metrics(self) -> dict:
        """A few numbers for a metrics row."""
        row = {"active_rubrics": self.active_rubric_count()}
        if self.pool is not None:
            row["pool/rubrics"] = len(self.pool)
            row["pool/active_skills"] = len(self.pool.active_skills())
            row["pool/reflection_errors"] = self._reflection_errors
        if self.weaver is not None and self.weaver.stage is not None:
            row["rewardweaver/stage"] = self.weaver.stage
            row["rewardweaver/stage_errors"] = self._stage_errors
        if hasattr(self.sampler, "coverage"):
            row["sampler/coverage"] = self.sampler.coverage()
        return row

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """Everything an exact resume needs (JSON-serializable apart from nothing: plain types only)."""
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "variant": self.variant.name,
            "settings": self.settings.to_dict(),
            "sampler": self.sampler.state_dict(),
            "pool": self.pool.state_dict() if self.pool is not None else None,
            "window": self.window.state_dict() if self.window is not None else None,
            "weaver": self.weaver.state_dict() if self.weaver is not None else None,
            "open_stages": self._process.state_dict() if hasattr(self._process, "new_stage") else [],
            "instance_rubrics": self._process.state_dict() if hasattr(self._process, "set_contexts") else {},
            "diagnostic_scores": self.diagnostic_scores(),
            "reflection_errors": self._reflection_errors,
            "stage_errors": self._stage_errors,
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Restores `state_dict()`; refuses another variant or other settings, naming them."""
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT or state.get("version") != _VERSION:
            raise ValueError(f"state must be a {_FORMAT!r} version {_VERSION} mapping")
        if state.get("variant") != self.variant.name:
            raise ValueError(
                f"train.method: the state was written by variant {state.get('variant')!r}, this method is "
                f"{self.variant.name!r}; resume with the variant the run started with"
            )
        saved, mine = dict(state.get("settings") or {}), self.settings.to_dict()
        for name in (*CREDIT_SETTINGS, "retire_while_shown"):  # written before these existed: the papers' rule
            saved.setdefault(name, getattr(MethodSettings(), name))
        if "rank_by" not in saved:  # written before rank_by existed, when attribution ranked by support
            saved["rank_by"] = "support" if self.variant.uses_library else mine["rank_by"]
        for key in mine:
            if saved.get(key) != mine[key]:
                hint = (
                    (
                        "; a state saved before rank_by existed ranked by support: resume it with rank_by='support' "
                        "(rw train: `rank_by: support` under `rewardweaver:` in the run's config.yaml)"
                    )
                    if key == "rank_by"
                    else ""
                )
                raise ValueError(
                    f"method setting {key!r}: the state has {saved.get(key)!r}, this method {mine[key]!r}{hint}"
                )
        for name, part in (("pool", self.pool), ("window", self.window), ("weaver", self.weaver)):
            if (state.get(name) is None) != (part is None):
                raise ValueError(f"state[{name!r}] does not match variant {self.variant.name!r}")
        self.sampler.load_state_dict(state["sampler"])
        if self.pool is not None:
            self.pool.load_state_dict(state["pool"])
        if self.window is not None:
            self.window.load_state_dict(state["window"])
        if self.weaver is not None:
            self.weaver.load_state_dict(state["weaver"])
        if hasattr(self._process, "new_stage"):
            self._process.load_state_dict(state["open_stages"])
        if hasattr(self._process, "set_contexts"):
            self._process.load_state_dict(state["instance_rubrics"])
        self._diagnostic_scores = [dict(p) for p in state["diagnostic_scores"]]
        self._reflection_errors = int(state["reflection_errors"])
        self._stage_errors = int(state["stage_errors"])
        self._sync_sampler()


def judge_groups(
    judge: Judge, trajectories: Sequence[Trajectory], plans: Sequence[Sequence[RubricSpec]], group_size: int
) -> list[JudgeReport]:
    """Judges trajectories group by group on `rubrics_to_judge`'s plans (one rubric list per group of
    `group_size` contiguous trajectories); consecutive groups with the same rubrics go to the judge in
    one call. One report per trajectory, in order; a group with no rubric gets empty reports.

    A judge call that raises (an LLM judge's bug, a user-supplied judge tripping over the policy's
    text) never ends the run: its trajectories get INVALID judgments of every planned rubric with the
    error recorded (`safe_evaluate`), and one warning per call of this function says what failed."""
    if len(trajectories) != len(plans) * group_size:
        raise ValueError(f"{len(trajectories)} trajectories are not {len(plans)} groups of {group_size}")
    reports: list[JudgeReport] = []
    failures: list[str] = []
    start = 0
    while start < len(plans):
        key = tuple(spec.rubric_id for spec in plans[start])
        end = start + 1
        while end < len(plans) and tuple(spec.rubric_id for spec in plans[end]) == key:
            end += 1
        block = list(trajectories[start * group_size : end * group_size])
        if key:
            reports.extend(safe_evaluate(judge, block, list(plans[start]), failures))
        else:
            reports.extend(JudgeReport(t.trajectory_id, {}) for t in block)
        start = end
    if failures:
        logger.warning(
            "judge %s raised in %d of its calls; those trajectories' judgments are INVALID (first: %s)",
            type(judge).__name__,
            len(failures),
            failures[0],
        )
    return reports


def safe_evaluate(
    judge: Judge, trajectories: Sequence[Trajectory], rubrics: Sequence[RubricSpec], failures: list[str] | None = None
) -> list[JudgeReport]:
    """`judge.evaluate(trajectories, rubrics)`, with any exception turned into INVALID judgments.

    The error ("<type>: <message>", cut to 500 characters) is in each INVALID judgment's `error` and
    appended to `failures` when given (the caller logs it; nothing is logged here). A judge that
    returns the wrong number of reports breaks its contract: ValueError naming the judge. A
    configuration error that no judgment can cure (`MissingAPIKeyError`) is raised as it is.
    """
    try:
        got = judge.evaluate(trajectories, rubrics)
    except MissingAPIKeyError:
        raise
    except Exception as exc:  # noqa: BLE001 - see the docstring: a judge failure is INVALID, never a crash
        error = f"{type(exc).__name__}: {exc}"[:500]
        if failures is not None:
            failures.append(error)
        message = f"the judge raised {error}"
        return [
            JudgeReport(
                t.trajectory_id,
                {r.rubric_id: RubricJudgment(r.rubric_id, Verdict.INVALID, error=message) for r in rubrics},
            )
            for t in trajectories
        ]
    if len(got) != len(trajectories):
        raise ValueError(
            f"judge.evaluate returned {len(got)} reports for {len(trajectories)} trajectories ({type(judge).__name__})"
        )
    return list(got)
