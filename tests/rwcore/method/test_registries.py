"""Samplers and process rewards are registries (verl's `register_adv_est` style): the variant table, the
config's choices and the provider checks come from them, and a newly registered one is usable at once."""

import numpy as np
import pytest

from rwcore.method import AdaptiveMethod, MethodSettings, Providers, Variant
from rwcore.method.variants import LIBRARY_STRATEGIES, PROCESS_REWARDS
from rwcore.rewardweaver.process_rewards import get_process_reward, process_reward_names, register_process_reward
from rwcore.rewardweaver.selection import STRATEGIES
from rwcore.sampling import register_sampler, sampler_names
from rwcore.types import JudgeReport, RubricJudgment, RubricSpec, Trajectory, Turn
from rwcore.verdict import Verdict


def test_the_catalogue_comes_from_the_registries():
    assert LIBRARY_STRATEGIES == STRATEGIES  # the selection strategies, listed once in selection.py
    assert set(PROCESS_REWARDS) == {None, *STRATEGIES, "open_vocabulary", "instance_specific"}
    assert {"capability", "outcome", "uniform"} <= set(sampler_names())
    assert get_process_reward("open_vocabulary").has_stages and not get_process_reward("instance_specific").has_stages
    assert get_process_reward("random").needs(MethodSettings(success_sample=0)) == ("library",)
    assert get_process_reward("random").needs(MethodSettings()) == ("library", "attributor")
    with pytest.raises(ValueError, match="already registered"):
        register_process_reward("open_vocabulary")(lambda settings, providers: None)
    with pytest.raises(ValueError, match="already registered"):
        register_sampler("uniform")(lambda tasks, settings: None)


class _FirstTasks:
    """A sampler that always draws the first batch_size tasks (registered below)."""

    def __init__(self, tasks, settings):
        self.task_ids, self.batch_size, self.rubrics, self.recorded = list(tasks), settings.batch_size, {}, []

    def sample(self, version):
        return self.task_ids[: self.batch_size]

    def record_group(self, task_id, verdicts, version, outcomes=None):
        self.recorded.append(task_id)

    def set_rubrics(self, rubrics):
        self.rubrics = dict(rubrics)

    def state_dict(self):
        return {"recorded": list(self.recorded)}

    def load_state_dict(self, state):
        self.recorded = list(state["recorded"])


class _FixedRubric:
    """A process reward with one fixed rubric for every task (registered below)."""

    def __init__(self):
        self.spec = RubricSpec("polite", "the reply is polite")

    def rubrics(self, task_id=None):
        return [self.spec]


def test_a_registered_sampler_and_process_reward_run_in_a_variant():
    if "first_tasks" not in sampler_names():
        register_sampler("first_tasks", "test")(_FirstTasks)
    if "fixed_rubric" not in process_reward_names():
        register_process_reward("fixed_rubric", description="test")(lambda settings, providers: _FixedRubric())
    variant = Variant(
        "my_variant",
        "a test variant",
        "none",
        None,
        {"process_reward": "fixed_rubric", "arise_rubrics": None, "skills": False, "sampler": "first_tasks"},
    )
    method = AdaptiveMethod(
        variant, {"t0": ["a"], "t1": ["b"], "t2": ["c"]}, MethodSettings(batch_size=2, group_size=2), Providers()
    )
    task_ids = method.sample(0)
    assert task_ids == ["t0", "t1"]
    assert [[s.rubric_id for s in plan] for plan in method.rubrics_to_judge(0, task_ids)] == [["polite"], ["polite"]]
    trajectories = [
        Trajectory(task_id=t, turns=[Turn("assistant", "hi", generated=True)], outcome=0.0, trajectory_id=f"{t}-{k}")
        for t in task_ids
        for k in range(2)
    ]
    verdicts = [Verdict.PASS, Verdict.FAIL, Verdict.PASS, Verdict.PASS]
    reports = [
        JudgeReport(t.trajectory_id, {"polite": RubricJudgment("polite", v)}) for t, v in zip(trajectories, verdicts)
    ]
    scored = method.score(trajectories, reports)
    np.testing.assert_array_equal(scored.process_terms, [1.0, 0.0, 1.0, 1.0])  # R = R_o + mean_A J_d, by hand
    method.observe(0, task_ids, trajectories, scored.judged)
    assert method.sampler.recorded == ["t0", "t1"]
