"""The environment protocol split: an environment that is only a simulator runs `rw train`
with an LLM judge / reflector / attributor filling in everything it does not bring; without them it is
refused at start naming env.name and what is missing; step_many is called once per turn; an episode that
its partner ended (a partner failure) is never charged to the agent."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from judge_server import (
    ChatServer,
    Reply,
    loopback_without_proxy,  # noqa: F401 - autouse fixture
    verdict_line,
)

from rwcore import AdaptiveMethod, MethodSettings, Verdict
from rwcore.method import Providers
from rwcore.rewardweaver import attribute
from rwcore.trainer import envs
from rwcore.trainer.config import load_config
from rwcore.trainer.envs.base import Episode, Outcome, Task, failure_of, partner_failed
from rwcore.trainer.trainer import Trainer
from rwcore.types import RubricSpec, Trajectory, Turn

KEY_ENV = "RWCORE_TEST_PROTOCOL_KEY"


class SimulatorOnly:
    """name, system_prompt, max_turns, tasks, reset, step, outcome, vocabulary - nothing else. The agent
    succeeds by saying "yes"; episodes with an odd seed are ended by a failing partner when `flaky`."""

    name = "simulator_only"
    system_prompt = "say yes"
    max_turns = 2

    def __init__(self, flaky: bool = False) -> None:
        self.flaky = flaky

    def tasks(self, split):
        prefix = "t" if split == "train" else "e"
        return [Task(f"{prefix}{i}", ("kind_a" if i % 2 else "kind_b",), {"i": i}) for i in range(4)]

    def reset(self, task, seed):
        return Episode(task, "say yes or no", False, {"said": [], "seed": seed})

    def step(self, episode, action):
        state = {**episode.state, "said": [*episode.state["said"], action]}
        if self.flaky and episode.state["seed"] % 2:
            return partner_failed(Episode(episode.task, episode.observation, False, state), "partner timed out")
        return Episode(episode.task, "again", len(state["said"]) >= self.max_turns or "yes" in action.split(), state)

    def outcome(self, episode):
        ok = any("yes" in said.split() for said in episode.state["said"])
        return Outcome(float(ok), ok)

    def vocabulary(self):
        return ["yes", "no", "say", "or", "again"]


class Batched(SimulatorOnly):
    """Records each step_many call's batch size."""

    name = "simulator_batched"

    def __init__(self, flaky: bool = False) -> None:
        super().__init__(flaky)
        self.batches: list[int] = []

    def step_many(self, episodes, actions):
        self.batches.append(len(episodes))
        return [self.step(e, a) for e, a in zip(episodes, actions)]


envs.register("simulator_only", SimulatorOnly)
envs.register("simulator_batched", Batched)

SMALL = [
    "rollout.tasks_per_step=2",
    "rollout.group_size=4",
    "train.eval_every=0",
    "train.checkpoint_every=0",
    "rollout.max_new_tokens=2",
]


class LLM:
    """The judge and the reflection model: passes every rubric, proposes two capabilities from the first
    views, attributes failures to the policy. Counts requests per kind."""

    def __init__(self) -> None:
        self.kinds: dict[str, int] = {}

    def __call__(self, request) -> Reply:
        system = request.system
        for marker, kind in (
            ("careful, impartial evaluator", "judge"),
            ("You diagnose why", "attribution"),
            ("You maintain the capability library", "proposal"),
        ):
            if marker in system:
                self.kinds[kind] = self.kinds.get(kind, 0) + 1
                return getattr(self, kind)(request)
        raise AssertionError(f"unexpected prompt: {system[:200]}")

    def judge(self, request) -> Reply:
        return Reply("\n".join(verdict_line(request, rid, "pass", score=0.9) for rid in request.rubric_ids))

    def attribution(self, request) -> Reply:
        return Reply(
            "\n".join(
                json.dumps(
                    {
                        "request_id": request.request_id,
                        "capability_id": cid,
                        "deficit": True,
                        "confidence": 0.9,
                        "evidence": "turn 1: no",
                        "cause": "policy",
                    }
                )
                for cid in request.candidate_ids
            )
        )

    def proposal(self, request) -> Reply:
        refs = [f"T{i}" for i in range(len(request.data["failures"]))]
        proposals = [
            {
                "capability_id": cid,
                "family": "Execution",
                "definition": f"The agent {text}.",
                "evaluator_instructions": "Read the agent's turns.",
                "support": refs,
            }
            for cid, text in (("says_yes", "says yes"), ("answers_briefly", "answers briefly"))
        ]
        return Reply(json.dumps({"request_id": request.request_id, "proposals": proposals}))


@pytest.fixture
def llm(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-test-protocol-91c3")
    script = LLM()
    with ChatServer(script) as chat:
        chat.script = script
        yield chat


def test_a_simulator_only_environment_trains_with_the_llm_filling_in_every_provider(llm, tmp_path):
    overrides = [
        *SMALL,
        "env.name=simulator_only",
        "train.steps=2",
        "train.method=rewardweaver",
        "rewardweaver.adaptation_interval=2",
        "rewardweaver.min_support=1",
        "rewardweaver.diagnosis_tasks=2",
        "rewardweaver.diagnostic_tasks=2",
        "rewardweaver.success_sample=0",
        "judge.kind=openai",
        "judge.model=judge-test",
        f"judge.base_url={llm.base_url}",
        f"judge.api_key_env={KEY_ENV}",
    ]
    trainer = Trainer(load_config(None, overrides), tmp_path / "run", quiet=True)
    trainer.setup()
    library = trainer.method.weaver.library
    # no rules, no labelled cases: the LLM proposed the capabilities, admitted without the acceptance test
    assert set(library.ids()) == {"says_yes", "answers_briefly"}
    assert all("unvalidated" in library[c].admission.reasons[0] for c in library.ids())
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [row for row in rows if row["kind"] == "train"]
    assert len(train) == 2 and all(row["judgments"] > 0 and row["invalid_rate"] == 0.0 for row in train)
    assert llm.script.kinds["proposal"] >= 1 and llm.script.kinds["judge"] > 0
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".yaml"):
            assert "sk-test-protocol-91c3" not in path.read_text()


@pytest.mark.parametrize("method, missing", [("rewardweaver", "rules"), ("arise", "rules")])
def test_without_an_llm_judge_a_simulator_only_environment_is_refused_naming_what_is_missing(tmp_path, method, missing):
    trainer = Trainer(
        load_config(None, [*SMALL, "env.name=simulator_only", f"train.method={method}"]), tmp_path / "run", quiet=True
    )
    with pytest.raises(ValueError, match=rf"env.name 'simulator_only' brings no {missing}.*judge.kind=openai"):
        trainer.setup()
    assert not (tmp_path / "run").exists()


def test_a_variant_needing_a_reflector_names_the_missing_provider(tmp_path):
    from rwcore.method import get_variant
    from rwcore.trainer.envs.base import Rule
    from rwcore.trainer.method_setup import build_providers

    class WithRulesOnly(SimulatorOnly):
        def rules(self):
            return [Rule(RubricSpec("says_yes", "The agent says yes."), "f", lambda t: True)]

        def reflector(self):
            return None  # "not provided"

    cfg = load_config(None, ["train.method=arise"])
    with pytest.raises(ValueError, match="env.name 'simulator_only' brings no reflector"):
        build_providers(cfg, WithRulesOnly(), judge=None, variant=get_variant("arise"))


def test_step_many_is_called_once_per_turn_with_every_live_episode_and_partner_failures_are_not_charged(tmp_path):
    trainer = Trainer(
        load_config(
            None,
            [
                *SMALL,
                "env.name=simulator_batched",
                "env.options.flaky=true",
                "train.steps=1",
                "train.method=outcome_only",
                "train.start_pass_k=0",  # no step-0 exploration batch: the batches are evaluation's and training's
            ],
        ),
        tmp_path / "run",
        quiet=True,
    )
    trainer.setup()
    trainer.env = env = Batched(flaky=True)
    env.batches.clear()
    seen = {}
    score = trainer.method.score

    def spy(trajectories, reports, *args, **kwargs):
        scored = score(trajectories, reports, *args, **kwargs)
        seen["trajectories"], seen["scored"] = list(trajectories), scored
        return scored

    trainer.method.score = spy
    trainer.train()
    # one step_many call per turn of each run_episodes (held-out evaluation of the 4 eval tasks before and
    # after, the training step's 2 x 4 episodes): the training step's first turn sends all 8 at once
    assert env.batches[0] == 4 and 8 in env.batches and max(env.batches) == 8
    assert len(env.batches) <= 3 * env.max_turns
    trajectories, scored = seen["trajectories"], seen["scored"]
    failed = [bool(t.partner_failure) for t in trajectories]
    row = next(
        r
        for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    )
    assert row["partner_failures"] == sum(failed) == 4  # the odd seeds: 2 of each group's 4 episodes
    for g in range(2):
        rows = range(4 * g, 4 * g + 4)
        kept = [i for i in rows if not failed[i]]
        outcomes = np.array([trajectories[i].outcome for i in kept])
        for i in rows:
            if failed[i]:
                assert scored.advantages[i] == 0.0 and trajectories[i].partner_failure == "partner timed out"
        # the others are normalized among themselves only (population of the kept episodes, ddof=1)
        if len(kept) > 1 and outcomes.std() > 0:
            expected = (outcomes - outcomes.mean()) / (outcomes.std(ddof=1) + 1e-9)
            assert np.allclose(scored.advantages[kept], expected)
    assert math.isfinite(row["loss"])


def test_a_partner_failure_is_the_episodes_typed_field_and_failure_of_reads_it_before_the_outcomes():
    live = Episode(Task("t", ("kind_a",)), "hello", False, {"said": ["yes"]})
    failed = partner_failed(live, "partner timed out")
    assert failed.done and failed.partner_failure == "partner timed out" and failed.observation == "hello"
    assert failed.state == {"said": ["yes"]} and failed.state is not live.state  # no key added, a copy
    assert not live.done and live.partner_failure == ""
    assert partner_failed(live, "").partner_failure == "partner failure"
    assert partner_failed(live, "x" * 600).partner_failure == "x" * 500
    assert failure_of(failed, Outcome(0.0, False, failure="evaluator down")) == "partner timed out"
    assert failure_of(live, Outcome(0.0, False, failure="evaluator down")) == "evaluator down"
    assert failure_of(live, Outcome(1.0, True)) == ""


def test_an_older_environments_state_key_is_still_read_with_a_warning_naming_the_removal_release():
    legacy = Episode(Task("t", ("kind_a",)), "hello", True, {"partner_failure": "opponent crashed"})
    with pytest.warns(DeprecationWarning, match=r"ignored from rwcore 0\.2\.0.*partner_failed"):
        assert failure_of(legacy, Outcome(0.0, False, failure="evaluator down")) == "opponent crashed"
    typed = partner_failed(legacy, "partner timed out")  # the typed field wins, without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert failure_of(typed, Outcome(0.0, False)) == "partner timed out"


def test_score_gives_a_partner_failure_no_advantage_and_no_verdict():
    method = AdaptiveMethod(
        "outcome_only", {"t0": ["tag"]}, MethodSettings(batch_size=1, group_size=4, length_threshold=0), Providers()
    )
    trajs = [
        Trajectory(
            "t0",
            [Turn("assistant", f"m{j}", True)],
            outcome,
            tags=("tag",),
            trajectory_id=f"s0/t0/{j}",
            partner_failure="partner sent garbage" if j == 3 else "",
        )
        for j, outcome in enumerate([1.0, 1.0, 0.0, 0.0])
    ]
    from rwcore.types import JudgeReport, RubricJudgment

    reports = [JudgeReport(t.trajectory_id, {"r": RubricJudgment("r", Verdict.PASS)}) for t in trajs]
    scored = method.score(trajs, reports)
    # by hand over the three kept: mean 2/3, sample std sqrt(1/3): A = (1/3, 1/3, -2/3) / 0.57735
    assert np.allclose(scored.advantages, [0.57735027, 0.57735027, -1.15470054, 0.0], atol=1e-6)
    codes = scored.judged.columns(["r"]).codes
    assert codes[3, 0] == Verdict.INVALID and (codes[:3, 0] == Verdict.PASS).all()


def test_attribution_blames_the_partner_for_a_partner_failure_without_asking_the_attributor():
    class Never:
        def attribute(self, trajectory, candidates):
            raise AssertionError("the attributor must not be asked about a partner failure")

    specs = [RubricSpec("c1", "criterion 1"), RubricSpec("c2", "criterion 2")]
    failure = Trajectory(
        "t0",
        [Turn("assistant", "hi", True)],
        0.0,
        trajectory_id="a",
        partner_failure="partner request failed: timed out",
    )
    result = attribute([failure], specs, Never())
    assert result.external == ("a",) and not result.accepted and result.unattributed == ()
    assert result.rejection_counts()["cause_partner"] == 2
    assert all("timed out" in r.record.evidence for r in result.rejected)


def test_a_partner_failure_is_no_outcome_evidence_for_vade_sampling():
    from method_fakes import Reflector

    method = AdaptiveMethod(
        "arise_vade_sampling",
        {"t0": ["tag"]},
        MethodSettings(batch_size=1, group_size=4, length_threshold=0),
        Providers(reflector=Reflector([])),
    )
    trajs = [
        Trajectory(
            "t0",
            [Turn("assistant", f"m{j}", True)],
            outcome,
            tags=("tag",),
            trajectory_id=f"s0/t0/{j}",
            partner_failure="partner timed out" if j == 3 else "",
        )
        for j, outcome in enumerate([1.0, 1.0, 0.0, 0.0])
    ]
    from rwcore.types import JudgeReport

    scored = method.score(trajs, [JudgeReport(t.trajectory_id, {}) for t in trajs])
    method.observe(0, ["t0"], trajs, scored.judged)
    # by hand: the failure takes the mean of the other three (2/3): S = 1 + 1 + 0 + 2/3, F = 0 + 0 + 1 + 1/3
    # (charged as a 0 it would be S = 2, F = 2)
    assert np.allclose(method.sampler.task_evidence("t0", 0), (8 / 3, 4 / 3))
