"""The built-in negotiation environment: tasks, splits, parsing, episodes, outcomes, vocabulary, learnability."""

import random

import pytest

from rwcore.trainer.envs import Environment, NegotiationEnv, Task, make
from rwcore.trainer.envs.negotiation import (
    ACTION_PHRASES,
    KINDS,
    build_trajectory,
    evaluate_policy,
    parse_action,
    parse_observation,
    random_policy,
    run_episode,
    scripted_policy,
)


def _task(kind="standard", **over):
    data = {"kind": kind, "item": "lamp", "cost": 60, "list": 100, "budget": 90, "opening": 50,
            "bundle_cost": None, "bundle_budget": None, "hostile": False, "feasible": True, "winnable": True}
    data.update(over)
    return Task("t-" + kind, KINDS.get(kind, (kind,)), data)


def _play(env, task, messages, seed=0):
    episode = env.reset(task, seed)
    for message in messages:
        if episode.done:
            break
        episode = env.step(episode, message)
    return episode


def _success_rate(env, policy, reps=3):
    wins = total = 0
    for rep in range(reps):
        for task in env.tasks("eval"):
            rng = random.Random(f"{task.task_id}/{rep}")
            episode = env.reset(task, rep)
            while not episode.done:
                episode = env.step(episode, policy(episode.observation, rng))
            wins += env.outcome(episode).success
            total += 1
    return wins / total


def test_registered_and_protocol():
    env = make("negotiation", seed=3, num_train=20, num_eval=10, max_turns=3)
    assert isinstance(env, Environment)
    assert env.name == "negotiation" and env.max_turns == 3
    assert len(env.tasks("train")) == 20 and len(env.tasks("eval")) == 10
    with pytest.raises(ValueError):
        env.tasks("test")
    with pytest.raises(ValueError):
        NegotiationEnv(num_train=0)
    with pytest.raises(ValueError):
        NegotiationEnv(kind_weights={"nope": 1.0})


def test_tasks_deterministic_and_seeded():
    a, b = NegotiationEnv(seed=0), NegotiationEnv(seed=0)
    assert a.tasks("train") == b.tasks("train") and a.tasks("eval") == b.tasks("eval")
    assert a.tasks("eval") == a.tasks("eval")
    c = NegotiationEnv(seed=1)
    assert [t.data for t in c.tasks("train")] != [t.data for t in a.tasks("train")]


def test_splits_disjoint():
    env = NegotiationEnv(seed=0, num_train=300, num_eval=100)
    train, evals = env.tasks("train"), env.tasks("eval")
    assert not {t.task_id for t in train} & {t.task_id for t in evals}
    train_data = {tuple(sorted(t.data.items())) for t in train}
    assert all(tuple(sorted(t.data.items())) not in train_data for t in evals)
    # every kind appears in both splits, and every task has 1-2 tags
    assert {t.data["kind"] for t in evals} == set(KINDS) == {t.data["kind"] for t in train}
    assert all(1 <= len(t.tags) <= 2 for t in train + evals)
    assert any(not t.data["feasible"] for t in evals) and any(not t.data["winnable"] for t in evals)


@pytest.mark.parametrize("text, expected", [
    ("offer 80", ("offer", 80)),
    ("OFFER 80!", ("offer", 80)),
    ("i offer 85 now", ("offer", 90)),
    ("offer 84", ("offer", 80)),
    ("offer 500", ("offer", 200)),
    ("offer 0", ("offer", 10)),
    ("price 70", ("offer", 70)),
    ("bundle offer 90", ("bundle", 90)),
    ("offer bundle 90", ("offer", 90)),
    ("accept", ("accept", None)),
    ("accept 80 offer", ("accept", None)),
    ("reject", ("reject", None)),
    ("ask budget", ("ask", None)),
    ("budget?", ("ask", None)),
    ("end", ("end", None)),
    ("offer", ("unclear", None)),
    ("bundle", ("unclear", None)),
    ("80", ("unclear", None)),
    ("the item", ("unclear", None)),
    ("", ("unclear", None)),
    (None, ("unclear", None)),
])
def test_parse_action_lenient(text, expected):
    assert parse_action(text) == expected


def test_observation_reveals_private_facts():
    env = NegotiationEnv()
    task = _task()
    episode = env.reset(task, 0)
    assert episode.observation == "item lamp cost 60 list 100 buyer offer 50"
    facts = parse_observation(episode.observation)
    assert facts["cost"] == 60 and facts["list"] == 100 and facts["offer"] == 50
    episode = env.step(episode, "ask budget")
    assert episode.observation.endswith("buyer budget 90") and not episode.done
    bundle = _task("bundle", cost=60, budget=40, opening=40, bundle_cost=80, bundle_budget=100)
    obs = env.reset(bundle, 0).observation
    assert obs == "item lamp cost 60 bundle cost 80 list 100 buyer wants bundle offer 40"
    f = parse_observation(env.step(env.reset(bundle, 0), "ask budget").observation)
    assert f["budget"] == 40 and f["bundle_budget"] == 100 and f["bundle_cost"] == 80


def test_episode_mechanics():
    env = NegotiationEnv(max_turns=4)
    task = _task()
    ep = _play(env, task, ["ask budget", "offer 90"])
    assert ep.done and ep.state["deal"] == {"price": 90, "kind": "plain", "cost": 60, "how": "offer"}
    out = env.outcome(ep)
    assert out.success and out.reward == 1.0
    ep = _play(env, task, ["accept"])
    out = env.outcome(ep)
    assert ep.done and not out.success and out.reward == 0.0
    ep = _play(env, task, ["offer 70"])
    out = env.outcome(ep)
    assert out.success and 0.5 < out.reward < 1.0
    ep = _play(env, task, ["end"])
    assert ep.done and env.outcome(ep).reward == 0.1 and not env.outcome(ep).success
    ep = _play(env, task, ["what", "what"])  # two unclear turns: the buyer walks away
    assert ep.done and ep.state["ended_by"] == "partner" and ep.observation.endswith("buyer leaves")
    ep = _play(env, task, ["ask budget"] * 4)
    assert ep.done and ep.state["ended_by"] == "timeout" and ep.observation.endswith("time up")
    with pytest.raises(ValueError):
        env.step(ep, "end")
    # step leaves the given episode unchanged
    first = env.reset(task, 0)
    before = (first.observation, repr(first.state))
    env.step(first, "offer 150")
    assert (first.observation, repr(first.state)) == before and not first.done
    # counters rise towards the budget and never above it
    ep = _play(env, task, ["offer 150", "offer 150", "offer 150"])
    offers = [e["buyer_offer_after"] for e in ep.state["events"]]
    assert all(o <= 90 for o in offers) and offers[0] > 50


def test_no_deal_and_hostile_outcomes():
    env = NegotiationEnv()
    hopeless = _task("no_deal", cost=80, budget=60, opening=50, feasible=False)
    assert env.outcome(_play(env, hopeless, ["end"])) .success
    assert env.outcome(_play(env, hopeless, ["ask budget", "end"])).reward == 1.0
    assert not env.outcome(_play(env, hopeless, ["accept"])).success
    assert not env.outcome(_play(env, hopeless, ["offer 60"])).success
    assert env.outcome(_play(env, hopeless, ["offer 150"] * 4)).reward == 0.3
    hostile = _task("hostile", opening=50, budget=70, hostile=True, winnable=False)
    ep = _play(env, hostile, ["ask budget", "ask budget"])
    assert ep.state["ended_by"] == "partner" and not env.outcome(ep).success
    assert "angry" in env.reset(hostile, 0).observation
    friendly = _task("hostile", opening=70, budget=70, hostile=True, winnable=True)
    assert env.outcome(_play(env, friendly, ["accept"])).success
    assert env.outcome(_play(env, friendly, ["offer 60"])).success


def test_episodes_deterministic_given_seed():
    env = NegotiationEnv(seed=0)
    for task in env.tasks("eval")[:20]:
        runs = []
        for _ in range(2):
            rng = random.Random(7)
            trajectory = run_episode(env, task, lambda obs, r=rng: random_policy(obs, r), seed=5)
            runs.append(trajectory.to_dict())
        assert runs[0] == runs[1]


def test_trajectory_contract():
    env = NegotiationEnv()
    task = env.tasks("eval")[0]
    trajectory = run_episode(env, task, scripted_policy, seed=2, group_id="g")
    roles = [t.role for t in trajectory.turns]
    assert roles[0] == "system" and roles[1] == "partner"
    assert roles[2::2] == ["assistant"] * len(roles[2::2])
    assert all(t.generated == (t.role == "assistant") for t in trajectory.turns)
    assert trajectory.turns[0].content == env.system_prompt
    assert trajectory.tags == task.tags and trajectory.task_id == task.task_id
    meta = trajectory.metadata
    assert set(meta) >= {"env_state", "task", "task_id", "seed", "success"}
    assert meta["task"] == task.data and meta["seed"] == 2
    assert 0.0 <= trajectory.outcome <= 1.0
    # JSON round trip keeps everything
    from rwcore.types import Trajectory
    assert Trajectory.from_dict(trajectory.to_dict()).to_dict() == trajectory.to_dict()
    # the builder used on a hand-driven episode
    episode = env.reset(task, 0)
    partner = [episode.observation]
    episode = env.step(episode, "end")
    partner.append(episode.observation)
    built = build_trajectory(env, episode, ["end"], partner, system_prompt="custom", trajectory_id="x")
    assert [t.content for t in built.turns] == ["custom", partner[0], "end", partner[1]]
    assert built.trajectory_id == "x" and built.outcome == env.outcome(episode).reward


def test_vocabulary_covers_everything():
    env = NegotiationEnv()
    vocab = set(env.vocabulary())
    assert len(vocab) < 150 and all(w == w.lower() and " " not in w and w for w in vocab)
    assert set(env.system_prompt.split()) <= vocab
    for phrase in ACTION_PHRASES:
        assert set(phrase.split()) <= vocab
    seen = set()
    for task in env.tasks("train")[:80]:
        for policy in (lambda o, r: scripted_policy(o), random_policy):
            rng = random.Random(task.task_id)
            trajectory = run_episode(env, task, lambda obs, p=policy, r=rng: p(obs, r))
            for turn in trajectory.turns:
                seen |= set(turn.content.split())
    assert seen <= vocab, seen - vocab


def test_random_vs_scripted_success_gap():
    env = NegotiationEnv(seed=0, num_train=50, num_eval=200)
    random_rate = _success_rate(env, random_policy)
    scripted_rate = _success_rate(env, lambda obs, rng: scripted_policy(obs))
    assert evaluate_policy(env, random_policy, "eval", seeds=range(3))[0] == pytest.approx(random_rate)
    assert 0.15 <= random_rate <= 0.35, random_rate
    assert scripted_rate >= 0.8, scripted_rate
    assert scripted_rate - random_rate > 0.4


def test_hints_mark_each_buyer_number_above_or_below_its_cost_and_change_nothing_else():
    from rwcore.trainer.envs.negotiation import NegotiationEnv, parse_observation

    plain, hinted = NegotiationEnv(seed=3), NegotiationEnv(seed=3, hints=True)
    assert {"above", "below"} <= set(hinted.vocabulary())
    checked = 0
    for task in hinted.tasks("eval")[:20]:
        a, b = plain.reset(task, 7), hinted.reset(task, 7)
        for action in ("ask budget", "offer 150", "end"):
            words = b.observation.split()
            facts = parse_observation(b.observation)
            assert {k: v for k, v in facts.items()} == parse_observation(a.observation)
            for i, word in enumerate(words[:-1]):
                if word.isdigit() and words[i - 1] in ("offer", "budget", "deal"):
                    cost = facts["bundle_cost"] if "bundle" in words[max(0, i - 3):i] and facts["bundle_cost"] else facts["cost"]
                    assert words[i + 1] == ("above" if int(word) >= cost else "below")
                    checked += 1
            if a.done:
                break
            a, b = plain.step(a, action), hinted.step(b, action)
            assert a.state == b.state  # the same episode, only the wording differs
    assert checked > 10
