"""Source-disjoint acceptance testing of a candidate capability (RewardWeaver §2.2, A.3, D.2).

Labelled cases are split by source into a development and a held-out
partition, no source in both; the evaluator (a `rwcore.types.Judge`) is run on
the held-out partition alone, and the candidate is admitted when

- its validity rate (agreement with the reference labels, see
  `AdmissionReport`) reaches `min_validity`,
- it gave a PASS/FAIL verdict on at least `min_applicable` held-out cases,
- it is not collapsed: among applicable held-out cases it neither passes nor
  fails (nearly) everything (paper D.2: applicable to 23, all 23 pass),
- the held-out reference labels hold both passes and fails (a contrastive set),
- it failed (INVALID) on at most `max_invalid_rate` of the held-out cases.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from rwcore.rewardweaver.capability import AdmissionReport, AdmittedCapability, Capability, _exact_fields
from rwcore.types import EvaluatorReviser, Judge, JudgeReport, RubricSpec, Trajectory
from rwcore.validation import check_int, check_str, check_unit
from rwcore.verdict import Verdict


@dataclass(frozen=True)
class LabelledCase:
    """One acceptance-test case: a trajectory, its reference label and where it came from.

    label: the verdict a correct evaluator gives (True/PASS, False/FAIL, or NA when the
        capability does not apply); stored as a Verdict.
    source: the case's origin (scenario, task family, run...); partitions never share a source.
    """

    trajectory: Trajectory
    label: Verdict
    source: str

    def __post_init__(self) -> None:
        if not isinstance(self.trajectory, Trajectory):
            raise ValueError(f"trajectory must be a Trajectory, got {type(self.trajectory).__name__}")
        label = self.label
        if isinstance(label, (bool, np.bool_)):
            label = Verdict.PASS if label else Verdict.FAIL
        if not isinstance(label, Verdict) or label == Verdict.INVALID:
            raise ValueError(f"label must be True, False, Verdict.PASS, Verdict.FAIL or Verdict.NA, got {self.label!r}")
        object.__setattr__(self, "label", Verdict(label))
        check_str(self.source, "source")


@dataclass(frozen=True)
class AdmissionConfig:
    """Acceptance criteria (defaults in brackets in the field docs).

    min_validity: validity rate needed on the held-out partition [0.8].
    min_applicable: held-out cases with a PASS/FAIL verdict needed [10].
    collapse_tolerance: collapsed when the applicable pass rate is <= tol or >= 1 - tol [0.05].
    max_invalid_rate: largest tolerated share of INVALID held-out judgments [0.2].
    min_each_label: held-out reference PASS and FAIL labels needed, each [1].
    heldout_fraction: share of sources put in the held-out partition when it is chosen automatically [0.5].
    seed: seeds the automatic source partition [0].
    """

    min_validity: float = 0.8
    min_applicable: int = 10
    collapse_tolerance: float = 0.05
    max_invalid_rate: float = 0.2
    min_each_label: int = 1
    heldout_fraction: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        check_unit(self.min_validity, "min_validity")
        check_int(self.min_applicable, "min_applicable", low=1)
        tolerance = check_unit(self.collapse_tolerance, "collapse_tolerance")
        if tolerance >= 0.5:
            raise ValueError(f"collapse_tolerance must be below 0.5, got {tolerance}")
        check_unit(self.max_invalid_rate, "max_invalid_rate")
        check_int(self.min_each_label, "min_each_label", low=0)
        fraction = check_unit(self.heldout_fraction, "heldout_fraction")
        if fraction == 0.0:
            raise ValueError("heldout_fraction must be above 0")
        check_int(self.seed, "seed", low=0)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping, argument: str = "config") -> AdmissionConfig:
        return cls(**_exact_fields(cls, data, argument))


def _check_cases(cases, argument: str) -> list[LabelledCase]:
    if isinstance(cases, (str, bytes)) or not isinstance(cases, Sequence):
        raise ValueError(f"{argument} must be a sequence of LabelledCase, got {type(cases).__name__}")
    out = list(cases)
    for i, case in enumerate(out):
        if not isinstance(case, LabelledCase):
            raise ValueError(f"{argument}[{i}] must be a LabelledCase, got {type(case).__name__}")
    return out


def check_source_disjoint(dev_cases: Sequence[LabelledCase], heldout_cases: Sequence[LabelledCase]) -> None:
    """ValueError when a source occurs in both partitions."""
    shared = {c.source for c in dev_cases} & {c.source for c in heldout_cases}
    if shared:
        raise ValueError(
            f"dev_cases and heldout_cases share source(s) {sorted(shared)}: acceptance testing must be source-disjoint"
        )


def partition_by_source(
    cases: Sequence[LabelledCase],
    heldout_sources: Sequence[str] | None = None,
    *,
    heldout_fraction: float = 0.5,
    seed: int = 0,
) -> tuple[list[LabelledCase], list[LabelledCase]]:
    """Splits `cases` into (dev, held-out) by source; no source lands in both.

    With `heldout_sources`, exactly those sources are held out (each must occur
    in `cases`). Otherwise ceil(heldout_fraction * #sources) sources, drawn by a
    generator seeded with `seed` from the sorted source list, are held out.
    """
    cases = _check_cases(cases, "cases")
    sources = sorted({c.source for c in cases})
    if not sources:
        raise ValueError("cases must not be empty")
    if heldout_sources is not None:
        if isinstance(heldout_sources, str) or not isinstance(heldout_sources, (Sequence, set, frozenset)):
            raise ValueError("heldout_sources must be a collection of source ids")
        held = set(heldout_sources)
        unknown = held - set(sources)
        if unknown:
            raise ValueError(f"heldout_sources lists source(s) {sorted(unknown)} that no case has")
        if not held:
            raise ValueError("heldout_sources must not be empty")
    else:
        fraction = check_unit(heldout_fraction, "heldout_fraction")
        count = min(len(sources), max(1, math.ceil(fraction * len(sources))))
        order = np.random.default_rng(check_int(seed, "seed", low=0)).permutation(len(sources))
        held = {sources[j] for j in order[:count]}
    dev = [c for c in cases if c.source not in held]
    heldout = [c for c in cases if c.source in held]
    return dev, heldout


# -- acceptance test ----------------------------------------------------------


def evaluator_name(evaluator) -> str:
    """The id stored with an admitted capability.

    An `evaluator_id` or `name` string attribute if the judge has one, else
    "<class>:<model>" when it has a `model` string (e.g. OpenAIJudge), else the class path.
    """
    for attribute in ("evaluator_id", "name"):
        value = getattr(evaluator, attribute, None)
        if isinstance(value, str) and value:
            return value
    kind = type(evaluator)
    model = getattr(evaluator, "model", None)
    if isinstance(model, str) and model:
        return f"{kind.__name__}:{model}"
    return f"{kind.__module__}.{kind.__qualname__}"


def run_judge(
    judge, trajectories: Sequence[Trajectory], rubrics: Sequence[RubricSpec], argument: str
) -> list[JudgeReport]:
    """Calls `judge.evaluate` and checks it returned one JudgeReport per trajectory, in order."""
    if not isinstance(judge, Judge):
        raise ValueError(f"{argument} must implement rwcore.types.Judge (an evaluate method)")
    reports = judge.evaluate(list(trajectories), list(rubrics))
    if isinstance(reports, (str, bytes)) or not isinstance(reports, Sequence) or len(reports) != len(trajectories):
        got = len(reports) if isinstance(reports, Sequence) else type(reports).__name__
        raise ValueError(
            f"{argument}.evaluate must return one JudgeReport per trajectory ({len(trajectories)}), got {got}"
        )
    for i, (report, trajectory) in enumerate(zip(reports, trajectories)):
        if not isinstance(report, JudgeReport) or not isinstance(report.judgments, Mapping):
            raise ValueError(f"{argument}.evaluate returned {type(report).__name__} at position {i}, not a JudgeReport")
        if trajectory.trajectory_id and report.trajectory_id and report.trajectory_id != trajectory.trajectory_id:
            raise ValueError(
                f"{argument}.evaluate returned the report of {report.trajectory_id!r} at the position of "
                f"{trajectory.trajectory_id!r}"
            )
    return list(reports)


def acceptance_test(
    candidate: Capability | RubricSpec,
    evaluator: Judge,
    cases: Sequence[LabelledCase] | None = None,
    *,
    dev_cases: Sequence[LabelledCase] | None = None,
    heldout_cases: Sequence[LabelledCase] | None = None,
    heldout_sources: Sequence[str] | None = None,
    config: AdmissionConfig | None = None,
    evaluator_id: str | None = None,
    reviser: EvaluatorReviser | None = None,
    max_revisions: int = 1,
) -> tuple[AdmissionReport, AdmittedCapability | None]:
    """Source-disjoint acceptance test of one candidate; returns (report, entry or None).

    Give either `cases` (partitioned by `partition_by_source`, using
    `heldout_sources` or the config's fraction and seed) or `heldout_cases`
    (and optionally `dev_cases`, which must not share a source with them).
    Acceptance is decided on the held-out partition alone. Pure: nothing is stored.

    reviser: when the held-out test rejects the candidate, the evaluator is run on the
        development partition and `reviser.revise_evaluator(rubric, disagreements)` writes new
        evaluator instructions from the development cases it got wrong (the held-out cases are
        never shown to it); the revised candidate (same definition, new evaluator_prompt) is then
        re-tested on the held-out partition - at most `max_revisions` times, and never when the
        development partition is empty or holds no disagreement. The returned report is the last
        test's; its reasons say how many revisions were made.
    """
    if reviser is not None and not isinstance(reviser, EvaluatorReviser):
        raise ValueError("reviser must implement rwcore.types.EvaluatorReviser (revise_evaluator)")
    max_revisions = check_int(max_revisions, "max_revisions", low=0)
    report, entry, dev, heldout, candidate, name = _accept(
        candidate, evaluator, cases, dev_cases, heldout_cases, heldout_sources, config, evaluator_id
    )
    revisions = 0
    while entry is None and reviser is not None and revisions < max_revisions and dev:
        rubric = candidate.rubric
        dev_reports = run_judge(evaluator, [c.trajectory for c in dev], [rubric], "evaluator")
        disagreements = []
        for case, dev_report in zip(dev, dev_reports):
            judgment = dev_report.judgments.get(rubric.rubric_id)
            verdict = Verdict.INVALID if judgment is None else judgment.verdict
            if verdict != case.label:
                disagreements.append((case.trajectory, case.label, verdict))
        if not disagreements:
            break
        try:
            prompt = reviser.revise_evaluator(rubric, disagreements)
        except Exception as error:  # a failed revision (an LLM's) leaves the rejection standing
            report = _with(
                report,
                reasons=report.reasons
                + (f"evaluator revision failed ({type(error).__name__}: {error}); candidate left as tested",),
            )
            break
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(
                f"reviser.revise_evaluator returned {prompt!r} for {rubric.rubric_id!r}; "
                "evaluator instructions must be non-empty text"
            )
        revisions += 1
        candidate = replace(candidate, evaluator_prompt=prompt.strip())
        report, entry, *_ = _accept(candidate, evaluator, None, dev, heldout, None, config, name)
    if revisions:
        note = (
            f"after {revisions} evaluator revision(s) from {len(dev)} development case(s); "
            "the held-out partition decided"
        )
        report = _with(report, reasons=report.reasons + (note,))
        if entry is not None:
            entry = AdmittedCapability.create(candidate, name, report)
    return report, entry


def _accept(candidate, evaluator, cases, dev_cases, heldout_cases, heldout_sources, config, evaluator_id):
    """One held-out test: (report, entry or None, dev, heldout, candidate, evaluator name)."""
    config = config if config is not None else AdmissionConfig()
    if not isinstance(config, AdmissionConfig):
        raise ValueError(f"config must be an AdmissionConfig, got {type(config).__name__}")
    if isinstance(candidate, RubricSpec):
        candidate = Capability.from_rubric(candidate)
    if not isinstance(candidate, Capability):
        raise ValueError(f"candidate must be a Capability or RubricSpec, got {type(candidate).__name__}")
    if cases is not None:
        if dev_cases is not None or heldout_cases is not None:
            raise ValueError("give either cases or dev_cases/heldout_cases, not both")
        dev, heldout = partition_by_source(
            cases, heldout_sources, heldout_fraction=config.heldout_fraction, seed=config.seed
        )
    else:
        if heldout_cases is None:
            raise ValueError("cases or heldout_cases must be given")
        if heldout_sources is not None:
            raise ValueError("heldout_sources only applies together with cases")
        heldout = _check_cases(heldout_cases, "heldout_cases")
        dev = _check_cases(dev_cases, "dev_cases") if dev_cases is not None else []
        check_source_disjoint(dev, heldout)
    if not heldout:
        raise ValueError("heldout_cases must not be empty")
    name = evaluator_name(evaluator) if evaluator_id is None else check_str(evaluator_id, "evaluator_id")

    rubric = candidate.rubric
    reports = run_judge(evaluator, [c.trajectory for c in heldout], [rubric], "evaluator")
    counts = dict.fromkeys(("valid", "invalid", "na", "pass", "fail", "agree"), 0)
    scores = []
    for i, (case, report) in enumerate(zip(heldout, reports)):
        judgment = report.judgments.get(rubric.rubric_id)
        verdict = Verdict.INVALID if judgment is None else judgment.verdict
        if not isinstance(verdict, Verdict):
            raise ValueError(f"evaluator returned verdict {verdict!r} (not a rwcore.Verdict) for held-out case {i}")
        if verdict == Verdict.INVALID:
            counts["invalid"] += 1
            continue
        counts["valid"] += 1
        counts["agree"] += int(verdict == case.label)
        if verdict == Verdict.NA:
            counts["na"] += 1
            continue
        counts["pass" if verdict == Verdict.PASS else "fail"] += 1
        value = judgment.value
        if value is None or not math.isfinite(float(value)) or not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"evaluator returned score {value!r} outside [0, 1] for held-out case {i}")
        scores.append(float(value))

    labels = [c.label for c in heldout]
    n_applicable = counts["pass"] + counts["fail"]
    validity = counts["agree"] / counts["valid"] if counts["valid"] else None
    pass_rate = counts["pass"] / n_applicable if n_applicable else None
    invalid_rate = counts["invalid"] / len(heldout)
    report = AdmissionReport(
        capability_id=candidate.capability_id,
        admitted=False,
        reasons=(),
        evaluator=name,
        dev_sources=tuple(sorted({c.source for c in dev})),
        heldout_sources=tuple(sorted({c.source for c in heldout})),
        n_dev=len(dev),
        n_heldout=len(heldout),
        n_valid=counts["valid"],
        n_invalid=counts["invalid"],
        n_na=counts["na"],
        n_pass=counts["pass"],
        n_fail=counts["fail"],
        n_agree=counts["agree"],
        n_reference_pass=sum(label == Verdict.PASS for label in labels),
        n_reference_fail=sum(label == Verdict.FAIL for label in labels),
        n_reference_na=sum(label == Verdict.NA for label in labels),
        validity_rate=validity,
        applicable_pass_rate=pass_rate,
        invalid_rate=invalid_rate,
        score_std=float(np.std(scores, ddof=1)) if len(scores) >= 2 else None,
        min_validity=config.min_validity,
        min_applicable=config.min_applicable,
        collapse_tolerance=config.collapse_tolerance,
        max_invalid_rate=config.max_invalid_rate,
        min_each_label=config.min_each_label,
    )
    problems = []
    if invalid_rate > config.max_invalid_rate:
        problems.append(
            f"evaluator failed (INVALID) on {counts['invalid']} of {len(heldout)} held-out cases "
            f"({invalid_rate:.3f} > max_invalid_rate {config.max_invalid_rate})"
        )
    if n_applicable < config.min_applicable:
        problems.append(f"too few applicable held-out cases: {n_applicable} < min_applicable {config.min_applicable}")
    if report.n_reference_pass < config.min_each_label or report.n_reference_fail < config.min_each_label:
        problems.append(
            f"held-out set is not contrastive: {report.n_reference_pass} reference PASS and "
            f"{report.n_reference_fail} reference FAIL labels (need {config.min_each_label} of each)"
        )
    if report.collapsed:
        problems.append(
            f"collapsed evaluator: passes {counts['pass']} of {n_applicable} applicable held-out cases "
            f"(pass rate {pass_rate:.3f} within {config.collapse_tolerance} of 0 or 1)"
        )
    if validity is None or validity < config.min_validity:
        shown = "undefined (no valid judgment)" if validity is None else f"{validity:.3f}"
        problems.append(f"validity rate {shown} below min_validity {config.min_validity}")
    if problems:
        return _with(report, reasons=tuple(problems)), None, dev, heldout, candidate, name
    reason = (
        f"admitted: validity {validity:.3f} >= {config.min_validity} on {counts['valid']} valid of "
        f"{len(heldout)} held-out cases from {len(report.heldout_sources)} source(s); applicable pass rate "
        f"{pass_rate:.3f}"
    )
    report = _with(report, admitted=True, reasons=(reason,))
    return report, AdmittedCapability.create(candidate, name, report), dev, heldout, candidate, name


def rejected_report(
    candidate_id: str, reason: str, evaluator: str = "", config: AdmissionConfig | None = None
) -> AdmissionReport:
    """A rejection decided before any test ran (e.g. the id is already taken)."""
    config = config if config is not None else AdmissionConfig()
    return AdmissionReport(
        capability_id=candidate_id,
        admitted=False,
        reasons=(reason,),
        evaluator=evaluator,
        min_validity=config.min_validity,
        min_applicable=config.min_applicable,
        collapse_tolerance=config.collapse_tolerance,
        max_invalid_rate=config.max_invalid_rate,
        min_each_label=config.min_each_label,
    )


def _with(report: AdmissionReport, **changes) -> AdmissionReport:
    return replace(report, **changes)
