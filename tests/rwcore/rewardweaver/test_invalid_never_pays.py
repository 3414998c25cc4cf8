"""INVALID never pays, and a failing judge or reflector never crashes a run.

An INVALID judgment (the judge failed, or its answer could not be read) must score no higher than a
FAIL in every reward - RewardWeaver's process term under both normalizations, Arise's rubric
advantages, the TRL reward functions and the verl advantage estimator - while evidence, coverage and
pool counts still see it as INVALID. Expected numbers are worked out by hand in the comments.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from judge_server import (
    ChatServer,
    Reply,
    all_pass,
    loopback_without_proxy,  # noqa: F401 - autouse fixture
)
from method_fakes import combined, reports_for, traj_with, trajectories
from rewardweaver_fakes import ScriptedAttributor, build_library, deficit

from rwcore import AdaptiveMethod, JudgedBatch, MethodSettings, Verdict
from rwcore.judges import OpenAIJudge, OpenAIReflector, ReflectionError
from rwcore.method import Providers, judge_groups
from rwcore.types import JudgeReport, RubricJudgment, RubricSpec, Trajectory, Turn

P, F, NA, INV = Verdict.PASS, Verdict.FAIL, Verdict.NA, Verdict.INVALID
KEY_ENV = "RWCORE_TEST_JUDGE_KEY"


# All outcomes 0. Group 0 varies the process rubrics, group 1 the pool rubric.
C1 = [P, P, P, P, P, P, P, P]
C2 = [F, INV, NA, P, P, P, P, P]
A1 = [P, P, P, P, P, P, F, INV]


def score(normalization: str):
    method = combined(normalization)
    trajs = trajectories(1, ["t0", "t1"], 4)
    return method, trajs, method.score(trajs, reports_for(trajs, {"c1": C1, "c2": C2, "a1": A1}))


def test_applicable_process_reward_scores_invalid_as_a_fail():
    # "applicable": mean over defined judgments, INVALID counted as a FAIL's 0 (before: left out -> 1.0).
    #   t0: (1 + 0)/2 = 0.5   t1: (1 + INVALID->0)/2 = 0.5   t2: c2 NA -> 1/1 = 1.0   t3: 1.0
    _, _, scored = score("applicable")
    assert np.allclose(scored.process_terms, [0.5, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    # Group 0 rewards [0.5, 0.5, 1, 1]: mean 0.75, sample std sqrt(4 * 0.0625 / 3) = 0.288675;
    # a1 all PASS there, so A = A_task = +-0.25 / 0.288675 = +-0.866025.
    assert np.allclose(scored.advantages[:4], [-0.866025, -0.866025, 0.866025, 0.866025], atol=1e-6)
    # evidence still sees INVALID as INVALID
    assert scored.judged.verdicts("c2")[1] == INV and np.isnan(scored.judged.values[1, scored.judged.index(["c2"])[0]])


def test_rubric_advantages_score_invalid_as_a_fail_and_evidence_keeps_it_invalid():
    method, trajs, scored = score("active_set")
    # "active_set" (1/|A|, NA and INVALID adding 0) already scored INVALID like a FAIL: 0.5, 0.5, 0.5, 1.0
    assert np.allclose(scored.process_terms[:4], [0.5, 0.5, 0.5, 1.0])
    # Group 1: rewards all 1 -> A_task = 0. a1 = [P, P, F, INVALID->0]: mean 0.5, sample std
    # sqrt(4 * 0.25 / 3) = 0.577350, A_rub = +-0.5 / 0.577350 = +-0.866025; A = 0.3 * A_rub = +-0.259808.
    # (Before: INVALID was not applicable -> A = A_task = 0 > the FAIL's -0.346410.)
    assert np.allclose(scored.advantages[4:], [0.259808, 0.259808, -0.259808, -0.259808], atol=1e-6)
    assert scored.judged.verdicts("a1")[7] == INV
    method.observe(1, ["t0", "t1"], trajs, scored.judged)
    # The pool's window counts (pass, fail, na, invalid) of a1: INVALID is not a FAIL there.
    window = method.pool.state_dict()
    assert json.dumps(window).count("s1/t1/2") == 1  # the FAILed trajectory id is recorded once ...
    assert "s1/t1/3" not in json.dumps(window)  # ... the INVALID one is not a failure


def test_rewardweaver_reward_scores_invalid_as_a_fail():
    from rwcore.rewardweaver import RewardWeaver

    library = build_library(ids=("c1", "c2"))
    weaver = RewardWeaver(library, ScriptedAttributor(), budget=2, min_support=1, normalize="applicable")
    diag = [traj_with(f"d{i}", 0.0, attribution=[deficit("c1"), deficit("c2")]) for i in range(3)]
    weaver.update(diag, reports_for(diag, {"c1": [F] * 3, "c2": [F] * 3}), step=0)
    assert set(weaver.active) == {"c1", "c2"}
    trajs = [traj_with(f"r{i}", 0.25) for i in range(3)]
    reports = reports_for(trajs, {"c1": [P, P, P], "c2": [F, INV, NA]})
    # R = 0.25 + [(1+0)/2, (1+INVALID->0)/2, 1/1] = [0.75, 0.75, 1.25]; before: [0.75, 1.25, 1.25]
    assert np.allclose(weaver.reward(trajs, reports), [0.75, 0.75, 1.25])


def test_judged_batch_reward_view_and_invalid_rates():
    trajs = trajectories(0, ["t0"], 4)
    reports = reports_for(trajs, {"a": [P, (F, 0.25), NA, INV], "b": [INV, INV, P, P]})
    judged = JudgedBatch.from_reports(reports, ["a", "b"])
    assert np.array_equal(judged.reward_values(), [[1.0, 0.0], [0.25, 0.0], [np.nan, 1.0], [0.0, 1.0]], equal_nan=True)
    assert np.array_equal(
        judged.reward_verdict_matrix(), [[1.0, 0.0], [0.0, 0.0], [np.nan, 1.0], [0.0, 1.0]], equal_nan=True
    )
    assert judged.invalid_rates() == {"a": 0.25, "b": 0.5}
    assert judged.invalid_rate_metrics() == {"judge/invalid_rate/a": 0.25, "judge/invalid_rate/b": 0.5}
    # the evidence views are unchanged
    assert np.isnan(judged.values[3, 0]) and judged.codes[3, 0] == INV


def test_trl_reward_functions_score_invalid_no_higher_than_a_fail():
    from rwcore.integrations.trl import rubric_reward_funcs

    class Judge:
        def evaluate(self, trajectories, rubrics):
            verdicts = [P, F, NA, INV]
            return [
                JudgeReport(t.trajectory_id, {"r": RubricJudgment("r", verdicts[i])})
                for i, t in enumerate(trajectories)
            ]

    funcs = rubric_reward_funcs(Judge(), [RubricSpec("r", "x")])
    values = funcs[0](["p"] * 4, ["c"] * 4, task_id=["t"] * 4)
    assert values == [1.0, 0.0, None, 0.0]  # INVALID scores a FAIL's 0 (before: None, i.e. left out)
    for bad in (None, 0.5):
        with pytest.raises(ValueError, match="invalid_value"):
            rubric_reward_funcs(Judge(), [RubricSpec("r", "x")], invalid_value=bad)
    # a judge that raises: every value is INVALID's, the batch goes on
    raising = rubric_reward_funcs(ExplodingJudge(), [RubricSpec("r", "x")], invalid_value=-1.0)
    assert raising[0](["p"] * 2, ["c"] * 2, task_id=["t"] * 2) == [-1.0, -1.0]


def test_verl_advantages_score_invalid_as_a_fail():
    import rwcore.integrations.verl as rv

    mask = torch.ones(4, 2, dtype=torch.bool)
    rewards = torch.zeros(4, 2)
    index = np.array(["g"] * 4, dtype=object)
    rows = np.array([{"r": "pass"}, {"r": "pass"}, {"r": "fail"}, {"r": Verdict.INVALID}], dtype=object)
    advantages, _ = rv.compute_arise_advantage(
        rewards, mask, index, config={"rwcore": {"lam": 0.3}}, non_tensor_batch={"uid": index, "rwcore_verdicts": rows}
    )
    # A_task = 0; y = [1, 1, 0, INVALID->0] -> A = 0.3 * +-0.866025 = +-0.259808 (before: INVALID got 0)
    assert torch.allclose(advantages[:, 0], torch.tensor([0.259808, 0.259808, -0.259808, -0.259808]), atol=1e-5)


# ---------------------------------------------------------------- exceptions -> INVALID


class ExplodingJudge:
    def __init__(self) -> None:
        self.calls = 0

    def evaluate(self, trajectories, rubrics):
        self.calls += 1
        raise KeyError("a rule crashed on the policy's text")


def test_a_judge_that_raises_gives_invalid_judgments_logged_once(caplog):
    trajs = trajectories(0, ["t0", "t1"], 2)
    plans = [[RubricSpec("a", "x")], [RubricSpec("b", "y")]]
    judge = ExplodingJudge()
    with caplog.at_level(logging.WARNING, logger="rwcore"):
        reports = judge_groups(judge, trajs, plans, 2)
    assert judge.calls == 2
    assert [sorted(r.judgments) for r in reports] == [["a"], ["a"], ["b"], ["b"]]
    for report in reports:
        for judgment in report.judgments.values():
            assert judgment.verdict == INV and "KeyError" in judgment.error and "crashed" in judgment.error
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "KeyError" in warnings[0].getMessage()


def test_a_missing_api_key_still_stops_the_run():
    # set-up, not a verdict: turning it into INVALID would train on an all-INVALID signal forever
    from rwcore.judges import MissingAPIKeyError

    class KeylessJudge:
        def evaluate(self, trajectories, rubrics):
            raise MissingAPIKeyError("api_key_env: environment variable 'X' is not set")

    with pytest.raises(MissingAPIKeyError, match="api_key_env"):
        judge_groups(KeylessJudge(), trajectories(0, ["t0"], 2), [[RubricSpec("a", "x")]], 2)


def test_openai_judge_turns_an_unexpected_error_into_invalid(monkeypatch, caplog):
    import rwcore.judges.openai_judge as module

    monkeypatch.setenv(KEY_ENV, "sk-test-secret-key")

    def broken(*args, **kwargs):  # an error message that happens to echo the key must not leak it
        raise RecursionError("maximum recursion depth exceeded near sk-test-secret-key")

    monkeypatch.setattr(module, "parse_judge_answer", broken)
    trajectory = Trajectory("t", [Turn("assistant", "x", generated=True)], 0.0)
    with ChatServer(all_pass) as server:
        judge = OpenAIJudge(
            "judge-test",
            base_url=server.base_url,
            api_key_env=KEY_ENV,
            timeout=2.0,
            max_retries=0,
            diagnostics=False,
            max_reasks=1,
        )
        [report] = judge.evaluate([trajectory], [RubricSpec("a", "x")])
        assert server.count == 2  # retried once with a fresh request, then final
    judgment = report.judgments["a"]
    assert judgment.verdict == INV and "RecursionError" in judgment.error
    assert "sk-test-secret-key" not in judgment.error and "sk-test-secret-key" not in caplog.text


def test_reflector_errors_become_reflection_errors(monkeypatch):
    import rwcore.judges.reflection as reflection
    import rwcore.judges.rewardweaver_reflection as rewardweaver_reflection

    monkeypatch.setenv(KEY_ENV, "sk-test")

    def broken(*args, **kwargs):
        raise TypeError("unhashable type: 'dict'")

    monkeypatch.setattr(rewardweaver_reflection, "answer_objects", broken)
    monkeypatch.setattr(reflection, "answer_parts", broken)
    trajectory = Trajectory("t", [Turn("assistant", "x", generated=True)], 0.0, trajectory_id="t/0")
    with ChatServer(lambda request: Reply("{}")) as server:
        reflector = OpenAIReflector(
            "reflect-test", base_url=server.base_url, api_key_env=KEY_ENV, timeout=2.0, max_retries=0, max_reasks=0
        )
        with pytest.raises(ReflectionError, match="TypeError"):
            reflector.propose_rubric_skills([trajectory], [], 2)
        with pytest.raises(ReflectionError, match="TypeError"):
            reflector.attribute(trajectory, [RubricSpec("c", "x")])


def test_a_failing_capability_proposer_keeps_the_dimensions_and_training_goes_on(caplog):
    # rw_open_vocabulary: before, an LLM proposer that raised at a stage boundary ended the run.
    class Proposer:
        def __init__(self) -> None:
            self.calls = 0

        def propose_capabilities(self, failures, library, max_new):
            self.calls += 1
            if self.calls > 1:
                raise ReflectionError("capability proposal: request failed: HTTP 500")
            return [RubricSpec("d1", "first dimension")]

    proposer = Proposer()
    method = AdaptiveMethod(
        "rw_open_vocabulary",
        {"t0": ["tag"], "t1": ["tag"]},
        MethodSettings(batch_size=2, group_size=2, adaptation_interval=1),
        Providers(proposer=proposer),
    )
    low = [traj_with(f"d{i}", 0.0) for i in range(2)]
    assert method.adapt(-1, diagnosis=(low, [JudgeReport(t.trajectory_id, {}) for t in low])).stage == 0
    with caplog.at_level(logging.WARNING, logger="rwcore.method"):
        report = method.adapt(0, diagnosis=(low, [JudgeReport(t.trajectory_id, {}) for t in low]))
    assert proposer.calls == 2 and report.stage == 1
    assert [spec.rubric_id for spec in method.process_rubrics()] == ["d1"]  # the dimensions stay
    assert method.state_dict()["stage_errors"] == 1 and "proposer failed" in caplog.text
