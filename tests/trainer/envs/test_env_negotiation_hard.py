"""The hard tier of the embedded default (env.options.difficulty=hard): multi-item sales.

Episodes are worked out by hand from the learnable tier's buyer (tests/trainer/envs/test_env_negotiation.py) and the
module docstring's rule for items: a sale the learnable tier counts a success opens the next item, anything else ends
the episode; rule verdicts by hand from the criteria, combined item by item.
"""

import collections
import itertools
import math
import random

import numpy as np
import pytest
from _util import negotiation_item

from rwcore.judges import RuleJudge
from rwcore.rewardweaver import CapabilityLibrary, attribute
from rwcore.trainer import envs
from rwcore.trainer.envs import HardNegotiationEnv, NegotiationEnv, Task
from rwcore.trainer.envs.negotiation import VERB_PHRASES, run_episode, scripted_policy
from rwcore.trainer.envs.negotiation.annotator import annotate, item_dialogues
from rwcore.trainer.envs.negotiation.attributor import failure_cause
from rwcore.trainer.envs.negotiation.cases import cases_for
from rwcore.trainer.envs.negotiation.reference_policies import _bad_policies
from rwcore.trainer.envs.negotiation.rubrics import RULE_DEFS, episode_state
from rwcore.trainer.exploration import exploration_figures, group_figures
from rwcore.types import Trajectory
from rwcore.verdict import Verdict

ENV = HardNegotiationEnv(seed=0, num_train=120, num_eval=100)
RULES = {rule.spec.rubric_id: rule for rule in ENV.rules()}


def _task(*items):
    return Task(
        "t-hard",
        tuple(dict.fromkeys(i["kind"] if i["kind"] != "hostile" else "hostile_partner" for i in items)),
        {
            "kinds": [i["kind"] for i in items],
            "items": list(items),
            "winnable": all(i["winnable"] for i in items),
            "feasible": all(i["feasible"] for i in items),
        },
    )


STANDARD_THEN_QUOTE = _task(negotiation_item(), negotiation_item("quote", item="chair", cost=80, budget=120, list=120))
NO_DEAL_THEN_HAGGLER = _task(
    negotiation_item("no_deal", cost=80, budget=60, list=140, feasible=False), negotiation_item("haggler", item="desk")
)
STANDARD_THEN_HOSTILE = _task(negotiation_item(), negotiation_item("hostile", item="bike"))


def _play(task, messages, env=ENV):
    """(trajectory, final episode) of saying `messages` in order (the episode must end with the last one)."""
    script = list(messages)
    trajectory = run_episode(env, task, lambda obs: script.pop(0))
    assert not script, "the episode ended before the last message"
    return trajectory


def test_difficulty_option_and_refusals():
    learnable = envs.make("negotiation")
    assert type(learnable) is NegotiationEnv
    same = NegotiationEnv()
    assert [(t.task_id, t.tags, t.data) for t in learnable.tasks("eval")] == [
        (t.task_id, t.tags, t.data) for t in same.tasks("eval")
    ]
    assert type(envs.make("negotiation", difficulty="hard")) is HardNegotiationEnv
    for options, key in (
        ({"difficulty": "medium"}, "env.options.difficulty"),
        ({"difficulty": 2}, "env.options.difficulty"),
        ({"items": 3}, "env.options.items"),
        ({"unwinnable_share": 0.2}, "env.options.unwinnable_share"),
        ({"difficulty": "hard", "kind_weights": {"standard": 1}}, "env.options.kind_weights"),
        ({"difficulty": "hard", "items": 1}, "env.options.items"),
        ({"difficulty": "hard", "items": True}, "env.options.items"),
        ({"difficulty": "hard", "unwinnable_share": 1.0}, "env.options.unwinnable_share"),
        ({"difficulty": "hard", "num_train": 0}, "env.options.num_train"),
        ({"difficulty": "hard", "max_turns": 0}, "env.options.max_turns"),
    ):
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            envs.make("negotiation", **options)


def test_tasks_splits_shares_and_tags():
    env = HardNegotiationEnv(seed=3, num_train=200, num_eval=100, items=3)
    train, evaluation = env.tasks("train"), env.tasks("eval")
    assert len(train) == 200 and len(evaluation) == 100
    again = HardNegotiationEnv(seed=3, num_train=200, num_eval=100, items=3)
    assert [(t.task_id, t.data) for t in again.tasks("train")] == [(t.task_id, t.data) for t in train]
    keys = [tuple(tuple(sorted(i.items())) for i in t.data["items"]) for t in train + evaluation]
    assert len(set(keys)) == len(keys)  # distinct tasks, so no held-out task is trained on
    for split, size in ((train, 200), (evaluation, 100)):
        unwinnable = [t for t in split if not t.data["winnable"]]
        assert len(unwinnable) == round(0.15 * size)  # 30 and 15
        for task in split:
            kinds = task.data["kinds"]
            assert len(kinds) == 3 and [i["kind"] for i in task.data["items"]] == kinds
            assert len({i["item"] for i in task.data["items"]}) == 3  # item names differ within a task
            assert all(k in ("standard", "bundle", "haggler", "quote", "no_deal") for k in kinds[:-1])
            tags = {"hostile": "hostile_partner"}
            assert task.tags == tuple(dict.fromkeys(tags.get(k, k) for k in kinds))
            assert task.data["winnable"] == (kinds[-1] not in ("hostile", "sold_out"))
    assert env.ceiling() == pytest.approx(85 / 100)
    assert ENV.ceiling() == pytest.approx(85 / 100)
    assert NegotiationEnv().ceiling() == pytest.approx(0.740)


def test_two_sales_in_a_row_by_hand():
    trajectory = _play(STANDARD_THEN_QUOTE, ["ask", "match", "confirm", "close", "list", "confirm", "close"])
    partner = [t.content for t in trajectory.turns if t.role == "partner"]
    assert partner == [
        "item lamp cost 60 list 120 buyer wants item",
        "item lamp cost 60 list 120 buyer budget 100 above",
        "item lamp cost 60 list 120 buyer agrees 100 above",
        "item lamp cost 60 list 120 buyer confirms",
        "item chair cost 80 list 120 buyer wants price",  # the first sale closed: the second item's brief
        "item chair cost 80 list 120 buyer agrees 120 above",
        "item chair cost 80 list 120 buyer confirms",
        "item chair cost 80 list 120 deal 120 above",
    ]
    assert trajectory.outcome == 1.0 and trajectory.metadata["success"]
    state = trajectory.metadata["env_state"]
    assert len(state["phases"]) == 2 and state["ended_by"] == "sold_all"
    assert [p["deal"]["price"] for p in state["phases"]] == [100, 120]


def test_a_failed_item_ends_the_episode():
    # the first sale leaves money on the table (offer 80 below the budget 100): no second item
    trajectory = _play(STANDARD_THEN_QUOTE, ["ask", "80", "confirm", "close"])
    state = trajectory.metadata["env_state"]
    assert len(state["phases"]) == 1 and trajectory.outcome == 0.0
    episode = ENV.reset(STANDARD_THEN_QUOTE, 0)
    for message in ["ask", "80", "confirm", "close"]:
        episode = ENV.step(episode, message)
    assert episode.done and ENV.outcome(episode).reason.startswith("item 1 of 2: deal at 80 left money")
    # an informed end of a hopeless first item opens the second; the haggler's sale then wins
    trajectory = _play(NO_DEAL_THEN_HAGGLER, ["ask", "end", "list", "accept", "confirm", "close"])
    assert trajectory.outcome == 1.0
    # the second item's buyer walks out at agreement (hostile): the partner's failure, not the policy's
    trajectory = _play(STANDARD_THEN_HOSTILE, ["ask", "match", "confirm", "close", "ask", "match"])
    assert trajectory.outcome == 0.0 and failure_cause(trajectory.metadata["env_state"]) == "partner"
    trajectory = _play(STANDARD_THEN_HOSTILE, ["ask", "120"])  # above the budget: the buyer leaves
    assert failure_cause(trajectory.metadata["env_state"]) == "policy"


def test_turn_limit_is_per_item_and_the_episode_limit_their_sum():
    assert ENV.max_turns == 12 and ENV.max_turns_per_item == 6
    trajectory = _play(STANDARD_THEN_QUOTE, ["ask", "match", "end"])
    assert trajectory.outcome == 0.0  # a plain buyer's feasible item ended by the seller: over
    env = HardNegotiationEnv(seed=0, num_train=1, num_eval=1, max_turns=4)
    trajectory = _play(STANDARD_THEN_QUOTE, ["ask", "match", "confirm", "close", "list", "confirm", "close"], env)
    assert trajectory.outcome == 1.0  # 4 + 3 turns fit two limits of 4
    trajectory = _play(STANDARD_THEN_QUOTE, ["ask", "match", "confirm", "confirm"], env)
    assert trajectory.turns[-1].content.endswith("buyer leaves")


def test_step_never_mutates_its_episode():
    episode = ENV.reset(STANDARD_THEN_QUOTE, 0)
    for message in ["ask", "match", "confirm", "close", "list"]:
        before = repr(episode.state)
        nxt = ENV.step(episode, message)
        assert repr(episode.state) == before
        episode = nxt
    with pytest.raises(ValueError, match="finished"):
        done = _play(STANDARD_THEN_QUOTE, ["ask", "120"])
        ENV.step(envs.Episode(STANDARD_THEN_QUOTE, "", True, done.metadata["env_state"]), "ask")


def test_scripted_reaches_the_ceiling_and_uniform_moves_almost_never_win():
    wins = 0
    for task in ENV.tasks("eval"):
        trajectory = run_episode(ENV, task, scripted_policy)
        wins += trajectory.metadata["success"]
        assert trajectory.metadata["success"] == task.data["winnable"]
    assert wins / len(ENV.tasks("eval")) == pytest.approx(ENV.ceiling())
    # a uniform policy over the eight move words: the best item pair is no_deal twice, (1/8)^4 = 1/4096 a try
    rng = random.Random(0)
    wins = sum(
        run_episode(ENV, task, lambda obs: rng.choice(VERB_PHRASES), seed=s).metadata["success"]
        for task in ENV.tasks("eval")
        for s in range(8)
    )
    assert wins <= 2  # expected < 0.1 over these 800 episodes


def _rule_verdict(rule_id, trajectory):
    return RULES[rule_id].check(trajectory)


@pytest.mark.parametrize(
    "rule_id, messages, expected",
    [
        # passes on both items
        ("confirms_agreement", ["ask", "match", "confirm", "close", "list", "confirm", "close"], True),
        # confirms the first agreement, fails the second (closes without confirming: out of place)
        ("confirms_agreement", ["ask", "match", "confirm", "close", "list", "close"], False),
        ("closes_after_confirmation", ["ask", "match", "confirm", "close", "list", "close"], True),
        # asks before committing on the lamp; the chair's buyer asked for a price (not applicable there)
        ("asks_budget_first", ["ask", "match", "confirm", "close", "list", "confirm", "close"], True),
        ("asks_budget_first", ["match"], None),  # match with no number stated: unclear, no commitment
        ("quotes_list_price", ["ask", "match", "confirm", "close", "list", "confirm", "close"], True),
        ("quotes_list_price", ["ask", "match", "confirm", "close", "list", "end"], False),
        ("quotes_list_price", ["ask", "120"], None),  # the episode never reached the chair
        # confirming and closing again on the next item repeats nothing the buyer of that item answered
        ("clear_actions", ["ask", "match", "confirm", "close", "list", "confirm", "close"], True),
        ("clear_actions", ["ask", "match", "confirm", "close", "list", "confirm", "confirm"], False),
    ],
)
def test_rules_are_checked_item_by_item(rule_id, messages, expected):
    trajectory = _play(STANDARD_THEN_QUOTE, messages)
    assert _rule_verdict(rule_id, trajectory) is expected
    assert annotate(rule_id, trajectory) == {True: Verdict.PASS, False: Verdict.FAIL, None: Verdict.NA}[expected]
    replayed = Trajectory.from_dict(trajectory.to_dict())
    del replayed.metadata["env_state"]  # the rules replay the episode from the task and the messages
    assert _rule_verdict(rule_id, replayed) is expected
    assert [p["events"] for p in episode_state(replayed)["phases"]] == [
        p["events"] for p in trajectory.metadata["env_state"]["phases"]
    ]


def test_annotator_splits_the_transcript_by_item():
    trajectory = _play(STANDARD_THEN_QUOTE, ["ask", "match", "confirm", "close", "list", "confirm", "close"])
    parts = item_dialogues(trajectory)
    assert [[t.role for t in part.turns] for part in parts] == [
        ["system", "partner", "assistant", "partner", "assistant", "partner", "assistant", "partner", "assistant"],
        ["system", "partner", "assistant", "partner", "assistant", "partner", "assistant", "partner"],
    ]
    assert [p.metadata["task"]["item"] for p in parts] == ["lamp", "chair"]
    learnable = run_episode(NegotiationEnv(), NegotiationEnv().tasks("eval")[0], scripted_policy)
    assert item_dialogues(learnable) == [learnable]


def test_rules_and_the_independent_annotator_agree_on_every_policy():
    disagreements = collections.Counter()
    for name, policy in _bad_policies().items():
        for task in ENV.tasks("eval")[:40]:
            rng = random.Random(f"{task.task_id}-{name}")
            trajectory = run_episode(ENV, task, lambda obs, p=policy, r=rng: p(obs, r))
            for rule in RULE_DEFS:
                verdict = rule.check(episode_state(trajectory))[0]
                label = annotate(rule.rule_id, trajectory)
                if label != {True: Verdict.PASS, False: Verdict.FAIL, None: Verdict.NA}[verdict]:
                    disagreements[rule.rule_id] += 1
    assert not disagreements


def test_labelled_cases_admit_every_rule_on_multi_item_tasks():
    rule_ids = [r.rule_id for r in RULE_DEFS]
    flat = ENV.labelled_cases(rule_ids)
    judge = RuleJudge({rid: rule.check for rid, rule in RULES.items()})
    library = CapabilityLibrary()
    for rule_id, rule in RULES.items():
        cases = cases_for(flat, rule_id)
        labels = [c.label for c in cases]
        assert labels.count(Verdict.PASS) >= 10 and labels.count(Verdict.FAIL) >= 10
        assert all(len(c.trajectory.metadata["task"]["items"]) == 2 for c in cases)
        for half in itertools.combinations(range(10), 5):
            sub = [c.label for c in cases if int(c.source[3:]) in half]
            assert Verdict.PASS in sub and Verdict.FAIL in sub
        report = library.admit(rule.spec, judge, cases)
        assert report.admitted, (rule_id, report.reasons)


def test_attribution_blames_the_failing_item():
    trajectory = _play(STANDARD_THEN_QUOTE, ["ask", "match", "confirm", "close", "list", "close"])
    records = ENV.attributor().attribute(trajectory, [RULES["confirms_agreement"].spec])
    assert records[0].deficit and records[0].cause == "policy" and records[0].evidence == "close"
    hostile = _play(STANDARD_THEN_HOSTILE, ["ask", "match", "confirm", "close", "ask", "match"])
    hostile.trajectory_id = "hostile"
    trajectory.trajectory_id = "unconfirmed"
    specs = [rule.spec for rule in RULES.values()]
    result = attribute([hostile, trajectory], specs, ENV.attributor())
    assert set(result.external) == {"hostile"}  # the second buyer walked out: not the agent's failure
    # the chair's sale: its agreement was not confirmed, and the move after the list price was not a confirmation
    assert {(r.trajectory_id, r.capability_id) for r in result.accepted} == {
        ("unconfirmed", "confirms_agreement"),
        ("unconfirmed", "quotes_list_price"),
    }


def test_group_figures_by_hand():
    outcomes = np.array([[0, 0, 0], [0, 1, 0], [1, 1, 1], [0, 0, 0]], dtype=float)
    figures = group_figures(outcomes, outcomes > 0)
    assert figures == {
        "pass@1": pytest.approx(4 / 12),
        "pass@3": pytest.approx(2 / 4),
        "zero_variance_groups": pytest.approx(3 / 4),  # all failed twice, all succeeded once
        "all_failed_groups": pytest.approx(2 / 4),
    }
    tasks = [Task("a", ("x",), {}), Task("b", ("x", "y"), {}), Task("c", ("y",), {}), Task("d", ("z",), {})]
    per_type = exploration_figures(tasks, outcomes, outcomes > 0)
    assert per_type["pass@3/x"] == pytest.approx(0.5) and per_type["pass@3/y"] == pytest.approx(1.0)
    assert per_type["pass@3/z"] == 0.0 and per_type["types_pass@3_below_0.05"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        group_figures(np.zeros(3), np.zeros(3, dtype=bool))
    assert math.isclose(1 - math.comb(8 - 0, 8) / math.comb(8, 8), 0.0)  # pass@k with n = k: any success
