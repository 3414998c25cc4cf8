"""RewardWeaver: failure-grounded, budgeted process rewards over a validated capability library.

Modules (one job each):

- `capability`: frozen `Capability` definitions, `AdmissionReport`, immutable hashed `AdmittedCapability`.
- `admission`: `LabelledCase`, source partitions and the source-disjoint `acceptance_test`.
- `library`: the `CapabilityLibrary` (admit, withdraw, families, JSON/YAML files, hash-checked on load).
- `attribution`: the low-outcome cohort, attribution records and their screening, `aggregate`.
- `selection`: `Select` strategies (attribution, static_topk, random, dynamic_topk,
  random_trajectory, success_failure_contrast) behind one `select(SelectionInput)`.
- `judgments`: judge reports -> [N, |A|] arrays (NaN for NA/INVALID) and rates.
- `reward`: R(tau) = R_o(tau) + mean of the defined active judgments.
- `history`: the reward specification history S_k.
- `expansion`: recurrent uncovered failures -> proposed capabilities -> admission.
- `analysis`: bottleneck importance, failure reduction, (partial / within-stage) Spearman, retention.
- `weaver`: `RewardWeaver`, the stage driver.
"""

from rwcore.rewardweaver.admission import (
    AdmissionConfig,
    LabelledCase,
    acceptance_test,
    check_source_disjoint,
    partition_by_source,
)
from rwcore.rewardweaver.analysis import (
    AssociationResult,
    RetentionEvent,
    RetentionResult,
    bottleneck_association,
    bottleneck_importance,
    capability_retention,
    failure_reduction,
    partial_spearman,
    rankdata,
    spearman,
    spearman_by_stage,
    within_stage_spearman,
)
from rwcore.rewardweaver.attribution import (
    REJECTION_REASONS,
    AggregatedFailures,
    AttributionResult,
    FailureMode,
    RejectedRecord,
    aggregate,
    attribute,
    low_outcome_mask,
    per_task_threshold,
    screen_record,
    verdict_retriever,
)
from rwcore.rewardweaver.capability import AdmissionReport, AdmittedCapability, Capability
from rwcore.rewardweaver.expansion import ExpansionResult, ExpansionTrigger, expand_library, find_expansion_triggers
from rwcore.rewardweaver.history import RewardHistory, StageRecord
from rwcore.rewardweaver.judgments import judge_failure_rates, judgment_matrix, mean_scores
from rwcore.rewardweaver.library import CapabilityLibrary
from rwcore.rewardweaver.reward import process_reward, process_terms
from rwcore.rewardweaver.selection import (
    STRATEGIES,
    AttributionSelect,
    DynamicTopK,
    RandomActiveSet,
    RandomTrajectoryAttribution,
    Selection,
    SelectionInput,
    StaticTopK,
    SuccessFailureContrast,
    make_strategy,
    select,
)
from rwcore.rewardweaver.weaver import RewardWeaver, StageUpdate

__all__ = [
    "REJECTION_REASONS",
    "STRATEGIES",
    "AdmissionConfig",
    "AdmissionReport",
    "AdmittedCapability",
    "AggregatedFailures",
    "AssociationResult",
    "AttributionResult",
    "AttributionSelect",
    "Capability",
    "CapabilityLibrary",
    "DynamicTopK",
    "ExpansionResult",
    "ExpansionTrigger",
    "FailureMode",
    "LabelledCase",
    "RandomActiveSet",
    "RandomTrajectoryAttribution",
    "RejectedRecord",
    "RetentionEvent",
    "RetentionResult",
    "RewardHistory",
    "RewardWeaver",
    "Selection",
    "SelectionInput",
    "StageRecord",
    "StageUpdate",
    "StaticTopK",
    "SuccessFailureContrast",
    "acceptance_test",
    "aggregate",
    "attribute",
    "bottleneck_association",
    "bottleneck_importance",
    "capability_retention",
    "check_source_disjoint",
    "expand_library",
    "failure_reduction",
    "find_expansion_triggers",
    "judge_failure_rates",
    "judgment_matrix",
    "low_outcome_mask",
    "make_strategy",
    "mean_scores",
    "partial_spearman",
    "partition_by_source",
    "per_task_threshold",
    "process_reward",
    "process_terms",
    "rankdata",
    "screen_record",
    "select",
    "spearman",
    "spearman_by_stage",
    "verdict_retriever",
    "within_stage_spearman",
]
