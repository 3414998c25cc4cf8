"""Controlled capability expansion (RewardWeaver §2, §2.5, appendix D.2).

Recurrent low-outcome failures that the library does not cover become
candidate capabilities, and candidates enter the library only through the same
source-disjoint acceptance test as every other capability.

A failure is *uncovered* when either
- attribution found no supported capability for the trajectory and did not
  blame the partner or the scenario (`AttributionResult.unattributed`), or
- a judge reported a behaviour no rubric covers (`JudgeReport.uncovered`).
It is *recurrent* when it occurs on at least `min_recurrence` distinct cohort
trajectories: all unattributed trajectories together form one trigger; each
uncovered-behaviour description (compared case- and whitespace-insensitively)
forms its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rwcore.judged import JudgedBatch
from rwcore.rewardweaver.admission import LabelledCase, acceptance_test, evaluator_name, rejected_report
from rwcore.rewardweaver.attribution import AttributionResult
from rwcore.rewardweaver.capability import AdmissionReport, AdmittedCapability, Capability
from rwcore.rewardweaver.library import CapabilityLibrary
from rwcore.types import CapabilityProposer, Judge, JudgeReport, RubricSpec, Trajectory
from rwcore.validation import check_int, check_trajectories

CaseProvider = Callable[[Capability], Sequence[LabelledCase]]
"""Labelled acceptance cases for a candidate: a sequence of LabelledCase (partitioned by
source with the library's config) or a pair (dev_cases, heldout_cases)."""


@dataclass(frozen=True)
class ExpansionTrigger:
    """A recurrent uncovered failure: kind "unattributed" or "uncovered_behaviour", what, and where."""

    kind: str
    description: str
    trajectory_ids: tuple[str, ...]


@dataclass(frozen=True)
class ExpansionResult:
    """triggers found, candidates proposed, one admission report per candidate, and the admitted entries."""

    triggers: tuple[ExpansionTrigger, ...] = ()
    proposed: tuple[RubricSpec, ...] = ()
    reports: tuple[AdmissionReport, ...] = ()
    entries: tuple[AdmittedCapability, ...] = ()

    @property
    def admitted(self) -> tuple[str, ...]:
        return tuple(entry.capability_id for entry in self.entries)

    def summary(self) -> dict:
        return {
            "triggers": [
                {"kind": t.kind, "description": t.description, "trajectories": len(t.trajectory_ids)}
                for t in self.triggers
            ],
            "proposed": [spec.rubric_id for spec in self.proposed],
            "admitted": list(self.admitted),
            "rejected": {r.capability_id: list(r.reasons) for r in self.reports if not r.admitted},
        }


def _normalize(text: str) -> str:
    return " ".join(text.casefold().split())


def find_expansion_triggers(
    cohort: Sequence[Trajectory],
    *,
    attribution: AttributionResult | None = None,
    reports: Sequence[JudgeReport] | None = None,
    min_recurrence: int = 3,
) -> list[ExpansionTrigger]:
    """Recurrent uncovered failures among the `cohort` (low-outcome trajectories).

    attribution: the cohort's attribution (its `unattributed` trajectories count).
    reports: judge reports or a JudgedBatch; only the cohort's are read, for `uncovered`.
    """
    cohort = check_trajectories(cohort, "cohort", need_ids=True, finite_outcomes=True)
    min_recurrence = check_int(min_recurrence, "min_recurrence", low=1)
    ids = [t.trajectory_id for t in cohort]
    members = set(ids)
    triggers = []
    if attribution is not None:
        if not isinstance(attribution, AttributionResult):
            raise ValueError(f"attribution must be an AttributionResult, got {type(attribution).__name__}")
        unattributed = tuple(tid for tid in attribution.unattributed if tid in members)
        if len(unattributed) >= min_recurrence:
            triggers.append(
                ExpansionTrigger(
                    "unattributed", "low-outcome failures with no supported capability in the library", unattributed
                )
            )
    if reports is not None:
        seen_text: dict[str, str] = {}
        where: dict[str, list[str]] = {}
        order = {tid: i for i, tid in enumerate(ids)}
        for trajectory_id, notes in _uncovered_notes(reports):
            if trajectory_id not in members:
                continue
            for text in notes:
                if not isinstance(text, str) or not text.strip():
                    continue
                key = _normalize(text)
                seen_text.setdefault(key, text.strip())
                bucket = where.setdefault(key, [])
                if trajectory_id not in bucket:
                    bucket.append(trajectory_id)
        for key, tids in where.items():
            if len(tids) >= min_recurrence:
                tids.sort(key=order.__getitem__)
                triggers.append(ExpansionTrigger("uncovered_behaviour", seen_text[key], tuple(tids)))
    return triggers


def _uncovered_notes(reports) -> list[tuple[str, tuple[str, ...]]]:
    """(trajectory id, uncovered-behaviour notes) of judge reports or a JudgedBatch."""
    if isinstance(reports, JudgedBatch):
        return list(zip(reports.trajectory_ids, reports.uncovered))
    if isinstance(reports, (str, bytes)) or not isinstance(reports, Sequence):
        raise ValueError("reports must be a sequence of JudgeReport or a JudgedBatch")
    out = []
    for i, report in enumerate(reports):
        if not isinstance(report, JudgeReport):
            raise ValueError(f"reports[{i}] must be a JudgeReport, got {type(report).__name__}")
        out.append((report.trajectory_id, tuple(report.uncovered)))
    return out


def _cases(provider: CaseProvider, candidate: Capability):
    cases = provider(candidate)
    if (
        isinstance(cases, tuple)
        and len(cases) == 2
        and all(isinstance(part, Sequence) for part in cases)
        and not any(isinstance(part, LabelledCase) for part in cases)
    ):
        return None, list(cases[0]), list(cases[1])
    return cases, None, None


def expand_library(
    library: CapabilityLibrary,
    proposer: CapabilityProposer,
    triggers: Sequence[ExpansionTrigger],
    cohort: Sequence[Trajectory],
    evaluator: Judge,
    acceptance_cases: CaseProvider,
    *,
    max_new: int = 2,
    evaluator_id: str | None = None,
    commit: bool = True,
    reviser=None,
    max_revisions: int = 1,
) -> ExpansionResult:
    """Proposes capabilities for `triggers` and admits those that pass acceptance testing.

    The proposer sees the triggering trajectories (from `cohort`, deduplicated,
    in cohort order) and the library's rubrics, once, for at most `max_new`
    candidates (extra proposals are ignored). A candidate whose id the library
    already holds, that repeats an earlier proposal or is malformed, is rejected
    without a test. Every other candidate runs `acceptance_test` with the
    library's config on `acceptance_cases(candidate)` (revised on its development partition by
    `reviser`, when given, before a re-test). With `commit` the admitted
    entries are added to the library together, after every test ran; otherwise
    they are only returned (`result.entries`).
    """
    if not isinstance(library, CapabilityLibrary):
        raise ValueError(f"library must be a CapabilityLibrary, got {type(library).__name__}")
    max_new = check_int(max_new, "max_new", low=0)
    triggers = tuple(triggers)
    if not triggers or max_new == 0:
        return ExpansionResult(triggers=triggers)
    for i, trigger in enumerate(triggers):
        if not isinstance(trigger, ExpansionTrigger):
            raise ValueError(f"triggers[{i}] must be an ExpansionTrigger, got {type(trigger).__name__}")
    if not isinstance(proposer, CapabilityProposer):
        raise ValueError("proposer must implement rwcore.types.CapabilityProposer (propose_capabilities)")
    if not callable(acceptance_cases):
        raise ValueError("acceptance_cases must be a callable candidate -> labelled cases")
    cohort = check_trajectories(cohort, "cohort", need_ids=True, finite_outcomes=True)
    by_id = {t.trajectory_id: t for t in cohort}
    wanted = {tid for trigger in triggers for tid in trigger.trajectory_ids}
    unknown = wanted - set(by_id)
    if unknown:
        raise ValueError(f"triggers name trajectories {sorted(unknown)[:5]} that are not in cohort")
    failures = [t for t in cohort if t.trajectory_id in wanted]
    proposals = proposer.propose_capabilities(failures, library.rubrics(), max_new)
    if isinstance(proposals, (str, bytes)) or not isinstance(proposals, Sequence):
        raise ValueError(f"proposer must return a list of RubricSpec, got {type(proposals).__name__}")
    proposals = list(proposals)[:max_new]
    name = evaluator_name(evaluator) if evaluator_id is None else evaluator_id
    reports: list[AdmissionReport] = []
    entries: list[AdmittedCapability] = []
    taken: set[str] = set()
    for j, spec in enumerate(proposals):
        if not isinstance(spec, RubricSpec):
            raise ValueError(f"proposer returned {type(spec).__name__} at position {j}, not a RubricSpec")
        try:
            candidate = Capability.from_rubric(spec)
        except ValueError as error:
            reports.append(rejected_report(str(spec.rubric_id), f"malformed candidate: {error}", name, library.config))
            continue
        cid = candidate.capability_id
        if cid in library:
            reports.append(
                rejected_report(
                    cid,
                    "capability id already in the library (admitted entries are never replaced; propose a new id)",
                    name,
                    library.config,
                )
            )
            continue
        if cid in taken:
            reports.append(rejected_report(cid, "capability id proposed twice", name, library.config))
            continue
        taken.add(cid)
        cases, dev, heldout = _cases(acceptance_cases, candidate)
        if not (cases if cases is not None else heldout):
            reports.append(rejected_report(cid, "no labelled cases to test its evaluator on", name, library.config))
            continue
        report, entry = acceptance_test(
            candidate,
            evaluator,
            cases,
            dev_cases=dev,
            heldout_cases=heldout,
            config=library.config,
            evaluator_id=name,
            reviser=reviser,
            max_revisions=max_revisions,
        )
        reports.append(report)
        if entry is not None:
            entries.append(entry)
    if commit and entries:
        library.add_admitted(entries)
    return ExpansionResult(triggers=triggers, proposed=tuple(proposals), reports=tuple(reports), entries=tuple(entries))
