"""Controlled expansion: recurrent uncovered failures -> proposals -> the same admission test."""

import pytest
from rewardweaver_fakes import (
    FakeProposer,
    LabelJudge,
    ScriptedAttributor,
    build_library,
    deficit,
    labelled_cases,
    traj,
)

from rwcore.rewardweaver import (
    CapabilityLibrary,
    LabelledCase,
    attribute,
    expand_library,
    find_expansion_triggers,
)
from rwcore.types import JudgeReport, RubricSpec
from rwcore.verdict import Verdict


def cohort_and_attribution(library, n_unattributed=3):
    cohort = [traj(f"u{j}", 0.0) for j in range(n_unattributed)]
    cohort += [
        traj("p1", 0.0, attribution=[deficit("c1", cause="partner")]),
        traj("a1", 0.0, attribution=[deficit("c1")]),
    ]
    return cohort, attribute(cohort, library, ScriptedAttributor())


def test_unattributed_trigger_needs_recurrence():
    library = build_library(("c1", "c2"))
    cohort, result = cohort_and_attribution(library, 3)
    assert result.unattributed == ("u0", "u1", "u2") and result.external == ("p1",)
    (trigger,) = find_expansion_triggers(cohort, attribution=result, min_recurrence=3)
    assert trigger.kind == "unattributed" and trigger.trajectory_ids == ("u0", "u1", "u2")
    assert find_expansion_triggers(cohort, attribution=result, min_recurrence=4) == []


def test_uncovered_behaviour_trigger_normalizes_and_counts_distinct_trajectories():
    cohort = [traj(f"t{j}") for j in range(4)]
    reports = [
        JudgeReport("t0", {}, ("Repeats the same offer",)),
        JudgeReport("t1", {}, ("repeats the   same OFFER", "rare thing")),
        JudgeReport("t1", {}, ("repeats the same offer",)),  # same trajectory twice: counted once
        JudgeReport("t3", {}, ("Repeats the same offer",)),
        JudgeReport("outside", {}, ("rare thing", "rare thing")),  # not in the cohort: ignored
    ]
    triggers = find_expansion_triggers(cohort, reports=reports, min_recurrence=3)
    assert len(triggers) == 1
    assert triggers[0].kind == "uncovered_behaviour" and triggers[0].description == "Repeats the same offer"
    assert triggers[0].trajectory_ids == ("t0", "t1", "t3")
    assert find_expansion_triggers(cohort, reports=reports, min_recurrence=4) == []


def collapsed_cases(cid):
    # The judge (reading metadata) passes everything; references are mixed -> collapsed, low validity.
    return [
        LabelledCase(traj(f"{cid}-{s}-{j}", verdicts={cid: Verdict.PASS}), Verdict.PASS if j % 2 else Verdict.FAIL, s)
        for s in ("a", "b", "c", "d")
        for j in range(8)
    ]


def test_expansion_goes_through_admission():
    library = build_library(("c1", "c2"))
    cohort, result = cohort_and_attribution(library, 3)
    triggers = find_expansion_triggers(cohort, attribution=result, min_recurrence=3)
    proposer = FakeProposer(
        [
            RubricSpec("clarity", "Uses clear language", capability="Expression"),
            RubricSpec("empathy", "Responds to feelings", capability="Relationship"),
            RubricSpec("c1", "a redefinition of c1"),
            RubricSpec("extra", "beyond max_new"),
        ]
    )
    provided = {"clarity": labelled_cases("clarity"), "empathy": collapsed_cases("empathy")}
    out = expand_library(
        library, proposer, triggers, cohort, LabelJudge(), lambda cap: provided[cap.capability_id], max_new=3
    )
    assert proposer.seen == [(["u0", "u1", "u2"], ["c1", "c2"], 3)]
    assert [spec.rubric_id for spec in out.proposed] == ["clarity", "empathy", "c1"]
    reports = {r.capability_id: r for r in out.reports}
    assert reports["clarity"].admitted
    assert not reports["empathy"].admitted and any("collapsed" in r for r in reports["empathy"].reasons)
    assert not reports["c1"].admitted and "already in the library" in reports["c1"].reasons[0]
    assert out.admitted == ("clarity",)
    assert library.ids() == ("c1", "c2", "clarity") and library["clarity"].family == "Expression"
    assert library["c1"].capability.definition == "definition of c1"  # untouched
    assert out.summary()["rejected"].keys() == {"empathy", "c1"}


def test_expansion_uses_the_library_config_and_commit_false():
    state = build_library(("c1",)).state_dict()
    library = CapabilityLibrary.from_state_dict({**state, "config": {**state["config"], "min_applicable": 13}})
    cohort, result = cohort_and_attribution(library, 3)
    triggers = find_expansion_triggers(cohort, attribution=result)
    proposer = FakeProposer([RubricSpec("clarity", "Uses clear language")])
    # labelled_cases: 12 applicable held-out cases < 13 required by this library.
    out = expand_library(library, proposer, triggers, cohort, LabelJudge(), lambda cap: labelled_cases("clarity"))
    assert out.admitted == () and "too few applicable" in out.reports[0].reasons[0]
    library2 = build_library(("c1",))
    out = expand_library(
        library2, proposer, triggers, cohort, LabelJudge(), lambda cap: labelled_cases("clarity"), commit=False
    )
    assert out.admitted == ("clarity",) and "clarity" not in library2


def test_explicit_partitions_from_provider_and_overlap_error():
    library = build_library(("c1",))
    cohort, result = cohort_and_attribution(library, 3)
    triggers = find_expansion_triggers(cohort, attribution=result)
    proposer = FakeProposer([RubricSpec("clarity", "Uses clear language")])
    cases = labelled_cases("clarity")
    dev = [c for c in cases if c.source in ("s1", "s2")]
    held = [c for c in cases if c.source in ("s3", "s4")]
    out = expand_library(library, proposer, triggers, cohort, LabelJudge(), lambda cap: (dev, held))
    assert out.reports[0].heldout_sources == ("s3", "s4") and out.admitted == ("clarity",)
    library2 = build_library(("c1",))
    with pytest.raises(ValueError, match="source-disjoint"):
        expand_library(library2, proposer, triggers, cohort, LabelJudge(), lambda cap: (cases, held))
    assert "clarity" not in library2


def test_no_trigger_no_proposal():
    library = build_library(("c1",))
    proposer = FakeProposer([RubricSpec("x", "y")])
    out = expand_library(library, proposer, [], [], LabelJudge(), lambda cap: [])
    assert out.proposed == () and proposer.seen == []
