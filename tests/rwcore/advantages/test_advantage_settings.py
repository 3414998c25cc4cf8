"""The credit settings (docs/method.md "Credit and exploration settings"): advantage.scale_rewards,
advantage.aggregation and advantage.process_gate.

Expected values are worked out by hand below for small groups (the arithmetic is written out next to each
case) and checked against both `rwcore.compute_advantages` and the plain reference of
tests/advantage_reference.py (written from TRL 1.16's formulas and the definitions, not from rwcore); random
cases compare the two. The defaults reproduce the papers' formulas (the existing reference) exactly, and
`AdaptiveMethod` refuses a setting its variant cannot apply, naming the config key.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from advantage_reference import ref_compute_advantages, ref_credit_advantages, ref_credit_mask
from pool_fakes import proposal
from rewardweaver_fakes import ScriptedAttributor, build_library, deficit, judgment

import rwcore
from rwcore.arise.advantages import process_credit_mask
from rwcore.method import (
    AdaptiveMethod,
    MethodSettings,
    Providers,
    differing_components,
    differing_pins,
    inapplicable_settings,
)
from rwcore.trainer.config import load_config
from rwcore.trainer.method_setup import method_settings
from rwcore.types import JudgeReport, RubricSkillProposal, RubricSpec, Trajectory, Turn
from rwcore.verdict import Verdict

P, F, NA, INV = Verdict.PASS, Verdict.FAIL, Verdict.NA, Verdict.INVALID
NAN = float("nan")
EPS = 1e-9
SCALES = ("group", "batch", "none")
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
GATES = ("off", "success_groups", "success_only")


@pytest.fixture(params=["rwcore", "reference"])
def adv(request):
    """The function under test, and the reference checked against the same hand values."""
    if request.param == "rwcore":
        return rwcore.compute_advantages

    def reference(task_rewards, verdicts, group_ids, lam=0.3, eps=1e-9, ddof=1, **settings):
        return ref_credit_advantages(task_rewards, verdicts, group_ids, lam=lam, eps=eps, ddof=ddof, **settings)

    return reference


def check(got, expected, tol=1e-12):
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), np.asarray(expected), rtol=tol, atol=tol)


# ------------------------------------------------------------------------------------------------------------
# RewardWeaver's composite reward, two groups of four (no Arise rubrics):
#
#   group 0, all failures:  R_o = [0, 0, 0, 0]   J = [0.1, 0.2, 0.3, 0.4]   R = J
#   group 1, mixed:         R_o = [1, 0, 1, 0]   J = [0.5, 0.5, 0.0, 0.0]   R = [1.5, 0.5, 1.0, 0.0]
#
# group 0: mean 0.25, deviations [-0.15, -0.05, 0.05, 0.15], sum of squares 0.05, sample std sqrt(0.05 / 3):
#   the small process differences of an all-failure group become advantages of size ~1 (the collapse).
# group 1: mean 0.75, deviations [0.75, -0.25, 0.25, -0.75], sum of squares 1.25, std sqrt(1.25 / 3).
# batch: R over all 8 has mean 4 / 8 = 0.5; squared deviations 0.16 .09 .04 .01 1 0 .25 .25 = 1.8, std sqrt(1.8 / 7).
# ------------------------------------------------------------------------------------------------------------

RW_TASK = np.array([0.0, 0, 0, 0, 1, 0, 1, 0])
RW_PROCESS = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.5, 0.0, 0.0])
RW_GROUPS = np.repeat([0, 1], 4)
DEV0 = np.array([-0.15, -0.05, 0.05, 0.15])
DEV1 = np.array([0.75, -0.25, 0.25, -0.75])
NO_RUBRICS = np.zeros((8, 0))


@pytest.mark.parametrize(
    "scale, expected",
    [
        ("group", np.r_[DEV0 / (math.sqrt(0.05 / 3) + EPS), DEV1 / (math.sqrt(1.25 / 3) + EPS)]),
        ("batch", np.r_[DEV0, DEV1] / (math.sqrt(1.8 / 7) + EPS)),
        ("none", np.r_[DEV0, DEV1]),
    ],
)
def test_an_all_failure_group_with_varying_process_terms_under_each_scale(adv, scale, expected):
    got = adv(RW_TASK, NO_RUBRICS, RW_GROUPS, process_rewards=RW_PROCESS, scale_rewards=scale)
    check(got, expected)
    if scale == "group":  # unit-size advantages out of differences of 0.05 in the process term
        assert abs(got[3]) > 1.1
    else:  # batch and none keep them in proportion to the mixed group's
        assert abs(got[3]) < abs(got[4]) / 4


def test_the_process_gate_by_hand(adv):
    # success = R_o >= 0.5: group 0 holds none, group 1 holds positions 4 and 6
    successes = RW_TASK >= 0.5
    # success_groups: group 0's J is gated off (R = 0: A = 0); group 1 is as ungated
    got = adv(
        RW_TASK, NO_RUBRICS, RW_GROUPS, process_rewards=RW_PROCESS, process_gate="success_groups", successes=successes
    )
    check(got, np.r_[np.zeros(4), DEV1 / (math.sqrt(1.25 / 3) + EPS)])
    # success_only: group 1 keeps J on its successes only: R = [1.5, 0, 1, 0], mean 0.625,
    # deviations [0.875, -0.625, 0.375, -0.625], sum of squares 1.6875, std sqrt(0.5625) = 0.75
    got = adv(
        RW_TASK, NO_RUBRICS, RW_GROUPS, process_rewards=RW_PROCESS, process_gate="success_only", successes=successes
    )
    check(got, np.r_[np.zeros(4), np.array([0.875, -0.625, 0.375, -0.625]) / (0.75 + EPS)])
    # off: the papers' formula, successes or not
    got = adv(RW_TASK, NO_RUBRICS, RW_GROUPS, process_rewards=RW_PROCESS, process_gate="off", successes=successes)
    check(got, np.r_[DEV0 / (math.sqrt(0.05 / 3) + EPS), DEV1 / (math.sqrt(1.25 / 3) + EPS)])


def test_normalize_then_sum_by_hand(adv):
    # group 0: R_o constant -> 0; J -> DEV0 / sqrt(0.05 / 3) = sqrt(0.15) * [-3, -1, 1, 3]
    # group 1: R_o = [1, 0, 1, 0] -> +-0.5 / sqrt(1 / 3) = +-sqrt(3) / 2; J = [.5, .5, 0, 0] -> +-0.25 / sqrt(0.25 / 3)
    #   = +-sqrt(3) / 2; summed: [sqrt(3), 0, 0, -sqrt(3)]
    # the sum over the batch: mean 0, sum of squares 0.15 * 20 + 3 + 3 = 9, std sqrt(9 / 7)
    total = np.r_[math.sqrt(0.15) * np.array([-3.0, -1, 1, 3]), [math.sqrt(3), 0, 0, -math.sqrt(3)]]
    got = adv(RW_TASK, NO_RUBRICS, RW_GROUPS, process_rewards=RW_PROCESS, aggregation="normalize_then_sum")
    check(got, total / (math.sqrt(9 / 7) + EPS), tol=1e-8)
    # with scale_rewards="none" each part is only centred: group 0 DEV0; group 1 [.5,-.5,.5,-.5] + [.25,.25,-.25,-.25]
    # = [.75, -.25, .25, -.75]; the sum (mean 0) over the batch: sum of squares 0.05 + 1.25 = 1.3, std sqrt(1.3 / 7)
    got = adv(
        RW_TASK,
        NO_RUBRICS,
        RW_GROUPS,
        process_rewards=RW_PROCESS,
        aggregation="normalize_then_sum",
        scale_rewards="none",
    )
    check(got, np.r_[DEV0, DEV1] / (math.sqrt(1.3 / 7) + EPS), tol=1e-8)


# ------------------------------------------------------------------------------------------------------------
# Arise's rubric term, lam = 0.5, one rubric, two groups of four:
#
#   group 0, all failures:  R = [0, 0, 0, 0]   y = [1, 0, 0, 0]
#   group 1:                R = [1, 1, 0, 0]   y = [1, 0, 1, 0]
#
# group scale: group 0 A_task = 0; y mean 0.25, deviations [.75, -.25, -.25, -.25], squares 0.75, std 0.5
#   -> A_rub = [1.5, -.5, -.5, -.5]; group 1 A_task = +-0.5 / sqrt(1 / 3), A_rub = [.5, -.5, .5, -.5] / sqrt(1 / 3)
# batch scale: R over the batch mean 0.25, squares 6 * 0.0625 + 2 * 0.5625 = 1.5, std sqrt(1.5 / 7); y over the
#   batch [1,0,0,0,1,0,1,0] mean 0.375, squares 3 * 0.390625 + 5 * 0.140625 = 1.875, std sqrt(1.875 / 7)
# ------------------------------------------------------------------------------------------------------------

AR_TASK = np.array([0.0, 0, 0, 0, 1, 1, 0, 0])
AR_Y = np.array([[1.0], [0], [0], [0], [1], [0], [1], [0]])
Y0, Y1 = np.array([0.75, -0.25, -0.25, -0.25]), np.array([0.5, -0.5, 0.5, -0.5])
T1 = np.array([0.5, 0.5, -0.5, -0.5])


@pytest.mark.parametrize(
    "scale, expected",
    [
        ("group", np.r_[0.5 * Y0 / (0.5 + EPS), 0.5 * (T1 + Y1) / (math.sqrt(1 / 3) + EPS)]),
        (
            "batch",
            np.r_[
                0.5 * Y0 / (math.sqrt(1.875 / 7) + EPS),
                0.5 * T1 / (math.sqrt(1.5 / 7) + EPS) + 0.5 * Y1 / (math.sqrt(1.875 / 7) + EPS),
            ],
        ),
        ("none", np.r_[0.5 * Y0, 0.5 * (T1 + Y1)]),
    ],
)
def test_arise_rubric_advantages_under_each_scale(adv, scale, expected):
    check(adv(AR_TASK, AR_Y, RW_GROUPS, lam=0.5, scale_rewards=scale), expected)


def test_the_process_gate_leaves_gated_trajectories_out_of_the_rubric_term(adv):
    successes = AR_TASK >= 0.5
    a_task1 = T1 / (math.sqrt(1 / 3) + EPS)
    # success_groups: group 0 holds no success: A = A_task = 0 there; group 1 as ungated
    got = adv(AR_TASK, AR_Y, RW_GROUPS, lam=0.5, process_gate="success_groups", successes=successes)
    check(got, np.r_[np.zeros(4), 0.5 * (T1 + Y1) / (math.sqrt(1 / 3) + EPS)])
    # success_only: the rubric among group 1's successes (y = [1, 0]: +-0.5 / sqrt(0.5)); its failures get A_task
    got = adv(AR_TASK, AR_Y, RW_GROUPS, lam=0.5, process_gate="success_only", successes=successes)
    rubric = np.array([0.5, -0.5]) / (math.sqrt(0.5) + EPS)
    check(got, np.r_[np.zeros(4), 0.5 * a_task1[:2] + 0.5 * rubric, a_task1[2:]])


def test_the_credit_mask_by_hand():
    successes = np.array([False, False, True, False, False, False])
    groups = np.array([7, 7, 7, 3, 3, 7])  # interleaved: group 7 holds the success
    assert process_credit_mask(successes, groups, "off").tolist() == [True] * 6
    assert process_credit_mask(successes, groups, "success_groups").tolist() == [True, True, True, False, False, True]
    assert process_credit_mask(successes, groups, "success_only").tolist() == successes.tolist()
    for gate in GATES:
        assert process_credit_mask(successes, groups, gate).tolist() == ref_credit_mask(successes, groups, gate)


# ------------------------------------------------------------------------------------------------------------
# the defaults, random cases, torch, bad input
# ------------------------------------------------------------------------------------------------------------


def _case(seed: int, n_groups: int = 5, g: int = 4, rubrics: int = 3):
    rng = np.random.default_rng(seed)
    groups = rng.permutation(np.repeat(rng.choice(1000, n_groups, replace=False), g))  # interleaved, any ids
    task = rng.choice([0.0, 0.0, 0.5, 1.0], size=len(groups)) * rng.choice([1.0, 1.3], size=len(groups))
    process = rng.random(len(groups)).round(2)
    verdicts = rng.choice([0.0, 1.0, NAN], size=(len(groups), rubrics), p=[0.4, 0.4, 0.2])
    return task, process, verdicts, groups


@pytest.mark.parametrize("seed", range(6))
def test_the_defaults_are_the_papers_formulas_exactly(seed):
    task, process, verdicts, groups = _case(seed)
    papers = ref_compute_advantages(task + process, verdicts, groups, lam=0.3, eps=1e-9, ddof=1)
    got = rwcore.compute_advantages(task, verdicts, groups, process_rewards=process)
    np.testing.assert_allclose(got, papers, rtol=1e-9, atol=1e-11)
    # the same numbers as before the settings existed: R passed whole (as AdaptiveMethod.score did)
    whole = rwcore.compute_advantages(task + process, verdicts, groups, lam=0.3, eps=1e-9, ddof=1)
    assert np.array_equal(got, whole)
    explicit = rwcore.compute_advantages(
        task,
        verdicts,
        groups,
        process_rewards=process,
        scale_rewards="group",
        aggregation="sum_then_normalize",
        process_gate="off",
        successes=task >= 0.5,
    )
    assert np.array_equal(explicit, whole)
    # and the new reference, at its defaults, is the old one
    np.testing.assert_allclose(ref_credit_advantages(task, verdicts, groups, process_rewards=process), papers, 1e-12)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("gate", GATES)
def test_every_setting_matches_the_reference(seed, scale, aggregation, gate):
    task, process, verdicts, groups = _case(seed)
    settings = dict(scale_rewards=scale, aggregation=aggregation, process_gate=gate, successes=task >= 0.5)
    for lam, ddof in ((0.3, 1), (0.7, 0)):
        expected = ref_credit_advantages(
            task, verdicts, groups, lam=lam, ddof=ddof, eps=1e-9, process_rewards=process, **settings
        )
        got = rwcore.compute_advantages(task, verdicts, groups, lam, 1e-9, ddof, process_rewards=process, **settings)
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-10)


def test_torch_in_torch_out_under_settings():
    task, process, verdicts, groups = _case(11)
    kwargs = dict(scale_rewards="batch", process_gate="success_only", successes=torch.from_numpy(task >= 0.5))
    got = rwcore.compute_advantages(
        torch.tensor(task, dtype=torch.float32),
        torch.from_numpy(verdicts),
        torch.from_numpy(groups),
        process_rewards=torch.from_numpy(process),
        **kwargs,
    )
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    expected = ref_credit_advantages(
        task, verdicts, groups, process_rewards=process, **{**kwargs, "successes": task >= 0.5}
    )
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_bad_settings_are_refused_naming_the_argument():
    task, process, verdicts, groups = _case(0)
    for name, value in (("scale_rewards", "std"), ("aggregation", "sum"), ("process_gate", "on")):
        with pytest.raises(ValueError, match=f"{name} must be one of"):
            rwcore.compute_advantages(task, verdicts, groups, **{name: value})
    with pytest.raises(ValueError, match="needs successes"):
        rwcore.compute_advantages(task, verdicts, groups, process_gate="success_only")
    with pytest.raises(ValueError, match="successes must be 1-D booleans"):
        rwcore.compute_advantages(task, verdicts, groups, process_gate="success_only", successes=task)
    with pytest.raises(ValueError, match="process_rewards has length"):
        rwcore.compute_advantages(task, verdicts, groups, process_rewards=process[:-1])
    with pytest.raises(ValueError, match="process_rewards holds NaN"):
        rwcore.compute_advantages(task, verdicts, groups, process_rewards=np.r_[process[:-1], NAN])


# ------------------------------------------------------------------------------------------------------------
# AdaptiveMethod: every variant, the same settings
# ------------------------------------------------------------------------------------------------------------


class _Reflector:
    def __init__(self, proposals=()) -> None:
        self.proposals = list(proposals)

    def propose_rubric_skills(self, trajectories, existing, max_new, **_):
        out, self.proposals = self.proposals[:max_new], self.proposals[max_new:]
        return out

    def refine_skill(self, rubric, skill, failures):
        return skill


def _trajectories(step, task_ids, g, outcomes):
    return [
        Trajectory(
            task_id,
            [Turn("assistant", f"{task_id} {j}", True)],
            float(outcomes[i * g + j]),
            tags=("tag",),
            trajectory_id=f"s{step}/{task_id}/{j}",
        )
        for i, task_id in enumerate(task_ids)
        for j in range(g)
    ]


def _reports(trajs, columns):
    out = []
    for n, t in enumerate(trajs):
        judgments = {}
        for rid, column in columns.items():
            verdict, score = column[n] if isinstance(column[n], tuple) else (column[n], None)
            judgments[rid] = judgment(rid, verdict, score)
        out.append(JudgeReport(t.trajectory_id, judgments))
    return out


def _combined(**settings) -> AdaptiveMethod:
    """RewardWeaver's active set {c1, c2} and Arise's pool {c1 (shared), a1}: the combined method after one step."""
    method = AdaptiveMethod(
        "combined",
        {"t0": ["tag"], "t1": ["tag"]},
        MethodSettings(
            batch_size=2,
            group_size=4,
            delta_pool=1,
            budget=2,
            success_sample=0,
            min_support=1,
            length_threshold=10**6,
            **settings,
        ),
        Providers(
            library=build_library(ids=("c1", "c2", "c3")),
            attributor=ScriptedAttributor(),
            reflector=_Reflector(
                [
                    RubricSkillProposal(RubricSpec("c1", "shared", capability="Execution"), "s"),
                    proposal("a1", "Execution"),
                ]
            ),
        ),
    )
    diag = [
        Trajectory(
            "t0",
            [Turn("assistant", f"d{i}", True)],
            0.0,
            tags=("tag",),
            trajectory_id=f"d{i}",
            metadata={"attribution": [deficit("c1"), deficit("c2")]},
        )
        for i in range(3)
    ]
    method.adapt(-1, diagnosis=(diag, _reports(diag, {"c1": [F] * 3, "c2": [F] * 3, "c3": [P] * 3})))
    task_ids = method.sample(0)
    trajs = _trajectories(0, task_ids, 4, [0.0] * 8)
    plan = method.rubrics_to_judge(0, task_ids)[0]
    scored = method.score(trajs, _reports(trajs, {spec.rubric_id: [P] * 8 for spec in plan}))
    method.observe(0, task_ids, trajs, scored.judged)
    method.adapt(0)
    assert method.pool.rubric_ids() == ["c1", "a1"] and set(method.weaver.active) == {"c1", "c2"}
    return method


# group t0 fails throughout with varying process scores (the all-failure case); group t1 is mixed
OUTCOMES = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]
C1 = [(P, 0.9), (F, 0.2), (P, 0.6), (F, 0.0), (P, 1.0), (F, 0.3), (NA, None), (P, 0.8)]
C2 = [(P, 0.7), (P, 0.5), (F, 0.1), (INV, None), (P, 0.9), (P, 0.4), (F, 0.2), (F, 0.0)]
A1 = [P, F, F, P, P, F, P, NA]


def _score(method, outcomes=OUTCOMES, failed=()):
    trajs = _trajectories(1, ["t0", "t1"], 4, outcomes)
    for k in failed:
        trajs[k].partner_failure = "the partner's model crashed"
    return method.score(trajs, _reports(trajs, {"c1": C1, "c2": C2, "a1": A1}))


def _process_by_hand():
    """1/|A| sum over the active set {c1, c2}: NA and INVALID add 0 and still count."""
    out = []
    for j in range(8):
        values = [v[1] for v in (C1[j], C2[j]) if v[0] in (P, F)]
        out.append(sum(values) / 2)
    return np.array(out)


A1_MATRIX = np.array([[1.0 if v == P else 0.0 if v == F else NAN] for v in A1])


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("gate", GATES)
def test_the_combined_method_scores_every_setting_as_the_reference(scale, aggregation, gate):
    method = _combined()
    method.set_credit_settings(scale_rewards=scale, aggregation=aggregation, process_gate=gate)
    scored = _score(method)
    assert scored.process_rubrics == ("c1", "c2") and scored.advantage_rubrics == ("a1",)
    outcomes = np.array(OUTCOMES)
    process = _process_by_hand()
    successes = outcomes >= 0.5  # rewardweaver.low_outcome
    expected = ref_credit_advantages(
        outcomes,
        A1_MATRIX,
        np.repeat([0, 1], 4),
        process_rewards=process,
        scale_rewards=scale,
        aggregation=aggregation,
        process_gate=gate,
        successes=successes,
    )
    np.testing.assert_allclose(scored.advantages, expected, rtol=1e-9, atol=1e-10)
    gated = process * np.array(ref_credit_mask(successes, np.repeat([0, 1], 4), gate))
    np.testing.assert_allclose(scored.process_terms, gated, atol=1e-12)
    np.testing.assert_allclose(scored.rewards, outcomes + gated, atol=1e-12)
    if gate != "off":  # the all-failure group gets no process credit: its advantages are 0 (to rounding)
        assert np.all(np.abs(scored.advantages[:4]) < 1e-12) and np.all(scored.process_terms[:4] == 0.0)
    else:
        assert np.all(np.abs(scored.advantages[:4]) > 1e-3)


def test_the_default_method_scores_as_before():
    scored = _score(_combined())
    before = ref_compute_advantages(np.array(OUTCOMES) + _process_by_hand(), A1_MATRIX, np.repeat([0, 1], 4))
    np.testing.assert_allclose(scored.advantages, before, rtol=1e-9, atol=1e-10)
    assert abs(scored.advantages[0]) > 1.0  # the all-failure group: unit-size advantages from process scores


def test_partner_failures_keep_their_handling_under_the_gate():
    method = _combined(process_gate="success_groups", scale_rewards="batch")
    scored = _score(method, failed=(4, 6))  # group t1's two successes ended by the partner: no success left there
    assert scored.advantages[4] == 0.0 and scored.advantages[6] == 0.0
    keep = np.array([k not in (4, 6) for k in range(8)])
    outcomes = np.array(OUTCOMES)
    expected = ref_credit_advantages(
        outcomes[keep],
        A1_MATRIX[keep],
        np.repeat([0, 1], 4)[keep],
        process_rewards=_process_by_hand()[keep],
        scale_rewards="batch",
        process_gate="success_groups",
        successes=np.zeros(6, dtype=bool),
    )
    np.testing.assert_allclose(scored.advantages[keep], expected, rtol=1e-9, atol=1e-10)
    assert np.all(scored.process_terms == 0.0)  # no group holds a success any more


def test_outcome_only_takes_scale_rewards():
    method = AdaptiveMethod("outcome_only", {"t0": ["x"], "t1": ["x"]}, MethodSettings(batch_size=2, group_size=4))
    method.set_credit_settings(scale_rewards="none")
    trajs = _trajectories(0, ["t0", "t1"], 4, [0, 1, 1, 1, 0, 0, 0.5, 0])
    scored = method.score(trajs, [JudgeReport(t.trajectory_id, {}) for t in trajs])
    np.testing.assert_allclose(scored.advantages, [-0.75, 0.25, 0.25, 0.25, -0.125, -0.125, 0.375, -0.125])


# ------------------------------------------------------------------------------------------------------------
# refusals, config keys, state
# ------------------------------------------------------------------------------------------------------------

NOT_APPLICABLE = {  # by hand from each variant's components (docs/method.md "Method variants")
    "outcome_only": ["advantage.aggregation", "advantage.process_gate"],
    "rw_outcome_grpo": ["advantage.aggregation", "advantage.process_gate"],
    "arise": ["advantage.aggregation"],
    "arise_frozen_rubrics": ["advantage.aggregation"],
    "arise_no_skills": ["advantage.aggregation"],
    "arise_no_adaptive_sampling": ["advantage.aggregation"],
    "arise_vade_sampling": ["advantage.aggregation"],
    "arise_retire_while_shown": ["advantage.aggregation"],
}


SHOWS_SKILLS = {
    "combined",
    "arise",
    "arise_retire_while_shown",
    "arise_frozen_rubrics",
    "arise_no_adaptive_sampling",
    "arise_vade_sampling",
}


@pytest.mark.parametrize("name", list(AdaptiveMethod.variants()))
def test_retire_while_shown_applies_only_where_skills_are_shown(name):
    other = not MethodSettings().retire_while_shown  # the value that is not the default
    found = inapplicable_settings(name, MethodSettings(retire_while_shown=other))
    assert found == ([] if name in SHOWS_SKILLS else ["pool.retire_while_shown"])
    if name == "arise":  # the setting reaches the pool
        settings = MethodSettings(batch_size=1, retire_while_shown=other)
        method = AdaptiveMethod(name, {"t": ["x"]}, settings, Providers(reflector=_Reflector()))
        assert method.pool.state_dict()["config"]["retire_while_shown"] is other


def test_arise_retire_while_shown_pins_eq5_and_refuses_the_other_value_only_when_set_apart_from_both():
    """The named variant runs eq. 5 read alone whatever the default; the default is the paper's lifecycle tables'
    hide-first rule, which `arise` runs."""
    assert MethodSettings().retire_while_shown is False
    tasks, providers = {"t": ["x"]}, Providers(reflector=_Reflector())
    eq5 = AdaptiveMethod("arise_retire_while_shown", tasks, MethodSettings(batch_size=1), providers)
    assert eq5.settings.retire_while_shown is True and eq5.pool.state_dict()["config"]["retire_while_shown"] is True
    assert eq5.resolved()["variant"]["pinned"] == {"retire_while_shown": True}
    arise = AdaptiveMethod("arise", tasks, MethodSettings(batch_size=1), providers)
    assert arise.pool.state_dict()["config"]["retire_while_shown"] is False
    assert (
        differing_components(AdaptiveMethod.variants()["arise_retire_while_shown"], AdaptiveMethod.variants()["arise"])
        == []
    )
    assert differing_pins(
        AdaptiveMethod.variants()["arise_retire_while_shown"], AdaptiveMethod.variants()["arise"]
    ) == ["retire_while_shown"]


@pytest.mark.parametrize("name", list(AdaptiveMethod.variants()))
def test_inapplicable_settings_per_variant(name):
    changed = MethodSettings(scale_rewards="batch", aggregation="normalize_then_sum", process_gate="success_only")
    assert inapplicable_settings(name, changed) == NOT_APPLICABLE.get(name, [])
    assert inapplicable_settings(AdaptiveMethod.variants()[name], MethodSettings(scale_rewards="none")) == []


def test_a_setting_a_variant_cannot_apply_is_refused_naming_the_key():
    tasks = {"t": ["x"]}
    with pytest.raises(
        ValueError, match="advantage.process_gate='success_only' does not apply to variant 'outcome_only'"
    ):
        AdaptiveMethod("outcome_only", tasks, MethodSettings(batch_size=1, process_gate="success_only"))
    with pytest.raises(
        ValueError, match="advantage.aggregation='normalize_then_sum' does not apply to variant 'arise'"
    ):
        AdaptiveMethod(
            "arise",
            tasks,
            MethodSettings(batch_size=1, aggregation="normalize_then_sum"),
            Providers(reflector=_Reflector()),
        )
    AdaptiveMethod("outcome_only", tasks, MethodSettings(batch_size=1, scale_rewards="batch"))  # applies everywhere
    AdaptiveMethod(
        "arise", tasks, MethodSettings(batch_size=1, process_gate="success_groups"), Providers(reflector=_Reflector())
    )
    # set_credit_settings: the same checks, nothing half-applied
    method = AdaptiveMethod("outcome_only", tasks, MethodSettings(batch_size=1))
    with pytest.raises(ValueError, match="advantage.aggregation"):
        method.set_credit_settings(scale_rewards="none", aggregation="normalize_then_sum")
    with pytest.raises(ValueError, match="takes only"):
        method.set_credit_settings(lam=0.5)
    with pytest.raises(ValueError, match="scale_rewards must be one of"):
        method.set_credit_settings(scale_rewards="std")
    assert method.settings == MethodSettings(batch_size=1)


def test_the_settings_are_advantage_config_keys_of_rw_train(tmp_path):
    # a config file may write them bare: YAML reads `off` as a boolean, which the key takes as "off"
    (tmp_path / "config.yaml").write_text("advantage:\n  process_gate: off\n  scale_rewards: none\n")
    from_file = load_config(tmp_path / "config.yaml").advantage
    assert (from_file.process_gate, from_file.scale_rewards) == ("off", "none")
    cfg = load_config(
        None,
        [
            "advantage.scale_rewards=none",
            "advantage.aggregation=normalize_then_sum",
            "advantage.process_gate=success_groups",
            "rewardweaver.low_outcome=0.75",
        ],
    )
    settings = method_settings(cfg)
    assert (settings.scale_rewards, settings.aggregation, settings.process_gate) == (
        "none",
        "normalize_then_sum",
        "success_groups",
    )
    defaults = load_config(None).advantage
    assert (defaults.scale_rewards, defaults.aggregation, defaults.process_gate) == (
        "group",
        "sum_then_normalize",
        "off",
    )
    for key, value in (("scale_rewards", "std"), ("aggregation", "mean"), ("process_gate", "always")):
        with pytest.raises(ValueError, match=f"advantage.{key}"):
            load_config(None, [f"advantage.{key}={value}"])


def test_rw_train_refuses_a_setting_its_variant_cannot_apply(tmp_path):
    from rwcore.trainer.trainer import Trainer

    cfg = load_config(None, ["model.init=random", "train.method=outcome_only", "advantage.process_gate=success_only"])
    trainer = Trainer(cfg, tmp_path / "run", quiet=True)
    try:
        with pytest.raises(ValueError, match="advantage.process_gate"):
            trainer.setup()
    finally:
        trainer.cleanup()


def test_a_state_from_before_the_settings_resumes_at_the_defaults():
    method = _combined()
    state = copy.deepcopy(method.state_dict())
    for name in ("scale_rewards", "aggregation", "process_gate"):
        del state["settings"][name]
    twin = _combined()
    twin.load_state_dict(state)
    np.testing.assert_array_equal(_score(twin).advantages, _score(method).advantages)
    with pytest.raises(ValueError, match="method setting 'scale_rewards': the state has 'group', this method 'batch'"):
        _combined(scale_rewards="batch").load_state_dict(state)
