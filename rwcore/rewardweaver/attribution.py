"""Outcome-grounded failure attribution (RewardWeaver §2.3, appendix D.3).

1. `low_outcome_mask`: the cohort F = {tau : q_o(R_o(tau), x) = 1}.
2. `attribute`: for each trajectory of a cohort, candidate capabilities C_i
   (all of them, or a retrieval function's pick, e.g. `verdict_retriever`), records a_{i,d} = (s, c, e)
   from an `Attributor`, and the screening of every record. A record earns
   credit only when it states a deficit (s), with observable evidence (e), at
   confidence c >= min_confidence, caused by the policy. Every rejected record
   keeps its reasons (see REJECTION_REASONS).
3. `aggregate`: per capability, the number of distinct trajectories with an
   accepted record (support), its frequency in the cohort, its deficit rate
   among the trajectories it was a candidate for, the mean confidence and
   example evidence; recurrent modes (support >= min_support) form G, ranked by
   deficit rate (default) or by support.

Why rank by rate: support counts how many trajectories a capability could be
blamed on, which is bounded by how many trajectories it applies to. On a task
mix, a capability that only one task type needs and that fails on every one
of those trajectories (a complete bottleneck of that type) is outnumbered by
broad capabilities that fail on a fraction of many types, and leaves a budgeted
active set whenever it is slightly outnumbered - the "less frequent capability
deficiency [that] may constitute the actual performance bottleneck" of
RewardWeaver §1. The rate divides support by the trajectories the capability
was a candidate for (retrieved for attribution, not blamed on the partner or the
scenario), so it says how completely the capability fails where it matters;
recurrence (support >= min_support) still keeps isolated low scores out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rwcore.rewardweaver.library import CapabilityLibrary
from rwcore.types import AttributionRecord, Attributor, RubricSpec, Trajectory
from rwcore.validation import check_int, check_trajectories, check_unit
from rwcore.verdict import Verdict

REJECTION_REASONS: tuple[str, ...] = (
    "no_deficit",  # s = False: the record says the capability was not deficient
    "no_evidence",  # e is empty: nothing observable supports it
    "low_confidence",  # c < min_confidence
    "cause_partner",  # the partner controlled the failure (D.3)
    "cause_scenario",  # the scenario's constraints did
    "cause_unclear",  # who controlled it cannot be told
    "not_candidate",  # capability outside the candidates C_i given to the attributor
    "wrong_trajectory",  # record names another trajectory
    "duplicate",  # a second record for the same (trajectory, capability)
)

LowOutcomeRule = float | Callable[[float, Trajectory], bool]
"""q_o: a threshold (low when outcome < threshold) or a callable (outcome, trajectory) -> bool."""

Retriever = Callable[[Trajectory, Sequence[RubricSpec]], Sequence[str]]
"""Candidate retrieval: (trajectory, all candidate rubrics) -> ids of the candidates C_i."""


def verdict_retriever(
    trajectory_ids: Sequence[str], capability_ids: Sequence[str], codes: np.ndarray, max_candidates: int = 8
) -> Retriever:
    """Candidate retrieval from judge verdicts: for each trajectory, the capabilities the judge found
    applicable (FAIL first, then INVALID - the judge could not tell - then PASS; library order within
    each), at most `max_candidates`. A capability judged not applicable is never a candidate, so a
    failure no admitted capability applies to stays unattributed (controlled expansion's trigger).

    trajectory_ids: the N judged trajectories; codes: uint8 [N, D] Verdict codes over `capability_ids`.
    """
    codes = np.asarray(codes)
    ids = tuple(capability_ids)
    if codes.shape != (len(trajectory_ids), len(ids)):
        raise ValueError(f"codes must have shape ({len(trajectory_ids)}, {len(ids)}), got {codes.shape}")
    max_candidates = check_int(max_candidates, "max_candidates", low=1)
    row_of = {tid: i for i, tid in enumerate(trajectory_ids)}
    order = (int(Verdict.FAIL), int(Verdict.INVALID), int(Verdict.PASS))

    def retrieve(trajectory: Trajectory, candidates: Sequence[RubricSpec]) -> list[str]:
        allowed = {spec.rubric_id for spec in candidates}
        row = row_of.get(trajectory.trajectory_id)
        if row is None:  # not judged in this update: every candidate
            return [spec.rubric_id for spec in candidates]
        picked = [cid for code in order for j, cid in enumerate(ids) if codes[row, j] == code and cid in allowed]
        return picked[:max_candidates]

    return retrieve


def low_outcome_mask(trajectories: Sequence[Trajectory], q_o: LowOutcomeRule = 0.5) -> np.ndarray:
    """Boolean mask of the low-outcome cohort.

    q_o: a number t (low when R_o(tau) < t, strictly), or a callable
        q_o(outcome, trajectory) -> bool implementing a per-task rule (the
        trajectory carries task_id, tags and metadata); see `per_task_threshold`.
    """
    trajectories = check_trajectories(trajectories, finite_outcomes=True)
    mask = np.zeros(len(trajectories), dtype=bool)
    if callable(q_o):
        for i, trajectory in enumerate(trajectories):
            value = q_o(float(trajectory.outcome), trajectory)
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(f"q_o must return a bool, got {value!r} for trajectories[{i}]")
            mask[i] = bool(value)
        return mask
    if (
        isinstance(q_o, (bool, np.bool_))
        or not isinstance(q_o, (int, float, np.integer, np.floating))
        or not np.isfinite(q_o)
    ):
        raise ValueError(f"q_o must be a finite threshold or a callable (outcome, trajectory) -> bool, got {q_o!r}")
    outcomes = np.array([t.outcome for t in trajectories], dtype=np.float64)
    return outcomes < float(q_o)


def per_task_threshold(
    thresholds: Mapping[str, float], default: float | None = None
) -> Callable[[float, Trajectory], bool]:
    """q_o from per-task thresholds: low when outcome < thresholds[task_id] (or `default`)."""
    if not isinstance(thresholds, Mapping):
        raise ValueError("thresholds must be a mapping of task id -> threshold")
    table = {}
    for task_id, value in thresholds.items():
        number = float(value)
        if not np.isfinite(number):
            raise ValueError(f"thresholds[{task_id!r}] must be finite, got {value!r}")
        table[task_id] = number
    if default is not None and not np.isfinite(float(default)):
        raise ValueError(f"default must be finite, got {default!r}")

    def rule(outcome: float, trajectory: Trajectory) -> bool:
        threshold = table.get(trajectory.task_id, default)
        if threshold is None:
            raise ValueError(f"thresholds has no entry for task {trajectory.task_id!r} and no default")
        return outcome < threshold

    return rule


@dataclass(frozen=True)
class RejectedRecord:
    """An attribution record that earns no credit, with every reason it fails (REJECTION_REASONS)."""

    record: AttributionRecord
    reasons: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"record": _record_dict(self.record), "reasons": list(self.reasons)}


def screen_record(record: AttributionRecord, min_confidence: float = 0.5) -> tuple[str, ...]:
    """The content reasons `record` is unsupported (empty when it earns credit), in REJECTION_REASONS order."""
    reasons = []
    if not record.deficit:
        reasons.append("no_deficit")
    if not isinstance(record.evidence, str) or not record.evidence.strip():
        reasons.append("no_evidence")
    if float(record.confidence) < min_confidence:
        reasons.append("low_confidence")
    if record.cause != "policy":
        reasons.append(f"cause_{record.cause}")
    return tuple(reasons)


@dataclass(frozen=True)
class AttributionResult:
    """What attribution found on one cohort.

    diagnosed: ids of the trajectories attributed, in order (the cohort).
    candidates: trajectory id -> candidate capability ids C_i given to the attributor.
    accepted: supported, confident, policy-caused deficit records.
    rejected: every other record, with its reasons.
    unattributed: diagnosed trajectories with no accepted record and no record
        blaming the partner or the scenario: failures the library does not cover
        (material for controlled expansion).
    external: diagnosed trajectories with no accepted record where some record
        blames the partner or the scenario (D.3: no agent-side credit).
    """

    diagnosed: tuple[str, ...]
    candidates: Mapping[str, tuple[str, ...]]
    accepted: tuple[AttributionRecord, ...]
    rejected: tuple[RejectedRecord, ...]
    unattributed: tuple[str, ...]
    external: tuple[str, ...]

    @property
    def n_diagnosed(self) -> int:
        return len(self.diagnosed)

    def rejection_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(REJECTION_REASONS, 0)
        for rejected in self.rejected:
            for reason in rejected.reasons:
                counts[reason] += 1
        return counts

    def to_dict(self) -> dict:
        return {
            "diagnosed": list(self.diagnosed),
            "candidates": {tid: list(ids) for tid, ids in self.candidates.items()},
            "accepted": [_record_dict(r) for r in self.accepted],
            "rejected": [r.to_dict() for r in self.rejected],
            "unattributed": list(self.unattributed),
            "external": list(self.external),
        }


def attribute(
    trajectories: Sequence[Trajectory],
    candidates,
    attributor: Attributor,
    *,
    retrieve: Retriever | None = None,
    min_confidence: float = 0.5,
) -> AttributionResult:
    """Runs `attributor` on each trajectory (the cohort) and screens its records.

    candidates: the candidate capabilities, a CapabilityLibrary (its available
        entries) or a sequence of RubricSpec.
    retrieve: optional; picks C_i for each trajectory as a subset of the
        candidate ids (default: every candidate). An unknown id is a ValueError.
    min_confidence: records below it are rejected ("low_confidence").

    A trajectory whose episode its partner ended (Trajectory.partner_failure = reason, see
    rwcore.trainer.envs.base) is not sent to the attributor: each candidate gets a record with cause
    "partner" and the reason as evidence, so it is rejected (cause_partner) and the trajectory is external.
    """
    trajectories = check_trajectories(trajectories, need_ids=True, finite_outcomes=True)
    min_confidence = check_unit(min_confidence, "min_confidence")
    if isinstance(candidates, CapabilityLibrary):
        specs = candidates.rubrics()
    else:
        if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence):
            raise ValueError("candidates must be a CapabilityLibrary or a sequence of RubricSpec")
        specs = list(candidates)
        for j, spec in enumerate(specs):
            if not isinstance(spec, RubricSpec):
                raise ValueError(f"candidates[{j}] must be a RubricSpec, got {type(spec).__name__}")
    by_id = {spec.rubric_id: spec for spec in specs}
    if len(by_id) != len(specs):
        raise ValueError("candidates holds a capability id twice")
    if not isinstance(attributor, Attributor):
        raise ValueError("attributor must implement rwcore.types.Attributor (an attribute method)")
    if retrieve is not None and not callable(retrieve):
        raise ValueError("retrieve must be a callable (trajectory, candidates) -> capability ids")

    accepted: list[AttributionRecord] = []
    rejected: list[RejectedRecord] = []
    chosen: dict[str, tuple[str, ...]] = {}
    unattributed: list[str] = []
    external: list[str] = []
    for _i, trajectory in enumerate(trajectories):
        tid = trajectory.trajectory_id
        if retrieve is None:
            ids = tuple(by_id)
        else:
            picked = retrieve(trajectory, specs)
            if isinstance(picked, (str, bytes)) or not isinstance(picked, Sequence):
                raise ValueError(f"retrieve must return a sequence of capability ids, got {type(picked).__name__}")
            ids = tuple(dict.fromkeys(picked))
            for cid in ids:
                if cid not in by_id:
                    raise ValueError(f"retrieve returned {cid!r} for trajectory {tid!r}, which is not a candidate")
        chosen[tid] = ids
        failure = trajectory.partner_failure
        if failure:
            # the partner ended the episode (timeout, garbage reply): the failure is the partner's, whatever
            # the candidates; the attributor is not asked (D.3: no agent-side credit)
            records = [AttributionRecord(tid, cid, True, 1.0, f"partner failure: {failure}", "partner") for cid in ids]
            if not ids:
                external.append(tid)
                continue
        else:
            records = attributor.attribute(trajectory, [by_id[cid] for cid in ids]) if ids else []
        if isinstance(records, (str, bytes)) or not isinstance(records, Sequence):
            raise ValueError(
                f"attributor.attribute must return a list of AttributionRecord, got {type(records).__name__}"
            )
        seen: set[str] = set()
        credited = False
        blamed_outside = False
        allowed = set(ids)
        for record in records:
            if not isinstance(record, AttributionRecord):
                raise ValueError(
                    f"attributor.attribute returned {type(record).__name__} for trajectory {tid!r}, not an "
                    "AttributionRecord"
                )
            reasons = list(screen_record(record, min_confidence))
            if record.trajectory_id != tid:
                reasons.append("wrong_trajectory")
            if record.capability_id not in allowed:
                reasons.append("not_candidate")
            if record.capability_id in seen:
                reasons.append("duplicate")
            if record.trajectory_id == tid and record.cause in ("partner", "scenario"):
                blamed_outside = True
            if reasons:
                rejected.append(RejectedRecord(record, tuple(sorted(set(reasons), key=REJECTION_REASONS.index))))
            else:
                accepted.append(record)
                credited = True
            if record.trajectory_id == tid and record.capability_id in allowed:
                seen.add(record.capability_id)
        if not credited:
            (external if blamed_outside else unattributed).append(tid)
    return AttributionResult(
        diagnosed=tuple(t.trajectory_id for t in trajectories),
        candidates=chosen,
        accepted=tuple(accepted),
        rejected=tuple(rejected),
        unattributed=tuple(unattributed),
        external=tuple(external),
    )


@dataclass(frozen=True)
class FailureMode:
    """One capability's aggregated attribution on a cohort.

    support: distinct trajectories with an accepted record for it.
    frequency: support / cohort size.
    candidates: diagnosed trajectories it was a candidate for (in C_i), less those whose record for it
        blamed the partner or the scenario (they say nothing about the policy's capability).
    rate: support / candidates, the deficit rate where it applies.
    mean_confidence: mean c over those records.
    trajectory_ids: the supporting trajectories, in cohort order.
    evidence: up to `max_examples` (trajectory id, evidence) examples.
    recurrent: support >= min_support.
    """

    capability_id: str
    support: int
    frequency: float
    mean_confidence: float
    trajectory_ids: tuple[str, ...]
    evidence: tuple[tuple[str, str], ...]
    recurrent: bool
    candidates: int = 0
    rate: float = 0.0

    def summary(self) -> dict:
        """The JSON-safe numbers a reward history keeps."""
        return {
            "capability_id": self.capability_id,
            "support": self.support,
            "frequency": self.frequency,
            "candidates": self.candidates,
            "rate": self.rate,
            "mean_confidence": self.mean_confidence,
        }


@dataclass(frozen=True)
class AggregatedFailures:
    """G = Aggregate({a_{i,d}}): recurrent modes ranked, plus the ones below the support threshold.

    modes: recurrent failure modes, ranked (see `rank_by`).
    below_support: capabilities with accepted records but support < min_support, same order.
    cohort_size: trajectories diagnosed.
    rank_by: "rate" (deficit rate, then support, then mean confidence, then id) or "support" (support,
        then mean confidence, then id).
    """

    modes: tuple[FailureMode, ...]
    below_support: tuple[FailureMode, ...]
    cohort_size: int
    min_support: int
    rank_by: str = "rate"

    def ranking(self) -> tuple[str, ...]:
        return tuple(mode.capability_id for mode in self.modes)

    def frequencies(self) -> dict[str, float]:
        """Capability -> attributed failure frequency in the cohort (every capability with an accepted record)."""
        return {m.capability_id: m.frequency for m in self.modes + self.below_support}

    def get(self, capability_id: str) -> FailureMode | None:
        for mode in self.modes + self.below_support:
            if mode.capability_id == capability_id:
                return mode
        return None


RANK_BY: tuple[str, ...] = ("rate", "support")
"""How `aggregate` ranks recurrent failure modes (see the module docstring)."""


def _rank_key(mode: FailureMode, rank_by: str):
    if rank_by == "rate":
        return (-mode.rate, -mode.support, -mode.mean_confidence, mode.capability_id)
    return (-mode.support, -mode.mean_confidence, mode.capability_id)


def aggregate(
    result: AttributionResult, *, min_support: int = 3, max_examples: int = 3, rank_by: str = "rate"
) -> AggregatedFailures:
    """Aggregates accepted records per capability; recurrent when support >= min_support.

    rank_by: "rate" [default] ranks the modes by deficit rate among the trajectories each capability was
        a candidate for, then support; "support" by support alone (the number of trajectories blamed).
    """
    if not isinstance(result, AttributionResult):
        raise ValueError(f"result must be an AttributionResult, got {type(result).__name__}")
    min_support = check_int(min_support, "min_support", low=1)
    max_examples = check_int(max_examples, "max_examples", low=0)
    if rank_by not in RANK_BY:
        raise ValueError(f"rank_by must be one of {RANK_BY}, got {rank_by!r}")
    order = {tid: i for i, tid in enumerate(result.diagnosed)}
    per_capability: dict[str, list[AttributionRecord]] = {}
    for record in result.accepted:
        per_capability.setdefault(record.capability_id, []).append(record)
    # the trajectories each capability could have been blamed on: candidates, less external blame
    external = {
        (r.record.trajectory_id, r.record.capability_id)
        for r in result.rejected
        if {"cause_partner", "cause_scenario"} & set(r.reasons)
    }
    candidates: dict[str, int] = {}
    for tid in result.diagnosed:
        for cid in result.candidates.get(tid, ()):
            if (tid, cid) not in external:
                candidates[cid] = candidates.get(cid, 0) + 1
    n = result.n_diagnosed
    modes = []
    for cid, records in per_capability.items():
        records = sorted(records, key=lambda r: order.get(r.trajectory_id, len(order)))
        tids = tuple(dict.fromkeys(r.trajectory_id for r in records))
        # an accepted record names a candidate and blames the policy, so candidates >= support; the max
        # only guards an AttributionResult assembled by hand
        eligible = max(candidates.get(cid, 0), len(tids))
        modes.append(
            FailureMode(
                capability_id=cid,
                support=len(tids),
                frequency=len(tids) / n if n else 0.0,
                mean_confidence=float(np.mean([float(r.confidence) for r in records])),
                trajectory_ids=tids,
                evidence=tuple((r.trajectory_id, r.evidence) for r in records[:max_examples]),
                recurrent=len(tids) >= min_support,
                candidates=eligible,
                rate=len(tids) / eligible,
            )
        )
    modes.sort(key=lambda mode: _rank_key(mode, rank_by))
    return AggregatedFailures(
        modes=tuple(m for m in modes if m.recurrent),
        below_support=tuple(m for m in modes if not m.recurrent),
        cohort_size=n,
        min_support=min_support,
        rank_by=rank_by,
    )


def _record_dict(record: AttributionRecord) -> dict:
    return {
        "trajectory_id": record.trajectory_id,
        "capability_id": record.capability_id,
        "deficit": bool(record.deficit),
        "confidence": float(record.confidence),
        "evidence": record.evidence,
        "cause": record.cause,
    }
