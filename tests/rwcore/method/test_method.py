"""rwcore.AdaptiveMethod: the variant catalogue, each rubric counted once, rewards and advantages against
an independent reference, Arise's empty start and windowed evidence, candidate retrieval, state."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from advantage_reference import ref_compute_advantages, ref_length_regularize
from method_fakes import Reflector, reports_for, traj_with, trajectories
from pool_fakes import proposal
from rewardweaver_fakes import ScriptedAttributor, build_library, deficit

from rwcore import AdaptiveMethod, JudgedBatch, MethodSettings, Verdict
from rwcore.method import COMPONENTS, Providers, differing_components
from rwcore.trainer.config import load_config
from rwcore.types import RubricSkillProposal, RubricSpec

P, F, NA, INV = Verdict.PASS, Verdict.FAIL, Verdict.NA, Verdict.INVALID

# The rows the papers name, with the one component each ablation changes.
ROWS = {
    "combined": None,
    "rewardweaver": None,
    "arise": None,
    "outcome_only": None,
    "rw_outcome_grpo": ("rewardweaver", "process_reward", None),
    "rw_static_topk": ("rewardweaver", "process_reward", "static_topk"),
    "rw_random_active_set": ("rewardweaver", "process_reward", "random"),
    "rw_failure_frequency": ("rewardweaver", "process_reward", "dynamic_topk"),
    "rw_random_trajectory": ("rewardweaver", "process_reward", "random_trajectory"),
    "rw_success_failure": ("rewardweaver", "process_reward", "success_failure_contrast"),
    "rw_open_vocabulary": ("rewardweaver", "process_reward", "open_vocabulary"),
    "rw_instance_specific": ("rewardweaver", "process_reward", "instance_specific"),
    "arise_frozen_rubrics": ("arise", "arise_rubrics", "frozen"),
    "arise_no_skills": ("arise", "skills", False),
    "arise_no_adaptive_sampling": ("arise", "sampler", "uniform"),
    "arise_vade_sampling": ("arise", "sampler", "outcome"),
}
# Rows that differ from their parent in a pinned setting, not a component: name -> (parent, setting, value).
PINNED_ROWS = {"arise_retire_while_shown": ("arise", "retire_while_shown", True)}


# ---------------------------------------------------------------- the catalogue


def test_variants_list_every_row_of_both_papers():
    variants = AdaptiveMethod.variants()
    assert set(variants) == set(ROWS) | set(PINNED_ROWS)
    for name, (parent, setting, value) in PINNED_ROWS.items():
        assert variants[name].parent == parent and variants[name].pinned == {setting: value}
        assert variants[name].components == variants[parent].components
    for _name, variant in variants.items():
        assert variant.description and variant.paper_row and set(variant.components) == set(COMPONENTS)
    assert variants["rewardweaver"].components == {
        "process_reward": "attribution",
        "arise_rubrics": None,
        "skills": False,
        "sampler": "uniform",
    }  # RW samples uniformly
    assert variants["arise"].components == {
        "process_reward": None,
        "arise_rubrics": "evolving",
        "skills": True,
        "sampler": "capability",
    }
    assert variants["combined"].components == {
        "process_reward": "attribution",
        "arise_rubrics": "evolving",
        "skills": True,
        "sampler": "capability",
    }
    # outcome-only RL is the baseline of both papers: no rubric rewards, no skills, uniform sampling
    assert (
        variants["outcome_only"].components
        == variants["rw_outcome_grpo"].components
        == {"process_reward": None, "arise_rubrics": None, "skills": False, "sampler": "uniform"}
    )


@pytest.mark.parametrize("name", [n for n, row in ROWS.items() if row is not None])
def test_each_ablation_differs_from_its_parent_in_exactly_the_component_the_paper_removes(name):
    parent_name, component, value = ROWS[name]
    variants = AdaptiveMethod.variants()
    variant, parent = variants[name], variants[parent_name]
    assert variant.parent == parent_name
    assert differing_components(variant, parent) == [component]
    assert variant.components[component] == value
    # ...and in the resolved run settings: the keys train.method sets differ in at most that component's key
    extra = ["pool.frozen_from=/somewhere"] if name == "arise_frozen_rubrics" else []
    mine = load_config(None, [f"train.method={name}", *extra])
    theirs = load_config(None, [f"train.method={parent_name}"])
    from rwcore.trainer.config.checks import _variant_settings

    ours, parents = (_variant_settings(AdaptiveMethod.variants()[c.train.method]) for c in (mine, theirs))
    changed = [key for key in ours if ours[key] != parents[key]]
    expected = {
        "process_reward": ["rewardweaver.selection"],
        "sampler": ["sampler.kind"],
        "skills": ["pool.skills"],
        "arise_rubrics": [],
    }[component]
    assert changed == expected


def test_an_unknown_variant_lists_the_known_ones():
    with pytest.raises(ValueError) as info:
        AdaptiveMethod("grpo_plus", {"t": ["x"]})
    assert "grpo_plus" in str(info.value) and "rw_open_vocabulary" in str(info.value)


def test_a_variant_refuses_missing_providers_naming_them():
    with pytest.raises(ValueError, match="providers.reflector"):
        AdaptiveMethod("arise", {"t": ["x"]})
    with pytest.raises(ValueError, match="providers.library"):
        AdaptiveMethod("rewardweaver", {"t": ["x"]})
    with pytest.raises(ValueError, match="providers.frozen_rubrics"):
        AdaptiveMethod("arise_frozen_rubrics", {"t": ["x"]}, providers=Providers(reflector=Reflector()))
    AdaptiveMethod("outcome_only", {"t": ["x"]}, MethodSettings(batch_size=1))  # needs nothing


@pytest.mark.parametrize("field, value", [("rank_by", "count"), ("process_normalization", "sum")])
def test_settings_refuse_unknown_choices_naming_them(field, value):
    with pytest.raises(ValueError, match=f"{field} must be one of"):
        MethodSettings(**{field: value})


# ---------------------------------------------------------------- fakes


def arise_method(tasks=8, batch=2, group=4, reflector=None, **settings) -> AdaptiveMethod:
    task_map = {f"t{i}": ["tag"] for i in range(tasks)}
    s = MethodSettings(batch_size=batch, group_size=group, delta_pool=settings.pop("delta_pool", 3), **settings)
    return AdaptiveMethod("arise", task_map, s, Providers(reflector=reflector or Reflector()))


def run_step(method: AdaptiveMethod, step: int, verdict_of=None, uncovered=None):
    task_ids = method.sample(step)
    g = method.settings.group_size
    trajs = trajectories(step, task_ids, g)
    plans = method.rubrics_to_judge(step, task_ids)
    ids = [spec.rubric_id for spec in plans[0]]
    verdicts = {rid: [verdict_of(rid, t) if verdict_of else P for t in trajs] for rid in ids}
    scored = method.score(trajs, reports_for(trajs, verdicts, uncovered(trajs) if uncovered else None))
    method.observe(step, task_ids, trajs, scored.judged)
    method.adapt(step)
    return trajs, scored


# ---------------------------------------------------------------- Arise: empty start, windowed evidence


def test_the_pool_starts_empty_and_the_first_reflection_reads_the_preceding_window():
    reflector = Reflector([proposal("r1", "Execution"), proposal("r2", "Verification")])
    method = arise_method(reflector=reflector, delta_pool=3)
    assert len(method.pool) == 0 and method.rubrics_to_judge(0, ["t0"]) == [[]]
    seen = []
    for step in range(3):
        trajs, scored = run_step(method, step)
        seen += [t.trajectory_id for t in trajs]
        if step < 2:
            assert reflector.propose_calls == [] and len(method.pool) == 0  # nothing before delta_pool steps
            assert scored.advantage_rubrics == ()
    (call,) = reflector.propose_calls
    assert sorted(call["ids"]) == sorted(seen)  # every record of steps 0..2 (24 <= 256), no other
    assert call["diagnostics"] is None  # empty pool: no judge diagnostics yet, the reflector analyses
    assert method.pool.rubric_ids() == ["r1", "r2"]
    created = [e for e in method.pool_events() if e["kind"] == "created"]
    assert {e["step"] for e in created} == {3}  # optimizer steps done: delta_pool
    assert method.rubrics_to_judge(3, ["t0"])[0] == method.pool.active_rubrics()


def test_reflection_reads_at_most_max_records_sampled_uniformly_over_the_window():
    fractions = []
    for seed in range(40):
        reflector = Reflector()
        method = arise_method(tasks=60, batch=25, group=8, reflector=reflector, delta_pool=3, seed=seed)
        for step in range(3):
            run_step(method, step)  # 3 x 200 records, 256 are kept
        (call,) = reflector.propose_calls
        assert len(call["ids"]) == len(set(call["ids"])) == 256
        fractions.append(np.mean([tid.startswith("s0/") for tid in call["ids"]]))
    # each record is kept with probability 256/600, whatever its step: a third from each step on average
    assert abs(np.mean(fractions) - 1 / 3) < 0.02


def test_reflection_gets_the_judges_uncovered_behaviour_notes_without_outcomes():
    reflector = Reflector([proposal("r1", "Execution")])
    method = arise_method(reflector=reflector, delta_pool=2, max_records=5)
    run_step(method, 0)
    run_step(method, 1)  # creates r1 (no notes yet)
    notes = lambda trajs: [("asks no question",) if n % 2 else () for n in range(len(trajs))]  # noqa: E731
    kept = []
    for step in (2, 3):
        trajs, _ = run_step(method, step, uncovered=notes)
        kept += [t.trajectory_id for n, t in enumerate(trajs) if n % 2]
    call = reflector.propose_calls[-1]
    assert len(call["ids"]) == 5 and set(call["ids"]) <= set(kept)  # records with diagnostics only
    lines = call["diagnostics"].splitlines()
    assert len(lines) == 5 and all('"uncovered": ["asks no question"]' in line for line in lines)
    assert "outcome" not in call["diagnostics"] and "reward" not in call["diagnostics"]


def test_refinement_reads_the_windows_failures_of_that_rubric_and_nobody_is_asked_without_any():
    reflector = Reflector([proposal("r1", "Execution"), proposal("r2", "Verification")])
    method = arise_method(reflector=reflector, delta_pool=2)
    run_step(method, 0)
    run_step(method, 1)  # r1, r2 created (hidden)
    run_step(method, 2, verdict_of=lambda rid, t: F)
    run_step(method, 3, verdict_of=lambda rid, t: F)  # pass rate 0: both skills activated
    assert set(method.pool.active_skills()) == {"r1", "r2"}
    failed = []

    def verdict(rid, t):
        if rid == "r2":
            return P  # r2 passes: hidden, not refined
        bad = t.trajectory_id.endswith("/0")
        if bad:
            failed.append(t.trajectory_id)
        return F if bad else NA  # r1: every applicable verdict fails

    run_step(method, 4, verdict_of=verdict)
    run_step(method, 5, verdict_of=verdict)
    assert reflector.refine_calls == [("r1", failed)]  # the window's (steps 4-5) failures of r1 only
    assert method.pool.active_skills()["r1"].endswith("(refined)")


def test_a_failing_reflector_is_logged_and_the_lifecycle_still_runs(caplog):
    class Broken(Reflector):
        def propose_rubric_skills(self, *args, **kwargs):
            raise RuntimeError("reflection model is down")

    method = AdaptiveMethod(
        "arise_frozen_rubrics",
        {f"t{i}": ["tag"] for i in range(4)},
        MethodSettings(batch_size=2, group_size=2, delta_pool=1),
        Providers(reflector=Broken(), frozen_rubrics=[proposal("r1", "Execution")]),
    )
    run_step(method, 0, verdict_of=lambda rid, t: F)  # frozen: no generation call at all
    assert method.pool.active_skills() == {"r1": "skill of r1"} and method.reflection_errors == 0

    method = arise_method(reflector=Broken(), delta_pool=1)
    run_step(method, 0)
    assert method.reflection_errors == 1 and len(method.pool) == 0
    assert "reflection model is down" in caplog.text


def test_frozen_rubrics_keep_every_rubric_while_skills_still_move():
    pairs = [proposal("r1", "Execution"), proposal("r2", "Verification")]
    reflector = Reflector([proposal("new", "Execution")])
    method = AdaptiveMethod(
        "arise_frozen_rubrics",
        {f"t{i}": ["tag"] for i in range(4)},
        MethodSettings(batch_size=2, group_size=2, delta_pool=1),
        Providers(reflector=reflector, frozen_rubrics=pairs),
    )
    run_step(method, 0, verdict_of=lambda rid, t: P)  # pass rate 1.0 would retire an evolving pool
    run_step(method, 1, verdict_of=lambda rid, t: F)
    assert method.pool.rubric_ids() == ["r1", "r2"] and reflector.propose_calls == []
    assert set(method.pool.active_skills()) == {"r1", "r2"}


# ---------------------------------------------------------------- rewards and advantages


def combined_method(group=4) -> AdaptiveMethod:
    library = build_library(ids=("c1", "c2", "c3"))
    method = AdaptiveMethod(
        "combined",
        {"t0": ["tag"], "t1": ["tag"]},
        MethodSettings(
            batch_size=2, group_size=group, delta_pool=1, budget=2, length_threshold=0, success_sample=0, min_support=1
        ),
        Providers(
            library=library,
            attributor=ScriptedAttributor(),
            reflector=Reflector(
                [
                    RubricSkillProposal(RubricSpec("c1", "shared", capability="Execution"), "s"),
                    proposal("a1", "Execution"),
                ]
            ),
        ),
    )
    # stage 0: attribution makes c1 and c2 active
    diag = [traj_with(f"d{i}", 0.0, attribution=[deficit("c1"), deficit("c2")]) for i in range(3)]
    method.adapt(-1, diagnosis=(diag, reports_for(diag, {"c1": [F] * 3, "c2": [F] * 3, "c3": [P] * 3})))
    assert set(method.weaver.active) == {"c1", "c2"}
    run_step(method, 0)  # the pool's first update: it holds c1 (also in A) and a1
    assert method.pool.rubric_ids() == ["c1", "a1"]
    return method


def test_combined_counts_each_rubric_once_and_matches_an_independent_reference():
    method = combined_method()
    task_ids = ["t0", "t1"]
    outcomes = [1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 1.0, 0.0]
    lengths = [10, 40, 20, 30, 5, 5, 9, 1]
    trajs = trajectories(1, task_ids, 4, outcomes, lengths)
    plan = method.rubrics_to_judge(1, task_ids)[0]
    assert sorted(spec.rubric_id for spec in plan) == ["a1", "c1", "c2"]  # judged once each
    c1 = [(P, 0.8), (F, 0.1), (NA, None), (P, 1.0), (F, 0.0), (P, 0.6), (INV, None), (P, 0.9)]
    c2 = [(P, 1.0), (P, 0.5), (F, 0.2), (NA, None), (P, 0.7), (F, 0.0), (P, 1.0), (P, 0.3)]
    a1 = [P, F, P, F, NA, P, F, F]
    scored = method.score(trajs, reports_for(trajs, {"c1": c1, "c2": c2, "a1": a1}))
    assert set(scored.process_rubrics) == {"c1", "c2"} and scored.advantage_rubrics == ("a1",)
    assert not set(scored.process_rubrics) & set(scored.advantage_rubrics)  # c1 is counted once
    groups = np.repeat([0, 1], 4)
    task = ref_length_regularize(np.array(outcomes), np.array(lengths), groups, alpha=0.5, threshold=0, eps=1e-9)
    process = []
    for j in range(8):  # 1/|A| sum over the active set |A| = 2 (NA / INVALID add 0 and still count)
        values = [v[1] for v in (c1[j], c2[j]) if v[0] in (P, F)]
        process.append(sum(values) / 2 if values else 0.0)
    rewards = np.asarray(task) + np.array(process)
    verdicts = np.array([[1.0 if v == P else 0.0 if v == F else np.nan] for v in a1])
    expected = ref_compute_advantages(rewards, verdicts, groups, lam=0.3, eps=1e-9, ddof=1)
    assert np.allclose(scored.rewards, rewards, atol=1e-12)
    assert np.allclose(scored.task_rewards, task, atol=1e-12)
    assert np.allclose(scored.advantages, expected, atol=1e-9)


def test_length_regularization_is_applied_to_the_task_reward_only():
    """Arise B.4 regularizes R_task; RewardWeaver's process term is added afterwards, unscaled."""
    method = combined_method(group=2)
    trajs = trajectories(1, ["t0", "t1"], 2, outcomes=[1.0, 0.0, 1.0, 0.0], lengths=[2, 10, 10, 2])
    c = [(P, 1.0)] * 4
    scored = method.score(trajs, reports_for(trajs, {"c1": c, "c2": c, "a1": [P] * 4}))
    # group 0: the shorter success gets 1 * (1 + 0.5 * (1 - 0)) = 1.5; a failure stays 0; + process term 1.0
    assert np.allclose(scored.rewards, [2.5, 1.0, 1.0 * (1 + 0.5 * (1 - 2)) + 1.0, 1.0])


# ---------------------------------------------------------------- RewardWeaver: retrieval, diagnosis


def test_candidates_are_retrieved_per_failed_trajectory_from_its_judged_applicable_capabilities():
    library = build_library(ids=("c1", "c2", "c3", "c4"))
    attributor = ScriptedAttributor()
    method = AdaptiveMethod(
        "rewardweaver",
        {"t0": ["tag"]},
        MethodSettings(batch_size=1, group_size=1, max_candidates=2, success_sample=0, min_support=1),
        Providers(library=library, attributor=attributor),
    )
    diag = [
        traj_with("x", 0.0, attribution=[deficit("c2")]),
        traj_with("y", 0.0, attribution=[deficit("c4")]),
        traj_with("z", 0.0),
        traj_with("ok", 1.0),
    ]
    verdicts = {"c1": [P, NA, NA, F], "c2": [F, INV, NA, F], "c3": [NA, F, NA, F], "c4": [F, P, NA, F]}
    method.adapt(-1, diagnosis=(diag, reports_for(diag, verdicts)))
    # x: FAILs first in library order (c2, c4), capped at 2 (c1's PASS left out); y: FAIL, then INVALID, then
    # PASS -> (c3, c2); z: nothing applies -> no candidate, no call; "ok" is not in the low-outcome cohort
    assert attributor.calls == [("x", ("c2", "c4")), ("y", ("c3", "c2"))]
    record = method.weaver.history.stages[0]
    assert record.diagnosis["unattributed"] == 2 and record.active == ("c2",)  # y's c4 was not a candidate


def test_a_stage_boundary_needs_a_fresh_diagnosis_batch():
    library = build_library(ids=("c1",))
    method = AdaptiveMethod(
        "rewardweaver",
        {"t0": ["tag"], "t1": ["tag"], "t2": ["tag"]},
        MethodSettings(batch_size=1, group_size=1, adaptation_interval=2, diagnosis_tasks=2, success_sample=0),
        Providers(library=library, attributor=ScriptedAttributor()),
    )
    assert method.stage_due(-1) and not method.stage_due(0) and method.stage_due(1) and method.stage_due(3)
    with pytest.raises(ValueError, match="fresh on-policy"):
        method.adapt(1)
    first, again = method.diagnosis_tasks(1), method.diagnosis_tasks(1)
    assert first == again and len(first) == 2 and len(set(first)) == 2  # seeded by step: resumable
    assert [spec.rubric_id for spec in method.diagnosis_rubrics()] == ["c1"]


def test_diagnostic_scores_are_means_over_applicable_episodes():
    library = build_library(ids=("c1", "c2"))
    method = AdaptiveMethod(
        "rewardweaver",
        {f"t{i}": ["tag"] for i in range(5)},
        MethodSettings(batch_size=1, group_size=1, diagnostic_tasks=3, success_sample=0),
        Providers(library=library, attributor=ScriptedAttributor()),
    )
    assert len(method.diagnostic_set) == 3 and method.diagnostic_set == tuple(sorted(method.diagnostic_set))
    trajs = [traj_with(f"e{i}", 0.0) for i in range(3)]
    point = method.record_diagnostic_scores(
        30, reports_for(trajs, {"c1": [(P, 0.5), (NA, None), (F, 0.0)], "c2": [(INV, None), (NA, None), (NA, None)]})
    )
    assert point["scores"] == {"c1": 0.25, "c2": None} and point["applicable"] == {"c1": 2, "c2": 0}


# ---------------------------------------------------------------- JudgedBatch and state


def test_judged_batch_is_built_once_and_read_by_every_consumer():
    trajs = trajectories(0, ["t0"], 3)
    reports = reports_for(trajs, {"a": [P, (F, 0.25), NA], "b": [INV, P, P]}, [("note",), (), ()])
    judged = JudgedBatch.from_reports(reports, ["a", "b"])
    assert judged.codes.tolist() == [[1, 3], [0, 1], [2, 1]]
    assert np.array_equal(judged.values, [[1.0, np.nan], [0.25, 1.0], [np.nan, 1.0]], equal_nan=True)
    assert np.array_equal(judged.verdict_matrix(), [[1.0, np.nan], [0.0, 1.0], [np.nan, 1.0]], equal_nan=True)
    assert judged.uncovered == (("note",), (), ()) and judged.columns(["b"]).rubric_ids == ("b",)
    with pytest.raises(ValueError, match="were not judged"):
        judged.columns(["c"])
    with pytest.raises(ValueError):
        judged.codes[0, 0] = 2  # read-only


def test_state_round_trip_and_a_resume_refuses_another_variant():
    reflector = Reflector([proposal("r1", "Execution")])
    method = arise_method(reflector=reflector, delta_pool=2)
    for step in range(3):
        run_step(method, step, verdict_of=lambda rid, t: F)
    state = method.state_dict()
    twin = arise_method(reflector=Reflector(), delta_pool=2)
    twin.load_state_dict(state)
    assert twin.state_dict() == state and twin.sample(3) == method.sample(3)
    other = AdaptiveMethod(
        "arise_no_skills", {f"t{i}": ["tag"] for i in range(8)}, method.settings, Providers(reflector=Reflector())
    )
    with pytest.raises(ValueError, match="train.method: the state was written by variant 'arise'"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="method setting 'delta_pool'"):
        arise_method(reflector=Reflector(), delta_pool=5).load_state_dict(state)


def test_a_state_from_before_rank_by_resumes_where_ranking_cannot_differ():
    # an Arise state without the setting: attribution never ran, so it loads under any ranking
    method = arise_method(reflector=Reflector(), delta_pool=2)
    run_step(method, 0, verdict_of=lambda rid, t: F)
    state = copy.deepcopy(method.state_dict())
    del state["settings"]["rank_by"]
    twin = arise_method(reflector=Reflector(), delta_pool=2)
    twin.load_state_dict(state)
    assert twin.sample(3) == method.sample(3)
    # a RewardWeaver state without it ranked by support: refused under "rate", with the way to resume it
    library = build_library(ids=("c1", "c2"))

    def weaver(rank_by):
        return AdaptiveMethod(
            "rewardweaver",
            {"t0": ["tag"]},
            MethodSettings(batch_size=1, group_size=1, success_sample=0, rank_by=rank_by),
            Providers(library=library, attributor=ScriptedAttributor()),
        )

    old = copy.deepcopy(weaver("support").state_dict())
    del old["settings"]["rank_by"]
    del old["weaver"]["config"]["rank_by"]
    with pytest.raises(ValueError, match="'rank_by': the state has 'support', this method 'rate'.*rank_by: support"):
        weaver("rate").load_state_dict(old)
    resumed = weaver("support")
    resumed.load_state_dict(old)
    assert resumed.settings.rank_by == "support"


def test_a_failing_attributor_keeps_the_active_set_and_training_goes_on(caplog):
    class Down:
        def attribute(self, trajectory, candidates):
            raise RuntimeError("attribution model is down")

    library = build_library(ids=("c1", "c2"))
    method = AdaptiveMethod(
        "rewardweaver",
        {"t0": ["tag"]},
        MethodSettings(batch_size=1, group_size=1, success_sample=0),
        Providers(library=library, attributor=Down()),
    )
    diag = [traj_with("x", 0.0)]
    report = method.adapt(-1, diagnosis=(diag, reports_for(diag, {"c1": [F], "c2": [F]})))
    assert report.stage is None and method.weaver.stage is None and method.metrics().get("active_rubrics") == 0
    assert method.state_dict()["stage_errors"] == 1 and "attribution model is down" in caplog.text
