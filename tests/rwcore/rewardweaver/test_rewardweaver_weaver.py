"""The RewardWeaver stage driver: the outer loop, history, exact resume, all-or-nothing bad input."""

import json

import numpy as np
import pytest
from _util import normalize
from rewardweaver_fakes import (
    FakeProposer,
    LabelJudge,
    ScriptedAttributor,
    build_library,
    deficit,
    judgment,
    labelled_cases,
    traj,
)

from rwcore.rewardweaver import RewardHistory, RewardWeaver, capability_retention
from rwcore.types import JudgeReport, RubricSpec
from rwcore.verdict import Verdict


def make_batch(prefix, low, n_success=4, success_deficits=()):
    """low: list of capability-id lists, one low-outcome trajectory each (outcome 0.1)."""
    out = [traj(f"{prefix}-f{j}", 0.1, attribution=[deficit(c) for c in caps]) for j, caps in enumerate(low)]
    out += [traj(f"{prefix}-s{j}", 0.9, attribution=[deficit(c) for c in success_deficits]) for j in range(n_success)]
    return out


STAGE1 = [["c1", "c2"], ["c1", "c2"], ["c1", "c3"], ["c2", "c4"], ["c4"], ["c4", "c5"], ["c6"]]
# supports: c1 3, c2 3, c4 3, c3 1, c5 1, c6 1
STAGE2 = [["c5", "c3"], ["c5", "c3"], ["c5"], ["c3", "c1"], []]
# supports: c5 3, c3 3, c1 1


def test_outer_loop_update_and_history():
    library = build_library()
    attributor = ScriptedAttributor()
    weaver = RewardWeaver(library, attributor, budget=6, min_support=3)
    assert weaver.active == () and weaver.stage is None
    first = weaver.update(make_batch("a", STAGE1), step=0)
    assert first.active == ("c1", "c2", "c4") and first.closed is None and first.stage == 0
    assert [tid for tid, _ in attributor.calls] == [f"a-f{j}" for j in range(7)]  # only the low-outcome cohort
    assert first.low_outcome == tuple(f"a-f{j}" for j in range(7))
    rec = weaver.history.current
    assert rec.start_step == 0 and rec.end_step is None and rec.strategy == "attribution"
    # no reports: every capability is every trajectory's candidate, so c1's rate is its 3 of 7
    assert "c1 (0.429)" in rec.reason and [m["capability_id"] for m in rec.failure_modes] == ["c1", "c2", "c4"]
    assert rec.active_hashes == {cid: library[cid].content_hash for cid in ("c1", "c2", "c4")}
    assert rec.diagnosis["failure_rates"]["c1"] == pytest.approx(3 / 7) and rec.diagnosis["low_outcome"] == 7
    assert [r.rubric_id for r in weaver.active_rubrics()] == ["c1", "c2", "c4"]

    second = weaver.update(make_batch("b", STAGE2), step=30, performance={"goal": 6.5})
    assert second.previous == ("c1", "c2", "c4") and second.active == ("c3", "c5")
    closed, opened = weaver.history.stages
    assert (closed.start_step, closed.end_step, opened.start_step) == (0, 30, 30)
    assert closed.performance == {
        "trajectories": 9,
        "mean_outcome": pytest.approx((5 * 0.1 + 4 * 0.9) / 9),
        "low_outcome_rate": pytest.approx(5 / 9),
        "goal": 6.5,
    }
    assert opened.performance is None
    active = weaver.history.active_matrix(["c1", "c3", "c5"])
    assert active.tolist() == [[True, False, False], [False, True, True]]
    rates = weaver.history.diagnosis_matrix("failure_rates", ["c1", "c5"])
    np.testing.assert_allclose(rates, [[3 / 7, 1 / 7], [1 / 5, 3 / 5]])
    json.dumps(weaver.state_dict())  # JSON-serializable


def test_reward_under_the_active_set():
    library = build_library()
    weaver = RewardWeaver(library, ScriptedAttributor(), initial_active=["c1", "c2"])
    batch = [traj("t1", 0.5), traj("t2", 0.0), traj("t3", 1.0)]
    reports = [
        JudgeReport("t1", {"c1": judgment("c1", Verdict.PASS, 0.8), "c2": judgment("c2", Verdict.NA)}),
        JudgeReport("t2", {"c1": judgment("c1", Verdict.FAIL), "c2": judgment("c2", Verdict.PASS, 0.6)}),
        JudgeReport("t3", {"c1": judgment("c1", Verdict.INVALID), "c3": judgment("c3", Verdict.PASS)}),
    ]
    # |A| = 2. t1: 0.5 + (0.8 + 0) / 2 (c2 NA adds 0); t2: 0 + (0 + 0.6) / 2; t3: nothing defined -> 1.0 + 0
    np.testing.assert_allclose(weaver.reward(batch, reports), [0.9, 0.3, 1.0])
    with pytest.raises(ValueError, match=r"reports\[1\].trajectory_id"):
        weaver.reward(batch, [reports[0], reports[2], reports[1]])
    with pytest.raises(ValueError, match=r"trajectories\[0\].outcome"):
        weaver.reward([traj("t1", float("nan"))], reports[:1])


def run(weaver, batches, start=0):
    return [weaver.update(batch, step=start + 30 * k).active for k, batch in enumerate(batches)]


BATCHES = [make_batch("a", STAGE1), make_batch("b", STAGE2), make_batch("c", STAGE1 + STAGE2, n_success=3)]


@pytest.mark.parametrize(
    "strategy", ["attribution", "random", "random_trajectory", "static_topk", "success_failure_contrast"]
)
def test_exact_resume(strategy):
    def fresh():
        return RewardWeaver(
            build_library(), ScriptedAttributor(), strategy=strategy, seed=7, min_support=2, max_success_attributions=2
        )

    full = fresh()
    full_active = run(full, BATCHES)
    part = fresh()
    run(part, BATCHES[:1])
    snapshot = json.loads(json.dumps(part.state_dict()))
    resumed = fresh()
    resumed.load_state_dict(snapshot)
    assert normalize(resumed.state_dict()) == normalize(part.state_dict())
    rest = [resumed.update(batch, step=30 * (k + 1)).active for k, batch in enumerate(BATCHES[1:])]
    assert full_active[1:] == rest
    assert normalize(resumed.state_dict()) == normalize(full.state_dict())


def test_strategies_through_the_driver():
    library = build_library()
    # random: seeded, budget respected, changes between stages.
    a = run(RewardWeaver(library, strategy="random", seed=3, budget=4), BATCHES)
    b = run(RewardWeaver(library, strategy="random", seed=3, budget=4), BATCHES)
    assert a == b and all(len(s) == 4 for s in a) and len(set(a)) > 1
    # static_topk: frozen from the first attribution ranking, never changes.
    static = RewardWeaver(library, ScriptedAttributor(), strategy="static_topk", budget=2, min_support=3)
    assert run(static, BATCHES) == [("c1", "c2")] * 3
    assert static.strategy.ranking[:3] == ("c1", "c2", "c4")
    # success_failure_contrast: success trajectories are attributed too.
    attributor = ScriptedAttributor()
    contrast = RewardWeaver(library, attributor, strategy="success_failure_contrast", min_support=3)
    update = contrast.update(make_batch("a", STAGE1, n_success=4, success_deficits=["c1"]), step=0)
    assert {tid for tid, _ in attributor.calls} >= {"a-s0", "a-s3"}
    # F_fail: c1 3/7, c2 3/7, c4 3/7; F_succ(c1) = 1 -> contrast negative, dropped.
    assert update.active == ("c2", "c4")
    # random_trajectory: attribution on a random sample of the cohort's size drawn from all trajectories.
    attributor = ScriptedAttributor()
    rt = RewardWeaver(library, attributor, strategy="random_trajectory", seed=1, min_support=1)
    update = rt.update(make_batch("a", STAGE1, n_success=20), step=0)
    diagnosed = [tid for tid, _ in attributor.calls]
    assert len(diagnosed) == 7 and any("-s" in tid for tid in diagnosed)
    assert update.attribution.diagnosed == tuple(diagnosed)
    # dynamic_topk: judge FAIL rates among low-outcome trajectories; needs reports.
    dyn = RewardWeaver(library, strategy="dynamic_topk", budget=2)
    batch = make_batch("a", STAGE1, n_success=2)
    reports = [
        JudgeReport(
            t.trajectory_id,
            {
                "c7": judgment("c7", Verdict.FAIL if t.outcome < 0.5 else Verdict.PASS),
                "c8": judgment("c8", Verdict.FAIL if t.trajectory_id in ("a-f0", "a-f1") else Verdict.PASS),
                "c3": judgment("c3", Verdict.PASS),
            },
        )
        for t in batch
    ]
    with pytest.raises(ValueError, match="reports are required"):
        dyn.update(batch, step=0)
    update = dyn.update(batch, reports, step=0)
    assert update.active == ("c7", "c8") and update.judge_fail_rates["c8"] == pytest.approx(2 / 7)
    assert np.isnan(update.judge_fail_rates["c1"])


def test_expansion_through_the_driver():
    library = build_library(("c1", "c2"))
    proposer = FakeProposer([RubricSpec("clarity", "Uses clear language", capability="Expression")])
    weaver = RewardWeaver(
        library,
        ScriptedAttributor(),
        proposer=proposer,
        evaluator=LabelJudge(),
        acceptance_cases=lambda cap: labelled_cases(cap.capability_id),
        min_support=3,
    )
    batch = make_batch("a", [["c1"], ["c1"], ["c1"], [], [], []])  # three uncovered failures
    update = weaver.update(batch, step=0)
    assert update.expansion.admitted == ("clarity",) and "clarity" in library
    assert update.active == ("c1",)  # admitted capabilities compete from the next update on
    assert weaver.history.current.admitted == ("clarity",)
    assert proposer.seen[0][0] == ["a-f3", "a-f4", "a-f5"]
    later = weaver.update(make_batch("b", [["clarity"]] * 3), step=30)
    assert later.active == ("clarity",)
    # Resume carries the grown library.
    other_library = build_library(("c1", "c2"))
    resumed = RewardWeaver(
        other_library,
        ScriptedAttributor(),
        proposer=proposer,
        evaluator=LabelJudge(),
        acceptance_cases=lambda cap: labelled_cases(cap.capability_id),
        min_support=3,
    )
    resumed.load_state_dict(json.loads(json.dumps(weaver.state_dict())))
    assert "clarity" in other_library and resumed.active == ("clarity",)
    # Expansion needs all three parts.
    with pytest.raises(ValueError, match="together"):
        RewardWeaver(library, ScriptedAttributor(), proposer=proposer)


def test_bad_input_changes_nothing():
    library = build_library()
    weaver = RewardWeaver(library, ScriptedAttributor(), strategy="static_topk", min_support=3)
    before = normalize(weaver.state_dict())
    nan_batch = make_batch("a", STAGE1)
    nan_batch[2] = traj("a-f2", float("nan"))
    with pytest.raises(ValueError, match=r"trajectories\[2\].outcome"):
        weaver.update(nan_batch, step=0)
    with pytest.raises(ValueError, match="reports has 1 reports for 11 trajectories"):
        weaver.update(make_batch("a", STAGE1), [JudgeReport("a-f0", {})], step=0)
    with pytest.raises(ValueError, match="performance"):
        weaver.update(make_batch("a", STAGE1), step=0, performance={"x": float("nan")})

    class Exploding(ScriptedAttributor):
        def attribute(self, trajectory, candidates):
            if trajectory.trajectory_id == "a-f5":
                raise RuntimeError("judge server down")
            return super().attribute(trajectory, candidates)

    exploding = RewardWeaver(library, Exploding(), strategy="static_topk", min_support=3)
    with pytest.raises(RuntimeError):
        exploding.update(make_batch("a", STAGE1), step=0)
    assert exploding.strategy.ranking is None and len(exploding.history) == 0
    assert normalize(weaver.state_dict()) == before
    weaver.update(make_batch("a", STAGE1), step=30)
    with pytest.raises(ValueError, match="step 10 is before"):
        weaver.update(make_batch("b", STAGE2), step=10)
    with pytest.raises(ValueError, match=r"initial_active\[1\] 'nope'"):
        RewardWeaver(library, ScriptedAttributor(), initial_active=["c1", "nope"])
    with pytest.raises(ValueError, match="more than budget"):
        RewardWeaver(library, ScriptedAttributor(), budget=2, initial_active=["c1", "c2", "c3"])
    with pytest.raises(ValueError, match="attributor is required"):
        RewardWeaver(library).update(make_batch("a", STAGE1), step=0)


def test_load_state_checks_hashes_and_config():
    weaver = RewardWeaver(build_library(), ScriptedAttributor(), min_support=3)
    weaver.update(make_batch("a", STAGE1), step=0)
    state = json.loads(json.dumps(weaver.state_dict()))
    tampered = json.loads(json.dumps(state))
    tampered["library"]["entries"][3]["capability"]["definition"] = "edited"
    target = RewardWeaver(build_library(), ScriptedAttributor(), min_support=3)
    before = normalize(target.state_dict())
    with pytest.raises(ValueError, match="capability 'c4'.*hash"):
        target.load_state_dict(tampered)
    assert normalize(target.state_dict()) == before
    with pytest.raises(ValueError, match="'budget' is 6 but this weaver has 5"):
        RewardWeaver(build_library(), ScriptedAttributor(), min_support=3, budget=5).load_state_dict(state)
    with pytest.raises(ValueError, match="'rank_by' is 'rate' but this weaver has 'support'"):
        RewardWeaver(build_library(), ScriptedAttributor(), min_support=3, rank_by="support").load_state_dict(state)
    # a state saved before rank_by existed ranked by support: it resumes on a support weaver only
    older = json.loads(json.dumps(state))
    del older["config"]["rank_by"]
    with pytest.raises(ValueError, match="'rank_by' is 'support' but this weaver has 'rate'"):
        RewardWeaver(build_library(), ScriptedAttributor(), min_support=3).load_state_dict(older)
    old_style = RewardWeaver(build_library(), ScriptedAttributor(), min_support=3, rank_by="support")
    old_style.load_state_dict(older)
    assert old_style.active == weaver.active
    with pytest.raises(ValueError, match="rank_by must be one of"):
        RewardWeaver(build_library(), ScriptedAttributor(), rank_by="count")
    bad_history = json.loads(json.dumps(state))
    bad_history["history"]["stages"][0]["active_hashes"]["c1"] = "0" * 64
    with pytest.raises(ValueError, match="stage 0: capability 'c1'"):
        target.load_state_dict(bad_history)


def test_history_file_round_trip_and_retention(tmp_path):
    weaver = RewardWeaver(build_library(), ScriptedAttributor(), min_support=3)
    run(weaver, BATCHES)
    path = tmp_path / "history.json"
    weaver.history.save(path)
    loaded = RewardHistory.load(path)
    assert loaded.state_dict() == weaver.history.state_dict()
    ids = ["c1", "c2", "c3"]
    active = loaded.active_matrix(ids)  # stages: (c1 c2 c4), (c3 c5), (c1 c3 c5 c2 c4)
    assert active.tolist() == [[True, True, False], [False, False, True], [True, True, True]]
    scores = np.array([[0.5, 0.4, 0.2], [0.6, 0.7, 0.3], [0.7, 0.8, 0.9]])
    result = capability_retention(scores, active, ids)
    # c1 and c2 leave after stage 0 and return at stage 2: one post-deactivation stage each.
    assert [(e.capability_id, e.last_active_stage) for e in result.events] == [("c1", 0), ("c2", 0)]
    assert result.n == 2 and result.mean == pytest.approx(0.2) and result.min == pytest.approx(0.1)


def test_release_uninformative_reads_the_batch_groups():
    """Two groups of four low-outcome trajectories. Every one is blamed for c1 and c2 (recurrent, 8 of 8); the judge
    fails c1 everywhere (constant) and passes c2 in one trajectory of group g0 (it varies there). With budget 2 the
    paper's rule keeps both; release keeps c2 alone and records the shares (c1 0.0, c2 0.5) in the diagnosis."""
    from rwcore.types import Trajectory, Turn

    def batch():
        out = []
        for g in range(2):
            for j in range(4):
                verdicts = {"c1": Verdict.FAIL, "c2": Verdict.PASS if (g, j) == (0, 0) else Verdict.FAIL}
                out.append(
                    Trajectory(
                        task_id=f"task{g}",
                        turns=[Turn("assistant", "x", generated=True)],
                        outcome=0.0,
                        group_id=f"g{g}",
                        trajectory_id=f"t{g}{j}",
                        metadata={"verdicts": verdicts, "attribution": [deficit("c1"), deficit("c2")]},
                    )
                )
        return out

    library = build_library(ids=("c1", "c2", "c3"))
    trajectories = batch()
    reports = LabelJudge(default=Verdict.NA).evaluate(trajectories, library.rubrics())
    paper = RewardWeaver(library, ScriptedAttributor(), budget=2, min_support=3)
    assert paper.update(trajectories, reports, step=0).active == ("c1", "c2")
    weaver = RewardWeaver(library, ScriptedAttributor(), budget=2, min_support=3, release_uninformative=True)
    update = weaver.update(trajectories, reports, step=0)
    assert update.active == ("c2",) and "released" in update.selection.reason
    assert update.opened.diagnosis["within_group_variation"] == {"c1": 0.0, "c2": 0.5}
    assert weaver.config["release_uninformative"] is True
    # a state of the paper's rule does not load into a releasing weaver (and the other way round)
    with pytest.raises(ValueError, match="release_uninformative"):
        weaver.load_state_dict(paper.state_dict())
    with pytest.raises(ValueError, match="release_uninformative=True applies to the strategies"):
        RewardWeaver(library, ScriptedAttributor(), strategy="random", release_uninformative=True)
    with pytest.raises(ValueError, match="reports are required"):
        RewardWeaver(library, ScriptedAttributor(), release_uninformative=True).update(trajectories, step=0)
