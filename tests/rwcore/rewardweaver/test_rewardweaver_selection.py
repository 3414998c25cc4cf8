"""Select strategies: budget, ranking, seeded randomness, static never changes, contrast."""

import numpy as np
import pytest
from rewardweaver_fakes import ScriptedAttributor, build_library, deficit, traj

from rwcore.rewardweaver import (
    STRATEGIES,
    AggregatedFailures,
    FailureMode,
    RandomTrajectoryAttribution,
    SelectionInput,
    StaticTopK,
    aggregate,
    attribute,
    make_strategy,
    select,
)

IDS = tuple(f"c{j}" for j in range(1, 11))


def mode(cid, support, cohort=20, conf=0.8):
    return FailureMode(cid, support, support / cohort, conf, (), (), support >= 3)


def failures(*pairs, cohort=20):
    """Modes ranked by support (aggregate's rank_by="support")."""
    modes = sorted(
        (mode(c, s, cohort) for c, s in pairs), key=lambda m: (-m.support, -m.mean_confidence, m.capability_id)
    )
    return AggregatedFailures(
        tuple(m for m in modes if m.recurrent), tuple(m for m in modes if not m.recurrent), cohort, 3, rank_by="support"
    )


def test_attribution_takes_top_budget_recurrent_modes():
    g = failures(("c1", 3), ("c2", 9), ("c3", 5), ("c4", 4), ("c5", 7), ("c6", 6), ("c7", 8), ("c8", 2))
    sel = select("attribution", SelectionInput(IDS, budget=6, failures=g))
    assert sel.active == ("c2", "c7", "c5", "c6", "c3", "c4")
    assert sel.strategy == "attribution" and "c2 (9)" in sel.reason
    assert select("attribution", SelectionInput(IDS, budget=2, failures=g)).active == ("c2", "c7")
    # c8 has support 2 < 3: never selected even with room in the budget.
    assert "c8" not in select("attribution", SelectionInput(IDS, budget=10, failures=g)).active


def test_attribution_by_rate_scores_and_names_the_rate():
    # support 12 of 40 candidates (0.3) against support 4 of 4 (1.0): the rate ranking puts c2 first
    modes = (
        FailureMode("c2", 4, 0.1, 0.9, (), (), True, candidates=4, rate=1.0),
        FailureMode("c1", 12, 0.3, 0.9, (), (), True, candidates=40, rate=0.3),
    )
    sel = select("attribution", SelectionInput(IDS, budget=1, failures=AggregatedFailures(modes, (), 40, 3)))
    assert sel.active == ("c2",) and sel.scores == {"c2": 1.0, "c1": 0.3}
    assert "ranked by deficit rate" in sel.reason and "c2 (1)" in sel.reason


def test_empty_evidence_keeps_previous_or_empties():
    g = failures(("c1", 1))
    sel = select("attribution", SelectionInput(IDS, previous=("c4", "c5"), failures=g))
    assert sel.active == ("c4", "c5") and "previous active set kept" in sel.reason
    sel = make_strategy("attribution", keep_previous_when_empty=False).select(
        SelectionInput(IDS, previous=("c4",), failures=g)
    )
    assert sel.active == () and "outcome-only" in sel.reason


def test_static_topk_never_changes():
    strategy = StaticTopK(["c3", "c1", "c9", "c2"])
    assert strategy.requires() == frozenset()
    first = strategy.select(SelectionInput(IDS, budget=3, failures=failures(("c5", 10))))
    second = strategy.select(SelectionInput(IDS, budget=3, failures=failures(("c6", 10), ("c7", 9))))
    assert first.active == second.active == ("c3", "c1", "c9")
    # Without a given ranking, the first attribution ranking is frozen.
    frozen = StaticTopK()
    assert frozen.requires() == frozenset({"attribution"})
    a = frozen.select(SelectionInput(IDS, budget=2, failures=failures(("c4", 8), ("c2", 5), ("c9", 1))))
    assert a.active == ("c4", "c2") and frozen.ranking == ("c4", "c2", "c9")
    assert frozen.requires() == frozenset()
    b = frozen.select(SelectionInput(IDS, budget=2, failures=failures(("c7", 12))))
    assert b.active == ("c4", "c2")
    restored = StaticTopK()
    restored.load_state_dict(frozen.state_dict())
    assert restored.select(SelectionInput(IDS, budget=2)).active == ("c4", "c2")


def test_random_active_set_seeded_and_budgeted():
    def run(seed):
        rng = np.random.default_rng(seed)
        return [select("random", SelectionInput(IDS, budget=6, rng=rng)).active for _ in range(4)]

    a, b, c = run(1), run(1), run(2)
    assert a == b and a != c
    assert all(len(s) == 6 and len(set(s)) == 6 and set(s) <= set(IDS) for s in a)
    assert len(set(a)) > 1  # changes between stages
    assert len(select("random", SelectionInput(("x", "y"), budget=6, rng=np.random.default_rng(0))).active) == 2
    with pytest.raises(ValueError, match="inputs.rng"):
        select("random", SelectionInput(IDS))


def test_dynamic_topk_by_judge_failure_rate():
    rates = {"c1": 0.2, "c2": 0.9, "c3": float("nan"), "c4": 0.0, "c5": 0.5, "c6": 0.5}
    sel = select("dynamic_topk", SelectionInput(IDS, budget=3, judge_fail_rates=rates))
    assert sel.active == ("c2", "c5", "c6")
    sel = select("dynamic_topk", SelectionInput(IDS, budget=6, judge_fail_rates=rates))
    assert sel.active == ("c2", "c5", "c6", "c1")  # NaN and zero rates are not bottlenecks
    assert make_strategy("dynamic_topk").requires() == frozenset({"judgments"})
    with pytest.raises(ValueError, match="judge_fail_rates"):
        select("dynamic_topk", SelectionInput(IDS))
    with pytest.raises(ValueError, match="judge_fail_rates names capability 'zz'"):
        SelectionInput(IDS, judge_fail_rates={"zz": 0.5})


def test_success_failure_contrast():
    fail = failures(("c1", 10), ("c2", 8), ("c3", 6), ("c4", 2), cohort=20)  # F_fail: .5 .4 .3 (.1 not recurrent)
    succ = failures(("c1", 9), ("c2", 1), ("c5", 5), cohort=20)  # F_succ: .45 .05 .25
    sel = select("success_failure_contrast", SelectionInput(IDS, budget=6, failures=fail, successes=succ))
    # contrasts: c2 .35, c3 .30, c1 .05; c4 is not recurrent.
    assert sel.active == ("c2", "c3", "c1")
    assert sel.scores["c2"] == pytest.approx(0.35)
    assert select("success_failure_contrast", SelectionInput(IDS, budget=1, failures=fail, successes=succ)).active == (
        "c2",
    )


def test_random_trajectory_attribution_diagnoses_random_trajectories():
    strategy = RandomTrajectoryAttribution()
    low = np.array([True, True, False, False, False, False, False, False])
    m1 = strategy.diagnosis_mask(low, np.random.default_rng(5))
    m2 = strategy.diagnosis_mask(low, np.random.default_rng(5))
    assert m1.tolist() == m2.tolist() and m1.sum() == 2
    masks = {tuple(strategy.diagnosis_mask(low, np.random.default_rng(s))) for s in range(20)}
    assert len(masks) > 1 and any(not np.array_equal(np.array(m), low) for m in masks)
    assert RandomTrajectoryAttribution(sample_size=5).diagnosis_mask(low, np.random.default_rng(0)).sum() == 5
    # Its ranking is the attribution ranking of whatever was diagnosed.
    library = build_library(("c1", "c2"))
    batch = [traj(f"t{j}", attribution=[deficit("c2")]) for j in range(3)]
    g = aggregate(attribute(batch, library, ScriptedAttributor()), min_support=3)
    sel = strategy.select(SelectionInput(library.ids(), failures=g))
    assert sel.active == ("c2",) and sel.strategy == "random_trajectory" and "random trajectories" in sel.reason


def test_inputs_validation():
    with pytest.raises(ValueError, match="budget"):
        SelectionInput(IDS, budget=0)
    with pytest.raises(ValueError, match="failures names capability 'zz'"):
        SelectionInput(IDS, failures=failures(("zz", 5)))
    with pytest.raises(ValueError, match="strategy must be one of"):
        make_strategy("best")
    assert set(STRATEGIES) == {
        "attribution",
        "static_topk",
        "random",
        "dynamic_topk",
        "random_trajectory",
        "success_failure_contrast",
    }
    with pytest.raises(ValueError, match="static ranking names capability 'zz'"):
        StaticTopK(["zz"]).select(SelectionInput(IDS))


def test_release_uninformative_gives_constant_modes_slots_to_varying_ones():
    # ranked c2 (9), c7 (8), c5 (7), c6 (6); budget 2. c2 never varied within a group (0.0), c7 has no group with
    # two defined judgments (NaN): both are passed over and c5, c6 take the two slots, in rank order.
    g = failures(("c2", 9), ("c7", 8), ("c5", 7), ("c6", 6))
    variation = {"c2": 0.0, "c7": float("nan"), "c5": 0.25, "c6": 0.5}
    paper = select("attribution", SelectionInput(IDS, budget=2, failures=g, within_group_variation=variation))
    assert paper.active == ("c2", "c7")
    release = make_strategy("attribution", release_uninformative=True)
    assert release.requires() == frozenset({"attribution", "judgments"})
    sel = release.select(SelectionInput(IDS, budget=2, failures=g, within_group_variation=variation))
    assert sel.active == ("c5", "c6")
    assert "(released, judged alike within every group: c2, c7)" in sel.reason
    # a released slot is not refilled with an uninformative mode: one informative mode, one slot used
    only = {"c2": 0.0, "c7": 0.0, "c5": 0.0, "c6": 0.125}
    assert release.select(SelectionInput(IDS, budget=3, failures=g, within_group_variation=only)).active == ("c6",)
    # all top modes informative: the paper's choice, no release named
    every = {cid: 1.0 for cid in ("c2", "c7", "c5", "c6")}
    sel = release.select(SelectionInput(IDS, budget=2, failures=g, within_group_variation=every))
    assert sel.active == ("c2", "c7") and "released" not in sel.reason
    # none varies: the paper's choice stands, and the reason says so
    none = {cid: 0.0 for cid in ("c2", "c7", "c5", "c6")}
    sel = release.select(SelectionInput(IDS, budget=2, failures=g, within_group_variation=none))
    assert sel.active == ("c2", "c7") and "none released" in sel.reason
    # the random-trajectory ablation ranks the same way and releases alike
    rt = make_strategy("random_trajectory", release_uninformative=True)
    assert rt.select(SelectionInput(IDS, budget=2, failures=g, within_group_variation=variation)).active == (
        "c5",
        "c6",
    )


def test_release_uninformative_needs_the_variation_and_checks_it():
    release = make_strategy("attribution", release_uninformative=True)
    with pytest.raises(ValueError, match="within_group_variation"):
        release.select(SelectionInput(IDS, failures=failures(("c1", 5))))
    with pytest.raises(ValueError, match=r"within_group_variation\['c1'\] = 1.5 is outside \[0, 1\]"):
        SelectionInput(IDS, within_group_variation={"c1": 1.5})
    with pytest.raises(ValueError, match="within_group_variation names capability 'zz'"):
        SelectionInput(IDS, within_group_variation={"zz": 0.5})
    with pytest.raises(ValueError, match="release_uninformative must be True or False"):
        make_strategy("attribution", release_uninformative="yes")
    with pytest.raises(ValueError, match="does not take these options"):
        make_strategy("random", release_uninformative=True)
