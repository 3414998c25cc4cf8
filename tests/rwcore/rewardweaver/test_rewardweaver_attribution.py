"""Failure attribution: cohort selection, each rejection rule, aggregation thresholds."""

import numpy as np
import pytest
from rewardweaver_fakes import ScriptedAttributor, build_library, deficit, traj

from rwcore.rewardweaver import (
    REJECTION_REASONS,
    aggregate,
    attribute,
    low_outcome_mask,
    per_task_threshold,
    screen_record,
)
from rwcore.types import AttributionRecord


def test_low_outcome_mask_threshold_and_rule():
    batch = [traj("a", 0.2), traj("b", 0.5), traj("c", 0.9, task_id="hard"), traj("d", 0.6, task_id="hard")]
    assert low_outcome_mask(batch, 0.5).tolist() == [True, False, False, False]  # strictly below
    rule = per_task_threshold({"hard": 0.7}, default=0.3)
    assert low_outcome_mask(batch, rule).tolist() == [True, False, False, True]
    assert low_outcome_mask(batch, lambda outcome, t: t.task_id == "task").tolist() == [True, True, False, False]
    with pytest.raises(ValueError, match="q_o must return a bool"):
        low_outcome_mask(batch, lambda outcome, t: 1)
    with pytest.raises(ValueError, match=r"trajectories\[1\].outcome"):
        low_outcome_mask([traj("a", 0.1), traj("b", float("nan"))], 0.5)
    with pytest.raises(ValueError, match="q_o"):
        low_outcome_mask(batch, float("nan"))


def record(**fields):
    base = dict(trajectory_id="t", capability_id="c1", deficit=True, confidence=0.9, evidence="quote", cause="policy")
    base.update(fields)
    return AttributionRecord(**base)


@pytest.mark.parametrize(
    "fields,reasons",
    [
        ({}, ()),
        ({"deficit": False}, ("no_deficit",)),
        ({"evidence": ""}, ("no_evidence",)),
        ({"evidence": "   "}, ("no_evidence",)),
        ({"confidence": 0.49}, ("low_confidence",)),
        ({"confidence": 0.5}, ()),  # at the threshold: accepted
        ({"cause": "partner"}, ("cause_partner",)),
        ({"cause": "scenario"}, ("cause_scenario",)),
        ({"cause": "unclear"}, ("cause_unclear",)),
        (
            {"deficit": False, "evidence": "", "confidence": 0.1, "cause": "partner"},
            ("no_deficit", "no_evidence", "low_confidence", "cause_partner"),
        ),
    ],
)
def test_screen_record_each_rule(fields, reasons):
    assert screen_record(record(**fields), min_confidence=0.5) == reasons


def test_attribute_records_reasons_and_structural_rejections():
    library = build_library(("c1", "c2", "c3"))
    cohort = [
        traj("t1", attribution=[deficit("c1"), deficit("c2", cause="partner")]),
        traj("t2", attribution=[deficit("c1", confidence=0.2), deficit("c1")]),  # second is a duplicate
        traj(
            "t3", attribution=[deficit("zzz"), deficit("c2", trajectory_id="t1", confidence=0.95)]
        ),  # not candidate, wrong id
        traj("t4", attribution=[deficit("c3", cause="scenario")]),  # external only
        traj("t5", attribution=[]),  # nothing covers it
        traj("t6", attribution=[deficit("c2", deficit=False)]),
    ]
    result = attribute(cohort, library, ScriptedAttributor())
    assert [(r.trajectory_id, r.capability_id) for r in result.accepted] == [("t1", "c1")]
    reasons = {
        (r.record.trajectory_id, r.record.capability_id, r.record.confidence): r.reasons for r in result.rejected
    }
    assert reasons[("t1", "c2", 0.9)] == ("cause_partner",)
    assert reasons[("t2", "c1", 0.2)] == ("low_confidence",)
    assert reasons[("t2", "c1", 0.9)] == ("duplicate",)
    assert reasons[("t3", "zzz", 0.9)] == ("not_candidate",)
    assert reasons[("t1", "c2", 0.95)] == ("wrong_trajectory",)
    assert reasons[("t6", "c2", 0.9)] == ("no_deficit",)
    counts = result.rejection_counts()
    assert set(counts) == set(REJECTION_REASONS)
    assert counts["duplicate"] == 1 and counts["not_candidate"] == 1 and counts["wrong_trajectory"] == 1
    assert result.external == ("t4",)
    assert result.unattributed == ("t2", "t3", "t5", "t6")
    assert result.candidates["t1"] == ("c1", "c2", "c3")


def test_retrieval_limits_candidates():
    library = build_library(("c1", "c2", "c3"))
    attributor = ScriptedAttributor()
    cohort = [traj("t1", attribution=[deficit("c1"), deficit("c3")])]
    result = attribute(cohort, library, attributor, retrieve=lambda t, specs: ["c3"])
    assert attributor.calls == [("t1", ("c3",))]
    assert [r.capability_id for r in result.accepted] == ["c3"]
    assert result.rejected[0].reasons == ("not_candidate",)
    with pytest.raises(ValueError, match="retrieve returned 'nope'"):
        attribute(cohort, library, attributor, retrieve=lambda t, specs: ["nope"])


def test_bad_attributor_output_is_an_error():
    library = build_library(("c1",))

    class Bad:
        def attribute(self, trajectory, candidates):
            return ["not a record"]

    with pytest.raises(ValueError, match="attributor"):
        attribute([traj("t1")], library, Bad())
    with pytest.raises(ValueError, match="appears twice"):
        attribute([traj("t1"), traj("t1")], library, ScriptedAttributor())


def test_aggregation_support_threshold_frequency_confidence_examples():
    library = build_library(("c1", "c2", "c3"))
    cohort = [
        traj("t1", attribution=[deficit("c1", confidence=0.6, evidence="e1"), deficit("c2")]),
        traj("t2", attribution=[deficit("c1", confidence=0.8, evidence="e2"), deficit("c2", cause="partner")]),
        traj("t3", attribution=[deficit("c1", confidence=1.0, evidence="e3"), deficit("c2")]),
        traj("t4", attribution=[deficit("c3")]),
        traj("t5", attribution=[deficit("c1", confidence=0.3)]),
    ]
    result = attribute(cohort, library, ScriptedAttributor())
    agg = aggregate(result, min_support=2, max_examples=2)
    assert agg.cohort_size == 5 and agg.ranking() == ("c1", "c2")
    c1, c2 = agg.modes
    assert (c1.support, c1.frequency, c1.mean_confidence) == (3, 3 / 5, pytest.approx(0.8))
    assert c1.trajectory_ids == ("t1", "t2", "t3") and c1.evidence == (("t1", "e1"), ("t2", "e2"))
    assert (c2.support, c2.frequency) == (2, 2 / 5) and c2.recurrent
    assert [m.capability_id for m in agg.below_support] == ["c3"] and not agg.below_support[0].recurrent
    assert agg.frequencies() == {"c1": 0.6, "c2": 0.4, "c3": 0.2}
    # A higher k keeps only c1; k = 1 keeps all three.
    assert aggregate(result, min_support=3).ranking() == ("c1",)
    assert aggregate(result, min_support=1).ranking() == ("c1", "c2", "c3")
    with pytest.raises(ValueError, match="min_support"):
        aggregate(result, min_support=0)


def test_rate_ranking_counts_candidates_and_leaves_out_external_blame():
    # "wide" is retrieved for all six trajectories and blamed on four: rate 4/6. "narrow" is retrieved for
    # t1-t4 only; t4's record for it blames the partner, so 3 trajectories could blame it, and all 3 do: rate 1.
    library = build_library(("wide", "narrow"))
    cohort = [
        traj("t1", attribution=[deficit("wide"), deficit("narrow")]),
        traj("t2", attribution=[deficit("wide", deficit=False), deficit("narrow")]),
        traj("t3", attribution=[deficit("wide"), deficit("narrow")]),
        traj("t4", attribution=[deficit("wide"), deficit("narrow", cause="partner")]),
        traj("t5", attribution=[deficit("wide")]),
        traj("t6", attribution=[deficit("wide", confidence=0.2)]),
    ]
    narrow_on = {"t1", "t2", "t3", "t4"}

    def retrieve(trajectory, candidates):
        return ["wide", "narrow"] if trajectory.trajectory_id in narrow_on else ["wide"]

    result = attribute(cohort, library, ScriptedAttributor(), retrieve=retrieve)
    by_rate = aggregate(result, min_support=3)
    assert by_rate.rank_by == "rate" and by_rate.ranking() == ("narrow", "wide")
    narrow, wide = by_rate.modes
    assert (narrow.support, narrow.candidates, narrow.rate) == (3, 3, 1.0)
    assert (wide.support, wide.candidates) == (4, 6) and wide.rate == pytest.approx(4 / 6)
    assert narrow.summary()["rate"] == 1.0 and wide.summary()["candidates"] == 6
    # by support, the broad capability comes first (4 trajectories against 3)
    assert aggregate(result, min_support=3, rank_by="support").ranking() == ("wide", "narrow")
    # recurrence still gates: at k = 4 the complete but rarer failure mode is not recurrent
    assert aggregate(result, min_support=4).ranking() == ("wide",)
    with pytest.raises(ValueError, match="rank_by"):
        aggregate(result, rank_by="frequency")


def test_rate_ties_break_by_support():
    library = build_library(("a", "b"))
    cohort = [
        traj("t1", attribution=[deficit("a")]),
        traj("t2", attribution=[deficit("a"), deficit("b")]),
        traj("t3", attribution=[deficit("a"), deficit("b")]),
        traj("t4", attribution=[deficit("a")]),
    ]

    def retrieve(trajectory, candidates):
        return ["a", "b"] if trajectory.trajectory_id in ("t2", "t3") else ["a"]

    agg = aggregate(attribute(cohort, library, ScriptedAttributor(), retrieve=retrieve), min_support=2)
    assert [(m.capability_id, m.support, m.rate) for m in agg.modes] == [("a", 4, 1.0), ("b", 2, 1.0)]


def test_ranking_ties_break_by_confidence_then_id():
    library = build_library(("a", "b", "c"))
    cohort = [
        traj(
            f"t{j}",
            attribution=[deficit("a", confidence=0.7), deficit("b", confidence=0.9), deficit("c", confidence=0.7)],
        )
        for j in range(3)
    ]
    agg = aggregate(attribute(cohort, library, ScriptedAttributor()), min_support=3)
    assert agg.ranking() == ("b", "a", "c")
    assert np.isclose(agg.modes[0].mean_confidence, 0.9)
